"""Each real, unmodified harness runs a multi-turn task to completion inside
a sandbox, on the local backend and in the task's own container on the Docker
backend (a real engine; the harness comes from its read-only mounted runtime),
with no network but the proxy, against the real proxy, gateway (scripted
engine playing the policy) and capture store; the verifier scores the result
and the trajectory is finalized."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.harnesses import get_harness
from services.sandbox.trial.lifecycle import TerminationReason
from stack.conformance.matrix import tools_script
from tests.sandbox_support import make_task, model_stack, run_harness_trial

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
MODEL = default_model_dir().name
# Harnesses start slowly on a loaded 2-core machine (OpenHands imports ~650 MB).
TOML = "[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n[environment]\nmemory_mb = 4096\n"
TITLE: list[dict[str, Any]] = [{"content": "Create hello"}]
DECLARED = ("pi", "qwen-code", "copilot-cli", "cline", "openclaw", "gemini-cli", "hermes-agent")

CASES: dict[str, tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]] = {
    "claude-code": ({"main": tools_script("claude-code"), "*": TITLE}, {"chunk_tokens": 4}),
    "opencode": ({"main": tools_script("opencode"), "*": TITLE}, {"chunk_tokens": 3}),
    "codex": ({"main": tools_script("codex"), "*": TITLE}, {"chunk_tokens": 3}),
    "mini-swe-agent": ({"main": tools_script("mini-swe-agent")}, {}),
    "openhands-sdk": ({"main": tools_script("openhands-sdk")}, {}),
    # Declared in TOML files (services/sandbox/harnesses/declared/): the script is their file's.
    **{name: ({"main": tools_script(name), "*": TITLE}, {"chunk_tokens": 3}) for name in DECLARED},
}


@pytest.fixture(params=["local", "docker"])
def backend_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "docker":
        engine = request.getfixturevalue("docker_engine")
        return {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    return {"backend": "local"}


@pytest.mark.parametrize("harness", list(CASES))
async def test_real_harness_completes_a_task_in_the_sandbox(
    tmp_path: Path, harness: str, backend_settings: dict[str, Any]
) -> None:
    adapter = get_harness(harness)
    missing = [p for p in adapter.install_paths() if not p.exists()]
    if missing:
        pytest.skip(f"{harness} is not installed ({missing[0]}); scripts/setup installs it")
    threads, extra = CASES[harness]
    task = make_task(tmp_path / "tasks", toml=TOML, instruction="Create hello.txt containing hello")
    async with model_stack(tmp_path / "stack", threads, **extra) as stack:
        done = await run_harness_trial(stack, tmp_path, task, harness, "run-h", MODEL, **backend_settings)
        runner, spec, outcome, log = done.runner, done.spec, done.outcome, done.log
        trial_id = spec.trial_id
        assert outcome.termination_reason == TerminationReason.COMPLETED, (outcome.error, log)
        assert outcome.reward == 1.0, log
        assert outcome.num_segments >= 1
        await runner.finalize(spec, outcome)
        async with connect(f"127.0.0.1:{stack.capture.port}") as channel:
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            traj = await store.GetTrajectory(capture_pb2.GetTrajectoryRequest(run_id="run-h", trial_id=trial_id))
        assert traj.finalized and traj.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED
        main = [s for s in traj.segments if s.key.thread == "main"]
        assert sum(s.num_turns for s in main) >= 3, "a multi-turn run"
