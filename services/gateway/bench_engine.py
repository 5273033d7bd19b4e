"""``harnessrl bench engine``: the local engine's tokens/s at the quickstart's
concurrency beside plain batched transformers ``generate``, same model, same
process (same threads), one after the other.

Both rows start from the same ``concurrency`` prompts of ``prompt`` random tokens
and count prefill and decode: the engine admits the requests as the sandbox's
trials send them (at once), prefills each in chunks between decode steps and
decodes every running sequence in one forward; ``generate`` gets them as one
padded-free batch (equal lengths). The engine samples at temperature 1 and may
stop a sequence at an end-of-sequence token; ``generate`` is held to exactly
``new_tokens`` per row. Tokens/s is tokens produced over wall seconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harnessrl import paths
from harnessrl.benchtable import print_table


@dataclass(frozen=True)
class EngineRow:
    what: str
    tokens: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def prompts(concurrency: int, length: int, seed: int = 0) -> npt.NDArray[np.int32]:
    return np.random.default_rng(seed).integers(3, 40_000, (concurrency, length)).astype(np.int32)


def plain_generate(batch: npt.NDArray[np.int32], new_tokens: int) -> EngineRow:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(paths.default_model_dir(), dtype=torch.float32).eval()
    ids = torch.from_numpy(batch.astype(np.int64))
    fixed = {"do_sample": True, "temperature": 1.0, "top_k": 0, "pad_token_id": 0}
    with torch.inference_mode():
        model.generate(ids[:1, :16], max_new_tokens=2, **fixed)  # warm-up: first-call costs out of the timing
        started = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **fixed)
        seconds = time.perf_counter() - started
    produced = int(out.shape[0] * (out.shape[1] - ids.shape[1]))
    return EngineRow(f"transformers generate, batch {batch.shape[0]} (baseline)", produced, seconds)


async def local_engine(batch: npt.NDArray[np.int32], new_tokens: int) -> EngineRow:
    from services.gateway.engines.base import GenerateInput, Sampling
    from services.gateway.engines.local import LocalEngine
    from services.gateway.settings import Settings

    concurrency = batch.shape[0]
    engine = LocalEngine(Settings.model_validate({"engine": "local", "max_batch_size": concurrency}))
    await engine.start()
    try:
        warm = GenerateInput("warm", "", "main", batch[0, :16], Sampling(max_tokens=2), 2)
        async for _ in engine.generate(warm):
            pass

        async def one(i: int) -> int:
            request = GenerateInput(
                f"r{i}", f"t{i}", "main", batch[i], Sampling(temperature=1.0, max_tokens=new_tokens), new_tokens
            )
            return sum([len(chunk) async for chunk in engine.generate(request)])

        started = time.perf_counter()
        produced = sum(await asyncio.gather(*(one(i) for i in range(concurrency))))
        seconds = time.perf_counter() - started
    finally:
        await engine.close()
    return EngineRow(f"local engine, {concurrency} requests at once", produced, seconds)


def print_engine(concurrency: int, prompt: int, new_tokens: int) -> None:
    import torch

    batch = prompts(concurrency, prompt)
    rows = [plain_generate(batch, new_tokens), asyncio.run(local_engine(batch, new_tokens))]
    title = (
        f"harnessrl bench engine ({paths.default_model_dir().name}, fp32, {torch.get_num_threads()} threads; "
        f"{concurrency} prompts of {prompt} tokens, {new_tokens} new tokens each)"
    )
    cells = [(r.what, r.tokens, f"{r.seconds:.1f}", f"{r.rate:.1f}") for r in rows]
    note = f"local engine / generate: {rows[1].rate / rows[0].rate:.2f}x tokens/s"
    print_table(title, ("path", "tokens", "seconds", "tokens/s"), cells, note, left=("path",))
