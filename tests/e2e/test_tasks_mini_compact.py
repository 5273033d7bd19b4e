"""The real mini-swe-agent with ``config=compact`` (text actions) through ``harnessrl tasks
filter``: the scripted policy answers in the compact format, the harness runs the first
bash block, the task is solved on every attempt and kept under ``--keep 2-2``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox_support import make_task

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
ROOT = Path(__file__).resolve().parents[2]
TOML = (
    '[metadata]\ncategory = "hello"\n[agent]\ntimeout_sec = 300\n[environment]\nmemory_mb = 4096\n'
    'network_mode = "no-network"\n'  # its test needs none: the default refuses a public verifier on local
)
# No tools in a text-action request, so the calls are not the proxy's "main" thread: "*".
REPLIES = [
    {"content": "I will write the file.\n```bash\necho hello > hello.txt\n```\nAnd then ```bash\nls\n```"},
    {"content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
]


def test_compact_config_solves_through_the_real_harness(tmp_path: Path) -> None:
    make_task(tmp_path / "pool", "hello", toml=TOML)
    script = tmp_path / "policy.json"
    script.write_text(json.dumps({"context_window": 8192, "threads": {"*": REPLIES}}))
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "stack.cli", "tasks", "filter", str(tmp_path / "pool")]
    cmd += ["--harness", "mini-swe-agent", "-o", "config=compact", "--engine", f"scripted:{script}"]
    cmd += ["--k", "2", "--keep", "2-2", "--out", str(tmp_path / "kept"), "--report", str(report)]
    env = {
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp_path / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
    }
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(report.read_text())
    [task] = data["tasks"]
    assert task["solves"] == 2, task
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["hello"]
    trajectory = json.loads(next((tmp_path / "artifacts").rglob("trajectory.json")).read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
