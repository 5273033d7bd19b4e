"""Outcomes that are never written (issue 37 item 4). An exception at any phase
boundary ends the trial with exactly one termination reason, its outcome written
(result.json), finalized and reported once, with no retry; an attempt that crashes
the worker itself is given back at once, retried at most ``crash_retries`` times,
then finished with an infrastructure reason naming the crash, so its group completes.

The one seam: ``FaultyBackend``, the real bubblewrap backend with a fault injected
at one named boundary; the runner, worker, Redis queue and capture store are real."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import pytest

from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.sandbox.backends.base import ExecRequest, ExecResult, Sandbox
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.errors import LeaseLost
from services.sandbox.common.settings import Settings
from services.sandbox.defences.module_shadow import VerifierImports
from services.sandbox.queue.base import TrialQueue, create_queue
from services.sandbox.trial.endpoints import CaptureFinalizer
from services.sandbox.trial.lifecycle import (
    POLICY_REASONS,
    REASON_TO_PROTO,
    TerminationReason,
    TrialOutcome,
    TrialSpec,
    TrialState,
)
from services.sandbox.trial.runner import StateCallback, TrialRunner
from services.sandbox.worker import Worker
from tests.sandbox_support import make_task, settings_for, wait_for_state

if TYPE_CHECKING:
    from harnessrl.localservers import RedisServer
    from services.capture_store.server import CaptureServer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

R = TerminationReason
RUN = "phase-failures"

# boundary -> the one reason it must end in, and the reward. The oracle passes the task,
# so without a fault every trial is completed/1.0. Teardown's stop comes after the reward
# was read: the reward stands and the error names the fault (runner.py's docstring).
BOUNDARIES: dict[str, tuple[TerminationReason, float | None]] = {
    "snapshot_pristine": (R.ENV_SETUP_FAILED, None),
    "upload_harness": (R.ENV_SETUP_FAILED, None),
    "exec_agent": (R.ENV_SETUP_FAILED, None),
    "restore_protected": (R.VERIFIER_ERROR, None),
    "upload_tests": (R.VERIFIER_ERROR, None),
    "exec_verify": (R.VERIFIER_ERROR, None),
    "download_verifier_logs": (R.VERIFIER_ERROR, None),
    "stop": (R.COMPLETED, 1.0),
}


class InjectedFault(RuntimeError):
    """Not a type the runner maps itself: what an unforeseen backend failure looks like."""


class FaultyBackend(LocalBackend):
    """The real local backend, raising InjectedFault at one named boundary (stop
    raises after it did its work, the others before)."""

    def __init__(self, settings: Settings, boundary: str) -> None:
        super().__init__(settings)
        self.boundary = boundary
        self.hits: list[str] = []

    def _at(self, name: str) -> None:
        if name == self.boundary:
            self.hits.append(name)
            raise InjectedFault(f"injected at {name}")

    async def snapshot_pristine(self, sandbox: Sandbox) -> None:
        self._at("snapshot_pristine")
        await super().snapshot_pristine(sandbox)

    async def restore_protected(self, sandbox: Sandbox, imports: VerifierImports | None = None) -> list[str]:
        self._at("restore_protected")
        return await super().restore_protected(sandbox, imports)

    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        # The oracle's solution is the harness's upload; tests are uploaded for verify only.
        self._at({sandbox.paths.solution: "upload_harness", sandbox.paths.tests: "upload_tests"}.get(dst, ""))
        await super().upload(sandbox, src, dst)

    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        self._at(f"exec_{request.phase}")
        return await super().exec(sandbox, request, cancel)

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        if src == sandbox.paths.verifier_logs:
            self._at("download_verifier_logs")
        await super().download(sandbox, src, dst)

    async def stop(self, sandbox: Sandbox) -> None:
        await super().stop(sandbox)
        self._at("stop")


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[CaptureServer]:
    """A real embedded capture store on a free 127.0.0.1 port."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings as CaptureSettings

    server = await create_server(
        CaptureSettings.model_validate({"store_dir": tmp_path / "store", "fsync": False, "shutdown_grace_s": 0.2})
    )
    yield server
    await server.stop(0.2)


def oracle_trial(tmp_path: Path, trial_id: str) -> TrialSpec:
    return TrialSpec(
        trial_id=trial_id,
        run_id=RUN,
        task_path=str(make_task(tmp_path / "tasks", trial_id)),
        group_id=f"g-{trial_id}",
        group_size=1,
        harness="oracle",
    )


async def serve_until_done(worker: Worker, queue: TrialQueue, trial_id: str) -> None:
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    try:
        await wait_for_state(queue, trial_id, TrialState.DONE, timeout_s=120)
    finally:
        stop.set()
        await serving


async def finalized(capture: CaptureServer, trial_id: str) -> records_pb2.Trajectory:
    async with connect(f"127.0.0.1:{capture.port}") as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=trial_id)
        traj: records_pb2.Trajectory = await store.GetTrajectory(req, timeout=10)
    return traj


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
async def test_a_fault_at_a_phase_boundary_ends_the_trial_once_with_its_outcome_written(
    tmp_path: Path, redis_server: RedisServer, capture: CaptureServer, boundary: str
) -> None:
    """One attempt (no retry, no lease to wait for), one reason of the right weight class,
    the fault's type and message in the error, result.json written, the trajectory
    finalized, the sandbox torn down; a failed restore never lets test.sh run."""
    expected_reason, expected_reward = BOUNDARIES[boundary]
    target = f"127.0.0.1:{capture.port}"
    settings = settings_for(
        tmp_path, queue_url=redis_server.url, capture_target=target, lease_s=2.0, heartbeat_s=0.5, max_attempts=3
    )
    backend = FaultyBackend(settings, boundary)
    queue = create_queue(redis_server.url)
    finalizer = CaptureFinalizer(target, None)
    runner = TrialRunner(settings, backend, capture=finalizer)
    try:
        await queue.submit(oracle_trial(tmp_path, "t"))
        await serve_until_done(Worker(settings, queue, runner, name="w"), queue, "t")
        record = await queue.get("t")
    finally:
        await queue.close()
        await finalizer.aclose()

    assert backend.hits == [boundary]  # the fault fired once: nothing ran the trial again
    assert (record.state, record.attempt, record.crashes, record.error) == (TrialState.DONE, 1, 0, "")
    outcome = record.outcome
    assert outcome is not None
    assert (outcome.termination_reason, outcome.reward) == (expected_reason, expected_reward)
    assert (outcome.termination_reason in POLICY_REASONS) == (boundary == "stop")
    assert f"InjectedFault: injected at {boundary}" in outcome.error
    artifacts = tmp_path / "artifacts" / RUN / "t"
    written = TrialOutcome.model_validate_json((artifacts / "result.json").read_text())
    assert (written.termination_reason, written.error) == (outcome.termination_reason, outcome.error)
    traj = await finalized(capture, "t")
    assert traj.finalized and traj.termination_reason == REASON_TO_PROTO[expected_reason]
    assert traj.has_reward == (expected_reward is not None)
    assert not any((tmp_path / "trials").iterdir())  # teardown stopped the sandbox
    if boundary in ("restore_protected", "upload_tests"):
        assert not (artifacts / "verifier.json").exists()  # test.sh never ran


class CrashingRunner(TrialRunner):
    """A runner whose ``run`` raises: what any exception escaping the worker's own
    code looks like to the worker (the runner itself maps everything it can)."""

    def __init__(self, settings: Settings, capture: CaptureFinalizer) -> None:
        super().__init__(settings, LocalBackend(settings), capture=capture)
        self.runs: list[str] = []

    async def run(
        self, spec: TrialSpec, *, cancel: asyncio.Event | None = None, on_state: StateCallback | None = None
    ) -> TrialOutcome:
        self.runs.append(spec.trial_id)
        raise ValueError(f"runner bug on {spec.trial_id}")


@pytest.mark.parametrize("queue_kind", ["memory", "redis"])
async def test_a_worker_crash_is_retried_crash_retries_times_then_finished_and_finalized(
    tmp_path: Path, redis_server: RedisServer, capture: CaptureServer, queue_kind: str
) -> None:
    """The attempt raises out of the worker: given back at once, retried once (the
    default crash_retries) although max_attempts allows more, then DONE env_setup_failed
    naming the crash, and finalized under the last attempt's id so the group completes."""
    target = f"127.0.0.1:{capture.port}"
    settings = settings_for(tmp_path, capture_target=target, lease_s=5.0, heartbeat_s=0.5, max_attempts=4)
    assert settings.crash_retries == 1
    queue = create_queue("memory://" if queue_kind == "memory" else redis_server.url)
    finalizer = CaptureFinalizer(target, None)
    runner = CrashingRunner(settings, finalizer)
    try:
        await queue.submit(oracle_trial(tmp_path, "c"))
        await serve_until_done(Worker(settings, queue, runner, name="w"), queue, "c")
        record = await queue.get("c")
    finally:
        await queue.close()
        await finalizer.aclose()

    assert runner.runs == ["c", "c.attempt-2"]
    assert (record.state, record.attempt, record.crashes) == (TrialState.DONE, 2, 1)
    assert "attempt 1 crashed in worker w: ValueError: runner bug on c" in record.error
    outcome = record.outcome
    assert outcome is not None and outcome.termination_reason == R.ENV_SETUP_FAILED and outcome.reward is None
    assert "attempt 2 crashed in worker w: ValueError: runner bug on c.attempt-2" in outcome.error
    assert "crashed 2 time(s)" in outcome.error and outcome.events == ["worker_crash"]
    traj = await finalized(capture, "c.attempt-2")
    assert traj.finalized and traj.termination_reason == records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED


@pytest.mark.parametrize("queue_kind", ["memory", "redis"])
async def test_requeue_gives_a_leased_trial_back_at_the_front(redis_server: RedisServer, queue_kind: str) -> None:
    queue = create_queue("memory://" if queue_kind == "memory" else redis_server.url)
    try:
        for trial_id in ("a", "b"):
            await queue.submit(TrialSpec(trial_id=trial_id, run_id="r", task_path="/tasks/x", harness="nop"))
        claimed = await queue.claim("w", lease_s=30, wait_s=1)
        assert claimed is not None and claimed.trial_id == "a"
        with pytest.raises(LeaseLost):
            await queue.requeue("a", "intruder", "no")
        await queue.set_state("a", "w", TrialState.AGENT)
        back = await queue.requeue("a", "w", "attempt 1 crashed")
        assert (back.state, back.worker, back.crashes, back.error) == (TrialState.QUEUED, "", 1, "attempt 1 crashed")
        with pytest.raises(LeaseLost):
            await queue.finish("a", "w", TrialOutcome(termination_reason=R.COMPLETED))
        again = await queue.claim("w2", lease_s=30, wait_s=1)
        assert again is not None and (again.trial_id, again.attempt, again.crashes) == ("a", 2, 1)
        assert (await queue.get("b")).state == TrialState.QUEUED
    finally:
        await queue.close()


STEPS_EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"


@pytest.mark.parametrize("where", ["combining the steps' rewards", "building the outcome"])
async def test_a_fault_in_the_bookkeeping_between_phases_ends_the_trial_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Outside ``_phase`` (a multi-step trial's bookkeeping, ``build_outcome``) a fault used
    to escape ``run`` into the worker's crash-retry path: the same deterministic fault ran
    the trial twice. Now it ends the trial once, verifier_error naming it (its result cannot
    be computed: never a reward)."""
    from services.sandbox.task import steps as task_steps
    from services.sandbox.trial import runner as runner_module

    def fault(*args: object) -> None:
        raise InjectedFault(f"injected at {where}")

    if where == "building the outcome":
        monkeypatch.setattr(runner_module, "build_outcome", fault)
    else:
        monkeypatch.setattr(task_steps, "combine", fault)
    settings = settings_for(tmp_path, lease_s=5.0, heartbeat_s=0.5, max_attempts=3)
    queue = create_queue("memory://")
    try:
        spec = TrialSpec(trial_id="b", run_id=RUN, task_path=str(STEPS_EXAMPLE), harness="oracle")
        await queue.submit(spec)
        await serve_until_done(
            Worker(settings, queue, TrialRunner(settings, LocalBackend(settings)), name="w"), queue, "b"
        )
        record = await queue.get("b")
    finally:
        await queue.close()
    assert (record.state, record.attempt, record.crashes) == (TrialState.DONE, 1, 0), record.error
    outcome = record.outcome
    assert outcome is not None and (outcome.termination_reason, outcome.reward) == (R.VERIFIER_ERROR, None)
    assert f"InjectedFault: injected at {where}" in outcome.error
