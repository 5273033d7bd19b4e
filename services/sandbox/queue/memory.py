"""The embedded, in-process queue (``memory://``): same semantics as Redis, for
one process (the embedded default and ``harnessrl trial run``)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator

from services.sandbox.common.errors import LeaseLost, TrialNotFound
from services.sandbox.queue.base import (
    Heartbeat,
    TrialQueue,
    cancelled_outcome,
    check_same_spec,
    lost_outcome,
    matches,
)
from services.sandbox.trial.lifecycle import TrialOutcome, TrialRecord, TrialSpec, TrialState


class MemoryQueue(TrialQueue):
    def __init__(self) -> None:
        self._records: dict[str, TrialRecord] = {}
        self._pending: deque[str] = deque()
        self._leases: dict[str, float] = {}
        self._wakeup = asyncio.Condition()
        self._subscribers: set[asyncio.Queue[TrialRecord]] = set()

    def _put(self, record: TrialRecord) -> TrialRecord:
        self._records[record.trial_id] = record
        for sub in self._subscribers:
            sub.put_nowait(record)
        return record

    async def _notify(self) -> None:
        async with self._wakeup:
            self._wakeup.notify_all()

    async def submit(self, spec: TrialSpec) -> tuple[TrialRecord, bool]:
        existing = self._records.get(spec.trial_id)
        if existing is not None:
            check_same_spec(existing.spec, spec)
            return existing, False
        record = self._put(TrialRecord(spec=spec))
        self._pending.append(spec.trial_id)
        await self._notify()
        return record, True

    async def get(self, trial_id: str) -> TrialRecord:
        try:
            return self._records[trial_id]
        except KeyError:
            raise TrialNotFound(f"no trial {trial_id!r}") from None

    async def claim(self, worker: str, lease_s: float, wait_s: float) -> TrialRecord | None:
        deadline = time.monotonic() + wait_s
        while True:
            while self._pending:
                trial_id = self._pending.popleft()
                record = self._records[trial_id]
                if record.state != TrialState.QUEUED:
                    continue
                self._leases[trial_id] = time.monotonic() + lease_s
                return self._put(record.transition(TrialState.SETUP, worker=worker, attempt=record.attempt + 1))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            async with self._wakeup:
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    return None

    def _held(self, trial_id: str, worker: str) -> TrialRecord:
        record = self._records.get(trial_id)
        if record is None or record.worker != worker or trial_id not in self._leases:
            raise LeaseLost(f"worker {worker} does not hold the lease of trial {trial_id}")
        return record

    async def heartbeat(self, trial_id: str, worker: str, lease_s: float) -> Heartbeat:
        try:
            record = self._held(trial_id, worker)
        except LeaseLost:
            return Heartbeat.LOST
        self._leases[trial_id] = time.monotonic() + lease_s
        return Heartbeat.CANCEL if record.cancel_requested else Heartbeat.OK

    async def set_state(self, trial_id: str, worker: str, state: TrialState) -> TrialRecord:
        record = self._held(trial_id, worker)
        return self._put(record.transition(state))

    async def finish(self, trial_id: str, worker: str, outcome: TrialOutcome) -> TrialRecord:
        record = self._held(trial_id, worker)
        del self._leases[trial_id]
        return self._put(record.transition(TrialState.DONE, outcome=outcome))

    async def requeue(self, trial_id: str, worker: str, error: str) -> TrialRecord:
        record = self._held(trial_id, worker)
        del self._leases[trial_id]
        queued = self._put(record.transition(TrialState.QUEUED, worker="", error=error, crashes=record.crashes + 1))
        self._pending.appendleft(trial_id)
        await self._notify()
        return queued

    async def cancel(self, trial_id: str) -> bool:
        record = await self.get(trial_id)
        if record.state == TrialState.DONE:
            return False
        if record.state == TrialState.QUEUED:
            self._put(record.transition(TrialState.DONE, outcome=cancelled_outcome()))
        else:
            self._put(record.model_copy(update={"cancel_requested": True}))
        return True

    async def reap(self, max_attempts: int) -> list[str]:
        now = time.monotonic()
        expired = [tid for tid, until in self._leases.items() if until < now]
        for trial_id in expired:
            del self._leases[trial_id]
            record = self._records[trial_id]
            if record.attempt < max_attempts and not record.cancel_requested:
                error = f"attempt {record.attempt}: worker {record.worker} lost the lease"
                self._put(record.transition(TrialState.QUEUED, worker="", error=error))
                self._pending.appendleft(trial_id)
            else:
                outcome = cancelled_outcome() if record.cancel_requested else lost_outcome(max_attempts)
                error = f"attempt {record.attempt}: worker {record.worker} lost the lease; no attempts left"
                self._put(record.transition(TrialState.DONE, outcome=outcome, error=error))
        if expired:
            await self._notify()
        return expired

    async def watch(self, run_id: str, trial_ids: list[str]) -> AsyncIterator[TrialRecord]:
        inbox: asyncio.Queue[TrialRecord] = asyncio.Queue()
        self._subscribers.add(inbox)
        try:
            for record in list(self._records.values()):
                if matches(record, run_id, trial_ids):
                    yield record
            while True:
                record = await inbox.get()
                if matches(record, run_id, trial_ids):
                    yield record
        finally:
            self._subscribers.discard(inbox)
