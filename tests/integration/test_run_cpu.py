"""A step's CPU-seconds by component (harnessrl.cpu), from a real ``harnessrl run``: the
local engine (a tiny random model, real forward passes), the bubblewrap sandbox running
an agent that asks the model once, the real trainer step. Every component is in each
step's metrics and in run.json; the engine and the trainer spent something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl import cpu, paths
from tests.run_support import make_pool, tiny_model, write_config

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")

# One model call (the engine's forward passes), then trials with an even index solve the
# task, odd ones do not: every group has a non-zero advantage, so the trainer takes a step.
AGENT = r"""set -e
python3 - <<'PY'
import json, os, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
body = json.dumps({"model": model, "max_tokens": 8,
                   "messages": [{"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}]}).encode()
req = urllib.request.Request(f"{base}/chat/completions", data=body,
                             headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
json.load(urllib.request.urlopen(req, timeout=120))
if int(os.environ["HARNESSRL_TRIAL_ID"].rsplit("-", 1)[1]) % 2 == 0:
    open("/app/hello.txt", "w").write("hello\n")
PY
"""


@pytest.mark.timeout(600)
def test_run_records_cpu_seconds_by_component(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    run = {"steps": 1, "engine": "local"}
    # The agent sends no tools: its thread is the main one all the same (trainable), as in the quickstart.
    proxy = "\n[proxy]\ndefault_max_tokens = 8\nmain_requires_tools = false\n"
    config = write_config(tmp_path, model, make_pool(tmp_path), run=run, extra=proxy)
    (tmp_path / "agent.sh").write_text(AGENT)

    command = [sys.executable, "-m", "stack.cli", "run", str(config)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=540, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / "e2e"
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
