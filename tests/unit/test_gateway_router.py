"""Routing across replicas: sticky per trial, least-loaded otherwise, ejection
and reinstatement, retry of requests that failed before their first token.

Replicas are small fake engines (a fake, not a mock: a working Engine that
can be told to be down)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator, Mapping

import numpy as np
import pytest

from services.gateway.engines.base import F32, I32, Chunk, Engine, EngineInfo, GenerateInput, Sampling
from services.gateway.errors import EngineFailed, EngineUnavailable
from services.gateway.router import EJECTED, HEALTHY, Router


class FakeEngine(Engine):
    kind = "fake"

    def __init__(self, name: str, capacity: int = 4) -> None:
        super().__init__(name)
        self.capacity = capacity
        self.down = False
        self.fail_after_first = False
        self.served: list[str] = []
        self.gate: asyncio.Event | None = None
        self.in_flight = 0

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        if self.down:
            raise EngineUnavailable(f"{self.name} is down")
        self.served.append(request.request_id)
        self.in_flight += 1
        try:
            yield Chunk(np.asarray([7], I32), np.asarray([-0.5], F32), np.asarray([0], I32))
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_after_first:
                raise EngineUnavailable(f"{self.name} died mid-reply")
            yield Chunk.empty("stop")
        finally:
            self.in_flight -= 1

    async def abort(self, request_id: str) -> bool:
        return False

    async def pause(self, timeout_s: float) -> int:
        return 0

    async def resume(self) -> int:
        return 0

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        return None

    def info(self) -> EngineInfo:
        return EngineInfo("fake", 100, 1000, 0, self.in_flight, self.capacity)

    async def check_health(self) -> None:
        if self.down:
            raise EngineUnavailable(f"{self.name} is down")


def req(rid: str, trial: str = "") -> GenerateInput:
    return GenerateInput(rid, trial, "main", np.asarray([1], np.int32), Sampling(), 10)


async def make_router(n: int, **kwargs: int) -> tuple[Router, list[FakeEngine]]:
    engines = [FakeEngine(f"r{i}") for i in range(n)]
    router = Router(list(engines), **kwargs)
    await router.probe()
    return router, engines


async def drain(router: Router, request: GenerateInput) -> list[tuple[str, Chunk]]:
    return [(replica.name, chunk) async for replica, chunk in router.generate(request)]


async def test_sticky_per_trial_and_spread_across_trials() -> None:
    router, _ = await make_router(4)
    for trial in ("alpha", "beta", "gamma"):
        names = {router.pick(trial).name for _ in range(20)}
        assert len(names) == 1
    spread = Counter(router.pick(f"trial-{i}").name for i in range(400))
    assert set(spread) == {"r0", "r1", "r2", "r3"} and min(spread.values()) > 60


async def test_ejecting_a_replica_moves_only_its_trials() -> None:
    router, _ = await make_router(4)
    before = {f"t{i}": router.pick(f"t{i}").name for i in range(200)}
    router.replicas[1].state = EJECTED
    after = {t: router.pick(t).name for t in before}
    moved = {t for t in before if before[t] != after[t]}
    assert moved == {t for t, name in before.items() if name == "r1"}
    assert "r1" not in after.values()


async def test_least_loaded_without_trial() -> None:
    router, _ = await make_router(3)
    router.replicas[0].in_flight = 3
    router.replicas[1].in_flight = 1
    router.replicas[2].in_flight = 2
    assert router.pick("").name == "r1"
    router.replicas[1].in_flight = 2  # tie between r1 and r2: both get picked over time
    assert {router.pick("").name for _ in range(6)} == {"r1", "r2"}


async def test_retry_on_another_replica_before_first_token_and_eject() -> None:
    router, engines = await make_router(3, eject_after_failures=1)
    sticky = router.pick("trial-x")
    engines[int(sticky.name[1:])].down = True
    out = await drain(router, req("a", "trial-x"))
    assert out[-1][1].finish_reason == "stop" and out[0][0] != sticky.name
    assert sticky.state == EJECTED and "down" in sticky.error
    # A passing probe reinstates it.
    engines[int(sticky.name[1:])].down = False
    await router.probe()
    assert sticky.state == HEALTHY and router.pick("trial-x").name == sticky.name


async def test_all_replicas_down_is_unavailable_with_states() -> None:
    router, engines = await make_router(2, eject_after_failures=1)
    for e in engines:
        e.down = True
    with pytest.raises(EngineUnavailable, match="before the first token"):
        await drain(router, req("a"))
    with pytest.raises(EngineUnavailable, match=r"no healthy replica.*r0=ejected"):
        await drain(router, req("b"))


async def test_failure_after_first_token_is_not_retried() -> None:
    router, engines = await make_router(2)
    for e in engines:
        e.fail_after_first = True
    with pytest.raises(EngineFailed, match="mid-generation"):
        await drain(router, req("a", "t"))
    served = [rid for e in engines for rid in e.served]
    assert served == ["a"]  # never replayed: its first token was already streamed


async def test_in_flight_counts_follow_streams() -> None:
    router, engines = await make_router(1)
    engines[0].gate = asyncio.Event()
    task = asyncio.create_task(drain(router, req("a")))
    await asyncio.sleep(0.01)
    assert router.replicas[0].in_flight == 1
    engines[0].gate.set()
    await task
    assert router.replicas[0].in_flight == 0
