"""The gateway over real gRPC (127.0.0.1, free port) with the scripted engine:
every RPC, pause/resume drain, partial rollout versions, and bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from harnessrl.arrays import pack_i32, unpack_f32, unpack_i32
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from services.gateway.server import GatewayServer, create_server
from services.gateway.settings import Settings

SCRIPT = {
    "context_window": 100,
    "tool_call_format": "hermes",
    "threads": {
        "main": [
            {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
            {"content": "Done."},
        ],
        "*": [{"content": "A short title"}],
    },
}


async def start_gateway(tmp_path: Path, script: dict[str, Any] | None = None, **settings: Any) -> GatewayServer:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script or SCRIPT))
    return await create_server(
        Settings(engine=f"scripted:{path}", scripted_log_path=tmp_path / "gen.jsonl", shutdown_grace_s=0.5, **settings)
    )


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[GatewayServer, gateway_pb2_grpc.RolloutGatewayStub]]:
    server = await start_gateway(tmp_path, {**SCRIPT, "chunk_tokens": 3, "chunk_delay_s": 0.02}, pause_wait_s=0.5)
    async with connect(f"127.0.0.1:{server.port}") as channel:
        yield server, gateway_pb2_grpc.RolloutGatewayStub(channel)
    await server.stop(0.5)


def gen_request(prompt: list[int] | bytes, rid: str = "r1", trial: str = "t1", **sampling: Any) -> pb.GenerateRequest:
    ids = prompt if isinstance(prompt, bytes) else pack_i32(prompt)
    return pb.GenerateRequest(
        request_id=rid, trial_id=trial, thread="main", prompt_ids=ids, sampling=pb.SamplingParams(**sampling)
    )


async def generate(stub: gateway_pb2_grpc.RolloutGatewayStub, req: pb.GenerateRequest) -> list[pb.GenerateChunk]:
    return [chunk async for chunk in stub.Generate(req)]


def tokens(chunks: list[pb.GenerateChunk]) -> tuple[list[int], list[float], list[int]]:
    ids = np.concatenate([unpack_i32(c.tokens.ids) for c in chunks]).tolist()
    lps = np.concatenate([unpack_f32(c.tokens.logprobs) for c in chunks]).tolist()
    versions = np.concatenate([unpack_i32(c.tokens.policy_versions) for c in chunks]).tolist()
    assert all(set(c.tokens.mask) <= {1} for c in chunks)
    return ids, lps, versions


async def test_generate_streams_chunks_usage_and_logs(gateway, tmp_path: Path) -> None:
    _, stub = gateway
    chunks = await generate(stub, gen_request([1, 2, 3], temperature=1.0))
    assert len(chunks) > 2 and all(not c.finish_reason for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == "stop" and last.replica == "scripted-0"
    ids, lps, versions = tokens(chunks)
    assert ids[-1] == 2 and last.usage.prompt_tokens == 3 and last.usage.completion_tokens == len(ids)
    record = json.loads((tmp_path / "gen.jsonl").read_text().splitlines()[0])
    assert record["sampled_ids"] == ids and record["logprobs"] == pytest.approx(lps, abs=0)
    assert record["prompt_ids"] == [1, 2, 3] and versions == [0] * len(ids)


async def test_health_reports_model_window_and_replicas(gateway) -> None:
    _, stub = gateway
    health = await stub.Health(pb.GatewayHealthRequest())
    assert health.model == "SmolLM2-135M-Instruct" and health.context_window == 100
    assert not health.paused and health.policy_version == 0
    assert [(r.name, r.state, r.engine) for r in health.replicas] == [("scripted-0", "healthy", "scripted")]


async def test_pause_holds_in_flight_new_requests_wait_then_resume(gateway) -> None:
    _, stub = gateway
    call = stub.Generate(gen_request([1, 2], rid="held"))
    first = await call.read()
    assert len(unpack_i32(first.tokens.ids)) == 3
    assert (await stub.Pause(pb.PauseRequest(timeout_s=1.0))).held == 1
    assert (await stub.Health(pb.GatewayHealthRequest())).paused
    # A new request waits, then gets UNAVAILABLE (retryable) after pause_wait_s.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, gen_request([1], rid="late", trial="t2"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "paused" in info.value.details()
    # A request that arrives while paused and waits less than the bound goes through after Resume.
    waiting = asyncio.create_task(generate(stub, gen_request([1], rid="waits", trial="t3")))
    await asyncio.sleep(0.1)
    update = await stub.UpdateWeights(pb.UpdateWeightsRequest(version=1))
    assert update.version == 1
    assert (await stub.Resume(pb.ResumeRequest())).resumed == 1
    rest = [first] + [chunk async for chunk in call]
    ids, _, versions = tokens(rest)
    assert rest[-1].finish_reason == "stop" and ids[-1] == 2
    assert versions[:3] == [0, 0, 0] and versions[-1] == 1  # partial rollout: mixed versions
    assert set(tokens(await waiting)[2]) == {1}


async def test_abort_by_request_and_by_trial(tmp_path: Path) -> None:
    slow = {**SCRIPT, "chunk_tokens": 1, "chunk_delay_s": 0.1, "on_exhausted": "cycle"}
    server = await start_gateway(tmp_path, slow)
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            call = stub.Generate(gen_request([1], rid="a1", trial="ta"))
            await call.read()
            assert (await stub.Abort(pb.AbortRequest(request_id="a1"))).aborted == 1
            rest = [c async for c in call]
            assert rest[-1].finish_reason == "abort" and len(rest) < 5
            calls = [stub.Generate(gen_request([1], rid=f"b{i}", trial="tb")) for i in range(2)]
            for c in calls:
                await c.read()
            assert (await stub.Abort(pb.AbortRequest(trial_id="tb"))).aborted == 2
            for c in calls:
                assert [x async for x in c][-1].finish_reason == "abort"
            assert (await stub.Abort(pb.AbortRequest(trial_id="nobody"))).aborted == 0
    finally:
        await server.stop(0.5)


async def test_update_weights_version_must_increase(gateway) -> None:
    _, stub = gateway
    assert (await stub.UpdateWeights(pb.UpdateWeightsRequest(version=5))).version == 5
    for version in (5, 4):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UpdateWeights(pb.UpdateWeightsRequest(version=version))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not greater than the current version 5" in info.value.details()
    assert (await stub.Health(pb.GatewayHealthRequest())).policy_version == 5
    ids, _, versions = tokens(await generate(stub, gen_request([1])))
    assert versions == [5] * len(ids)


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (gen_request(b"\x01\x02\x03"), grpc.StatusCode.INVALID_ARGUMENT, "whole number of int32"),
        (gen_request([]), grpc.StatusCode.INVALID_ARGUMENT, "prompt_ids is empty"),
        (gen_request([1, -4]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
        (gen_request([1, 10**7]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
        (gen_request([1] * 100), grpc.StatusCode.OUT_OF_RANGE, "context_length_exceeded: the prompt has 100"),
        (gen_request([1], temperature=-1), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        (gen_request([1], temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        (gen_request([1], top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        (gen_request([1], top_k=-2), grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
        (gen_request([1], stop_token_ids=[-1]), grpc.StatusCode.INVALID_ARGUMENT, "stop_token_ids"),
    ],
)
async def test_bad_generate_input_gets_clear_status(gateway, request_, code, message) -> None:
    _, stub = gateway
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, request_)
    assert info.value.code() == code
    assert message in info.value.details()


async def test_bad_control_input_gets_clear_status(gateway) -> None:
    _, stub = gateway
    cases = [
        (stub.Abort(pb.AbortRequest(request_id="ghost")), grpc.StatusCode.NOT_FOUND, "no running request 'ghost'"),
        (stub.Abort(pb.AbortRequest()), grpc.StatusCode.INVALID_ARGUMENT, "request_id or a trial_id"),
        (stub.Pause(pb.PauseRequest(timeout_s=-1)), grpc.StatusCode.INVALID_ARGUMENT, "timeout_s"),
    ]
    for call, code, message in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == code and message in info.value.details()


async def test_duplicate_running_request_id_is_refused(gateway) -> None:
    _, stub = gateway
    call = stub.Generate(gen_request([1], rid="dup"))
    await call.read()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, gen_request([1], rid="dup"))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert [c async for c in call][-1].finish_reason == "stop"


async def test_max_tokens_and_window_cut_with_length(tmp_path: Path) -> None:
    server = await start_gateway(tmp_path)
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            chunks = await generate(stub, gen_request([1], max_tokens=4))
            assert len(tokens(chunks)[0]) == 4 and chunks[-1].finish_reason == "length"
            # 95 prompt tokens leave 5 in a 100-token window.
            chunks = await generate(stub, gen_request([1] * 95, rid="w", trial="t9"))
            assert len(tokens(chunks)[0]) == 5 and chunks[-1].finish_reason == "length"
    finally:
        await server.stop(0.5)


async def test_many_concurrent_sessions(tmp_path: Path) -> None:
    server = await start_gateway(tmp_path, {**SCRIPT, "context_window": 32768})
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            results = await asyncio.gather(
                *(generate(stub, gen_request(list(range(1, 200)), rid=f"c{i}", trial=f"t{i}")) for i in range(64))
            )
            first = tokens(results[0])[0]
            assert all(tokens(r)[0] == first for r in results)
    finally:
        await server.stop(0.5)


async def test_waiting_request_can_be_aborted_and_waiting_is_bounded(tmp_path: Path) -> None:
    server = await start_gateway(tmp_path, pause_wait_s=30, max_waiting=1)
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            await stub.Pause(pb.PauseRequest(timeout_s=1))
            waiting = asyncio.create_task(generate(stub, gen_request([1], rid="w1", trial="a")))
            await asyncio.sleep(0.2)
            # The bound: one request may wait; the next is refused at once, retryable.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await generate(stub, gen_request([1], rid="w2", trial="b"))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "already wait" in info.value.details()
            # Abort wakes the waiting request without waiting for Resume.
            assert (await stub.Abort(pb.AbortRequest(request_id="w1"))).aborted == 1
            chunks = await asyncio.wait_for(waiting, 5)
            assert chunks[-1].finish_reason == "abort" and not tokens(chunks)[0]
            assert (await stub.Health(pb.GatewayHealthRequest())).paused
            await stub.Resume(pb.ResumeRequest())
            assert tokens(await generate(stub, gen_request([1], rid="w3", trial="c")))[0][-1] == 2
    finally:
        await server.stop(0.5)
