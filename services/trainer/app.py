"""The trainer process: the gRPC service (Status, Metrics) plus, when a capture
store is configured, the training loop; resumes from its newest checkpoint.

A restart loses nothing: groups not yet acknowledged are redelivered by the
capture store, groups already trained are remembered (``consumed_groups.json``)
and skipped, and weights, optimizer state and counters come back bit-exact.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from harnessrl.errors import Unavailable
from harnessrl.rpc import RunningServer, connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from services.trainer import checkpoint
from services.trainer.cpu_trainer import CpuTrainer
from services.trainer.loop import GatewaySync, ReadyGroupSource, TrainingLoop
from services.trainer.server import create_server
from services.trainer.service import TrainerService
from services.trainer.settings import Settings

log = logging.getLogger(__name__)

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_SYNC_CHECK_S = 2.0


class TrainerApp:
    """Owns the service, the server and (optionally) the loop task."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        out = settings.resolved_output_dir()
        self.service = TrainerService(settings.run_id, out / "tensorboard" if settings.capture_target else None)
        self.server: RunningServer | None = None
        self.task: asyncio.Task[object] | None = None
        self._source: ReadyGroupSource | None = None
        self._sync: TrackedSync | None = None

    async def start(self) -> RunningServer:
        self.server = await create_server(self.settings, self.service)
        if self.settings.capture_target:
            self.task = asyncio.ensure_future(self._train())
        else:
            self.service.set_state("waiting")
        return self.server

    async def _train(self) -> object:
        s = self.settings
        token = s.service_token.get_secret_value() if s.service_token else None
        trainer = await asyncio.to_thread(CpuTrainer, s)
        latest = checkpoint.latest(s.resolved_output_dir())
        if latest is not None:
            await asyncio.to_thread(trainer.restore, latest)
            self.service.set_progress(trainer.step, trainer.policy_version)
            log.warning("resumed", extra={"kv": {"checkpoint": str(latest), "step": trainer.step}})
        assert s.capture_target is not None
        watchdog = None
        if s.gateway_target:
            sync = GatewaySync(s.gateway_target, s.rollout.partial_rollout, s.rollout.pause_timeout_s, token)
            self._sync = TrackedSync(sync, trainer.policy_version, str(latest) if latest is not None else None)
            watchdog = asyncio.ensure_future(self._keep_gateway_in_sync(self._sync, s.gateway_target, token))
        try:
            return await self._supervise(trainer, token)
        finally:
            if watchdog is not None:
                watchdog.cancel()

    async def _supervise(self, trainer: CpuTrainer, token: str | None) -> object:
        """Runs the loop; a capture store or gateway that went away (restart, network)
        only pauses training: resubscribe with backoff. Unacked groups come back
        (redelivery) and groups already trained are skipped, so nothing is lost or
        trained twice. Any other error fails the loop."""
        s, delay = self.settings, 0.5
        while True:
            assert s.capture_target is not None
            # max_steps counts the run's steps: a restarted (resumed) trainer does only the steps left.
            if s.rollout.max_steps and trainer.step >= s.rollout.max_steps:
                self.service.set_state("done")
                return []
            self._source = ReadyGroupSource(s.capture_target, s.run_id, s.consumer_group, token)
            await self._source.start()
            try:
                return await TrainingLoop(s, trainer, self._source, self.service, self._sync).run()
            except (Unavailable, grpc.aio.AioRpcError) as e:
                if isinstance(e, grpc.aio.AioRpcError) and e.code() not in _TRANSIENT:
                    raise self._failed(e) from e
                log.warning("training paused; reconnecting", extra={"kv": {"error": str(e)[:300], "in_s": delay}})
                self.service.set_state("waiting")
                await self._source.close(grace_s=0)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as e:
                raise self._failed(e) from e

    def _failed(self, e: Exception) -> Exception:
        log.exception("training loop failed")
        self.service.alert(f"training loop failed: {type(e).__name__}: {e}")
        return e

    @staticmethod
    async def _keep_gateway_in_sync(sync: TrackedSync, target: str, token: str | None) -> None:
        """A gateway that restarted serves its initial weights: hand it the last
        published checkpoint again, so rollouts are not sampled by an old policy."""
        async with connect(target, token) as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            while True:
                await asyncio.sleep(_SYNC_CHECK_S)
                try:
                    health = await stub.Health(gateway_pb2.GatewayHealthRequest(), timeout=5)
                    await sync.republish_if_behind(health.policy_version)
                except grpc.aio.AioRpcError as e:
                    log.info("gateway check failed", extra={"kv": {"code": e.code().name}})

    async def stop(self) -> None:
        await self.stop_training()
        if self.server is not None:
            await self.server.stop()

    async def stop_training(self) -> None:
        """Cancels the loop (unacked groups will be redelivered) and closes the clients."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self._source is not None:
            await self._source.close()
        if self._sync is not None:
            await self._sync.close()
        self.service.close()


class TrackedSync:
    """The loop's weight sync, remembering the last (version, checkpoint) it handed
    the gateway (or tried to: a gateway down at publish time gets it once back, from
    ``TrainerApp._keep_gateway_in_sync``).
    Publishes are serialised, so a republish never overtakes a newer version."""

    def __init__(self, inner: GatewaySync, version: int, checkpoint_path: str | None) -> None:
        self.inner = inner
        self.version, self.path = version, checkpoint_path
        self._lock = asyncio.Lock()

    async def publish(self, version: int, checkpoint_path: str) -> dict[str, float]:
        """A gateway that is down does not stop training: the step is already
        checkpointed, and the watchdog hands the weights over once it is back."""
        async with self._lock:
            self.version, self.path = version, checkpoint_path
            try:
                return await self.inner.publish(version, checkpoint_path)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _TRANSIENT:
                    raise
                log.warning("gateway unreachable; weights published when it is back", extra={"kv": {"v": version}})
                return {"sync/failed": 1.0}

    async def republish_if_behind(self, gateway_version: int) -> None:
        async with self._lock:
            if self.path is None or gateway_version >= self.version:
                return
            log.warning("gateway behind; republishing", extra={"kv": {"gateway": gateway_version, "to": self.version}})
            await self.inner.publish(self.version, self.path)

    async def close(self) -> None:
        await self.inner.close()
