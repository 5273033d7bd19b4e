"""Sandbox worker loss, the rarer cases the chaos run (test_chaos.py) found: a trial
whose workers all died is finalized (its group completes), and a retry after a worker
died past FinalizeTrajectory reports that outcome instead of running a second rollout."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harnessrl.localservers import RedisServer
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from stack.procs import ProcessStack
from tests.sandbox_support import make_task

if TYPE_CHECKING:
    from services.capture_store.server import CaptureServer
    from services.sandbox.trial.lifecycle import TrialSpec

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

RUN = "worker-loss"


async def start_capture(tmp_path: Path) -> CaptureServer:
    """A real embedded capture store on a free 127.0.0.1 port."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings

    return await create_server(
        Settings.model_validate({"store_dir": tmp_path / "store", "fsync": False, "shutdown_grace_s": 0.2})
    )


def solo_trial(tmp_path: Path, trial_id: str, script: str) -> TrialSpec:
    """A one-trial group running ``script`` with the shell harness."""
    from services.sandbox.trial.lifecycle import TrialSpec

    return TrialSpec(
        trial_id=trial_id,
        run_id=RUN,
        task_path=str(make_task(tmp_path / "tasks")),
        group_id="solo",
        group_size=1,
        harness="shell",
        harness_options={"script": script},
    )


async def test_a_trial_out_of_attempts_is_finalized_so_its_group_completes(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A worker SIGKILLed mid-trial with no attempt left: the reaper marks the trial
    done (infrastructure reason) and FinalizeTrajectory records it, so the group is ready."""
    from services.sandbox.queue.redis import RedisQueue
    from services.sandbox.trial.lifecycle import TrialState
    from tests.sandbox_support import wait_for_state

    capture = await start_capture(tmp_path)
    config = tmp_path / "worker.toml"
    config.write_text(
        f'[sandbox]\nqueue_url = "{redis_server.url}"\ncapture_target = "127.0.0.1:{capture.port}"\n'
        f'work_dir = "{tmp_path / "trials"}"\ncache_dir = "{tmp_path / "cache"}"\n'
        f'artifacts_dir = "{tmp_path / "artifacts"}"\nlease_s = 2.0\nheartbeat_s = 0.5\nmax_attempts = 1\n'
    )
    stack = ProcessStack(tmp_path, config)
    stack.add("worker", ["sandbox", "worker", "-c", str(config), "--name", "w"])
    queue = RedisQueue(redis_server.url)
    spec = solo_trial(tmp_path, "doomed", "sleep 60")
    try:
        await queue.submit(spec)
        await stack.start()
        await wait_for_state(queue, "doomed", TrialState.AGENT, timeout_s=60)
        stack["worker"].kill()
        await stack.start()  # a new worker reaps the expired lease
        record = await wait_for_state(queue, "doomed", TrialState.DONE, timeout_s=60)
        assert record.outcome is not None and record.outcome.termination_reason == "env_setup_failed"
        async with connect(f"127.0.0.1:{capture.port}") as channel:
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id="doomed")
            for _ in range(100):  # finalized right after the reap
                try:
                    traj = await store.GetTrajectory(req, timeout=5)
                    break
                except Exception:  # noqa: BLE001 - not finalized yet
                    await asyncio.sleep(0.1)
        assert traj.finalized and traj.termination_reason == records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED
    finally:
        stack.stop_all()
        await queue.close()
        await capture.stop(0.2)


async def test_a_retry_after_a_worker_died_past_finalize_reports_that_outcome(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The worker died after FinalizeTrajectory but before reporting the trial: the
    retry finds the finalized outcome and reports it instead of running a second
    rollout (which would overfill the group)."""
    from services.sandbox.factory import build_worker
    from services.sandbox.queue.redis import RedisQueue
    from services.sandbox.trial.endpoints import CaptureFinalizer
    from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialState
    from tests.sandbox_support import settings_for, wait_for_state

    capture = await start_capture(tmp_path)
    target = f"127.0.0.1:{capture.port}"
    queue = RedisQueue(redis_server.url)
    spec = solo_trial(tmp_path, "half-done", "echo must not run > /logs/agent/ran")
    finalizer = CaptureFinalizer(target, None)
    settings = settings_for(
        tmp_path, queue_url=redis_server.url, capture_target=target, lease_s=1.0, heartbeat_s=0.2, max_attempts=3
    )
    worker = build_worker(settings, queue, "second")
    stop = asyncio.Event()
    try:
        await queue.submit(spec)
        assert await queue.claim("dead", lease_s=0.5, wait_s=1) is not None
        outcome = TrialOutcome(termination_reason=TerminationReason.AGENT_TIMEOUT, reward=0.0, task_id="t")
        await finalizer.finalize(spec, "t", outcome)  # ... and the worker died here
        running = asyncio.ensure_future(worker.run(stop))
        record = await wait_for_state(queue, "half-done", TrialState.DONE, timeout_s=30)
        stop.set()
        await running
        assert record.attempt == 2 and record.outcome is not None
        assert (record.outcome.termination_reason, record.outcome.reward) == (TerminationReason.AGENT_TIMEOUT, 0.0)
        assert not (tmp_path / "artifacts" / RUN / "half-done.attempt-2").exists()
        async with connect(target) as channel:
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            page = await store.ListTrajectories(capture_pb2.ListTrajectoriesRequest(run_id=RUN), timeout=10)
        assert [t.trial_id for t in page.trajectories] == ["half-done"]
    finally:
        stop.set()
        await finalizer.aclose()
        await queue.close()
        await capture.stop(0.2)
