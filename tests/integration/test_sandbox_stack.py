"""The sandbox with the real proxy, gateway (scripted engine) and capture
store: the agent reaches the model only through the proxy's socket, the proxy
is closed (segments durable, token refused) before FinalizeTrajectory, and the
capture store holds the outcome (invariants 5 and 7)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.sandbox.backends.local import LocalBackend
from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import ModelStack, make_task, model_stack

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]
MODEL = default_model_dir().name
TURNS = [
    {"content": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
    {"content": "Done."},
]
AGENT = """set -e
echo "$OPENAI_API_KEY" > /logs/agent/token
python3 - <<'PY'
import json, os, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def call(messages):
    body = json.dumps({"model": model, "tools": tools, "messages": messages}).encode()
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    request = urllib.request.Request(f"{base}/chat/completions", data=body, headers=headers)
    return json.load(urllib.request.urlopen(request, timeout=60))


messages = [{"role": "user", "content": "go"}]
message = call(messages)["choices"][0]["message"]
messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
json.dump(call(messages), open("/logs/agent/second.json", "w"))
PY
echo hello > hello.txt
"""


def runner_for(stack: ModelStack, tmp: Path, via_proxy_socket: bool = True) -> TrialRunner:
    settings = stack.sandbox_settings(tmp)
    if not via_proxy_socket:  # the worker relays to the proxy's TCP port instead
        settings = settings.model_copy(update={"proxy_uds_path": None})
    proxy = ProxyAdmin(stack.proxy.url, stack.admin_token)
    return TrialRunner(
        settings, LocalBackend(settings), proxy=proxy, capture=CaptureFinalizer(settings.capture_target or "", None)
    )


def spec(task: Path, script: str) -> TrialSpec:
    trial_id = f"s-{uuid.uuid4().hex[:8]}"
    return TrialSpec(
        trial_id=trial_id,
        run_id="run-s",
        task_path=str(task),
        group_id=trial_id,
        group_size=1,
        harness="shell",
        harness_options={"script": script},
        model=MODEL,
    )


@pytest.mark.parametrize("via_proxy_socket", [True, False])
async def test_trial_through_the_proxy_is_captured_and_finalized(tmp_path: Path, via_proxy_socket: bool) -> None:
    task = make_task(tmp_path / "tasks")
    async with model_stack(tmp_path / "stack", {"main": TURNS, "*": TURNS}) as stack:
        runner = runner_for(stack, tmp_path, via_proxy_socket)
        trial = spec(task, AGENT)
        outcome = await runner.run(trial)
        assert outcome.termination_reason == TerminationReason.COMPLETED, outcome.error
        assert outcome.reward == 1.0 and outcome.num_segments == 1
        artifacts = Path(outcome.artifacts_dir)
        second = json.loads((artifacts / "agent" / "second.json").read_text())
        assert second["choices"][0]["message"]["content"] == "Done."
        token = (artifacts / "agent" / "token").read_text().strip()
        async with httpx.AsyncClient() as client:
            refused = await client.post(
                f"{stack.proxy.url}/trials/{trial.trial_id}/v1/chat/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": "again"}]},
            )
        assert refused.status_code == 401, "the trial token is refused once the proxy closed the trial"
        await runner.finalize(trial, outcome)
        async with connect(f"127.0.0.1:{stack.capture.port}") as channel:
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            traj = await store.GetTrajectory(capture_pb2.GetTrajectoryRequest(run_id="run-s", trial_id=trial.trial_id))
        assert traj.finalized and traj.has_reward and traj.reward == 1.0
        assert traj.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED
        assert traj.harness == "shell" and len(traj.segments) == 1
        assert traj.segments[0].num_turns >= 2 and traj.segments[0].closed
        assert abs(traj.timings.agent_s - outcome.timings.agent_s) < 1e-6


async def test_an_engine_failure_is_engine_error_not_a_reward(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    async with model_stack(tmp_path / "stack", {"main": TURNS, "*": TURNS}) as stack:
        await stack.gateway.stop(0)
        runner = runner_for(stack, tmp_path)
        trial = spec(task, AGENT.replace("set -e", "set +e"))
        outcome = await runner.run(trial)
        assert outcome.termination_reason == TerminationReason.ENGINE_ERROR, outcome
        await runner.finalize(trial, outcome)


async def test_a_model_harness_without_a_proxy_is_env_setup_failed(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    async with model_stack(tmp_path / "stack", {"main": TURNS}) as stack:
        settings = stack.sandbox_settings(tmp_path)
    runner = TrialRunner(settings, LocalBackend(settings))
    outcome = await runner.run(TrialSpec(trial_id="np", task_path=str(task), harness="claude-code"))
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert "proxy" in outcome.error or "not found" in outcome.error
