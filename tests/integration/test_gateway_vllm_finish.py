"""A reply's last tokens go out with its finish: the vLLM engine yields one chunk per
network read while the reply runs, and its last tokens in one chunk that carries the
finish reason and the cached-prompt count (read from the usage event after them),
never an empty finish chunk after them (one message fewer per reply for the gateway
and the proxy); a whole reply asks vLLM for events of its whole budget, a reply whose
caller watches no stop string for events of vllm_stream_interval_wide. A real HTTP
server stands in for the replica, in the token endpoint's wire format, one event per write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from fastapi import Request
from fastapi.responses import StreamingResponse

from services.gateway.engines.base import Chunk, GenerateInput, Sampling
from services.gateway.engines.vllm_pool import VllmEngine
from services.gateway.engines.vllm_tokens import PATH
from services.gateway.settings import Settings
from tests.asgi_support import serve
from tests.integration.test_gateway_vllm_tls import replica_app

pytestmark = pytest.mark.asyncio


def token_events(parts: list[list[int]], finish: str, cached: int) -> list[dict[str, Any]]:
    n, out = sum(len(p) for p in parts), []
    for i, ids in enumerate(parts):
        last = i == len(parts) - 1
        choice: dict[str, Any] = {
            "token_ids": ids,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids]},
            "finish_reason": finish if last else None,
        }
        if last:
            choice["weight_versions"] = [{"version": "default", "start": 0, "end": n}]
        out.append({"choices": [choice]})
    return [*out, {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": cached}}}]


async def reply(
    parts: list[list[int]],
    finish: str = "stop",
    cached: int = 2,
    whole: bool = False,
    bodies: list[Any] | None = None,
    wide: bool = False,
    **settings: Any,
) -> list[Chunk]:
    app = replica_app([])

    @app.post(PATH)
    async def generate(request: Request) -> StreamingResponse:
        (bodies if bodies is not None else []).append(await request.json())

        async def events() -> AsyncIterator[str]:
            for event in token_events(parts, finish, cached):
                yield f"data: {json.dumps(event)}\n\n"
                await asyncio.sleep(0.02)  # each event its own read
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async with serve(app) as url:
        engine = VllmEngine(Settings.model_validate({"engine": "vllm", "vllm_urls": [url]} | settings), url)
        await engine.start()
        try:
            request = GenerateInput("r", "t", "main", np.array([1, 2, 3], np.int32), Sampling(), 64, whole, wide)
            return [c async for c in engine.generate(request)]
        finally:
            await engine.close()


async def test_the_last_tokens_carry_the_finish_and_the_cached_count() -> None:
    parts = [[5], list(range(100, 116)), [7, 8, 9]]
    chunks = await reply(parts, cached=2)
    assert [c.ids.tolist() for c in chunks] == parts
    assert [c.finish_reason for c in chunks] == ["", "", "stop"]
    assert chunks[-1].cached_prompt_tokens == 2
    assert all((c.versions == 0).all() and (c.logprobs == np.float32(-0.5)).all() for c in chunks)


async def test_a_reply_that_fits_one_event_is_one_chunk() -> None:
    chunks = await reply([[5, 6]], finish="length", cached=0)
    assert [(c.ids.tolist(), c.finish_reason) for c in chunks] == [([5, 6], "length")]


async def test_a_finish_without_tokens_is_an_empty_finish_chunk() -> None:
    chunks = await reply([[5], []], cached=1)
    assert [(c.ids.tolist(), c.finish_reason, c.cached_prompt_tokens) for c in chunks] == [
        ([5], "", 0),
        ([], "stop", 1),
    ]


async def test_a_whole_reply_asks_vllm_for_events_of_its_whole_budget() -> None:
    bodies: list[Any] = []
    await reply([[5], [6]], bodies=bodies)
    await reply([[5], [6]], whole=True, bodies=bodies)
    assert [b["sampling_params"]["stream_interval"] for b in bodies] == [16, 64]  # the setting; the budget


async def test_a_reply_without_stop_strings_asks_vllm_for_wide_events() -> None:
    bodies: list[Any] = []
    parts = [[5], list(range(100, 164)), [6]]
    chunks = await reply(parts, wide=True, bodies=bodies)
    assert [c.ids.tolist() for c in chunks] == parts  # the same chunks as vLLM's events, whatever their width
    await reply([[5], [6]], wide=True, bodies=bodies, vllm_stream_interval_wide=32)
    await reply([[5], [6]], wide=True, bodies=bodies, vllm_stream_interval=128)  # never narrower than the setting
    await reply([[5], [6]], whole=True, wide=True, bodies=bodies, vllm_stream_interval_wide=32)  # whole: its budget
    assert [b["sampling_params"]["stream_interval"] for b in bodies] == [64, 32, 128, 64]
