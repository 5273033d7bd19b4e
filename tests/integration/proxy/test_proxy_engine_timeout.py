"""``engine_timeout_s`` bounds the proxy's wait for the gateway's next chunk, not a
whole Generate call: a long reply that keeps streaming, and one held by a weight
update (the gateway paused, partial rollout) for longer than the timeout, both
complete; only a silence of the timeout while the gateway is not paused fails.
Real gateway (gRPC, scripted engine) and the proxy's real gateway client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harnessrl.arrays import unpack_i32
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from services.proxy.errors import EngineUnavailable
from services.proxy.gateway_client import EngineClient
from tests.integration.test_gateway_grpc import SCRIPT, gen_request, start_gateway

TIMEOUT_S = 1.0  # generous: a loaded 2-core machine must not stall a chunk this long


async def reply(tmp_path: Path, delay_s: float, pause_s: float = 0.0) -> list[int]:
    """The ids of one reply through the proxy's client; with ``pause_s`` the gateway is
    paused after the first chunk for that long, then resumed."""
    script = {**SCRIPT, "chunk_tokens": 1, "chunk_delay_s": delay_s}
    server = await start_gateway(tmp_path, script, pause_wait_s=30)
    client = EngineClient(f"127.0.0.1:{server.port}", None, TIMEOUT_S, tracing=False)
    ids: list[int] = []
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            control = gateway_pb2_grpc.RolloutGatewayStub(channel)
            async for chunk in client.generate(gen_request([1, 2, 3], temperature=1.0)):
                ids += unpack_i32(chunk.tokens.ids).tolist()
                if pause_s and len(ids) == 1:
                    await control.Pause(pb.PauseRequest(timeout_s=5))
                    await asyncio.sleep(pause_s)  # the weight update, longer than engine_timeout_s
                    await control.Resume(pb.ResumeRequest())
    finally:
        await client.close()
        await server.stop(0.5)
    return ids


async def test_a_reply_longer_than_the_timeout_that_keeps_streaming_completes(tmp_path: Path) -> None:
    ids = await reply(tmp_path, delay_s=0.1)
    assert len(ids) * 0.1 > TIMEOUT_S and ids[-1] == 2, "the whole reply, past engine_timeout_s in total"


async def test_a_reply_held_by_a_weight_update_longer_than_the_timeout_completes(tmp_path: Path) -> None:
    ids = await reply(tmp_path, delay_s=0.0, pause_s=2.5 * TIMEOUT_S)
    assert len(ids) > 1 and ids[-1] == 2


async def test_a_silent_engine_that_is_not_paused_still_times_out(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match="engine_timeout_s"):
        await reply(tmp_path, delay_s=3 * TIMEOUT_S)
