from __future__ import annotations

from typer.testing import CliRunner

from harnessrl.cli.main import app

NOUNS = ["proxy", "gateway", "sandbox", "trial", "capture", "train", "dashboard", "tasks", "bench"]


def test_help_lists_every_command_group() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for noun in NOUNS:
        assert noun in result.output


def test_unknown_command_fails() -> None:
    result = CliRunner().invoke(app, ["frobnicate"])
    assert result.exit_code != 0
