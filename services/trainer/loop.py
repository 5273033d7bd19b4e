"""The async training loop: ready groups in (WatchReady, acked after use),
bounded staleness, one optimizer step per batch, checkpoint, weight sync.

Rollouts never wait for the optimizer: groups arrive on the WatchReady stream
while a step runs (the step runs in a worker thread; a pump task reads the
stream, so acks, admission and the Status/Metrics RPCs keep flowing). With a
launcher, the loop admits groups continuously with the policy of
``services.trainer.admission`` (the simulator behind ``harnessrl bench async``
uses the same code): whenever a group is ready its slots free and a new group
starts, tagged with the served policy version, as long as it cannot be more
than k versions old when trained; each step takes the groups whose last chance
it is and fills up with the oldest ready ones. A group is as old as its oldest
sampled token (or its admission tag, whichever is older); a group older than k
versions (only a foreign one: a redelivery, a group this loop did not admit) is
dropped, acked and counted. k = 0 is synchronous training (the same code).

Partial rollout: a weight sync is Pause -> UpdateWeights -> Resume on the
gateway; in-flight generations continue on the new weights, so one response
can carry several policy versions. Those tokens are importance-corrected per
token in the loss (``losses.is_weights``), each against the logprob of the
version that sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from harnessrl import arrays, cpu, memory
from harnessrl.errors import ConfigError, Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, gateway_pb2, gateway_pb2_grpc, records_pb2
from services.trainer import checkpoint
from services.trainer.admission import Admission
from services.trainer.cpu_trainer import CpuTrainer, StepResult
from services.trainer.service import TrainerService
from services.trainer.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ReadyBatchGroup:
    ready: capture_pb2.ReadyGroup
    trajectories: list[records_pb2.Trajectory]

    def min_version(self) -> int | None:
        """The oldest policy version of any sampled token of the group."""
        seen = [v for t in self.trajectories for v in t.policy_versions_seen]
        if seen:
            return int(min(seen))
        versions = []
        for t in self.trajectories:
            for seg in t.segments:
                v = arrays.unpack_i32(seg.response.policy_versions, "policy_versions")
                versions += [int(x) for x in v if x >= 0]
        return min(versions) if versions else None


class ReadyGroupSource:
    """A WatchReady subscription: ready groups with their trajectories; acks on demand.

    Unacknowledged groups are redelivered to the next subscriber of the same
    consumer group, so a restarted trainer loses nothing it had not trained on.
    """

    def __init__(self, target: str, run_id: str, consumer_group: str, token: str | None = None) -> None:
        self._target, self._run_id, self._group, self._token = target, run_id, consumer_group, token
        self._requests: asyncio.Queue[capture_pb2.WatchReadyRequest | None] = asyncio.Queue()
        self._ready: asyncio.Queue[capture_pb2.ReadyGroup | BaseException] = asyncio.Queue()
        self._channel: grpc.aio.Channel | None = None
        self._reader: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()

    async def start(self, consumer: str = "trainer-0") -> None:
        self._channel = connect(self._target, self._token)
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)
        sub = capture_pb2.WatchReadyRequest.Subscribe(
            run_id=self._run_id, consumer_group=self._group, consumer=consumer
        )
        await self._requests.put(capture_pb2.WatchReadyRequest(subscribe=sub))
        self._reader = asyncio.ensure_future(self._read(self._stub.WatchReady(self._outgoing())))

    async def _outgoing(self) -> AsyncIterator[capture_pb2.WatchReadyRequest]:
        while (req := await self._requests.get()) is not None:
            yield req
        self._drained.set()

    async def _read(self, call: AsyncIterator[capture_pb2.ReadyGroup]) -> None:
        try:
            async for ready in call:
                await self._ready.put(ready)
        except grpc.aio.AioRpcError as e:
            await self._ready.put(Unavailable(f"WatchReady on {self._target}: {e.code().name}: {e.details()}"))

    def pending(self) -> int:
        return self._ready.qsize()

    async def next(self, wait_s: float | None = None) -> ReadyBatchGroup:
        """The next ready group with its trajectories; TimeoutError after ``wait_s``."""
        item = await asyncio.wait_for(self._ready.get(), wait_s)
        if isinstance(item, BaseException):
            raise item
        trajectories = []
        for trial in item.trial_ids:
            req = capture_pb2.GetTrajectoryRequest(run_id=item.run_id, trial_id=trial, include_tokens=True)
            try:
                trajectories.append(await self._stub.GetTrajectory(req))
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise Unavailable(f"GetTrajectory {trial}: {e.code().name}: {e.details()}") from e
                log.warning("trajectory of a ready group is missing", extra={"kv": {"trial": trial}})
        return ReadyBatchGroup(item, trajectories)

    async def ack(self, group_id: str) -> None:
        await self._requests.put(
            capture_pb2.WatchReadyRequest(ack=capture_pb2.WatchReadyRequest.Ack(group_id=group_id))
        )

    async def close(self, grace_s: float = 0.5) -> None:
        """Sends the queued acks, gives the store ``grace_s`` to apply them, then hangs up.

        An ack lost in a crash only means a redelivery, which ``TrainingLoop``
        recognises (it remembers the groups it consumed) and skips.
        """
        await self._requests.put(None)
        if self._reader is not None and not self._reader.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace_s)
            await asyncio.sleep(grace_s)
        if self._reader is not None:
            self._reader.cancel()
        if self._channel is not None:
            await self._channel.close()


class BatchLauncher(Protocol):
    """Starts the trials of one step's batch (groups_per_step tasks x G rollouts) with the given policy version.

    The loop calls it whenever the admission window has room for a whole
    batch (k = 0: batch s once the weights are at version s, i.e. synchronous).
    The groups of a batch are matched to the window when they are ready.

    Optional, detected with ``getattr``: ``launch_group`` (see ``GroupLauncher``).
    A launcher that has it is driven group by group (continuous admission:
    rollout slots stay full); ``launch`` is then never called.
    """

    async def launch(self, step: int, policy_version: int) -> None: ...


class GroupLauncher(Protocol):
    """Starts ONE group: G trials of the task the index-th group of step ``step``'s batch
    would use, captured under ``group_id`` with ``policy_version``.

    The loop names the group (``group_name``: ``<run>-s<step:05d>-g<index>``), so a ready
    group is matched to its admission without a race, and a resumed run names the same
    slots the same way: a launcher skips trials it finds already finalized, and the loop
    never relaunches a group it trained (nor waits for it)."""

    async def launch_group(self, group_id: str, step: int, index: int, policy_version: int) -> None: ...


def group_name(run_id: str, step: int, index: int) -> str:
    return f"{run_id}-s{step:05d}-g{index}"


class WeightSync(Protocol):
    async def publish(self, version: int, checkpoint_path: str) -> dict[str, float]: ...


class GatewaySync:
    """Publishes a checkpoint to the rollout gateway: Pause -> UpdateWeights -> Resume."""

    def __init__(self, target: str, partial_rollout: bool, pause_timeout_s: float, token: str | None = None) -> None:
        self._channel = connect(target, token)
        self._stub = gateway_pb2_grpc.RolloutGatewayStub(self._channel)
        self._partial = partial_rollout
        self._pause_timeout = pause_timeout_s

    async def publish(self, version: int, checkpoint_path: str) -> dict[str, float]:
        started = time.monotonic()
        held = 0
        if self._partial:
            held = (await self._stub.Pause(gateway_pb2.PauseRequest(timeout_s=self._pause_timeout))).held
        try:
            await self._stub.UpdateWeights(
                gateway_pb2.UpdateWeightsRequest(version=version, checkpoint_path=checkpoint_path)
            )
        finally:
            if self._partial:
                await self._stub.Resume(gateway_pb2.ResumeRequest())
        return {"sync/seconds": time.monotonic() - started, "sync/held_requests": float(held)}

    async def close(self) -> None:
        await self._channel.close()


class TrainingLoop:
    """Consumes ready groups until ``max_steps`` (or cancellation), admitting new ones as slots free."""

    def __init__(
        self,
        settings: Settings,
        trainer: CpuTrainer,
        source: ReadyGroupSource,
        service: TrainerService,
        sync: WeightSync | None = None,
        launcher: BatchLauncher | GroupLauncher | None = None,
    ) -> None:
        self.settings, self.trainer, self.source, self.service, self.sync = settings, trainer, source, service, sync
        self.launcher = launcher
        self.output_dir = settings.resolved_output_dir()
        self.dropped: Counter[str] = Counter()
        self.consumed = self._load_consumed()
        rollout = settings.rollout
        if sync is not None and rollout.sync_every > rollout.max_staleness + 1:
            raise ConfigError(
                f"[trainer.rollout] sync_every = {rollout.sync_every} lets rollouts lag {rollout.sync_every - 1} "
                f"versions behind the trainer: max_staleness (now {rollout.max_staleness}) must be at least that"
            )
        cap = rollout.max_groups_in_flight
        if launcher is not None and not hasattr(launcher, "launch_group") and 0 < cap < rollout.groups_per_step:
            raise ConfigError(
                f"[trainer.rollout] max_groups_in_flight = {cap} cannot hold one batch of "
                f"{rollout.groups_per_step} groups, and this launcher starts whole batches"
            )
        self.published = trainer.policy_version  # the version rollouts are sampled with (tag of new groups)
        self.admission = Admission(
            rollout.groups_per_step,
            rollout.max_staleness,
            group_size=1,  # capacity is counted in groups here: the loop learns when a group is ready
            slots=rollout.max_groups_in_flight or None,
            start_version=trainer.policy_version,
            # max_steps counts steps since the run began (a restarted trainer finishes the same run)
            max_groups=max(rollout.max_steps - trainer.step, 0) * rollout.groups_per_step
            if rollout.max_steps
            else None,
            first_step=trainer.step,
        )
        self.ready: dict[str, ReadyBatchGroup] = {}
        self._wake = asyncio.Event()
        self._admit_lock = asyncio.Lock()
        self._failure: BaseException | None = None
        # The optimizer on a thread of its own, named so that its CPU (and its OpenMP
        # workers') counts as the trainer's (harnessrl.cpu); the event loop stays free. The
        # thread ends when this loop is collected, not when run() returns: a run reads its
        # CPU after that (a thread that ended is no longer counted as the trainer's).
        self._thread = ThreadPoolExecutor(1, "trainer", initializer=cpu.name_thread, initargs=("trainer",))

    def _consumed_path(self) -> Path:
        return self.output_dir / "consumed_groups.json"

    def _load_consumed(self) -> set[str]:
        """Groups trained on or dropped by an earlier run of this loop (redeliveries are skipped)."""
        path = self._consumed_path()
        return set(json.loads(path.read_text())) if path.exists() else set()

    def _save_consumed(self) -> None:
        path = self._consumed_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(sorted(self.consumed)))
        os.replace(tmp, path)

    async def run(self) -> list[StepResult]:
        results: list[StepResult] = []
        rollout = self.settings.rollout
        pump = asyncio.ensure_future(self._pump())
        try:
            while not rollout.max_steps or self.trainer.step < rollout.max_steps:
                await self._admit()
                batch = await self._next_batch()
                if batch is None:
                    break
                results.append(await self._step(batch))
            self.service.set_state("done")
        except BaseException:
            self.service.set_state("failed")
            raise
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        return results

    async def _admit(self) -> None:
        """Starts every group the admission policy allows now (whole batches for a batch launcher)."""
        if self.launcher is None:
            return
        async with self._admit_lock:
            version, adm = self.published, self.admission
            launch_group = getattr(self.launcher, "launch_group", None)
            if launch_group is not None:
                while adm.admissible(version) > 0:
                    step, index = adm.next_slot()
                    group_id = group_name(self.settings.run_id, step, index)
                    if group_id in self.consumed:  # trained (or dropped) before a restart
                        adm.skip()
                        continue
                    if adm.admit(group_id, version).ready_seq is None:  # else: redelivered, ready already
                        await launch_group(group_id, step, index, version)
                return
            launcher: BatchLauncher = self.launcher  # type: ignore[assignment]
            while adm.admissible(version) >= adm.b:
                step, _ = adm.next_slot()
                for _ in range(adm.b):
                    adm.admit(None, version)
                await launcher.launch(step, version)

    async def _pump(self) -> None:
        """Reads ready groups as they come (also while a step trains): frees their slots, admits more.

        A failure (the store went away, a launcher raised) is handed to ``run`` which raises it.
        """
        try:
            while True:
                await self._receive(await self.source.next())
        except Exception as e:  # noqa: BLE001 - re-raised by run()
            self._failure = e
            self._wake.set()

    async def _receive(self, group: ReadyBatchGroup) -> None:
        gid = group.ready.group_id
        if gid in self.consumed or gid in self.ready:
            self.dropped["dropped/duplicate_groups"] += 1
            if gid in self.consumed:
                await self.source.ack(gid)
            return
        self.ready[gid] = group
        oldest = group.min_version()
        self.admission.ready(gid, self.trainer.policy_version if oldest is None else oldest)
        self._wake.set()
        await self._admit()

    async def _next_batch(self) -> list[ReadyBatchGroup] | None:
        """The step's groups per the admission policy; stale foreign groups are acked and counted."""
        timeout = self.settings.rollout.wait_timeout_s or None
        while True:
            if self._failure is not None:
                raise self._failure
            sel = self.admission.select(self.trainer.policy_version)
            for gid in sel.dropped:
                self.dropped["dropped/stale_groups"] += 1
                self.consumed.add(gid)
                self.ready.pop(gid, None)
                log.info("dropped stale group", extra={"kv": {"group": gid}})
                await self.source.ack(gid)
            if sel.batch:
                return [self.ready.pop(gid) for gid in sel.batch]
            self.service.set_state("waiting", self.source.pending() + len(self.ready))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                log.warning("no ready group within %.1fs; stopping", self.settings.rollout.wait_timeout_s)
                return None

    async def _step(self, batch: list[ReadyBatchGroup]) -> StepResult:
        self.service.set_state("training", self.source.pending() + len(self.ready))
        groups = [(g.ready.group_id, g.trajectories) for g in batch]
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._thread, self.trainer.train_step, groups)
        result.metrics.update({k: float(v) for k, v in self.dropped.items()})
        result.metrics["batch/groups"] = float(len(batch))
        path = checkpoint.step_dir(self.output_dir, result.step)
        await loop.run_in_executor(self._thread, self.trainer.save, path)
        await loop.run_in_executor(self._thread, memory.trim)  # the step's activations, freed, back to the system
        checkpoint.prune(self.output_dir, self.settings.keep_checkpoints)
        self.consumed.update(g.ready.group_id for g in batch)
        self._save_consumed()
        for g in batch:  # durable in a checkpoint: safe to acknowledge
            await self.source.ack(g.ready.group_id)
        if self.sync is None:
            self.published = result.policy_version  # nothing to publish: rollouts follow the trainer
        elif result.updated and result.step % self.settings.rollout.sync_every == 0:
            self.service.set_state("syncing")
            result.metrics.update(await self.sync.publish(result.policy_version, str(path)))
            self.published = result.policy_version
        self.admission.step_done()
        result.metrics["trainer/idle_fraction"] = self.service.idle_fraction()
        self.service.record_step(result.step, result.policy_version, result.metrics, result.alerts)
        return result
