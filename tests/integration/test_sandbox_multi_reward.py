"""A multi-key ``reward.json`` (Harbor's reward kit writes ``{"correctness": 1,
"performance": 0.25}``) through real trials on the local backend: every key is kept in
the outcome, the capture store's finalized trajectory, the Parquet export and the
dashboard's API, and the value that trains is the run's choice (Harbor's default, a
key, or weights); without a choice the trial completes with no trained reward (the
verifier did its job); a choice the verifier's keys cannot meet is verifier_error, never 0."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.export import metadata_row
from services.sandbox.factory import build_worker
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.trial.lifecycle import TerminationReason, TrialRecord, TrialSpec, TrialState
from tests.integration.test_dashboard.conftest import TOKEN, dashboard
from tests.sandbox_support import make_task, settings_for, wait_for_state

if TYPE_CHECKING:
    from services.capture_store.server import CaptureServer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

RUN = "multi-reward"
R = TerminationReason


def writes(rewards: dict[str, float]) -> str:
    return f"#!/bin/bash\necho '{json.dumps(rewards)}' > /logs/verifier/reward.json\n"


# trial -> (task, how the run chooses, expected reason, expected trained reward, error text)
CASES: dict[str, tuple[str, dict[str, Any], R, float | None, str]] = {
    "default": ("graded", {}, R.COMPLETED, None, ""),
    "by-key": ("graded", {"reward_key": "performance"}, R.COMPLETED, 0.25, ""),
    "weighted": ("graded", {"reward_weights": {"correctness": 1.0, "performance": 2.0}}, R.COMPLETED, 1.5, ""),
    "unknown-key": (
        "graded",
        {"reward_key": "speed"},
        R.VERIFIER_ERROR,
        None,
        "reward_key 'speed' is not among the verifier's rewards; keys present: ['correctness', 'performance']",
    ),
    "primary": ("primary", {}, R.COMPLETED, 0.5, ""),
}
WRITTEN = {"graded": {"correctness": 1.0, "performance": 0.25}, "primary": {"reward": 0.5, "correctness": 1.0}}


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[CaptureServer]:
    """A real embedded capture store, in the run directory the dashboard reads."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings as CaptureSettings

    store = tmp_path / "runs" / RUN / "capture"
    settings = CaptureSettings.model_validate({"store_dir": store, "fsync": False, "shutdown_grace_s": 0.2})
    server = await create_server(settings)
    yield server
    await server.stop(0.2)


async def run_trials(tmp_path: Path, target: str) -> dict[str, TrialRecord]:
    tasks = {name: make_task(tmp_path / "tasks", name, test_sh=writes(r)) for name, r in WRITTEN.items()}
    settings = settings_for(tmp_path, concurrency=3, capture_target=target)
    specs = [
        TrialSpec(
            trial_id=trial,
            run_id=RUN,
            task_path=str(tasks[task]),
            group_id=f"g-{trial}",
            group_size=1,
            harness="oracle",
            **selection,
        )
        for trial, (task, selection, *_) in CASES.items()
    ]
    queue = MemoryQueue()
    worker = build_worker(settings, queue, name="w")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    try:
        for spec in specs:
            await queue.submit(spec)
        return {s.trial_id: await wait_for_state(queue, s.trial_id, TrialState.DONE) for s in specs}
    finally:
        stop.set()
        await serving


async def stored(target: str, trial: str) -> records_pb2.Trajectory:
    async with connect(target) as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=trial)
        traj: records_pb2.Trajectory = await store.GetTrajectory(req, timeout=10)
    return traj


async def test_every_key_is_kept_and_the_run_chooses_what_trains(tmp_path: Path, capture: CaptureServer) -> None:
    target = f"127.0.0.1:{capture.port}"
    records = await run_trials(tmp_path, target)

    for trial, (task, _, reason, reward, error) in CASES.items():
        outcome = records[trial].outcome
        assert outcome is not None
        assert (outcome.termination_reason, outcome.reward) == (reason, reward), (trial, outcome)
        assert outcome.rewards == WRITTEN[task], trial  # kept even when the choice failed
        assert error in outcome.error, (trial, outcome.error)
        status = records[trial].to_status()  # what WatchTrials answers: every key, has_reward as chosen
        assert dict(status.rewards) == WRITTEN[task] and status.has_reward == (reward is not None), trial
        traj = await stored(target, trial)
        assert traj.finalized and dict(traj.rewards) == WRITTEN[task], trial
        assert (traj.has_reward, traj.reward) == (reward is not None, reward or 0.0), trial
        row = metadata_row(traj)  # `capture export --format parquet`'s row
        assert (dict(row["rewards"]), row["reward"]) == (WRITTEN[task], reward), trial

    # a trajectory finalized without the rewards map (a worker from before it) reads as {"reward": value}
    async with connect(target) as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        await store.FinalizeTrajectory(
            capture_pb2.FinalizeTrajectoryRequest(
                run_id=RUN,
                trial_id="old-worker",
                task_id="graded",
                group_id="g-old",
                group_size=1,
                reward=0.75,
                has_reward=True,
                termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
            ),
            timeout=10,
        )
    assert dict((await stored(target, "old-worker")).rewards) == {"reward": 0.75}

    runs = tmp_path / "runs"
    capture_ref = {"backend": "embedded", "dir": str(runs / RUN / "capture")}
    (runs / RUN / "run.json").write_text(json.dumps({"run_id": RUN, "status": "done", "capture": capture_ref}))
    async with (
        dashboard(runs) as d,
        httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c,
    ):
        view = (await c.get(f"/api/runs/{RUN}/trajectories/weighted")).json()
        listed = (await c.get(f"/api/runs/{RUN}/trajectories")).json()["trajectories"]
    assert (view["rewards"], view["reward"]) == (WRITTEN["graded"], 1.5)
    by_trial = {r["trial_id"]: r for r in listed}
    assert by_trial["unknown-key"]["rewards"] == WRITTEN["graded"] and by_trial["unknown-key"]["reward"] is None
    assert by_trial["old-worker"]["rewards"] == {"reward": 0.75}
