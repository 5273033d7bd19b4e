"""Ctrl-C stops ``harnessrl run`` cleanly: no more launches, in-flight trials
cancelled (finalized as ``cancelled``), run.json status ``stopped``, exit 130, and
no process of the run left behind (sandboxes, harnesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl import paths
from tests.run_support import AGENT, make_pool, tiny_model, write_config

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_sigint_stops_the_run_and_leaves_nothing_running(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    config = write_config(tmp_path, model, make_pool(tmp_path), run={"steps": 3})
    (tmp_path / "agent.sh").write_text(AGENT + "\nsleep 300\n")  # every trial hangs after its model calls
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    trials = tmp_path / "sb" / "trials"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(trials.glob("e2e-s00000-*"))) < 4:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.5)
        assert len(list(trials.glob("e2e-s00000-*"))) == 4, "the first batch never started"
        time.sleep(3)  # the agents are past their model calls, sleeping
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert "SIGINT: stopping" in out and "run e2e stopped" in out
    run_dir = tmp_path / "runs" / "e2e"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped"
    results = [json.loads(p.read_text()) for p in (run_dir / "artifacts" / "e2e").glob("*/result.json")]
    assert len(results) == 4 and {r["termination_reason"] for r in results} == {"cancelled"}
    assert all(r["reward"] is None for r in results)
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == []
    assert list(trials.glob("e2e-*")) == []
