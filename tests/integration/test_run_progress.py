"""Without a terminal (stdout a pipe, as in CI or under nohup), ``harnessrl run`` and
``harnessrl eval`` print rollout lines while trials run, not only a line per step:
the real commands on the embedded stack (scripted engine, tiny model, bubblewrap
sandbox, the shell agent, which here sleeps before it asks the model so that trials
last longer than ``progress_every_s``). The run also prints and keeps the machine's
calibration and its peak memory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl import paths
from tests.run_support import AGENT, make_pool, tiny_model, write_config
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")
ROLLOUT = re.compile(r"^(rollouts|eval) of step \d+: done (\d+)/(\d+)  (rewards [\d.]+/\d+|rewards -)  running \[.*\]")


def harnessrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", *args], capture_output=True, text=True, timeout=600, env=os.environ
    )


@pytest.mark.timeout(1500)  # two commands, one of which loads the default model to calibrate
def test_piped_run_and_eval_print_rollout_lines(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    heldout = tmp_path / "heldout"
    make_task(heldout, "east", instruction="Create hello.txt holding the word hello.")
    run = {"steps": 1, "progress_every_s": 0.5, "eval_tasks": [str(heldout)], "eval_k": 2, "calibrate": True}
    config = write_config(tmp_path, model, make_pool(tmp_path), run=run)
    (tmp_path / "agent.sh").write_text("sleep 3\n" + AGENT)

    proc = harnessrl("run", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    step = next(i for i, line in enumerate(lines) if line.startswith("step 1/1"))
    rollouts = [m for m in map(ROLLOUT.match, lines[:step]) if m]
    assert rollouts, proc.stdout
    assert all(m.group(3) == "4" for m in rollouts), proc.stdout  # 2 groups x 2 trials in step 0
    assert any("slowest e2e-s00000-g" in line for line in lines[:step]), proc.stdout
    # The calibration of the machine and the peak memory: printed, and kept in run.json.
    info = json.loads((tmp_path / "runs" / "e2e" / "run.json").read_text())
    calibration = info["calibration"]
    assert calibration["model"] == paths.default_model_dir().name and calibration["generate_tokens_per_s"] > 0
    assert f"calibration: plain generate of {calibration['model']} (fp32" in proc.stdout
    assert info["peak_rss_mib"] > 100 and "peak resident memory: " in proc.stdout

    proc = harnessrl("eval", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evals = [m for m in map(ROLLOUT.match, proc.stdout.splitlines()) if m and m.group(1) == "eval"]
    assert evals and all(m.group(3) == "2" for m in evals), proc.stdout
