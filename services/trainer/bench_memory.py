"""``harnessrl bench trainer-memory``: a trainer step's peak memory with the
output head over whole micro-batches (``optim.logit_chunk_tokens = 0``, the
former path) beside the chunked head, in the same run.

Each row is one training step in a fresh process, so its peak resident set
(``ru_maxrss``) is its own: the weights, AdamW's state and the gradients (the
same in every row) plus what the step allocates. The default shape is the
quickstart's (``examples/quickstart.toml``: 16 trials per step, token budget
2048, no gradient checkpointing, temperature 0.7) with one segment of 900
prompt and 600 response tokens per trial, a long mini-swe-agent transcript.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from harnessrl.benchtable import print_table


@dataclass(frozen=True)
class Shape:
    samples: int = 16
    prompt: int = 900
    response: int = 600
    token_budget: int = 2048
    checkpointing: bool = False


@dataclass(frozen=True)
class MemoryRow:
    chunk_tokens: int
    seconds: float
    loaded_rss_gib: float
    peak_rss_gib: float


def measure(shape: Shape, chunk_tokens: int) -> MemoryRow:
    args = json.dumps({**shape.__dict__, "chunk_tokens": chunk_tokens})
    code = f"from services.trainer.bench_memory import _child; _child({args!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child failed: {proc.stderr[-2000:]}")
    return MemoryRow(chunk_tokens, **json.loads(proc.stdout.strip().splitlines()[-1]))


def _child(args: str) -> None:
    from services.trainer.bench import random_group
    from services.trainer.cpu_trainer import CpuTrainer
    from services.trainer.settings import Settings

    a = json.loads(args)
    optim = {
        "gradient_checkpointing": a["checkpointing"],
        "token_budget": a["token_budget"],
        "logit_chunk_tokens": a["chunk_tokens"],
        "lr": 1e-6,
    }
    trainer = CpuTrainer(Settings.model_validate({"optim": optim, "rollout": {"temperature": 0.7}}))
    loaded = _rss_now_gib()
    group = random_group(np.random.default_rng(0), 0, a["samples"], a["prompt"], a["response"])
    started = time.monotonic()
    result = trainer.train_step([group])
    if not result.updated:
        raise RuntimeError(f"the step did not train: {result.alerts}")
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"seconds": seconds, "loaded_rss_gib": loaded, "peak_rss_gib": peak}))


def _rss_now_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def print_memory(shape: Shape, chunk_tokens: int) -> None:
    rows = [measure(shape, 0), measure(shape, chunk_tokens)]
    tokens = shape.samples * (shape.prompt + shape.response)
    title = (
        f"harnessrl bench trainer-memory (CPU, fp32, SmolLM2-135M; one step of {shape.samples} samples x "
        f"{shape.prompt}+{shape.response} tokens, token budget {shape.token_budget}, gradient checkpointing "
        f"{'on' if shape.checkpointing else 'off'})"
    )
    columns = ("output head", "seconds", "tokens/s", "RSS after load GiB", "peak RSS GiB", "step's own GiB")
    cells = [
        (
            "whole micro-batch" if r.chunk_tokens == 0 else f"chunks of {r.chunk_tokens}",
            f"{r.seconds:.1f}",
            f"{tokens / r.seconds:.0f}",
            f"{r.loaded_rss_gib:.2f}",
            f"{r.peak_rss_gib:.2f}",
            f"{r.peak_rss_gib - r.loaded_rss_gib:.2f}",
        )
        for r in rows
    ]
    base, chunked = rows[0].peak_rss_gib, rows[1].peak_rss_gib
    note = f"peak {chunked:.2f} GiB chunked vs {base:.2f} GiB whole: {chunked / base:.2f}x"
    print_table(title, columns, cells, note)
