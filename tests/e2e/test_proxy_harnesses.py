"""Real, unmodified harnesses against the proxy (the scripted engine plays the
policy), through the conformance runner's scenarios (stack/conformance/matrix.py):
each harness completes a multi-turn tool-using task; sub-agents are their own
trainable threads and main stays one segment; a compaction continues main in
a new segment whose prompt is the rewritten context; title and summary calls
are side threads, not trainable. Every mask-1 token of each capture is checked
against the engine's own generation log (invariants 1-4). stack/conformance/drivers.py says
how each harness is pointed at a local endpoint; the scenarios say why a cell is
not applicable to a harness."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harnessrl.paths import tools_dir
from stack.cli.main import app
from stack.conformance.drivers import DRIVERS, ClaudeCode, Target
from stack.conformance.matrix import (
    CLAUDE_TOOLS,
    COLUMNS,
    SCENARIOS,
    Outcome,
    Scenario,
    all_drivers,
    done_file,
    run_scenario,
    scenarios_of,
)
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

pytestmark = pytest.mark.harness


def tool(rel: str) -> Path:
    path = tools_dir() / rel
    if not path.exists():
        pytest.skip(f"{path} is not installed (scripts/setup installs the harnesses)")
    return path


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    return subprocess.run(
        cmd, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def finish(stack: Stack, trial: str, min_turns: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = stack.close_trial(trial)
    segments = stack.export(trial)
    main = [s for s in segments if s["thread"] == "main"]
    assert summary["render_mismatches"] == 0 and summary["malformed_tool_calls"] == 0
    assert sum(s["num_turns"] for s in main) >= min_turns, summary
    assert all(s["closed"] for s in segments)
    check_faithful(segments, stack.engine_log(), trial)
    return summary, segments


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    threads, extra = request.param
    s = Stack(tmp_path, script(tmp_path, threads, **{"context_window": 200_000, **extra}))
    yield s
    s.stop()


@pytest.mark.parametrize("stack", [({"main": CLAUDE_TOOLS}, {"context_window": 8000})], indirect=True)
def test_claude_code_understands_context_overflow(stack: Stack, dirs: tuple[Path, Path]) -> None:
    """Claude Code's first request (~12k tokens) does not fit an 8k window: it must
    read the proxy's answer as "prompt too long", and the trial records the overflow."""
    home, work = dirs
    base, token = stack.new_trial("claude-overflow", model=MODEL)
    claude = ClaudeCode()
    tool(claude.binary)
    p = claude.run(Target(base, token, MODEL, work, home), "Create hello.txt", {}, timeout=300)
    result = json.loads(p.stdout)
    assert result["is_error"] and result["terminal_reason"] == "prompt_too_long", result
    summary = stack.close_trial("claude-overflow")
    assert summary["context_overflow"] is True and summary["num_turns"] == 0 and summary["engine_errors"] == 0


CODEX_MAIN = [
    {"content": "Looking.", "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "ls -la"}}]},
    {
        "reasoning": "Write it now.",
        "content": "Creating.",
        "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "echo hello > hello.txt"}}],
    },
    {"content": "Created hello.txt."},
]


def test_side_calls_are_trainable_when_the_config_says_so(tmp_path: Path) -> None:
    """Codex's summary call again, with trainable_thread_kinds naming side: its
    thread is still labelled side, and now trainable (the config decides, not the proxy)."""
    driver = DRIVERS["codex"]
    tool(driver.binary)
    scenario = SCENARIOS["codex"]()["side calls"]
    assert isinstance(scenario, Scenario)

    def trainable_side(o: Outcome) -> None:
        done_file(o)
        side = [s for s in o.segments if s["thread_kind"] == "side"]
        assert side and all(s["trainable"] and s["thread"].startswith("side-") for s in side)

    kinds = {"trainable_thread_kinds": ["main", "subagent", "side"]}
    run_scenario(driver, replace(scenario, check=trainable_side, proxy=kinds), tmp_path / "cell")


def test_conformance_command_on_the_installed_harnesses(tmp_path: Path) -> None:
    """`harnessrl conformance --markdown --json F` (CI's harness suite): every cell with
    a scenario passes on an installed harness; the rest are n/a, with the reason. This
    one run is the matrix's pin (a per-cell test ran each scenario a second time, 5-6
    minutes of CI); `harnessrl conformance --harness H --scenario S` reruns one cell."""
    out = tmp_path / "conformance.json"
    result = CliRunner().invoke(app, ["conformance", "--markdown", "--json", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    rows = json.loads(out.read_text())["harnesses"]
    drivers = all_drivers()  # the built-in five, then every declared harness (TOML files)
    assert [r["harness"] for r in rows] == list(drivers)
    for row in rows:
        driver, scenarios = drivers[row["harness"]], scenarios_of(row["harness"])
        assert list(row["cells"]) == list(COLUMNS)
        for column, cell in row["cells"].items():
            runnable = driver.installed() and isinstance(scenarios[column], Scenario)
            assert cell["status"] == ("passed" if runnable else "n/a"), (row["harness"], column, cell["detail"])
            assert cell["status"] == "passed" or cell["detail"]
        assert row["version"] not in ("?", "not installed") or not driver.installed(), row
    assert result.output.count("\n| ") >= len(drivers), result.output
    print(result.output)
