"""The local engine's device and dtype settings, on the CPU: naming the CPU
samples exactly what the default samples, bf16 weights sample in bf16 with
logprobs close to fp32's, and a bad or absent device is refused clearly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from harnessrl.errors import ConfigError
from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.local import LocalEngine, merge_chunks
from services.gateway.settings import Settings
from services.trainer import tinymoe
from tests.test_gateway_support import teacher_forced

PROMPTS = [[5, 17, 300, 2, 9], [40, 41], [7, 1000, 12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MoE: routes are captured too, which is where the device matters most."""
    path = tmp_path_factory.mktemp("moe")
    tinymoe.build("tiny").save_pretrained(path)
    return path


async def generate(settings: Settings) -> list[tuple[list[int], np.ndarray, np.ndarray | None]]:
    engine = LocalEngine(settings)
    await engine.start()
    try:

        async def one(i: int, prompt: list[int]) -> tuple[list[int], np.ndarray, np.ndarray | None]:
            s = Sampling(temperature=1.0, max_tokens=12, seed=i + 1, return_routed_experts=True)
            request = GenerateInput(f"r{i}", f"t{i}", "main", np.asarray(prompt, np.int32), s, 12)
            chunk = merge_chunks([c async for c in engine.generate(request)])
            return chunk.ids.tolist(), chunk.logprobs.astype(np.float64), chunk.routed_experts

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS))))
    finally:
        await engine.close()


async def test_explicit_cpu_samples_exactly_like_the_default(folder: Path) -> None:
    default = await generate(Settings(model_path=folder, max_batch_size=2))
    cpu = await generate(Settings(model_path=folder, max_batch_size=2, device="cpu", dtype="fp32"))
    for (ids_a, lp_a, routes_a), (ids_b, lp_b, routes_b) in zip(default, cpu, strict=True):
        assert ids_a == ids_b and np.array_equal(lp_a, lp_b)
        assert routes_a is not None and routes_b is not None and np.array_equal(routes_a, routes_b)


async def test_bf16_engine_samples_with_logprobs_close_to_fp32(folder: Path) -> None:
    results = await generate(Settings(model_path=folder, max_batch_size=4, dtype="bf16"))
    reference = tinymoe.build("tiny")
    gaps = []
    for prompt, (ids, lps, _) in zip(PROMPTS, results, strict=True):
        gaps.append(np.abs(teacher_forced(reference, prompt, ids, Sampling(temperature=1.0)) - lps))
    gap = np.concatenate(gaps)
    assert 0 < gap.max() < 0.5, gap.max()  # bf16 differs from fp32, a little


@pytest.mark.parametrize("field, value", [("device", "gpu"), ("device", "cuda:"), ("dtype", "float16")])
def test_settings_refuse_a_bad_device_or_dtype(field: str, value: str) -> None:
    with pytest.raises(
        ValidationError, match=f"{field}\n.*(is not valid; use 'auto'|Input should be 'fp32' or 'bf16')"
    ):
        Settings(**{field: value})  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
async def test_cuda_is_refused_at_start_where_there_is_none(folder: Path) -> None:
    engine = LocalEngine(Settings(model_path=folder, device="cuda"))
    with pytest.raises(ConfigError, match="torch sees no CUDA device"):
        await engine.start()
