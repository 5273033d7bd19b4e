"""The sandbox's CLI entry points as a user runs them: ``trial run`` (with and
without the model stack), ``tasks validate``, ``sandbox worker``; bad input is
one clear line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.paths import default_model_dir
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "services" / "sandbox" / "examples" / "hello"


def cli(tmp: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the tasks' verifiers need no network
        "HARNESSRL_RUNS_DIR": str(tmp / "runs"),  # where trial run keeps each trial
    }
    cmd = [sys.executable, "-m", "stack.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_trial_run_shell_without_a_model(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("echo hello > hello.txt\n")
    out = cli(
        tmp_path, "trial", "run", "--task", str(HELLO), "--harness", "shell", "--agent-script", str(script), "--json"
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["reward"] == 1.0 and result["termination_reason"] == "completed"
    assert set(result["timings"]) == {"setup_s", "agent_s", "verify_s", "teardown_s"}
    assert result["num_segments"] == 0 and result["trial_id"].startswith("trial-")


def test_trial_run_prints_every_reward_key_and_trains_the_one_chosen(tmp_path: Path) -> None:
    # A reward.json of two keys, as Harbor's reward kit writes: the trial reports both, and
    # the [run] table of --config chooses what trains (here a weighted sum).
    test_sh = '#!/bin/bash\necho \'{"correctness": 1, "performance": 0.5}\' > /logs/verifier/reward.json\n'
    task = make_task(tmp_path, "multi", test_sh=test_sh)
    config = tmp_path / "trial.toml"
    config.write_text("[run]\nreward_weights = { correctness = 0.5, performance = 0.5 }\n")
    out = cli(tmp_path, "trial", "run", "--task", str(task), "--harness", "oracle", "-c", str(config), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["rewards"] == {"correctness": 1.0, "performance": 0.5} and result["reward"] == 0.75
    text = cli(tmp_path, "trial", "run", "--task", str(task), "--harness", "oracle", "-c", str(config))
    assert '{"correctness": 1.0, "performance": 0.5}' in text.stdout and "0.75" in text.stdout, text.stdout
    # No choice: completed with both keys and no trial reward, and the run is told what to set.
    plain = cli(tmp_path, "trial", "run", "--task", str(task), "--harness", "oracle")
    assert plain.returncode == 0, plain.stderr
    lines = {line.split(None, 1)[0]: line for line in plain.stdout.splitlines() if line.strip()}
    assert lines["reward"].split() == ["reward", "None"] and "completed" in lines["termination_reason"]
    assert '{"correctness": 1.0, "performance": 0.5}' in plain.stdout
    assert "set [run] reward_key or reward_weights" in plain.stdout


@pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
def test_trial_run_through_proxy_gateway_and_capture(tmp_path: Path) -> None:
    """The agent (a shell script) calls the model through the proxy's Unix
    socket, the only way out of its sandbox; the call is captured and the
    trajectory finalized."""
    # A server on the host's loopback that the sandboxed agent must not reach.
    host_server = socket.create_server(("127.0.0.1", 0))
    port = host_server.getsockname()[1]
    engine = tmp_path / "script.json"
    turns = [{"content": "Hello from the policy."}]
    engine.write_text(json.dumps({"context_window": 8192, "threads": {"main": turns, "*": turns}}))
    body = {
        "model": default_model_dir().name,
        "messages": [{"role": "user", "content": "say hi"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    }
    script = tmp_path / "agent.sh"
    script.write_text(
        "set -e\n"
        f'curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" '
        f"-H 'content-type: application/json' -d '{json.dumps(body)}' > /logs/agent/reply.json\n"
        "grep -q 'Hello from the policy' /logs/agent/reply.json && echo hello > hello.txt\n"
        f"curl -s --max-time 2 http://127.0.0.1:{port}/ && echo ESCAPED > hello.txt || true\n"
    )
    args = ["trial", "run", "--task", str(HELLO), "--harness", "shell", "--agent-script", str(script)]
    with host_server:
        out = cli(tmp_path, *args, "--engine", f"scripted:{engine}", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["termination_reason"] == "completed" and result["reward"] == 1.0, result
    assert result["num_segments"] == 1 and result["error"] == ""
    assert "not finalized: no captured segments" not in result["events"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--task", "/no/such/task", "--harness", "nop"], "not a directory"),
        (["--task", str(HELLO), "--harness", "shell"], "--agent-script"),
        (["--task", str(HELLO), "--harness", "gpt-agent"], "valid harnesses"),
        (["--task", str(HELLO), "--harness", "shell", "--agent-script", "/no/file"], "not a file"),
    ],
)
def test_trial_run_bad_input(tmp_path: Path, args: list[str], fragment: str) -> None:
    out = cli(tmp_path, "trial", "run", *args, "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_tasks_validate(tmp_path: Path) -> None:
    lazy = make_task(tmp_path / "tasks", "lazy", solve_sh="#!/bin/bash\ntrue\n")
    generous = make_task(tmp_path / "tasks", "generous", test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    out = cli(tmp_path, "tasks", "validate", str(HELLO), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["ok"]
    out = cli(tmp_path, "tasks", "validate", str(HELLO), str(lazy), str(generous), str(tmp_path / "nope"), "--json")
    assert out.returncode == 1
    report = {Path(r["path"]).name: r for r in json.loads(out.stdout)}
    assert report["hello"]["ok"]
    assert report["lazy"]["reasons"] == ["oracle: scored 0.0, expected 1"]
    assert report["generous"]["reasons"] == ["nop: scored 1.0, expected 0"]
    assert "not a directory" in report["nope"]["reasons"][0]


def test_worker_needs_a_shared_queue_and_a_valid_config(tmp_path: Path) -> None:
    out = cli(tmp_path, "sandbox", "worker", timeout=60)
    assert out.returncode == 2 and "redis://" in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[sandbox]\nconcurrency = 0\n")
    out = cli(tmp_path, "sandbox", "worker", "-c", str(bad), "--queue-url", "redis://127.0.0.1:1/0", timeout=60)
    assert out.returncode == 2 and str(bad) in out.stderr and "concurrency" in out.stderr
    bad.write_text("[sandbox.integrity]\nsquash_git_history = 'maybe'\n")
    out = cli(tmp_path, "sandbox", "worker", "-c", str(bad), "--queue-url", "redis://127.0.0.1:1/0", timeout=60)
    assert out.returncode == 2 and "integrity.squash_git_history" in out.stderr
