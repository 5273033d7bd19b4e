"""``harnessrl bench vllm-path`` refuses bad arguments with a clear message before starting anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stack.cli.main import app


def plain(text: str) -> str:
    """The message without rich's box and line wrapping (its width is not always COLUMNS)."""
    return " ".join(text.replace("\u2502", " ").split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stream", "maybe"], "choose both, no or yes"),
        (["--short-calls", "0", "--long-calls", "0"], "nothing to measure"),
        (["--short-calls", "-1"], "greater than or equal to 0"),
        (["--long-calls", "many"], "--long-calls"),
        (["--stream-interval", "0"], "greater than or equal to 1"),
        (["--stream-interval", "x"], "--stream-interval"),
        (["--wide-interval", "0"], "greater than or equal to 1"),
        (["--wide-interval", "wide"], "--wide-interval"),
    ],
)
def test_malformed_arguments_are_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "vllm-path", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in plain(result.output), result.output


def test_a_missing_vllm_venv_names_the_setup_script(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["bench", "vllm-path", "--short-calls", "1"], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "setup_vllm.sh" in result.output


def test_a_vllm_url_must_be_http() -> None:
    result = CliRunner().invoke(app, ["bench", "vllm-path", "--vllm-url", "127.0.0.1:8000"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "is not an http(s) URL" in result.output, result.output


@pytest.mark.parametrize(
    ("level", "message"),
    [("0", "greater than or equal to 1"), ("65", "less than or equal to 64"), ("x", "--concurrency")],
)
def test_a_concurrency_out_of_range_is_refused(level: str, message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "vllm-path", "--concurrency", level], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in plain(result.output), result.output
