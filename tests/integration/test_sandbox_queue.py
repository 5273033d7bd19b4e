"""The trial queue's contract, run against the in-process queue and a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from harnessrl.errors import AlreadyExists
from harnessrl.localservers import RedisServer
from services.sandbox.common.errors import LeaseLost, TrialNotFound
from services.sandbox.queue.base import Heartbeat, TrialQueue, create_queue
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialRecord, TrialSpec, TrialState


@pytest.fixture(params=["memory", "redis"])
async def queue(request: pytest.FixtureRequest) -> AsyncIterator[TrialQueue]:
    if request.param == "memory":
        q = create_queue("memory://")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        q = create_queue(server.url)
    yield q
    await q.close()


def spec(trial_id: str = "t1", run_id: str = "run", **kw: object) -> TrialSpec:
    return TrialSpec(trial_id=trial_id, run_id=run_id, task_path="/tasks/x", harness="nop", **kw)  # type: ignore[arg-type]


async def test_submission_is_idempotent_by_trial_id(queue: TrialQueue) -> None:
    record, created = await queue.submit(spec())
    assert created and record.state == TrialState.QUEUED
    again, created = await queue.submit(spec())
    assert not created and again.trial_id == "t1"
    with pytest.raises(AlreadyExists, match="different spec"):
        await queue.submit(spec(harness_options={"x": "y"}))
    with pytest.raises(TrialNotFound):
        await queue.get("missing")
    claimed = await queue.claim("w", lease_s=10, wait_s=0)
    assert claimed is not None and claimed.trial_id == "t1"
    assert await queue.claim("w", lease_s=10, wait_s=0) is None  # queued once, not twice


async def test_lifecycle_under_a_lease(queue: TrialQueue) -> None:
    await queue.submit(spec())
    record = await queue.claim("w1", lease_s=10, wait_s=1)
    assert record is not None and record.state == TrialState.SETUP and record.attempt == 1 and record.worker == "w1"
    assert await queue.heartbeat("t1", "w1", 10) == Heartbeat.OK
    assert await queue.heartbeat("t1", "intruder", 10) == Heartbeat.LOST
    with pytest.raises(LeaseLost):
        await queue.set_state("t1", "intruder", TrialState.AGENT)
    await queue.set_state("t1", "w1", TrialState.AGENT)
    with pytest.raises(ValueError, match="invalid transition"):
        await queue.set_state("t1", "w1", TrialState.SETUP)
    outcome = TrialOutcome(termination_reason=TerminationReason.COMPLETED, reward=1.0)
    done = await queue.finish("t1", "w1", outcome)
    assert done.state == TrialState.DONE and done.outcome is not None and done.outcome.reward == 1.0
    assert await queue.heartbeat("t1", "w1", 10) == Heartbeat.LOST
    assert not await queue.cancel("t1")


async def test_claim_waits_for_a_submission(queue: TrialQueue) -> None:
    waiter = asyncio.ensure_future(queue.claim("w", lease_s=10, wait_s=5))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await queue.submit(spec("late"))
    record = await asyncio.wait_for(waiter, 5)
    assert record is not None and record.trial_id == "late"


async def test_expired_lease_is_retried_then_marked_never_dropped(queue: TrialQueue) -> None:
    await queue.submit(spec())
    first = await queue.claim("dead-worker", lease_s=0.1, wait_s=0)
    assert first is not None
    await asyncio.sleep(0.2)
    assert await queue.reap(max_attempts=2) == ["t1"]
    requeued = await queue.get("t1")
    assert requeued.state == TrialState.QUEUED and "dead-worker lost the lease" in requeued.error
    with pytest.raises(LeaseLost):
        await queue.finish("t1", "dead-worker", TrialOutcome(termination_reason=TerminationReason.COMPLETED))
    second = await queue.claim("w2", lease_s=0.1, wait_s=0)
    assert second is not None and second.attempt == 2
    await asyncio.sleep(0.2)
    assert await queue.reap(max_attempts=2) == ["t1"]
    final = await queue.get("t1")
    assert final.state == TrialState.DONE
    assert final.outcome is not None and final.outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert final.outcome.reward is None and "w2" in final.error
    assert await queue.claim("w3", lease_s=1, wait_s=0) is None


async def test_cancel_queued_running_and_done(queue: TrialQueue) -> None:
    await queue.submit(spec("q"))
    assert await queue.cancel("q")
    cancelled = await queue.get("q")
    assert cancelled.state == TrialState.DONE and cancelled.outcome is not None
    assert cancelled.outcome.termination_reason == TerminationReason.CANCELLED
    assert await queue.claim("w", lease_s=10, wait_s=0) is None
    await queue.submit(spec("r"))
    await queue.claim("w", lease_s=10, wait_s=0)
    assert await queue.cancel("r")
    assert await queue.heartbeat("r", "w", 10) == Heartbeat.CANCEL
    assert not await queue.cancel("q")
    with pytest.raises(TrialNotFound):
        await queue.cancel("missing")


async def test_watch_yields_current_state_then_changes(queue: TrialQueue) -> None:
    await queue.submit(spec("a"))
    await queue.submit(spec("other", run_id="another-run"))
    seen: list[TrialRecord] = []

    async def consume() -> None:
        async for record in queue.watch("run", []):
            seen.append(record)
            if record.state == TrialState.DONE:
                return

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)
    await queue.claim("w", lease_s=10, wait_s=0)
    await queue.set_state("a", "w", TrialState.AGENT)
    await queue.finish("a", "w", TrialOutcome(termination_reason=TerminationReason.COMPLETED, reward=0.0))
    await asyncio.wait_for(task, 5)
    assert {r.trial_id for r in seen} == {"a"}
    # Changes may coalesce (a watcher reads the latest state), never go backwards.
    order = list(TrialState)
    states = [order.index(r.state) for r in seen]
    assert states[0] == order.index(TrialState.QUEUED) and seen[-1].state == TrialState.DONE
    assert states == sorted(states)
