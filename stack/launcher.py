"""The real launcher of ``harnessrl run``: groups go to the Sandbox service over
gRPC (``SubmitTrial``), one trace per trial. The trainer loop drives it group by
group (``launch_group``: continuous admission, services/trainer/admission.py);
``launch`` starts a whole step's batch (the older ``BatchLauncher`` protocol).

Deterministic, so a resumed run never redoes finished work:
- the tasks of step s are a seeded walk over the pool (a fresh permutation per
  pass over it, so every task is used equally often): ``plan_step``;
- ids are ``<run>-s<step>-g<j>`` (group) and ``<group>-<i>`` (trial);
- before submitting, the launcher asks the capture store which trials of the
  step are already finalized and skips them; the capture store redelivers
  finished, untrained groups to the trainer by itself.

It also follows the run's trials (``WatchTrials``) for the progress display and
cancels whatever is still in flight when the run stops. A trial past its agent
phase calls the model no more: the launcher tells the gateway (``Abort`` by
trial), which drops the KV caches its engine kept for the trial's next turns
(up to ``prefix_cache_mib``; otherwise held until the next weight update).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from harnessrl import telemetry
from harnessrl.captured import list_trajectories
from harnessrl.errors import Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import (
    capture_pb2,
    capture_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    records_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
)
from stack.progress import TrialBoard

if TYPE_CHECKING:
    from stack.runconfig import RunConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedTrial:
    trial_id: str
    group_id: str
    task: Path
    step: int
    index: int


def group_id(run_id: str, step: int, group: int) -> str:
    return f"{run_id}-s{step:05d}-g{group}"


def task_for(tasks: Sequence[Path], seed: int, slot: int) -> Path:
    """The task of the ``slot``-th group of the run: pass ``slot // n`` over a seeded permutation."""
    n = len(tasks)
    order = list(range(n))
    random.Random(f"harnessrl:{seed}:{slot // n}").shuffle(order)
    return tasks[order[slot % n]]


def plan_step(
    run_id: str, step: int, tasks: Sequence[Path], groups_per_step: int, group_size: int, seed: int
) -> list[list[PlannedTrial]]:
    """The groups of one step: ``groups_per_step`` tasks x ``group_size`` trials."""
    groups = []
    for j in range(groups_per_step):
        task = task_for(tasks, seed, step * groups_per_step + j)
        gid = group_id(run_id, step, j)
        groups.append([PlannedTrial(f"{gid}-{i}", gid, task, step, i) for i in range(group_size)])
    return groups


@dataclass
class TrialTemplate:
    """What every trial of the run shares."""

    run_id: str
    harness: str
    model: str
    group_size: int
    max_turns: int = 0
    agent_timeout_s: float = 0.0
    verifier_timeout_s: float = 0.0
    harness_options: dict[str, str] | None = None
    # Which of the verifier's rewards trains ([run] reward_key / reward_weights).
    reward_key: str = ""
    reward_weights: dict[str, float] | None = None

    @classmethod
    def for_run(cls, cfg: RunConfig) -> TrialTemplate:
        """The template of ``cfg``'s trials: what ``[run]`` says every trial shares."""
        r = cfg.run
        return cls(
            run_id=cfg.run_id,
            harness=r.harness,
            model=cfg.model_name,
            group_size=r.group_size,
            max_turns=r.max_turns,
            agent_timeout_s=r.agent_timeout_s,
            verifier_timeout_s=r.verifier_timeout_s,
            harness_options=dict(r.harness_options),
            reward_key=r.reward_key or "",
            reward_weights=dict(r.reward_weights or {}),
        )

    def spec(self, trial: PlannedTrial, policy_version: int) -> sandbox_pb2.TrialSpec:
        return sandbox_pb2.TrialSpec(
            trial_id=trial.trial_id,
            run_id=self.run_id,
            task_path=str(trial.task),
            task_id=trial.task.name,
            group_id=trial.group_id,
            group_size=self.group_size,
            step=trial.step,
            harness=self.harness,
            policy_version=policy_version,
            max_turns=self.max_turns,
            agent_timeout_s=self.agent_timeout_s,
            verifier_timeout_s=self.verifier_timeout_s,
            harness_options=dict(self.harness_options or {}),
            model=self.model,
            reward_key=self.reward_key,
            reward_weights=dict(self.reward_weights or {}),
        )


def board_update(board: TrialBoard, status: sandbox_pb2.TrialStatus) -> None:
    state = sandbox_pb2.TrialState.Name(status.state).removeprefix("TRIAL_STATE_").lower()
    board.update(status.trial_id, state, status.reward if status.has_reward else None)


class SandboxLauncher:
    """Submits each step's batch to the sandbox; knows every trial's last status."""

    def __init__(
        self,
        template: TrialTemplate,
        tasks: Sequence[Path],
        *,
        sandbox_target: str,
        capture_target: str,
        groups_per_step: int,
        steps: int,
        seed: int = 0,
        token: str | None = None,
        gateway_target: str | None = None,
    ) -> None:
        if not tasks:
            raise ValueError("no tasks to launch")
        self.template, self.tasks = template, list(tasks)
        self.groups_per_step, self.steps, self.seed = groups_per_step, steps, seed
        self._sandbox = connect(sandbox_target, token, service="trainer")
        self._capture = connect(capture_target, token, service="trainer")
        self._gateway = connect(gateway_target, token, service="trainer") if gateway_target else None
        self._ended: set[str] = set()  # trials whose end the gateway was told
        self._ending: set[asyncio.Task[None]] = set()
        self.status: dict[str, sandbox_pb2.TrialStatus] = {}
        self.submitted: list[str] = []
        self.skipped: list[str] = []
        self.launched_steps: list[int] = []
        self._watch: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.board = TrialBoard(groups_per_step * template.group_size)  # what the progress lines report

    @property
    def _stub(self) -> sandbox_pb2_grpc.SandboxStub:
        return sandbox_pb2_grpc.SandboxStub(self._sandbox)

    async def start(self) -> None:
        self._watch = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        """Keeps ``status`` current from WatchTrials (reconnects while the run lasts)."""
        while True:
            try:
                call = self._stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(run_id=self.template.run_id))
                async for status in call:
                    self.observe(status)
            except grpc.aio.AioRpcError as e:
                log.warning("WatchTrials interrupted: %s", e.code().name)
            await asyncio.sleep(1.0)

    def observe(self, status: sandbox_pb2.TrialStatus) -> None:
        """A trial's new status: kept, shown, and past the agent phase, told to the gateway."""
        self.status[status.trial_id] = status
        board_update(self.board, status)
        self._changed.set()
        if status.state >= sandbox_pb2.TRIAL_STATE_VERIFY:
            self._trial_ended(status.trial_id)

    async def settle(self) -> None:
        """Waits for the gateway calls already made (trials' ends)."""
        await asyncio.gather(*self._ending, return_exceptions=True)

    def _trial_ended(self, trial_id: str) -> None:
        """Tells the gateway once that ``trial_id`` is past its agent phase (see the module docstring)."""
        if self._gateway is None or trial_id in self._ended:
            return
        self._ended.add(trial_id)
        task = asyncio.ensure_future(self._forget(trial_id))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _forget(self, trial_id: str) -> None:
        assert self._gateway is not None
        stub = gateway_pb2_grpc.RolloutGatewayStub(self._gateway)
        try:
            await stub.Abort(gateway_pb2.AbortRequest(trial_id=trial_id), timeout=10)
        except grpc.aio.AioRpcError as e:  # the caches go at the next weight update anyway
            log.warning("gateway: Abort(trial %s): %s", trial_id, e.code().name)

    async def finalized(self, step: int) -> set[str]:
        """Trials of ``step`` the capture store already holds finalized."""
        stub = capture_pb2_grpc.CaptureStoreStub(self._capture)
        req = capture_pb2.ListTrajectoriesRequest(
            run_id=self.template.run_id, step=step, finalized_only=True, page_size=500
        )
        try:
            return {t.trial_id async for t in list_trajectories(stub, req, page_timeout_s=30)}
        except grpc.aio.AioRpcError as e:
            raise Unavailable(f"capture store: ListTrajectories: {e.code().name}: {e.details()}") from e

    async def launch(self, step: int, policy_version: int) -> None:
        """Submits the step's trials not yet finalized; steps past the run's end are not launched."""
        if step >= self.steps:
            return
        done = await self.finalized(step)
        tracer = telemetry.tracer(__name__, "trainer")
        attributes: dict[str, str | int] = {"harnessrl.run_id": self.template.run_id, "harnessrl.step": step}
        with tracer.start_as_current_span("trainer.launch", attributes=attributes):
            for group in plan_step(
                self.template.run_id, step, self.tasks, self.groups_per_step, self.template.group_size, self.seed
            ):
                for trial in group:
                    if trial.trial_id in done:
                        self._skip(trial)
                        continue
                    await self._submit(self.template.spec(trial, policy_version))
        self.launched_steps.append(step)

    async def launch_group(self, group_id: str, step: int, index: int, policy_version: int) -> None:
        """Submits the trials of the ``index``-th group of ``step`` not yet finalized, as ``group_id``.

        The loop names groups like ``group_id()``, so a resumed run finds the trials it already has.
        """
        if step >= self.steps:
            return
        done = await self.finalized(step)
        task = task_for(self.tasks, self.seed, step * self.groups_per_step + index)
        tracer = telemetry.tracer(__name__, "trainer")
        attributes: dict[str, str | int] = {
            "harnessrl.run_id": self.template.run_id,
            "harnessrl.step": step,
            "harnessrl.group_id": group_id,
        }
        with tracer.start_as_current_span("trainer.launch", attributes=attributes):
            for i in range(self.template.group_size):
                trial = PlannedTrial(f"{group_id}-{i}", group_id, task, step, i)
                if trial.trial_id in done:
                    self._skip(trial)
                    continue
                await self._submit(self.template.spec(trial, policy_version))
        if step not in self.launched_steps:
            self.launched_steps.append(step)

    def _skip(self, trial: PlannedTrial) -> None:
        """A trial the capture store holds finalized (a resumed run): not run again, counted done."""
        self.skipped.append(trial.trial_id)
        self.board.submitted(trial.trial_id, trial.step)
        self.board.update(trial.trial_id, "done")

    async def _submit(self, spec: sandbox_pb2.TrialSpec) -> None:
        with telemetry.trial_trace("trainer.enqueue", "trainer", telemetry.trial_attributes(spec)):
            try:
                await self._stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec), timeout=30)
            except grpc.aio.AioRpcError as e:
                raise Unavailable(f"sandbox: SubmitTrial {spec.trial_id}: {e.code().name}: {e.details()}") from e
        self.submitted.append(spec.trial_id)
        self.board.submitted(spec.trial_id, spec.step)

    def in_flight(self) -> list[str]:
        done = sandbox_pb2.TRIAL_STATE_DONE
        return [t for t in self.submitted if t not in self.status or self.status[t].state != done]

    async def cancel_in_flight(self) -> int:
        """CancelTrial for every submitted trial that is not done; returns how many."""
        ids = self.in_flight()
        for trial_id in ids:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stub.CancelTrial(sandbox_pb2.CancelTrialRequest(trial_id=trial_id), timeout=10)
        return len(ids)

    async def wait_settled(self, timeout_s: float) -> bool:
        """Waits until no submitted trial is in flight (True) or ``timeout_s`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.in_flight():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
        return True

    def counts(self) -> dict[str, int]:
        """Trials per state name (queued, setup, agent, verify, teardown, done)."""
        out: dict[str, int] = {}
        for trial_id in self.submitted:
            status = self.status.get(trial_id)
            name = sandbox_pb2.TrialState.Name(status.state) if status else "TRIAL_STATE_QUEUED"
            key = name.removeprefix("TRIAL_STATE_").lower()
            out[key] = out.get(key, 0) + 1
        return out

    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for status in self.status.values():
            if status.state == sandbox_pb2.TRIAL_STATE_DONE and status.termination_reason:
                name = records_pb2.TerminationReason.Name(status.termination_reason)
                key = name.removeprefix("TERMINATION_REASON_").lower()
                out[key] = out.get(key, 0) + 1
        return out

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.settle()
        await self._sandbox.close()
        await self._capture.close()
        if self._gateway is not None:
            await self._gateway.close()
