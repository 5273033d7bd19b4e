"""A vLLM replica that does not serve the token endpoint (started without
--enable-scale-out: 403; an older vLLM: 404) still serves every request: the
first falls back to per-token events from /v1/completions, and later ones go
there at once. A real HTTP server stands in for the replica's API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.vllm_pool import VllmEngine
from services.gateway.engines.vllm_tokens import PATH
from services.gateway.settings import Settings
from tests.asgi_support import serve
from tests.integration.test_gateway_vllm_finish import token_events
from tests.integration.test_gateway_vllm_tls import REPLY, replica_app

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("status", [403, 404])
async def test_a_replica_without_the_token_endpoint_gets_per_token_requests(status: int) -> None:
    seen: list[dict[str, Any]] = []
    asked: list[int] = []
    app = replica_app(seen)

    @app.post(PATH)
    async def disabled() -> JSONResponse:
        asked.append(status)
        return JSONResponse({"error": {"message": "Scale-out endpoints are disabled."}}, status_code=status)

    async with serve(app) as url:
        engine = VllmEngine(Settings.model_validate({"engine": "vllm", "vllm_urls": [url]}), url)
        await engine.start()
        try:
            for rid in ("a", "b"):
                request = GenerateInput(rid, "t", "main", np.array([1, 2], np.int32), Sampling(), 8)
                chunks = [c async for c in engine.generate(request)]
                assert np.concatenate([c.ids for c in chunks]).tolist() == [t for ids in REPLY for t in ids]
                assert chunks[-1].finish_reason == "stop"
        finally:
            await engine.close()
    assert asked == [status]  # asked once, then never again
    assert [body["request_id"] for body in seen] == ["a", "b"]
    assert all("stream_interval" not in body for body in seen)


async def test_a_request_aborted_before_the_refusal_is_not_run_again() -> None:
    seen: list[dict[str, Any]] = []
    app = replica_app(seen)
    asked = asyncio.Event()

    @app.post(PATH)
    async def disabled() -> JSONResponse:
        asked.set()
        await asyncio.sleep(0.3)  # the abort lands while the refusal is on its way
        return JSONResponse({"error": {"message": "Scale-out endpoints are disabled."}}, status_code=403)

    async with serve(app) as url:
        engine = VllmEngine(Settings.model_validate({"engine": "vllm", "vllm_urls": [url]}), url)
        await engine.start()
        try:
            request = GenerateInput("ab", "t", "main", np.array([1, 2], np.int32), Sampling(), 8)

            async def abort_when_asked() -> bool:
                await asked.wait()
                return await engine.abort("ab")

            aborting = asyncio.ensure_future(abort_when_asked())
            chunks = [c async for c in engine.generate(request)]
            assert await aborting
        finally:
            await engine.close()
    assert [c.finish_reason for c in chunks] == ["abort"] and seen == []


async def test_the_token_endpoint_is_asked_again_after_a_bounded_backoff() -> None:
    """One refusal (a replica restarting with other flags, a proxy briefly answering 403)
    does not downgrade the replica for good: within the backoff requests go per token,
    after it the next request probes the token endpoint; a refusal again doubles the
    wait (capped), and once it serves, requests stay on it."""
    seen: list[dict[str, Any]] = []
    answers = [403, 403, 200, 200]  # what the token endpoint answers, in turn
    asked: list[int] = []
    app = replica_app(seen)

    @app.post(PATH)
    async def generate(request: Request) -> Any:
        status = answers[len(asked)]
        asked.append(status)
        if status != 200:
            return JSONResponse({"error": {"message": "Scale-out endpoints are disabled."}}, status_code=status)

        async def events() -> AsyncIterator[str]:
            for event in token_events([[5], [6, 7]], "stop", 0):
                yield f"data: {json.dumps(event)}\n\n"
                await asyncio.sleep(0)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def ids(engine: VllmEngine, rid: str) -> list[int]:
        request = GenerateInput(rid, "t", "main", np.array([1, 2], np.int32), Sampling(), 8)
        return np.concatenate([c.ids for c in [c async for c in engine.generate(request)]]).tolist()

    per_token, wide = [t for ids in REPLY for t in ids], [5, 6, 7]
    async with serve(app) as url:
        engine = VllmEngine(Settings.model_validate({"engine": "vllm", "vllm_urls": [url]}), url)
        engine.token_retry_s, engine.token_retry_max_s = 3600.0, 7200.0
        await engine.start()
        try:
            assert await ids(engine, "a") == per_token  # refused: falls back
            assert await ids(engine, "b") == per_token and asked == [403], "within the backoff: no probe"
            assert engine._tokens_backoff == 3600.0
            engine._tokens_retry_at = 0.0  # the backoff has passed
            assert await ids(engine, "c") == per_token and asked == [403, 403], "the probe, refused again"
            assert engine._tokens_backoff == 7200.0, "doubled, capped at token_retry_max_s"
            engine._tokens_retry_at = 0.0
            assert await ids(engine, "d") == wide and engine._tokens_backoff == 0.0, "served: back on it"
            assert await ids(engine, "e") == wide and asked == [403, 403, 200, 200]
        finally:
            await engine.close()
    assert [body["request_id"] for body in seen] == ["a", "b", "c"]
