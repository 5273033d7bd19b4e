"""Routed experts (R3) from the local engine on a tiny random Qwen3-MoE: each
reply token carries the experts every layer chose when that token was fed
forward, exactly as a teacher-forced pass chooses them; the last row is zeros."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harnessrl.arrays import pack_i32, unpack_i32, unpack_routes
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.local import LocalEngine
from services.gateway.routes import RouteRecorder
from services.gateway.server import create_server
from services.gateway.settings import Settings
from tests.test_gateway_support import teacher_forced, tiny_moe

PROMPT = [1, 520, 9531, 198, 30, 31, 32]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("moe"))


@torch.inference_mode()
def teacher_forced_routes(model, tokens: list[int]) -> np.ndarray:
    recorder = RouteRecorder(model)
    with recorder.recording():
        model(input_ids=torch.tensor([tokens]))
    return recorder.rows()


async def test_routes_match_a_teacher_forced_pass(moe_dir: Path) -> None:
    engine = LocalEngine(Settings(model_path=moe_dir, max_batch_size=4))
    await engine.start()
    try:
        sampling = Sampling(temperature=1.0, seed=5, max_tokens=6, return_routed_experts=True)
        plain = Sampling(temperature=1.0, seed=5, max_tokens=6)
        runs = {}
        for name, s in (("routes", sampling), ("plain", plain)):
            request = GenerateInput(name, "", "main", np.asarray(PROMPT, np.int32), s, 6)
            runs[name] = [c async for c in engine.generate(request)]
        chunks = runs["routes"]
        ids = np.concatenate([c.ids for c in chunks]).tolist()
        routes = np.concatenate([c.routed_experts for c in chunks if c.routed_experts is not None])
        assert routes.shape == (len(ids), 2, 2) and routes.dtype == np.uint8
        assert not routes[-1].any()
        reference = teacher_forced_routes(engine.model, PROMPT + ids[:-1])[len(PROMPT) :]
        assert len(np.unique(reference.reshape(len(reference), -1), axis=0)) > 1  # routes vary: a real check
        assert np.array_equal(np.sort(routes[:-1], axis=-1), np.sort(reference, axis=-1))
        lps = np.concatenate([c.logprobs for c in chunks]).astype(np.float64)
        assert np.max(np.abs(lps - teacher_forced(engine.model, PROMPT, ids, sampling))) < 1e-4
        # Same seed without routes: same tokens, no routes.
        assert np.concatenate([c.ids for c in runs["plain"]]).tolist() == ids
        assert all(c.routed_experts is None for c in runs["plain"])
    finally:
        await engine.close()


async def test_routes_cross_grpc(moe_dir: Path) -> None:
    server = await create_server(Settings(engine="local", model_path=moe_dir, shutdown_grace_s=0.5))
    try:
        async with connect(f"127.0.0.1:{server.port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            params = pb.SamplingParams(temperature=0.0, max_tokens=4, return_routed_experts=True)
            request = pb.GenerateRequest(request_id="r", prompt_ids=pack_i32(PROMPT), sampling=params)
            chunks = [c async for c in stub.Generate(request)]
        rows = [unpack_routes(c.tokens.routed_experts) for c in chunks]
        ids = [i for c in chunks for i in unpack_i32(c.tokens.ids).tolist()]
        routes = np.concatenate([r for r in rows if r is not None])
        assert routes.shape == (len(ids), 2, 2) == (4, 2, 2)
    finally:
        await server.stop(0.5)
