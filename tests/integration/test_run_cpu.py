"""A step's CPU-seconds by component (harnessrl.cpu), from a real ``harnessrl run``: the
local engine (a tiny random model, real forward passes), the bubblewrap sandbox running
an agent that asks the model once, the real trainer step. Every component is in each
step's metrics and in run.json; the engine and the trainer spent something."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl import cpu, paths
from tests.run_support import local_engine_run

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


@pytest.mark.timeout(600)
def test_run_records_cpu_seconds_by_component(tmp_path: Path) -> None:
    proc, run_dir = local_engine_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rewards = [json.loads(p.read_text())["reward"] for p in (run_dir / "artifacts" / "e2e").glob("*/result.json")]
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]

    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["values"]["step/policy_version"] == 1.0  # an optimizer step, not an empty one
    spent = {c: step["values"][f"cpu/{c}_s"] for c in cpu.COMPONENTS}
    assert all(s >= 0 for s in spent.values()), spent
    assert spent["engine"] > 0 and spent["trainer"] > 0, spent
    # Four agent phases ran python3 in the sandbox (tens of ms each); the verifiers ran too.
    assert spent["harness"] > 0 and spent["sandbox"] > 0, spent

    info = json.loads((run_dir / "run.json").read_text())
    assert set(info["cpu_s"]) == set(cpu.COMPONENTS)
    # The run's total: the step's window and what came after it, up to the services' stop.
    assert all(info["cpu_s"][c] >= spent[c] - 0.05 for c in cpu.COMPONENTS), (info["cpu_s"], spent)
    assert "CPU-seconds by component: engine " in proc.stdout
