"""The real mini-swe-agent, driven by the real model (SmolLM2-135M-Instruct on the
local CPU engine), finishes a built-in task in the task's own container on the
Docker backend, through ``harnessrl tasks filter`` (the normal trial path) as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from harnessrl.paths import default_model_dir
from services.sandbox.harnesses import get_harness

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tasks" / "builtin" / "train" / "echo-00"


def test_mini_swe_agent_with_the_real_model_in_a_container(tmp_path: Path, docker_engine: DockerEngine) -> None:
    if not default_model_dir().exists() or any(not p.exists() for p in get_harness("mini-swe-agent").install_paths()):
        pytest.skip("scripts/setup prepares the model and mini-swe-agent")
    env = {
        **os.environ,
        "HARNESSRL_SANDBOX_BACKEND": "docker",
        "HARNESSRL_SANDBOX_DOCKER__HOST": docker_engine.host,
        "HARNESSRL_SANDBOX_DOCKER__VERIFY_NETWORK": "none",  # this engine has no bridge
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp_path / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
    }
    shutil.copytree(TASK, tmp_path / "pool" / TASK.name)
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "stack.cli", "tasks", "filter", str(tmp_path / "pool"), "--engine", "local"]
    cmd += ["--harness", "mini-swe-agent", "-o", "config=compact", "--max-turns", "3", "--k", "1"]
    cmd += ["--keep", "0-1", "--out", str(tmp_path / "kept"), "--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [task] = json.loads(report.read_text())["tasks"]
    assert not task["infra_failed"] and len(task["attempts"]) == 1, task
    assert task["attempts"][0]["termination_reason"] in ("completed", "max_turns"), task
    client = docker.DockerClient(base_url=docker_engine.host)
    built = [tag for image in client.images.list() for tag in image.tags if tag.startswith("harnessrl-env:")]
    assert built, "the task's Dockerfile was built by the engine"
    assert not client.containers.list(all=True, filters={"label": "io.harnessrl.trial"}), "the container is gone"
