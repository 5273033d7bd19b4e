"""The gateway over real gRPC with the real default model (SmolLM2-135M, fp32 CPU):
sampled logprobs equal a teacher-forced forward pass, batching and KV reuse
keep them exact, and a reply spanning UpdateWeights carries both versions.
Replies are kept to a few tokens so the suite stays fast."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
import torch
from safetensors.torch import save_file

from harnessrl import paths
from harnessrl.arrays import pack_i32, unpack_f32, unpack_i32
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from services.gateway.engines.base import Sampling
from services.gateway.engines.local import LocalEngine
from services.gateway.server import GatewayServer, create_server
from services.gateway.settings import Settings
from tests.test_gateway_support import PROMPT, teacher_forced

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not (paths.default_model_dir() / "config.json").exists(), reason="run scripts/setup first"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[tuple[GatewayServer, gateway_pb2_grpc.RolloutGatewayStub, LocalEngine]]:
    server = await create_server(Settings(engine="local", shutdown_grace_s=0.5, max_batch_size=4))
    engine = server.service.router.replicas[0].engine
    assert isinstance(engine, LocalEngine)
    async with connect(f"127.0.0.1:{server.port}") as channel:
        yield server, gateway_pb2_grpc.RolloutGatewayStub(channel), engine
    await server.stop(0.5)


def request(prompt: list[int], rid: str, trial: str = "", **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        trial_id=trial,
        thread="main",
        prompt_ids=pack_i32(prompt),
        sampling=pb.SamplingParams(**sampling),
    )


async def generate(stub, req: pb.GenerateRequest) -> tuple[list[int], np.ndarray, list[int], pb.GenerateChunk]:
    chunks = [c async for c in stub.Generate(req)]
    ids = np.concatenate([unpack_i32(c.tokens.ids) for c in chunks]).tolist()
    lps = np.concatenate([unpack_f32(c.tokens.logprobs) for c in chunks]).astype(np.float64)
    versions = np.concatenate([unpack_i32(c.tokens.policy_versions) for c in chunks]).tolist()
    return ids, lps, versions, chunks[-1]


async def test_health_reports_the_real_model(gateway) -> None:
    _, stub, _ = gateway
    health = await stub.Health(pb.GatewayHealthRequest())
    assert health.model == "SmolLM2-135M-Instruct" and health.context_window == 8192
    assert [(r.state, r.engine) for r in health.replicas] == [("healthy", "local")]


async def test_sampled_logprobs_match_teacher_forced_fp32(gateway) -> None:
    """Concurrent (batched) requests with different sampling, then a second turn
    served from the trial's KV cache: every logprob within 1e-3 of a full forward."""
    _, stub, engine = gateway
    cases = [
        ("a", dict(temperature=1.0, seed=1)),
        ("b", dict(temperature=0.7, top_p=0.9, seed=2)),
        ("c", dict(temperature=0.8, top_k=40, seed=3)),
    ]
    results = await asyncio.gather(
        *(generate(stub, request(PROMPT, f"lp-{t}", trial=f"lp-{t}", max_tokens=6, **s)) for t, s in cases)
    )
    for (_, s), (ids, lps, versions, last) in zip(cases, results, strict=True):
        assert len(ids) == last.usage.completion_tokens and versions == [0] * len(ids)
        delta = np.max(np.abs(lps - teacher_forced(engine.model, PROMPT, ids, Sampling(**s))))
        assert delta <= 1e-3, (s, delta)
    # Turn 2 of trial "lp-a": the prompt extends turn 1, so its KV cache is reused.
    ids1 = results[0][0]
    prompt2 = PROMPT + ids1 + [2, 198, 1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198]
    ids, lps, _, last = await generate(
        stub, request(prompt2, "lp-a2", trial="lp-a", max_tokens=5, temperature=1.0, seed=4)
    )
    assert last.usage.cached_prompt_tokens == len(PROMPT) + len(ids1) - 1
    delta = np.max(np.abs(lps - teacher_forced(engine.model, prompt2, ids, Sampling(temperature=1.0))))
    assert delta <= 1e-3


async def test_prompt_past_the_window_is_out_of_range(gateway) -> None:
    _, stub, _ = gateway
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, request([1] * 8192, "too-long"))
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "context window is 8192" in info.value.details()


async def test_reply_continues_across_update_weights(gateway, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Partial rollout: pause mid-reply, load new weights, resume; the reply
    finishes and its tokens carry version 0, then version 1."""
    _, stub, engine = gateway
    checkpoint = tmp_path_factory.mktemp("ckpt")
    params = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    params["model.norm.weight"] *= 1.05  # a real change of the output distribution
    save_file(params, str(checkpoint / "model.safetensors"))

    call = stub.Generate(request(PROMPT, "partial", trial="partial", max_tokens=10, temperature=0.0))
    first = await call.read()
    assert (await stub.Pause(pb.PauseRequest(timeout_s=10))).held == 1
    update = await stub.UpdateWeights(pb.UpdateWeightsRequest(version=1, checkpoint_path=str(checkpoint)))
    assert update.version == 1 and update.seconds > 0
    assert (await stub.Resume(pb.ResumeRequest())).resumed == 1
    chunks = [first] + [c async for c in call]
    versions = np.concatenate([unpack_i32(c.tokens.policy_versions) for c in chunks]).tolist()
    assert chunks[-1].finish_reason == "length" and len(versions) == 10
    switch = versions.index(1)
    assert switch > 0 and versions == [0] * switch + [1] * (10 - switch)
    assert torch.equal(engine.model.model.norm.weight, params["model.norm.weight"])
    health = await stub.Health(pb.GatewayHealthRequest())
    assert health.policy_version == 1 and health.replicas[0].policy_version == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpdateWeights(pb.UpdateWeightsRequest(version=2, checkpoint_path=str(checkpoint / "nope")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stub.Health(pb.GatewayHealthRequest())).policy_version == 1


async def test_top_logprobs_are_reported_and_change_nothing_sampled(gateway) -> None:
    """``top_logprobs`` reports the k most likely tokens at each position under the
    sampled distribution (the sampled token's logprob ranks among them) and leaves
    what is sampled, and its logprobs, exactly as without it; over 20 is refused."""
    _, stub, _ = gateway
    base = dict(max_tokens=6, temperature=0.8, top_k=40, seed=7)
    plain = await generate(stub, request(PROMPT, "top-0", **base))
    chunks = [c async for c in stub.Generate(request(PROMPT, "top-5", top_logprobs=5, **base))]
    ids = np.concatenate([unpack_i32(c.tokens.ids) for c in chunks]).tolist()
    lps = np.concatenate([unpack_f32(c.tokens.logprobs) for c in chunks]).astype(np.float64)
    assert ids == plain[0] and np.array_equal(lps, plain[1])
    assert {c.top_logprobs.k for c in chunks if c.tokens.ids} == {5}
    top_ids = np.concatenate([unpack_i32(c.top_logprobs.ids) for c in chunks if c.tokens.ids]).reshape(-1, 5)
    top_lps = np.concatenate([unpack_f32(c.top_logprobs.logprobs) for c in chunks if c.tokens.ids]).reshape(-1, 5)
    assert top_ids.shape == (len(ids), 5) and (np.diff(top_lps, axis=1) <= 0).all()
    for token, lp, row_ids, row_lps in zip(ids, lps, top_ids.tolist(), top_lps.tolist(), strict=True):
        assert lp <= row_lps[0] + 1e-6
        if token in row_ids:
            assert row_lps[row_ids.index(token)] == pytest.approx(lp, abs=1e-6)
        else:
            assert lp <= row_lps[-1] + 1e-6
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, request(PROMPT, "top-21", top_logprobs=21, max_tokens=2))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_logprobs" in info.value.details()
