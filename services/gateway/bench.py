"""``harnessrl bench gateway``: what the gateway costs on top of its engines.

Scripted engine: turns per second at several concurrencies, straight to the
engine (the baseline, in-process) and through the gateway over gRPC. Local
engine (optional, slow): decode tokens per second alone and batched.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harnessrl.arrays import pack_i32
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.engines.base import Engine, GenerateInput, Sampling
from services.gateway.server import create_server
from services.gateway.settings import Settings

SCRIPT = {
    "context_window": 1_000_000,
    "threads": {
        "main": [
            {
                "content": "Let me look at the repository.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
            }
        ]
    },
}


@dataclass
class Row:
    what: str
    concurrency: int
    context: int
    turns: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0


async def _sessions(concurrency: int, turns: int, one_turn: Callable[[int, int], Awaitable[int]]) -> tuple[float, int]:
    """Runs ``concurrency`` sessions of ``turns`` calls; returns (seconds, sum of what the calls returned)."""
    counted = 0

    async def session(i: int) -> None:
        nonlocal counted
        for t in range(turns):
            n = await one_turn(i, t)
            counted += n

    started = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(concurrency)))
    return time.perf_counter() - started, counted


def _direct(engine: Engine, prompt: npt.NDArray[np.int32], tag: str) -> Callable[[int, int], Awaitable[int]]:
    async def turn(i: int, t: int) -> int:
        request = GenerateInput(f"{tag}-{i}-{t}", f"t{i}", "main", prompt, Sampling(), 1000)
        async for _ in engine.generate(request):
            pass
        return 1

    return turn


def _via_grpc(
    stub: gateway_pb2_grpc.RolloutGatewayStub, packed: bytes, tag: str
) -> Callable[[int, int], Awaitable[int]]:
    async def turn(i: int, t: int) -> int:
        request = gateway_pb2.GenerateRequest(
            request_id=f"{tag}-{i}-{t}", trial_id=f"t{i}", thread="main", prompt_ids=packed
        )
        async for _ in stub.Generate(request):
            pass
        return 1

    return turn


async def bench_scripted(concurrencies: list[int], contexts: list[int], total_turns: int) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.json"
        path.write_text(json.dumps(SCRIPT))
        server = await create_server(Settings.model_validate({"engine": f"scripted:{path}"}))
        engine = server.service.router.replicas[0].engine
        try:
            async with connect(f"127.0.0.1:{server.port}") as channel:
                stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
                for context in contexts:
                    prompt = ((np.arange(context) % 40_000) + 1).astype(np.int32)
                    for c in concurrencies:
                        turns = max(1, total_turns // c)
                        seconds, n = await _sessions(c, turns, _direct(engine, prompt, f"d{context}-{c}"))
                        rows.append(Row("scripted engine (baseline)", c, context, n, seconds))
                        seconds, n = await _sessions(c, turns, _via_grpc(stub, pack_i32(prompt), f"g{context}-{c}"))
                        rows.append(Row("gateway gRPC -> scripted", c, context, n, seconds))
        finally:
            await server.stop(0.1)
    return rows


def _local_turn(engine: Engine, prompt: npt.NDArray[np.int32], new_tokens: int) -> Callable[[int, int], Awaitable[int]]:
    async def turn(i: int, t: int) -> int:
        sampling = Sampling(temperature=1.0, max_tokens=new_tokens)
        produced = 0
        async for chunk in engine.generate(GenerateInput(f"l{i}-{t}", "", "main", prompt, sampling, new_tokens)):
            produced += len(chunk)
        return produced

    return turn


async def bench_local(batches: list[int], new_tokens: int, prompt_tokens: int) -> list[Row]:
    """Decode throughput of the local engine (the ``turns`` column counts tokens)."""
    server = await create_server(Settings.model_validate({"engine": "local", "max_batch_size": max(batches)}))
    engine = server.service.router.replicas[0].engine
    prompt = ((np.arange(prompt_tokens) % 40_000) + 1).astype(np.int32)
    rows = []
    try:
        for batch in batches:
            seconds, produced = await _sessions(batch, 1, _local_turn(engine, prompt, new_tokens))
            rows.append(Row("local engine (tokens)", batch, prompt_tokens, produced, seconds))
    finally:
        await server.stop(0.1)
    return rows
