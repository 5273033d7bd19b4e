"""Whole trials with the real proxy, gateway (scripted engine) and capture store:
a harness the proxy refused is an infrastructure failure (``proxy_error``, weight
0), never ``completed`` with a reward; a harness that asks for a model name of its
own is served the trial's policy, and the name is recorded with the trajectory; a
temperature of its own that the run pins is counted with the trajectory."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.sandbox.backends.local import LocalBackend
from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
from services.sandbox.trial.lifecycle import POLICY_REASONS, TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import ModelStack, make_task, model_stack

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]
TURNS = [{"content": "Hello."}]
# One model call with the given model name and first message role; then the task is done
# whatever the answer (so a refusal would pass for a reward of 1 if it were not caught).
AGENT = """python3 - <<'PY'
import json, os, urllib.error, urllib.request

body = {{"model": "{model}", "messages": [{{"role": "{role}", "content": "go"}}]}}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}},
)
try:
    print(urllib.request.urlopen(request, timeout=60).read().decode())
except urllib.error.HTTPError as e:
    print("refused", e.code, e.read().decode())
PY
echo hello > hello.txt
"""


async def run_trial(stack: ModelStack, tmp: Path, task: Path, script: str) -> tuple[object, records_pb2.Trajectory]:
    settings = stack.sandbox_settings(tmp)
    runner = TrialRunner(
        settings,
        LocalBackend(settings),
        proxy=ProxyAdmin(stack.proxy.url, stack.admin_token),
        capture=CaptureFinalizer(settings.capture_target or "", None),
    )
    trial_id = f"p-{uuid.uuid4().hex[:8]}"
    spec = TrialSpec(
        trial_id=trial_id,
        run_id="run-p",
        task_path=str(task),
        group_id=trial_id,
        group_size=1,
        harness="shell",
        harness_options={"script": script},
    )
    outcome = await runner.run(spec)
    await runner.finalize(spec, outcome)
    async with connect(f"127.0.0.1:{stack.capture.port}") as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        traj = await store.GetTrajectory(capture_pb2.GetTrajectoryRequest(run_id="run-p", trial_id=trial_id))
    return outcome, traj


async def test_a_refused_harness_is_proxy_error_and_a_foreign_model_name_is_served(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    async with model_stack(tmp_path / "stack", {"main": TURNS, "*": TURNS}) as stack:
        refused, traj = await run_trial(stack, tmp_path, task, AGENT.format(model="harnessrl-policy", role="wizard"))
        assert refused.termination_reason == TerminationReason.PROXY_ERROR, refused  # type: ignore[attr-defined]
        assert refused.termination_reason not in POLICY_REASONS  # type: ignore[attr-defined]
        assert "the proxy refused 1 request(s)" in refused.error and "400 chat/completions" in refused.error  # type: ignore[attr-defined]
        assert "agent:no_model_call" not in refused.events  # type: ignore[attr-defined] # shell needs no model
        assert traj.finalized and traj.termination_reason == records_pb2.TERMINATION_REASON_PROXY_ERROR
        assert len(traj.segments) == 0

        served, traj = await run_trial(stack, tmp_path, task, AGENT.format(model="harnessrl-policy", role="user"))
        assert served.termination_reason == TerminationReason.COMPLETED, served  # type: ignore[attr-defined]
        assert served.reward == 1.0 and served.requested_models == ["harnessrl-policy"]  # type: ignore[attr-defined]
        assert traj.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED and len(traj.segments) == 1
        assert traj.metadata["requested_models"] == "harnessrl-policy"


async def test_a_harness_temperature_the_run_pins_is_counted_on_the_trajectory(tmp_path: Path) -> None:
    """The proxy pins the run's sampling by default: the harness's own temperature is
    overridden, counted in the outcome and the trajectory's metadata, recorded on the segment."""
    task = make_task(tmp_path / "tasks")
    script = AGENT.replace('"messages"', '"temperature": 0.2, "messages"').format(model="harnessrl-policy", role="user")
    async with model_stack(tmp_path / "stack", {"main": TURNS, "*": TURNS}) as stack:
        outcome, traj = await run_trial(stack, tmp_path, task, script)
    assert outcome.termination_reason == TerminationReason.COMPLETED, outcome  # type: ignore[attr-defined]
    assert outcome.sampling_overrides == 1  # type: ignore[attr-defined]
    assert traj.metadata["sampling_overrides"] == "1"
    (seg,) = traj.segments
    assert seg.sampling.mode == "pin" and list(seg.sampling.overridden) == ["temperature"]
    assert seg.sampling.temperature != pytest.approx(0.2)  # the run's, not the harness's
