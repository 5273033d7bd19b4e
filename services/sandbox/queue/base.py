"""The trial queue: the only state shared between the gRPC front and the workers.

Semantics both implementations keep (and the same tests check):
- ``submit`` is idempotent by trial id: the same spec returns the existing
  trial, a different spec under the same id is AlreadyExists.
- ``claim`` moves one QUEUED trial to SETUP under a lease held by one worker.
- A worker renews its lease with ``heartbeat``; a lease that expires is reaped:
  the trial goes back to QUEUED (attempt + 1) while attempts remain, else it is
  DONE with an infrastructure reason and the error says why. Never dropped.
- Only the lease holder may move a trial (``set_state``, ``finish``,
  ``requeue``); a worker that lost its lease gets LeaseLost and must discard
  its result.
- ``requeue`` gives a leased trial back at once (its attempt crashed in the
  worker): QUEUED at the front, ``crashes`` + 1, the error kept; the worker
  decides whether retries remain (``crash_retries``, ``max_attempts``).
- ``cancel`` finishes a queued trial at once and asks a running one to stop
  (its worker sees CANCEL on its next heartbeat).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from enum import StrEnum

from harnessrl.errors import AlreadyExists
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialRecord, TrialSpec, TrialState


class Heartbeat(StrEnum):
    OK = "ok"
    LOST = "lost"
    CANCEL = "cancel"


def lost_outcome(attempts: int) -> TrialOutcome:
    """The outcome of a trial whose workers kept dying (the sandbox could not be
    kept running): infrastructure, weight 0. The record's ``error`` names the worker."""
    return TrialOutcome(
        termination_reason=TerminationReason.ENV_SETUP_FAILED,
        error=f"the trial's worker lost its lease {attempts} time(s); no attempts left",
        events=["lease_expired"],
    )


def crashed_outcome(error: str, crashes: int) -> TrialOutcome:
    """The outcome of a trial whose attempts kept raising out of the worker's own
    code (usually deterministic: retrying again would crash the same way):
    infrastructure, weight 0, the error naming the last crash."""
    return TrialOutcome(
        termination_reason=TerminationReason.ENV_SETUP_FAILED,
        error=f"{error}; crashed {crashes} time(s), no retries left",
        events=["worker_crash"],
    )


def cancelled_outcome() -> TrialOutcome:
    return TrialOutcome(termination_reason=TerminationReason.CANCELLED, error="cancelled while queued")


def check_same_spec(existing: TrialSpec, spec: TrialSpec) -> None:
    if not existing.same_as(spec):
        raise AlreadyExists(f"trial {spec.trial_id} already exists with a different spec")


class TrialQueue(abc.ABC):
    @abc.abstractmethod
    async def submit(self, spec: TrialSpec) -> tuple[TrialRecord, bool]:
        """Returns the record and whether it was created."""

    @abc.abstractmethod
    async def get(self, trial_id: str) -> TrialRecord:
        """Raises TrialNotFound."""

    @abc.abstractmethod
    async def claim(self, worker: str, lease_s: float, wait_s: float) -> TrialRecord | None:
        """Leases the next queued trial (waiting up to ``wait_s``), or None."""

    @abc.abstractmethod
    async def heartbeat(self, trial_id: str, worker: str, lease_s: float) -> Heartbeat:
        """Renews the lease if ``worker`` still holds it."""

    @abc.abstractmethod
    async def set_state(self, trial_id: str, worker: str, state: TrialState) -> TrialRecord:
        """Moves a leased trial along the lifecycle. Raises LeaseLost."""

    @abc.abstractmethod
    async def finish(self, trial_id: str, worker: str, outcome: TrialOutcome) -> TrialRecord:
        """Records the outcome (state DONE) and releases the lease. Raises LeaseLost."""

    @abc.abstractmethod
    async def requeue(self, trial_id: str, worker: str, error: str) -> TrialRecord:
        """Puts a leased trial back at the front of the queue (its attempt crashed),
        counting the crash and keeping ``error``. Raises LeaseLost."""

    @abc.abstractmethod
    async def cancel(self, trial_id: str) -> bool:
        """False when the trial had already finished."""

    @abc.abstractmethod
    async def reap(self, max_attempts: int) -> list[str]:
        """Requeues (or finishes) trials whose lease expired; returns their ids."""

    @abc.abstractmethod
    def watch(self, run_id: str, trial_ids: list[str]) -> AsyncIterator[TrialRecord]:
        """Current records of the matching trials, then every change, until the caller stops."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Releases connections."""


def matches(record: TrialRecord, run_id: str, trial_ids: list[str]) -> bool:
    if trial_ids:
        return record.trial_id in trial_ids
    return record.spec.run_id == run_id


def create_queue(url: str) -> TrialQueue:
    """``memory://`` or ``redis://host:port/db``."""
    from harnessrl.errors import ConfigError

    if url.startswith("memory://"):
        from services.sandbox.queue.memory import MemoryQueue

        return MemoryQueue()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from services.sandbox.queue.redis import RedisQueue

        return RedisQueue(url)
    raise ConfigError(f"queue_url {url!r}: expected memory:// or redis://host:port/db")


__all__ = ["Heartbeat", "TrialQueue", "TrialState", "create_queue"]
