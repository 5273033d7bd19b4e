"""A multi-step trial's per-step rewards travel where the trial's rewards travel: the
worker's FinalizeTrajectory, the capture store's trajectory (one trajectory for every
step), the Parquet/JSONL export rows, the dashboard's API, and the outcome recovered from
the store after a worker's loss. Real services: an embedded capture store, a worker on
the local backend, the dashboard."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pyarrow as pa
import pytest

from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.export import PARQUET_SCHEMA, metadata_row, segment_objects
from services.gateway.engines.scripted import read_generation_log
from services.sandbox.factory import build_worker
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.trial.endpoints import CaptureFinalizer
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec, TrialState
from tests.integration.test_dashboard.conftest import CHROMIUM, TOKEN, artifacts, dashboard, page_check, web_dist
from tests.sandbox_support import model_stack, settings_for, wait_for_state

if TYPE_CHECKING:
    from services.capture_store.server import CaptureServer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

RUN = "multi-step"
EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"
__all__ = ["artifacts", "web_dist"]  # the dashboard tests' fixtures, used here
STEPS = [("greet", {"reward": 1.0}, True), ("personalise", {"reward": 1.0, "kept": 1.0}, True)]


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[CaptureServer]:
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings as CaptureSettings

    store = tmp_path / "runs" / RUN / "capture"
    server = await create_server(CaptureSettings.model_validate({"store_dir": store, "fsync": False}))
    yield server
    await server.stop(0.2)


async def test_each_steps_rewards_reach_the_store_the_export_and_the_dashboard(
    tmp_path: Path, capture: CaptureServer, web_dist: Path, artifacts: Path
) -> None:
    target = f"127.0.0.1:{capture.port}"
    queue = MemoryQueue()
    worker = build_worker(settings_for(tmp_path, capture_target=target), queue, name="w")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    spec = TrialSpec(trial_id="steps-oracle", run_id=RUN, task_path=str(EXAMPLE), group_id="g", harness="oracle")
    try:
        await queue.submit(spec)
        record = await wait_for_state(queue, spec.trial_id, TrialState.DONE)
    finally:
        stop.set()
        await serving
    assert record.outcome is not None and record.outcome.termination_reason == TerminationReason.COMPLETED

    async with connect(target) as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=spec.trial_id)
        traj: records_pb2.Trajectory = await store.GetTrajectory(req, timeout=10)
    assert traj.finalized and dict(traj.rewards) == {"reward": 1.0, "kept": 0.5}
    assert [(s.name, dict(s.rewards), s.verified) for s in traj.task_steps] == STEPS
    row = metadata_row(traj)  # `capture export --format parquet`'s row
    assert [(s["name"], dict(s["rewards"]), s["verified"]) for s in row["task_steps"]] == STEPS
    table = pa.Table.from_pylist([row], schema=PARQUET_SCHEMA)  # the column has the schema's type
    assert table.column("task_steps").to_pylist()[0][1]["name"] == "personalise"
    assert list(segment_objects(traj)) == []  # the oracle made no model call: no segment rows

    # A worker lost after finalize: the outcome recovered from the store keeps the steps.
    finalizer = CaptureFinalizer(target, None)
    try:
        recovered = await finalizer.finalized_outcome(RUN, spec.trial_id)
    finally:
        await finalizer.aclose()
    assert recovered is not None and [(s.name, s.rewards, s.verified) for s in recovered.steps] == STEPS

    runs = tmp_path / "runs"
    capture_ref = {"backend": "embedded", "dir": str(runs / RUN / "capture")}
    (runs / RUN / "run.json").write_text(json.dumps({"run_id": RUN, "status": "done", "capture": capture_ref}))
    async with (
        dashboard(runs) as d,
        httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c,
    ):
        view = (await c.get(f"/api/runs/{RUN}/trajectories/{spec.trial_id}")).json()
        assert [(s["name"], s["rewards"], s["verified"]) for s in view["task_steps"]] == STEPS
        if CHROMIUM.exists():  # the trajectory page lists the steps with their rewards
            steps = [{"name": n, "verified": v, "rewards": dict(sorted(r.items()))} for n, r, v in STEPS]
            cfg = {"url": d.url, "token": TOKEN, "runId": RUN, "trialId": spec.trial_id, "steps": steps}
            cfg |= {"rewards": {"kept": 0.5, "reward": 1.0}, "artifacts": str(artifacts)}
            await page_check("steps.mjs", cfg, tmp_path)


async def test_a_malformed_step_result_is_refused_by_name(capture: CaptureServer) -> None:
    import grpc

    async with connect(f"127.0.0.1:{capture.port}") as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        step = records_pb2.TaskStepResult(name="greet", rewards={"reward": float("nan")}, verified=True)
        req = capture_pb2.FinalizeTrajectoryRequest(
            run_id=RUN,
            trial_id="bad-step",
            task_id="t",
            group_id="g",
            group_size=1,
            termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
            task_steps=[step],
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await store.FinalizeTrajectory(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "task_steps[0].rewards['reward'] nan is not finite" in (info.value.details() or "")


# Each step's agent asks the model once with its own instruction, through the trial's proxy.
ASK = """set -e
python3 - <<'PY'
import json, os, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
body = {"model": model, "messages": [{"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}]}
headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
request = urllib.request.Request(f"{base}/chat/completions", data=json.dumps(body).encode(), headers=headers)
answer = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]
step = "two" if os.path.exists("/app/greet.sh") else "one"
open(f"/logs/agent/answer-{step}.txt", "w").write(answer)
PY
if [ -e /app/greet.sh ]; then printf '#!/bin/bash\\necho "hello${1:+ $1}"\\n' > /app/greet.sh
else printf '#!/bin/bash\\necho hello\\n' > /app/greet.sh; fi
"""


@pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_every_steps_model_calls_are_one_trajectory(tmp_path: Path) -> None:
    from services.proxy.chat.tokenizer import Tokenizer
    from services.sandbox.backends.local import LocalBackend
    from services.sandbox.trial.endpoints import ProxyAdmin
    from services.sandbox.trial.runner import TrialRunner

    turns = [{"content": "On it."}]  # a fresh conversation's first turn, in each step
    async with model_stack(tmp_path / "stack", {"main": turns, "*": turns}) as stack:
        settings = stack.sandbox_settings(tmp_path)
        finalizer = CaptureFinalizer(settings.capture_target or "", None)
        runner = TrialRunner(
            settings, LocalBackend(settings), ProxyAdmin(stack.proxy.url, stack.admin_token), finalizer
        )
        spec = TrialSpec(
            trial_id="steps-model",
            run_id=RUN,
            task_path=str(EXAMPLE),
            group_id="g",
            harness="shell",
            harness_options={"script": ASK},
            model=default_model_dir().name,
        )
        outcome = await runner.run(spec)
        assert (outcome.termination_reason, outcome.reward) == (TerminationReason.COMPLETED, 1.0), outcome.error
        await runner.finalize(spec, outcome)
        await finalizer.aclose()
        # The proxy stayed open for the second step: each step's agent got its answer. Each
        # step's /logs/agent is its own (emptied before the next step, as Harbor empties it).
        steps = Path(outcome.artifacts_dir) / "steps"
        assert [p.name for p in (steps / "greet" / "agent").iterdir()] == ["answer-one.txt"]
        assert [p.name for p in (steps / "personalise" / "agent").iterdir()] == ["answer-two.txt"]
        assert (steps / "personalise" / "agent" / "answer-two.txt").read_text() == "On it."
        async with connect(f"127.0.0.1:{stack.capture.port}") as channel:
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=spec.trial_id, include_tokens=True)
            traj: records_pb2.Trajectory = await store.GetTrajectory(req, timeout=10)
        assert traj.finalized and sum(s.num_turns for s in traj.segments) == 2
        assert [s.name for s in traj.task_steps] == ["greet", "personalise"]
        tokenizer = Tokenizer(default_model_dir())
        prompts = [
            tokenizer.decode(r["prompt_ids"], skip_special_tokens=False)
            for r in read_generation_log(stack.engine_log)
            if r["trial_id"] == spec.trial_id
        ]
        assert len(prompts) == 2 and "Write an executable script" in prompts[0] and "Extend" in prompts[1]
