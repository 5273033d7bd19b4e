"""The gateway service over several replicas: a failed weight update ejects the
replica, which catches up when its probe passes; pause skips ejected replicas."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from services.gateway.engines.base import EngineInfo
from services.gateway.errors import EngineUnavailable
from services.gateway.router import EJECTED, HEALTHY
from services.gateway.service import GatewayService
from services.gateway.settings import Settings
from tests.unit.test_gateway_router import FakeEngine


class VersionedFake(FakeEngine):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.version = 0
        self.fail_load = False
        self.loads: list[tuple[int, str]] = []
        self.paused = False

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        if self.fail_load or self.down:
            raise EngineUnavailable(f"{self.name} cannot load")
        self.loads.append((version, checkpoint_path))
        self.version = version

    async def pause(self, timeout_s: float) -> int:
        if self.down:
            raise EngineUnavailable(f"{self.name} is down")
        self.paused = True
        return 0

    def info(self) -> EngineInfo:
        return EngineInfo("fake", 100, 1000, self.version, self.in_flight, self.capacity)


async def make_service() -> tuple[GatewayService, list[VersionedFake]]:
    engines = [VersionedFake("r0"), VersionedFake("r1")]
    service = GatewayService(list(engines), Settings(engine="local", health_interval_s=3600))
    await service.start()
    return service, engines


async def test_failed_update_ejects_replica_which_catches_up_later() -> None:
    service, engines = await make_service()
    try:
        engines[1].fail_load = True
        await service.update_weights(3, "/ckpt/3", {})
        assert service.version == 3
        r0, r1 = service.router.replicas
        assert r0.state == HEALTHY and r1.state == EJECTED and "version 3 failed" in r1.error
        # Still broken: the probe keeps it out, with the reason.
        await service.probe()
        assert r1.state == EJECTED and "catching up failed" in r1.error
        engines[1].fail_load = False
        await service.probe()
        assert r1.state == HEALTHY and engines[1].loads == [(3, "/ckpt/3")]
    finally:
        await service.close()


async def test_update_failing_everywhere_keeps_the_version() -> None:
    service, engines = await make_service()
    try:
        for e in engines:
            e.fail_load = True
        with pytest.raises(EngineUnavailable, match="cannot load"):
            await service.update_weights(1, "/ckpt/1", {})
        assert service.version == 0 and all(r.state == HEALTHY for r in service.router.replicas)
    finally:
        await service.close()


async def test_pause_and_update_skip_ejected_replicas() -> None:
    service, engines = await make_service()
    try:
        engines[0].down = True
        await service.probe()
        assert service.router.replicas[0].state == HEALTHY  # one failure is not enough (eject_after_failures=2)
        await service.probe()
        assert service.router.replicas[0].state == EJECTED
        assert await service.pause(1.0) == 0
        assert service.paused and engines[1].paused and not engines[0].paused
        await service.update_weights(1, "/ckpt/1", {})
        assert engines[1].loads == [(1, "/ckpt/1")] and engines[0].loads == []
        await service.resume()
        assert not service.paused
    finally:
        await service.close()


async def test_no_healthy_replica_is_unavailable_before_validation() -> None:
    import numpy as np

    from services.gateway.engines.base import Sampling

    service, engines = await make_service()
    try:
        for engine in engines:
            engine.down = True
        await service.probe()
        await service.probe()
        with pytest.raises(EngineUnavailable, match="no healthy replica"):
            async for _ in service.generate("r", "t", "main", np.asarray([1] * 500, np.int32), Sampling()):
                pass
    finally:
        await service.close()
