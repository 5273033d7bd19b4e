"""The quickstart config with the real model (SmolLM2-135M-Instruct on the local
CPU engine) and the real mini-swe-agent: one training step end to end.

One group of 4 trials instead of the quickstart's 2 groups of 8: this checks the path (every
service, the harness, the capture, a trainer step), not the learning, and the 16 trials were
~350 s of CI's 2 cores. The quickstart itself, whole, is measured by hand (README, issue 48)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from harnessrl import paths
from services.sandbox.harnesses import get_harness

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.harness,
    pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared"),
    pytest.mark.skipif(not (ROOT / "tasks" / "builtin" / "train").is_dir(), reason="built-in task pool absent"),
]


def test_quickstart_one_step(tmp_path: Path) -> None:
    get_harness("mini-swe-agent").check_installed()
    data = tomllib.loads((ROOT / "examples" / "quickstart.toml").read_text())
    run = data["run"]
    run |= {"run_id": "qs", "runs_dir": str(tmp_path / "runs"), "steps": 1, "group_size": 4, "groups_per_step": 1}
    run["train_tasks"] = [str((ROOT / "examples" / p).resolve()) for p in run["train_tasks"]]
    run["eval_tasks"] = [str((ROOT / "examples" / p).resolve()) for p in run["eval_tasks"]]
    config = tmp_path / "quickstart.toml"
    config.write_text(tomli_w.dumps(data))
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "run", str(config)], capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "runs" / "qs"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1]
    results = [json.loads(p.read_text()) for p in (run_dir / "artifacts" / "qs").glob("*/result.json")]
    assert len(results) == run["group_size"] * run["groups_per_step"]  # one step's trials, none beyond it
    policy = {"completed", "max_turns", "context_overflow", "agent_timeout"}
    assert all(r["termination_reason"] in policy for r in results), [r["termination_reason"] for r in results]
    assert sum(r["num_segments"] for r in results) > 0  # the model was called through the proxy and captured
