"""``stream_interval_ms``: the gateway coalesces a reply's streamed tokens into fewer
messages; the first token and the finish go at once, every id, logprob and version
arrives once and in order, and 0 sends every engine chunk as it comes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np

from services.gateway.engines.base import F32, I32, Chunk, GenerateInput, Sampling
from services.gateway.service import GatewayService
from services.gateway.settings import Settings
from tests.unit.test_gateway_router import FakeEngine


class Ticking(FakeEngine):
    """Ten one-token chunks, ``gap_s`` apart, then the finish with a cached count."""

    def __init__(self, gap_s: float) -> None:
        super().__init__("tick")
        self.gap_s = gap_s

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        for i in range(10):
            yield Chunk(np.asarray([100 + i], I32), np.asarray([-i / 10], F32), np.asarray([i // 5], I32))
            await asyncio.sleep(self.gap_s)
        yield Chunk.empty("stop", cached_prompt_tokens=3)


async def stream(interval_ms: float, gap_s: float) -> list[tuple[list[int], list[float], list[int], str]]:
    settings = Settings(engine="local", health_interval_s=3600, stream_interval_ms=interval_ms)
    service = GatewayService([Ticking(gap_s)], settings)
    await service.start()
    try:
        prompt = np.asarray([1, 2], I32)
        return [
            (o.chunk.ids.tolist(), o.chunk.logprobs.tolist(), o.chunk.versions.tolist(), o.chunk.finish_reason)
            async for o in service.generate("r", "t", "main", prompt, Sampling(max_tokens=10))
        ]
    finally:
        await service.close()


async def test_tokens_within_the_window_go_together_with_the_first_and_the_finish_alone() -> None:
    out = await stream(interval_ms=60_000, gap_s=0.001)
    assert [ids for ids, *_ in out] == [[100], list(range(101, 110))]  # first at once; the rest with the finish
    assert out[-1][3] == "stop"
    assert [x for _, lps, *_ in out for x in lps] == np.asarray([-i / 10 for i in range(10)], F32).tolist()
    assert [x for *_, versions, _ in out for x in versions] == [0] * 5 + [1] * 5


async def test_a_window_shorter_than_the_gap_and_zero_change_nothing() -> None:
    for interval_ms in (0.0, 1.0):
        out = await stream(interval_ms=interval_ms, gap_s=0.01)
        assert [ids for ids, *_ in out] == [[100 + i] for i in range(10)] + [[]]


class Held(FakeEngine):
    """Two tokens 10 ms apart, then nothing until released (a paused engine); records its close."""

    def __init__(self) -> None:
        super().__init__("held")
        self.release = asyncio.Event()
        self.closed = False

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        try:
            for i in (100, 101):
                yield Chunk(np.asarray([i], I32), np.asarray([-0.5], F32), np.asarray([0], I32))
                await asyncio.sleep(0.01)
            await self.release.wait()
            yield Chunk.empty("stop")
        finally:
            self.closed = True


async def test_a_held_token_goes_when_its_window_ends_and_closing_the_stream_closes_the_engine() -> None:
    engine = Held()
    service = GatewayService([engine], Settings(engine="local", health_interval_s=3600, stream_interval_ms=50))
    await service.start()
    try:
        stream = service.generate("r", "t", "main", np.asarray([1], I32), Sampling(max_tokens=10))
        first = await anext(stream)
        held = await asyncio.wait_for(anext(stream), 2)  # no new token: the window's end sends it
        assert first.chunk.ids.tolist() == [100] and held.chunk.ids.tolist() == [101]
        assert not held.chunk.finish_reason
        await stream.aclose()  # the proxy went away mid-reply
        assert engine.closed
    finally:
        await service.close()


async def test_tokens_that_arrive_after_a_window_ended_are_read_on() -> None:
    out = await stream(interval_ms=10, gap_s=0.003)  # ~30 ms of tokens: a few windows
    assert [i for ids, *_ in out for i in ids] == list(range(100, 110)) and out[-1][3] == "stop"
    assert 2 <= len(out) < 11
