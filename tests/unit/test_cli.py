from __future__ import annotations

from typer.testing import CliRunner

from stack.cli.main import app
from tests.cli_support import run_cli

NOUNS = ["proxy", "gateway", "sandbox", "trial", "capture", "train", "dashboard", "tasks", "bench"]


def test_help_lists_every_command_group() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for noun in NOUNS:
        assert noun in result.output


def test_unknown_command_fails() -> None:
    result = CliRunner().invoke(app, ["frobnicate"])
    assert result.exit_code != 0


def test_capture_agreement_is_the_trainers_agreement_command(tmp_path) -> None:
    out = tmp_path / "report.json"
    args = ["capture", "agreement", "--run", "r1", "--model", str(tmp_path / "nope"), "--out", str(out)]
    proc = run_cli(*args, "--capture", "127.0.0.1:1")
    assert proc.returncode == 2 and "not a model folder" in proc.stderr
    assert not out.exists()


def test_bench_sandbox_refuses_an_unknown_backend() -> None:
    result = CliRunner().invoke(app, ["bench", "sandbox", "--backend", "firecracker"])
    assert result.exit_code == 2 and "firecracker" in result.output and "docker" in result.output
