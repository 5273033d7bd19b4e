"""The vLLM engine's stream reader: events that arrive in one network read become one
chunk (ids, logprobs, versions concatenated in order), an event split across reads is
joined, and a server's SSE error is an engine error. Against a real HTTP server on
127.0.0.1 that writes vLLM's event lines in chosen pieces, read by the engine's own
HTTP/1.1 client (``vllm_http``)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from services.gateway.engines.base import Chunk
from services.gateway.engines.vllm_http import HttpPool, sse_batches
from services.gateway.engines.vllm_pool import merge_chunks
from services.gateway.errors import EngineFailed


def event(ids: list[int], lps: list[float], finish: str | None = None) -> bytes:
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


async def read_batches(pieces: list[bytes]) -> list[list[dict]]:
    """Serves ``pieces`` as separate chunked-encoding writes (a pause between them), reads them back."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}", {}, 10)
    try:
        response = await pool.stream_post("/v1/completions", {"stream": True})
        return [batch async for batch in sse_batches(response.aiter_bytes())]
    finally:
        pool.close()
        server.close()


def test_events_of_one_read_come_together_and_a_split_event_is_joined() -> None:
    two = event([5], [-0.5]) + event([6], [-0.25])
    split = event([7], [-1.0], "stop")
    pieces = [two, split[:9], split[9:] + b"data: [DONE]\n\n", event([99], [0.0])]  # nothing after [DONE] counts
    batches = asyncio.run(read_batches(pieces))
    assert [[e["choices"][0]["token_ids"] for e in b] for b in batches] == [[[5], [6]], [[7]]]


def test_a_stream_error_event_is_an_engine_error() -> None:
    with pytest.raises(EngineFailed, match="overloaded"):
        asyncio.run(read_batches([b'data: {"error": {"message": "overloaded"}}\n\n']))


def test_merged_chunks_keep_every_array_in_order() -> None:
    a = Chunk(np.asarray([1, 2], np.int32), np.asarray([-0.1, -0.2], np.float32), np.asarray([0, 0], np.int32))
    b = Chunk(np.asarray([3], np.int32), np.asarray([-0.3], np.float32), np.asarray([1], np.int32))
    (merged,) = merge_chunks([a, b])
    assert merged.ids.tolist() == [1, 2, 3] and merged.versions.tolist() == [0, 0, 1]
    assert merged.logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert merge_chunks([a]) == [a] and merge_chunks([]) == []
    a.top_ids, a.top_logprobs = np.zeros((2, 1), np.int32), np.zeros((2, 1), np.float32)
    assert merge_chunks([a, b]) == [a, b]  # top rows on only one: kept apart, each row with its token
