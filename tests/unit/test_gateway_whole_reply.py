"""``whole``: a caller that takes the reply only at its end gets it from the gateway in
one message, with every id, logprob and version in order, the finish and the usage;
the engine is told (so vLLM can send fewer events); a reply that fails sends nothing;
an Abort finds the replica while nothing has been sent (a whole reply, a prefill)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import pytest

from services.gateway.engines.base import F32, I32, Chunk, GenerateInput, Sampling
from services.gateway.service import GatewayService
from services.gateway.settings import Settings
from tests.unit.test_gateway_router import FakeEngine
from tests.unit.test_gateway_stream_interval import Ticking

pytestmark = pytest.mark.asyncio


class Seen(Ticking):
    def __init__(self) -> None:
        super().__init__(gap_s=0.001)
        self.requests: list[GenerateInput] = []

    def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        self.requests.append(request)
        return super().generate(request)


async def outputs(engine: FakeEngine, whole: bool, interval_ms: float = 0.0) -> list[Chunk]:
    settings = Settings(engine="local", health_interval_s=3600, stream_interval_ms=interval_ms)
    service = GatewayService([engine], settings)
    await service.start()
    try:
        stream = service.generate("r", "t", "main", np.asarray([1, 2], I32), Sampling(max_tokens=10), whole=whole)
        return [o.chunk async for o in stream]
    finally:
        await service.close()


async def test_a_whole_reply_is_one_message_with_what_a_stream_carries() -> None:
    engine = Seen()
    streamed, whole = await outputs(engine, whole=False), await outputs(engine, whole=True)
    assert len(streamed) == 11 and len(whole) == 1
    for field in ("ids", "logprobs", "versions"):
        assert np.concatenate([getattr(c, field) for c in streamed]).tolist() == getattr(whole[0], field).tolist()
    assert whole[0].finish_reason == "stop" and whole[0].cached_prompt_tokens == 3
    assert [r.whole for r in engine.requests] == [False, True]


async def test_whole_wins_over_a_stream_window() -> None:
    out = await outputs(Seen(), whole=True, interval_ms=1.0)
    assert [c.ids.tolist() for c in out] == [list(range(100, 110))]


async def test_a_whole_reply_that_fails_sends_nothing_before_the_error() -> None:
    engine = FakeEngine("dies")
    engine.fail_after_first = True
    service = GatewayService([engine], Settings(engine="local", health_interval_s=3600, max_attempts=1))
    await service.start()
    got: list[Chunk] = []
    try:
        with pytest.raises(Exception, match="died mid-reply"):
            async for out in service.generate("r", "t", "main", np.asarray([1], I32), Sampling(), whole=True):
                got.append(out.chunk)
        assert got == []
    finally:
        await service.close()


class Abortable(FakeEngine):
    """Samples one token (or, ``prefill``, none yet), then runs until aborted."""

    def __init__(self, prefill: bool) -> None:
        super().__init__("abortable")
        self.prefill = prefill
        self.aborted: list[str] = []
        self.stop = asyncio.Event()
        self.running = asyncio.Event()

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        self.running.set()
        if not self.prefill:
            yield Chunk(np.asarray([7], I32), np.asarray([-0.5], F32), np.asarray([0], I32))
        await self.stop.wait()
        yield Chunk.empty("abort")

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        self.stop.set()
        return True


@pytest.mark.parametrize(("prefill", "whole"), [(False, True), (True, False)], ids=["whole-reply", "in-prefill"])
async def test_abort_reaches_the_engine_before_anything_was_sent(prefill: bool, whole: bool) -> None:
    """Nothing of the reply has passed the gateway yet (a whole reply holds it, a prefill
    has sampled nothing): the abort still finds the replica and stops the engine."""
    engine = Abortable(prefill)
    service = GatewayService([engine], Settings(engine="local", health_interval_s=3600))
    await service.start()
    try:
        stream = service.generate("r", "t", "main", np.asarray([1], I32), Sampling(), whole=whole)
        reading = asyncio.ensure_future(anext(stream))
        await asyncio.wait_for(engine.running.wait(), 2)
        assert await service.abort("r", "") == 1 and engine.aborted == ["r"]
        first = await asyncio.wait_for(reading, 2)
        assert first.chunk.ids.tolist() == ([] if prefill else [7]) and first.chunk.finish_reason == "abort"
        await stream.aclose()
    finally:
        await service.close()
