"""The local engine's step loop on a tiny random Llama (fast): batching,
prefix reuse, logprob fidelity, abort, pause and in-place weight updates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from harnessrl.errors import InvalidArgument
from services.gateway.engines.base import Chunk, GenerateInput, Sampling
from services.gateway.engines.local import LocalEngine
from services.gateway.settings import Settings
from tests.test_gateway_support import teacher_forced, tiny_llama

PROMPTS = [[1, 520, 9531, 198, 30, 31, 32], [1, 4093, 198], [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_llama(tmp_path_factory.mktemp("tiny-a"), seed=0), tiny_llama(tmp_path_factory.mktemp("tiny-b"), seed=1)


@pytest.fixture
async def engine(folders: tuple[Path, Path]) -> AsyncIterator[LocalEngine]:
    eng = LocalEngine(Settings(model_path=folders[0], max_batch_size=4, prefill_chunk_tokens=16))
    await eng.start()
    yield eng
    await eng.close()


def req(prompt: list[int], rid: str = "r", trial: str = "", max_tokens: int = 6, **sampling: Any) -> GenerateInput:
    s = Sampling(max_tokens=max_tokens, **sampling)
    return GenerateInput(rid, trial, "main", np.asarray(prompt, np.int32), s, max_tokens)


async def run(eng: LocalEngine, request: GenerateInput) -> tuple[list[int], np.ndarray, list[int], Chunk]:
    chunks = [c async for c in eng.generate(request)]
    ids = np.concatenate([c.ids for c in chunks]).tolist()
    lps = np.concatenate([c.logprobs for c in chunks]).astype(np.float64)
    versions = np.concatenate([c.versions for c in chunks]).tolist()
    return ids, lps, versions, chunks[-1]


async def test_concurrent_requests_batch_and_match_sequential(engine: LocalEngine) -> None:
    greedy = {"temperature": 0.0}
    alone = [await run(engine, req(p, rid=f"s{i}", **greedy)) for i, p in enumerate(PROMPTS)]
    together = await asyncio.gather(*(run(engine, req(p, rid=f"c{i}", **greedy)) for i, p in enumerate(PROMPTS)))
    for a, b in zip(alone, together, strict=True):
        assert a[0] == b[0] and a[3].finish_reason == b[3].finish_reason == "length"
        assert np.max(np.abs(a[1] - b[1])) < 1e-4


async def test_logprobs_match_teacher_forced_forward(engine: LocalEngine) -> None:
    cases = [
        Sampling(temperature=1.0, seed=3),
        Sampling(temperature=0.7, top_k=50, seed=4),
        Sampling(temperature=0.9, top_p=0.8, seed=5),
        Sampling(temperature=0.0),
    ]
    results = await asyncio.gather(
        *(
            run(
                engine,
                req(
                    PROMPTS[i % 3],
                    rid=f"f{i}",
                    max_tokens=8,
                    temperature=s.temperature,
                    top_k=s.top_k,
                    top_p=s.top_p,
                    seed=s.seed,
                ),
            )
            for i, s in enumerate(cases)
        )
    )
    for i, (s, (ids, lps, _, _)) in enumerate(zip(cases, results, strict=True)):
        reference = teacher_forced(engine.model, PROMPTS[i % 3], ids, s)
        assert np.max(np.abs(lps - reference)) <= 1e-4, s


async def test_seeded_generation_is_reproducible(engine: LocalEngine) -> None:
    a = await run(engine, req(PROMPTS[0], rid="a", temperature=1.0, seed=42))
    b = await run(engine, req(PROMPTS[0], rid="b", temperature=1.0, seed=42))
    assert a[0] == b[0]


async def test_next_turn_reuses_the_trials_kv_cache(engine: LocalEngine) -> None:
    first = await run(engine, req(PROMPTS[0], rid="t1", trial="trial", temperature=0.0))
    assert first[3].cached_prompt_tokens == 0
    prompt2 = PROMPTS[0] + first[0] + [198, 1, 4093, 198]
    second = await run(engine, req(prompt2, rid="t2", trial="trial", temperature=0.0))
    assert second[3].cached_prompt_tokens == len(PROMPTS[0]) + len(first[0]) - 1
    fresh = await run(engine, req(prompt2, rid="t3", trial="other", temperature=0.0))
    assert fresh[3].cached_prompt_tokens == 0
    assert second[0] == fresh[0] and np.max(np.abs(second[1] - fresh[1])) < 1e-4
    # A rewritten history reuses only the shared prefix.
    rewritten = [*PROMPTS[0][:3], 77, 78]
    third = await run(engine, req(rewritten, rid="t4", trial="trial", temperature=0.0))
    assert third[3].cached_prompt_tokens == 3


async def test_stop_ids_and_budget(engine: LocalEngine) -> None:
    ids, *_ = await run(engine, req(PROMPTS[1], rid="x", temperature=0.0, max_tokens=5))
    stop = ids[2]
    ids2, _, _, last = await run(engine, req(PROMPTS[1], rid="y", temperature=0.0, stop_token_ids=(stop,)))
    assert ids2 == ids[: ids.index(stop) + 1] and last.finish_reason == "stop"


async def test_abort_running_and_queued(folders: tuple[Path, Path]) -> None:
    eng = LocalEngine(Settings(model_path=folders[0], max_batch_size=1))
    await eng.start()
    try:
        running = eng.generate(req(PROMPTS[0], rid="long", max_tokens=400, temperature=0.0))
        first = await anext(running)
        queued = asyncio.create_task(run(eng, req(PROMPTS[1], rid="queued", max_tokens=3)))
        await asyncio.sleep(0.05)
        assert await eng.abort("queued")
        assert (await queued)[3].finish_reason == "abort"
        assert await eng.abort("long")
        rest = [c async for c in running]
        assert rest[-1].finish_reason == "abort" and len(first) + sum(len(c) for c in rest) < 400
        assert not await eng.abort("long")
        assert eng.info().in_flight == 0
    finally:
        await eng.close()


async def test_pause_holds_and_weight_update_changes_versions_mid_reply(engine: LocalEngine, folders) -> None:
    stream = engine.generate(req(PROMPTS[2], rid="p", max_tokens=30, temperature=0.0))
    received = [await anext(stream)]
    assert await engine.pause(5.0) == 1
    held = engine.info().in_flight
    await asyncio.sleep(0.3)
    assert held == 1 and engine.info().in_flight == 1
    await engine.load_weights(1, str(folders[1]), {})
    assert await engine.resume() == 1
    received += [c async for c in stream]
    ids = np.concatenate([c.ids for c in received]).tolist()
    versions = np.concatenate([c.versions for c in received]).tolist()
    assert len(ids) == 30 and received[-1].finish_reason == "length"
    switch = versions.index(1)
    assert 0 < switch and versions == [0] * switch + [1] * (30 - switch)
    # New weights really serve: a fresh reply matches a forward pass of the other model.
    ids2, lps2, versions2, _ = await run(engine, req(PROMPTS[0], rid="q", temperature=0.0))
    assert set(versions2) == {1}
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(folders[1]).eval()
    assert np.max(np.abs(lps2 - teacher_forced(other, PROMPTS[0], ids2, Sampling(temperature=0.0)))) < 1e-4


async def test_bad_checkpoints_leave_weights_untouched(engine: LocalEngine, folders, tmp_path: Path) -> None:
    before = await run(engine, req(PROMPTS[0], rid="b0", temperature=0.0))
    wrong_shape = {name: torch.zeros(3) for name in engine.model.state_dict()}
    save_file({"model.norm.weight": torch.zeros(3)}, str(tmp_path / "shape.safetensors"))
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "empty").mkdir()
    cases = [
        (str(tmp_path / "missing"), "no such file"),
        (str(tmp_path / "empty"), "no .safetensors"),
        (str(tmp_path / "garbage"), "not a readable safetensors"),
        (str(tmp_path / "shape.safetensors"), "lacks"),
        ("", "checkpoint_path is required"),
    ]
    for path, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            await engine.load_weights(1, path, {})
    with pytest.raises(InvalidArgument, match="do not fit"):
        await engine.load_state_dict(1, wrong_shape)
    with pytest.raises(InvalidArgument, match="does not"):
        await engine.load_state_dict(1, {**engine.model.state_dict(), "extra.weight": torch.zeros(1)})
    after = await run(engine, req(PROMPTS[0], rid="b1", temperature=0.0))
    assert before[0] == after[0] and engine.info().policy_version == 0


async def test_in_process_weight_update_through_the_service(folders: tuple[Path, Path]) -> None:
    from transformers import AutoModelForCausalLM

    from services.gateway.errors import FailedPrecondition
    from services.gateway.service import GatewayService

    settings = Settings(model_path=folders[0], health_interval_s=3600)
    service = GatewayService([LocalEngine(settings)], settings)
    await service.start()
    try:
        other = AutoModelForCausalLM.from_pretrained(folders[1]).eval()
        await service.load_state_dict(2, other.state_dict())
        with pytest.raises(FailedPrecondition, match="not greater"):
            await service.load_state_dict(2, other.state_dict())
        outs = [
            o
            async for o in service.generate(
                "r", "t", "main", np.asarray(PROMPTS[0], np.int32), Sampling(temperature=0.0, max_tokens=4)
            )
        ]
        versions = np.concatenate([o.chunk.versions for o in outs]).tolist()
        assert versions == [2, 2, 2, 2] and service.health().policy_version == 2
    finally:
        await service.close()


async def test_abort_of_a_trial_drops_its_kept_caches(folders: tuple[Path, Path]) -> None:
    """Abort by trial (the launcher's "this trial ended"): its next call would reuse nothing;
    another trial's cache stays."""
    from services.gateway.service import GatewayService

    settings = Settings(model_path=folders[0], health_interval_s=3600)
    engine = LocalEngine(settings)
    service = GatewayService([engine], settings)
    await service.start()
    try:
        greedy = Sampling(temperature=0.0, max_tokens=4)

        async def turn(rid: str, trial: str) -> int:
            outs = [o async for o in service.generate(rid, trial, "main", np.asarray(PROMPTS[2], np.int32), greedy)]
            assert outs[-1].usage is not None
            # The turn's cache is kept just after its last token is sent: wait for the worker's next boundary.
            await asyncio.wrap_future(engine.worker.call(lambda: None))
            return outs[-1].usage.cached_prompt_tokens

        assert [await turn("a1", "ta"), await turn("b1", "tb")] == [0, 0]
        assert len(engine.worker.prefix) == 2
        assert await service.abort("", "ta") == 0  # nothing running; its cache goes
        assert len(engine.worker.prefix) == 1
        assert await turn("a2", "ta") == 0
        assert await turn("b2", "tb") == len(PROMPTS[2]) - 1
    finally:
        await service.close()
