"""`harnessrl conformance` without harness runs: its refusals, its tables, the
not-installed cell, and the faithfulness check failing on a tampered capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harnessrl.errors import ConfigError
from stack.cli.main import app
from stack.conformance.drivers import DRIVERS
from stack.conformance.matrix import (
    COLUMNS,
    Report,
    all_drivers,
    render_markdown,
    render_text,
    resolve_harnesses,
    run_cell,
    run_matrix,
)
from stack.conformance.proxy_stack import Unfaithful, check_faithful


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--harness", "claude"], "unknown harness(es) ['claude']; known: ['claude-code', 'cline', 'codex'"),
        (["--harness", "codex", "--scenario", "memory"], "unknown scenario(s) ['memory']"),
    ],
)
def test_bad_names_are_refused_naming_the_valid_ones(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["conformance", *args])
    assert isinstance(result.exception, ConfigError) and message in str(result.exception)


def test_json_to_a_directory_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["conformance", "--harness", "codex", "--json", str(tmp_path)])
    assert isinstance(result.exception, ConfigError) and "is a directory" in str(result.exception)


def test_resolve_keeps_order_and_defaults_to_all() -> None:
    assert [d.name for d in resolve_harnesses(["codex", "opencode"])] == ["codex", "opencode"]
    assert [d.name for d in resolve_harnesses([])] == list(all_drivers())


def test_a_harness_not_installed_is_na_never_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tmp_path / "none"))
    cell = run_cell(DRIVERS["claude-code"], "tools", tmp_path / "cell")
    assert cell.status == "n/a" and "not installed" in cell.detail
    report = run_matrix(["mini-swe-agent"])
    [row] = report.rows
    assert row["version"] == "not installed" and {c["status"] for c in row["cells"].values()} == {"n/a"}


def _row(name: str, statuses: dict[str, tuple[str, str]]) -> dict[str, Any]:
    cells = {c: {"status": s, "detail": d, "chat_template": ""} for c, (s, d) in statuses.items()}
    head = {"harness": name, "version": "1.2.3", "protocol": "openai chat", "streaming": True}
    return {**head, "chat_template": "hermes-chatml", "cells": cells}


def test_tables_show_every_cell_and_say_why_a_cell_is_not_passed() -> None:
    statuses = {c: ("passed", "") for c in COLUMNS}
    statuses["sub-agent"] = ("n/a", "no sub-agent tool")
    statuses["compaction"] = ("failed", "no rewrite of main")
    report = Report([_row("codex", statuses)])
    md = render_markdown(report).splitlines()
    assert (
        md[0]
        == "| harness | version | protocol | streaming | tools | sub-agent | compaction | side calls | chat template |"
    )
    assert md[2] == "| codex | 1.2.3 | openai chat | yes | passed | n/a [1] | FAILED [2] | passed | hermes-chatml |"
    assert "[1] codex, sub-agent: no sub-agent tool" in md and "[2] codex, compaction: no rewrite of main" in md
    text = render_text(report)
    assert "codex / compaction: FAILED: no rewrite of main" in text


def _segment(ids: list[int], mask: list[int], logprobs: list[float]) -> dict[str, Any]:
    versions = [3 if m else -1 for m in mask]
    return {
        "thread": "main",
        "segment_index": 0,
        "prompt_ids": [1, 2],
        "response_ids": ids,
        "response_mask": mask,
        "response_logprobs": logprobs,
        "policy_versions": versions,
    }


def test_check_faithful_fails_on_a_tampered_capture() -> None:
    log = [
        {
            "trial_id": "t",
            "thread": "main",
            "prompt_ids": [1, 2],
            "sampled_ids": [7, 8],
            "logprobs": [-0.5, -0.25],
            "policy_versions": [3, 3],
            "finish_reason": "stop",
        }
    ]
    check_faithful([_segment([7, 8], [1, 1], [-0.5, -0.25])], log, "t")
    with pytest.raises(Unfaithful, match="logprobs"):
        check_faithful([_segment([7, 8], [1, 1], [-0.5, -0.3])], log, "t")
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([_segment([7, 9], [1, 1], [-0.5, -0.25])], log, "t")
    with pytest.raises(Unfaithful, match="captured 0 times"):
        check_faithful([], log, "t")
    with pytest.raises(Unfaithful, match="matches 2"):  # trained twice: the same run twice in one segment's context
        check_faithful([_segment([7, 8], [1, 1], [-0.5, -0.25])], log * 2, "t")
