"""The remote front's trial records and the driver that follows each trial's
execution on the executor.

Guarantees (services/sandbox/CONTRACT.md): submit is idempotent by trial id; a
trial moves forward along QUEUED -> SETUP -> AGENT -> VERIFY -> TEARDOWN -> DONE
(states it did not see may be skipped; QUEUED again only when an attempt was
lost); DONE carries exactly one termination reason and never changes. The lease:
every successful poll renews it; an execution unreachable (or unknown to the
executor, or reported lost) for ``lease_s`` is lost, and the trial is dispatched
again as ``<trial>.attempt-<n>`` while attempts remain, else it is DONE with
env_setup_failed and an error naming the executor. Records live in memory: a
restarted front forgets its trials (a provider that must survive restarts keeps
them in a database)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from harnessrl import telemetry
from harnessrl.errors import AlreadyExists, HarnessError, InvalidArgument, NotFound
from harnessrl.rpc import check_target
from harnessrl.v1 import records_pb2, sandbox_pb2
from services.sandbox_remote.capture import CaptureFinalizer
from services.sandbox_remote.executor_client import ExecutorClient, ExecutorUnreachable
from services.sandbox_remote.settings import Settings

log = logging.getLogger(__name__)

S = sandbox_pb2
QUEUED, SETUP, AGENT, VERIFY, TEARDOWN, DONE = (
    S.TRIAL_STATE_QUEUED,
    S.TRIAL_STATE_SETUP,
    S.TRIAL_STATE_AGENT,
    S.TRIAL_STATE_VERIFY,
    S.TRIAL_STATE_TEARDOWN,
    S.TRIAL_STATE_DONE,
)
# Forward moves only (a poll may miss a short phase); back to QUEUED only on a lost attempt.
VALID_TRANSITIONS: dict[int, frozenset[int]] = {
    QUEUED: frozenset({SETUP, AGENT, VERIFY, TEARDOWN, DONE}),
    SETUP: frozenset({AGENT, VERIFY, TEARDOWN, DONE, QUEUED}),
    AGENT: frozenset({VERIFY, TEARDOWN, DONE, QUEUED}),
    VERIFY: frozenset({TEARDOWN, DONE, QUEUED}),
    TEARDOWN: frozenset({DONE, QUEUED}),
    DONE: frozenset(),
}
EXECUTOR_STATES = {"queued": QUEUED, "setup": SETUP, "agent": AGENT, "verify": VERIFY, "teardown": TEARDOWN}
_TRIAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class ExecutionLost(HarnessError):
    """The executor no longer runs this attempt (lease expired, restarted, or it gave up)."""


@dataclass
class Trial:
    spec: sandbox_pb2.TrialSpec
    status: sandbox_pb2.TrialStatus
    trace_context: dict[str, str]
    cancel_requested: bool = False
    driver: asyncio.Task[None] | None = None


def check_spec(spec: sandbox_pb2.TrialSpec) -> None:
    """What the front itself requires of a spec; the executor checks the harness and task."""
    problems = []
    if not _TRIAL_ID.match(spec.trial_id):
        problems.append(f"trial_id {spec.trial_id!r}: 1-128 of [A-Za-z0-9._:-], starting alphanumeric")
    if not spec.task_path:
        problems.append("task_path is required")
    if not spec.harness:
        problems.append("harness is required")
    if spec.gateway_target:
        try:
            check_target(spec.gateway_target)
        except ValueError as e:
            problems.append(f"gateway_target: {e}")
    if problems:
        raise InvalidArgument("invalid trial spec: " + "; ".join(problems))


class RemoteSandbox:
    def __init__(self, settings: Settings, executor: ExecutorClient, capture: CaptureFinalizer | None = None) -> None:
        self.settings = settings
        self.executor = executor
        self.capture = capture
        self.trials: dict[str, Trial] = {}
        self._watchers: set[tuple[str, frozenset[str], asyncio.Queue[sandbox_pb2.TrialStatus]]] = set()

    async def submit(self, spec: sandbox_pb2.TrialSpec) -> tuple[str, bool]:
        check_spec(spec)
        existing = self.trials.get(spec.trial_id)
        if existing is not None and existing.spec == spec:
            return spec.trial_id, False
        await self.executor.validate(spec)  # an invalid spec is INVALID_ARGUMENT even under a taken id
        existing = self.trials.get(spec.trial_id)  # again: a racing submit may have created it meanwhile
        if existing is not None:
            if existing.spec == spec:
                return spec.trial_id, False
            raise AlreadyExists(f"trial {spec.trial_id} already exists with a different spec")
        status = S.TrialStatus(trial_id=spec.trial_id, run_id=spec.run_id, state=QUEUED, updated_at=time.time())
        trial = Trial(spec=spec, status=status, trace_context=telemetry.inject())
        self.trials[spec.trial_id] = trial
        self._publish(trial)
        trial.driver = asyncio.ensure_future(self._drive(trial))
        return spec.trial_id, True

    def get(self, trial_id: str) -> sandbox_pb2.TrialStatus:
        return self._trial(trial_id).status

    async def watch(self, run_id: str, trial_ids: list[str]) -> AsyncIterator[sandbox_pb2.TrialStatus]:
        if not run_id and not trial_ids:
            raise InvalidArgument("watch needs a run_id or trial_ids")
        inbox: asyncio.Queue[sandbox_pb2.TrialStatus] = asyncio.Queue()
        watcher = (run_id, frozenset(trial_ids), inbox)
        self._watchers.add(watcher)
        try:
            for trial in list(self.trials.values()):
                if _matches(trial.status, run_id, watcher[1]):
                    yield _copy(trial.status)
            while True:
                yield await inbox.get()
        finally:
            self._watchers.discard(watcher)

    async def cancel(self, trial_id: str) -> bool:
        trial = self._trial(trial_id)
        if trial.status.state == DONE:
            return False
        trial.cancel_requested = True
        try:
            await self.executor.cancel(_execution_id(trial))
        except (ExecutorUnreachable, NotFound) as e:  # the driver ends it as cancelled when the lease runs out
            log.info("cancel not delivered yet", extra={"kv": {"trial": trial_id, "error": str(e)}})
        return True

    async def close(self) -> None:
        drivers = [t.driver for t in self.trials.values() if t.driver is not None]
        for driver in drivers:
            driver.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
        await self.executor.close()
        if self.capture is not None:
            await self.capture.close()

    # -- the driver ----------------------------------------------------------
    async def _drive(self, trial: Trial) -> None:
        try:
            while True:
                self._move(trial, QUEUED, attempt=trial.status.attempt + 1)
                try:
                    await self._follow(trial)
                    return
                except ExecutionLost as e:
                    log.warning("execution lost", extra={"kv": {"trial": trial.spec.trial_id, "error": str(e)}})
                    if trial.cancel_requested:
                        return await self._end(trial, records_pb2.TERMINATION_REASON_CANCELLED, f"cancelled; {e}")
                    if trial.status.attempt >= self.settings.max_attempts:
                        error = f"{e}; no attempts left ({trial.status.attempt} of {self.settings.max_attempts})"
                        return await self._end(trial, records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED, error)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # broad: any fault ends the trial once (env_setup_failed), never a hung front
            log.exception("driving the trial failed", extra={"kv": {"trial": trial.spec.trial_id}})
            error = f"front: {type(e).__name__}: {e}"
            await self._end(trial, records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED, error)

    async def _follow(self, trial: Trial) -> None:
        """Starts this attempt's execution and polls it until it is done (or lost)."""
        attempt = trial.status.attempt
        spec = S.TrialSpec()
        spec.CopyFrom(trial.spec)
        spec.trial_id = _execution_id(trial)
        previous = "" if attempt <= 1 else _attempt_id(trial.spec.trial_id, attempt - 1)
        renewed = time.monotonic()
        started = False
        while True:
            try:
                if not started:
                    view = await self.executor.start(spec, trial.trace_context, previous)
                    started = True
                    if trial.cancel_requested:
                        view = await self.executor.cancel(spec.trial_id)
                else:
                    view = await self.executor.get(spec.trial_id)
                if view.get("state") == "lost":
                    raise ExecutionLost(view.get("error") or f"executor {self.executor.url} lost {spec.trial_id}")
                renewed = time.monotonic()
                if self._apply(trial, view):
                    return
            except (ExecutorUnreachable, NotFound) as e:
                if time.monotonic() - renewed > self.settings.lease_s:
                    raise ExecutionLost(f"{spec.trial_id}: no answer for {self.settings.lease_s:.0f}s: {e}") from e
            await asyncio.sleep(self.settings.poll_s)

    def _apply(self, trial: Trial, view: dict[str, Any]) -> bool:
        """Moves the trial to the executor's state; True when it is DONE."""
        trial.status.worker = str(view.get("worker", ""))
        outcome = view.get("outcome")
        if view.get("state") == "done" and isinstance(outcome, dict):
            self._finish(trial, outcome)
            return True
        state = EXECUTOR_STATES.get(str(view.get("state")))
        if state is None:
            raise ExecutionLost(f"executor {self.executor.url} reported an unknown state {view.get('state')!r}")
        if state != trial.status.state and state in VALID_TRANSITIONS[trial.status.state]:
            self._move(trial, state)
        return False

    def _finish(self, trial: Trial, outcome: dict[str, Any]) -> None:
        name = f"TERMINATION_REASON_{str(outcome.get('termination_reason', '')).upper()}"
        if name not in records_pb2.TerminationReason.keys() or name == "TERMINATION_REASON_UNSPECIFIED":
            raise ExecutionLost(
                f"executor reported an unknown termination reason {outcome.get('termination_reason')!r}"
            )
        status = trial.status
        status.termination_reason = records_pb2.TerminationReason.Value(name)
        reward = outcome.get("reward")
        status.has_reward = reward is not None
        status.reward = float(reward or 0.0)
        timings = outcome.get("timings") or {}
        status.timings.CopyFrom(records_pb2.PhaseTimings(**{k: float(v) for k, v in timings.items()}))
        status.num_segments = int(outcome.get("num_segments", 0))
        status.harness_exit_code = int(outcome.get("harness_exit_code", 0))
        del status.tamper_events[:]
        status.tamper_events.extend(str(e) for e in outcome.get("tamper_events", []))
        del status.suspicious_events[:]
        status.suspicious_events.extend(str(e) for e in outcome.get("suspicious_events", []))
        status.error = str(outcome.get("error", ""))
        self._move(trial, DONE)

    async def _end(self, trial: Trial, reason: int, error: str) -> None:
        """Ends a trial the front gave up on: finalized in the capture store, then DONE."""
        status = trial.status
        status.termination_reason = reason  # type: ignore[assignment]
        status.has_reward = False
        status.error = error
        if self.capture is not None and trial.status.state != DONE:
            try:
                await self.capture.finalize(trial.spec, _execution_id(trial), status, trial.trace_context)
            except Exception as e:  # broad: the trial still ends (below) and the error names the failure
                log.exception("finalize failed", extra={"kv": {"trial": trial.spec.trial_id}})
                status.error += f"; FinalizeTrajectory failed: {type(e).__name__}: {e}"
        self._move(trial, DONE)

    def _move(self, trial: Trial, state: int, attempt: int | None = None) -> None:
        trial.status.state = state  # type: ignore[assignment]
        if attempt is not None:
            trial.status.attempt = attempt
        trial.status.updated_at = time.time()
        self._publish(trial)

    def _publish(self, trial: Trial) -> None:
        for run_id, ids, inbox in list(self._watchers):
            if _matches(trial.status, run_id, ids):
                inbox.put_nowait(_copy(trial.status))

    def _trial(self, trial_id: str) -> Trial:
        if not trial_id:
            raise InvalidArgument("trial_id is required")
        trial = self.trials.get(trial_id)
        if trial is None:
            raise NotFound(f"trial {trial_id} not found")
        return trial


def _execution_id(trial: Trial) -> str:
    return _attempt_id(trial.spec.trial_id, trial.status.attempt)


def _attempt_id(trial_id: str, attempt: int) -> str:
    """The project's convention: a retried attempt is its own trajectory."""
    return trial_id if attempt <= 1 else f"{trial_id}.attempt-{attempt}"


def _matches(status: sandbox_pb2.TrialStatus, run_id: str, ids: frozenset[str]) -> bool:
    return status.trial_id in ids if ids else status.run_id == run_id


def _copy(status: sandbox_pb2.TrialStatus) -> sandbox_pb2.TrialStatus:
    out = S.TrialStatus()
    out.CopyFrom(status)
    return out
