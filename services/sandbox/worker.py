"""A sandbox worker: claims trials from the queue, runs up to ``concurrency``
at once, renews each lease while it runs, and reports the outcome only while
it still holds the lease (a worker that lost it discards its result: the
retry owns the trial). Every worker also reaps expired leases, so a dead
worker's trials are retried or marked without any coordinator.

An attempt that raises out of the worker's own code (a bug, a capture store that
refuses the outcome) is not left to its lease: such a crash usually repeats, so the
worker gives the trial back at once, at most ``crash_retries`` times (and never past
``max_attempts``), then finishes it ``env_setup_failed`` with an error naming the crash
and finalizes that in the capture store, so its group completes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from opentelemetry import trace

from harnessrl import metrics, telemetry
from services.sandbox.common.errors import LeaseLost
from services.sandbox.common.settings import Settings
from services.sandbox.queue.base import Heartbeat, TrialQueue, crashed_outcome
from services.sandbox.trial.lifecycle import TrialRecord, TrialSpec, TrialState
from services.sandbox.trial.runner import TrialRunner

log = logging.getLogger(__name__)


def _tracer() -> trace.Tracer:
    return telemetry.tracer(__name__, "sandbox")


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(self, settings: Settings, queue: TrialQueue, runner: TrialRunner, name: str | None = None) -> None:
        self.settings = settings
        self.queue = queue
        self.runner = runner
        self.name = name or default_worker_name()
        self.running: dict[str, asyncio.Task[None]] = {}
        self.completed = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Serves until ``stop`` is set, then lets running trials finish."""
        slots = asyncio.Semaphore(self.settings.concurrency)
        try:
            orphans = await self.runner.backend.cleanup_orphans()
            if orphans:
                log.warning("removed sandboxes of dead workers", extra={"kv": {"count": orphans}})
        except Exception:  # broad: any backend's sweep may fail; the worker serves anyway, the next start sweeps again
            log.exception("orphan cleanup failed")
        reaper = asyncio.ensure_future(self._reap_forever(stop))
        try:
            while not stop.is_set():
                await slots.acquire()
                record = None
                try:
                    record = await self.queue.claim(self.name, self.settings.lease_s, wait_s=0.5)
                except Exception:  # broad: the serving loop outlives any queue fault (Redis, memory), retries
                    log.exception("claim failed", extra={"kv": {"worker": self.name}})
                    await asyncio.sleep(1)
                if record is None:
                    slots.release()
                    continue
                task = asyncio.ensure_future(self._serve(record))
                self.running[record.trial_id] = task
                task.add_done_callback(self._released(record.trial_id, slots))
            if self.running:
                await asyncio.gather(*self.running.values(), return_exceptions=True)
        finally:
            reaper.cancel()
            await self.runner.backend.close()  # the Docker backend's warm pool: no container outlives the worker

    def _released(self, trial_id: str, slots: asyncio.Semaphore):  # type: ignore[no-untyped-def]
        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(trial_id, None)
            slots.release()

        return done

    async def _reap_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.2, self.settings.lease_s / 3))
            try:
                reaped = await self.queue.reap(self.settings.max_attempts)
                if reaped:
                    log.warning("reaped expired leases", extra={"kv": {"worker": self.name, "trials": reaped}})
                for trial_id in reaped:
                    await self._finalize_if_out_of_attempts(trial_id)
            except Exception:  # broad: the reaper loop outlives any queue or capture fault, retries next period
                log.exception("reap failed")

    async def _finalize_if_out_of_attempts(self, trial_id: str) -> None:
        """A trial whose workers kept dying is DONE in the queue (infrastructure
        reason); FinalizeTrajectory records it too, so its group still completes."""
        record = await self.queue.get(trial_id)
        if record.state == TrialState.DONE and record.outcome is not None:
            await self.runner.finalize(attempt_spec(record), record.outcome)

    async def _serve(self, record: TrialRecord) -> None:
        """Runs one trial in its own span, a child of the submitter's (the trainer step's) trace."""
        parent = telemetry.extract(record.spec.trace_context)
        attributes = telemetry.trial_attributes(record.spec) | {"harnessrl.attempt": record.attempt}
        metrics.ACTIVE_TRIALS.labels("sandbox").inc()
        try:
            with _tracer().start_as_current_span("sandbox.trial", context=parent, attributes=attributes):
                await self._serve_in_span(record)
        finally:
            metrics.ACTIVE_TRIALS.labels("sandbox").dec()

    async def _serve_in_span(self, record: TrialRecord) -> None:
        trial_id = record.trial_id
        spec = attempt_spec(record)
        cancel, lost = asyncio.Event(), asyncio.Event()

        async def on_state(state: TrialState) -> None:
            if state == TrialState.SETUP or lost.is_set():
                return
            try:
                await self.queue.set_state(trial_id, self.name, state)
            except LeaseLost:
                lost.set()
                cancel.set()
            except Exception:
                # The state shown is informative only; finish (under the lease) is what counts.
                log.warning("reporting the trial's state failed", exc_info=True, extra={"kv": {"trial": trial_id}})

        heart = asyncio.ensure_future(self._heartbeat(trial_id, cancel, lost))
        try:
            outcome = None
            if spec is not record.spec:
                previous = record.spec.model_copy(update={"trial_id": previous_attempt_id(record)})
                # The previous worker may have died after FinalizeTrajectory: then that is the outcome.
                outcome = await self.runner.finalized_outcome(previous)
                if outcome is not None:
                    await self.queue.finish(trial_id, self.name, outcome)
                    return
                await self.runner.abandon(previous)
            outcome = await self.runner.run(spec, cancel=cancel, on_state=on_state)
            if lost.is_set():
                log.warning("lease lost; result discarded", extra={"kv": {"trial": trial_id, "worker": self.name}})
                return
            await self.runner.finalize(spec, outcome)
            await self.queue.finish(trial_id, self.name, outcome)
            self.completed += 1
        except LeaseLost:
            log.warning("lease lost at finish", extra={"kv": {"trial": trial_id}})
        except Exception as e:  # broad: any fault of the worker's own code is a crash, given back by _crashed
            log.exception("trial crashed in the worker", extra={"kv": {"trial": trial_id}})
            # The heartbeat keeps the lease while the crash is reported (finalize may be slow).
            if not lost.is_set():
                await self._crashed(record, spec, e)
        finally:
            heart.cancel()

    async def _crashed(self, record: TrialRecord, spec: TrialSpec, error: Exception) -> None:
        """Gives a crashed attempt's trial back now: queued again while crash retries
        (and attempts) remain, else done with an infrastructure outcome naming the crash,
        finalized first (or the outcome the attempt had already finalized) so its group
        completes. If the queue cannot be told, the lease expires and the reaper decides."""
        trial_id = record.trial_id
        what = f"attempt {record.attempt} crashed in worker {self.name}: {type(error).__name__}: {error}"
        try:
            if record.crashes < self.settings.crash_retries and record.attempt < self.settings.max_attempts:
                await self.queue.requeue(trial_id, self.name, what)
                log.warning("crashed trial requeued", extra={"kv": {"trial": trial_id, "crashes": record.crashes + 1}})
                return
            outcome = crashed_outcome(what, record.crashes + 1)
            try:
                finalized = await self.runner.finalized_outcome(spec)
                if finalized is None:
                    await self.runner.finalize(spec, outcome)
                else:  # the attempt crashed after FinalizeTrajectory: that is the outcome
                    outcome = finalized
            except Exception:  # broad: the queue is still told (finish below), whatever the capture store raised
                log.exception("finalizing a crashed trial failed", extra={"kv": {"trial": trial_id}})
            await self.queue.finish(trial_id, self.name, outcome)
            log.warning("crashed trial finished", extra={"kv": {"trial": trial_id, "crashes": record.crashes + 1}})
        except LeaseLost:
            log.warning("lease lost after a crash", extra={"kv": {"trial": trial_id}})
        except Exception:  # broad: if the queue cannot be told, the lease expires and the reaper decides
            log.exception("giving a crashed trial back failed", extra={"kv": {"trial": trial_id}})

    async def _heartbeat(self, trial_id: str, cancel: asyncio.Event, lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                beat = await self.queue.heartbeat(trial_id, self.name, self.settings.lease_s)
            except Exception:  # broad: a missed beat is retried; the lease's expiry is the safety net
                log.exception("heartbeat failed", extra={"kv": {"trial": trial_id}})
                continue
            if beat == Heartbeat.LOST:
                lost.set()
                cancel.set()
                return
            if beat == Heartbeat.CANCEL:
                cancel.set()


def attempt_spec(record: TrialRecord) -> TrialSpec:
    """The spec one attempt runs under. A retried attempt (its worker died) is a new
    rollout from scratch, so it is its own trajectory, ``<trial>.attempt-<n>``: the
    dead attempt's captured turns stay under the previous id, unfinalized (never
    trained, never given this attempt's reward), and the group counts this one."""
    if record.attempt <= 1:
        return record.spec
    return record.spec.model_copy(update={"trial_id": f"{record.trial_id}.attempt-{record.attempt}"})


def previous_attempt_id(record: TrialRecord) -> str:
    return record.trial_id if record.attempt <= 2 else f"{record.trial_id}.attempt-{record.attempt - 1}"
