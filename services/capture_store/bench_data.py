"""Workloads for ``harnessrl bench capture``: agent-like trajectories and the
naive JSONL-per-token baseline they are compared with.

Token ids are real: the default model's tokenizer over real Python source
(what ``cat file.py`` tool output looks like), falling back to a Zipf draw
when the model folder is missing. Sampled-token logprobs are synthetic but
shaped like sampling at temperature 1 (half near zero, a long tail), with
full float32 mantissas, so they compress no better than real ones.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harnessrl import arrays, paths
from harnessrl.v1 import capture_pb2, records_pb2

MOE_LAYERS, MOE_TOP_K, MOE_EXPERTS = 40, 8, 128


@dataclass
class Corpus:
    ids: npt.NDArray[np.int32]
    source: str

    def take(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int32]:
        start = int(rng.integers(0, max(len(self.ids) - n, 1)))
        return self.ids[start : start + n]


def load_corpus(min_tokens: int = 400_000) -> Corpus:
    """Real tokens of real source files when the tokenizer is available."""
    model = paths.default_model_dir()
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if (model / "tokenizer.json").exists() and files:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        chunks: list[npt.NDArray[np.int32]] = []
        total = 0
        for path in files:
            ids = np.asarray(tok.encode(path.read_text(errors="replace")).ids, dtype=np.int32)
            chunks.append(ids)
            total += len(ids)
            if total >= min_tokens:
                break
        return Corpus(np.concatenate(chunks), f"{model.name} tokenizer over {len(chunks)} stdlib source files")
    rng = np.random.default_rng(0)
    return Corpus((rng.zipf(1.3, min_tokens) % 49_152).astype(np.int32), "Zipf(1.3) ids (no tokenizer found)")


def sampled_logprobs(rng: np.random.Generator, n: int) -> npt.NDArray[np.float32]:
    confident = rng.random(n) < 0.5
    near_zero = -np.exp(rng.uniform(np.log(1e-6), np.log(1e-2), n))
    tail = -rng.exponential(1.5, n)
    return np.where(confident, near_zero, tail).astype(np.float32)


@dataclass
class Shape:
    """How a trajectory grows: each model call adds tool output (mask 0) then sampled tokens (mask 1)."""

    context: tuple[int, int] = (200, 1800)
    sampled: tuple[int, int] = (50, 400)
    prompt: int = 2000
    all_sampled: bool = False
    routes: bool = False


def trajectory(
    corpus: Corpus, rng: np.random.Generator, run: str, trial: str, turns: int, shape: Shape, version: int = 0
) -> Iterator[capture_pb2.AppendSegmentRequest]:
    """The AppendSegment requests of one single-segment trajectory."""
    for part in range(turns):
        n_ctx = 0 if shape.all_sampled else int(rng.integers(*shape.context))
        n_smp = int(rng.integers(*shape.sampled))
        if shape.all_sampled:
            n_smp += int(rng.integers(*shape.context))
        n = n_ctx + n_smp
        mask = np.r_[np.zeros(n_ctx, np.uint8), np.ones(n_smp, np.uint8)]
        lp = np.zeros(n, np.float32)
        lp[n_ctx:] = sampled_logprobs(rng, n_smp)
        versions = np.where(mask == 1, version, -1).astype(np.int32)
        routes = None
        if shape.routes:
            routes = np.zeros((n, MOE_LAYERS, MOE_TOP_K), np.uint8)
            routes[n_ctx:] = _routes(rng, n_smp)
        req = capture_pb2.AppendSegmentRequest(
            key=records_pb2.SegmentKey(run_id=run, trial_id=trial, thread="main", segment_index=0),
            part_index=part,
            thread_kind="main",
            trainable=True,
            tokens=arrays.make_tokens(corpus.take(rng, n), mask, lp, versions, routes),
            finish_reason="tool_calls" if part < turns - 1 else "stop",
            usage=records_pb2.Usage(prompt_tokens=shape.prompt, completion_tokens=n_smp),
            model="bench-model",
            close=part == turns - 1,
        )
        if part == 0:
            req.prompt_ids = arrays.pack_i32(corpus.take(rng, shape.prompt))
            req.task_id, req.group_id = "bench-task", f"group-{trial}"
        yield req


def _routes(rng: np.random.Generator, n: int) -> npt.NDArray[np.uint8]:
    """Top-8 distinct experts of 128 per layer, in router order: uniform, the incompressible case."""
    scores = rng.random((n, MOE_LAYERS, MOE_EXPERTS))
    return np.argsort(scores, axis=-1)[..., :MOE_TOP_K].astype(np.uint8)


def tokens_of(req: capture_pb2.AppendSegmentRequest) -> int:
    return len(req.tokens.ids) // 4 + len(req.prompt_ids) // 4


# The naive baseline: one JSON object per token, the reference system's shape.
def jsonl_lines(req: capture_pb2.AppendSegmentRequest) -> Iterator[str]:
    k = req.key
    head = {"run_id": k.run_id, "trial_id": k.trial_id, "thread": k.thread, "segment_index": k.segment_index}
    prompt = arrays.unpack_i32(req.prompt_ids).tolist() if req.prompt_ids else []
    for pos, token in enumerate(prompt):
        yield json.dumps({**head, "part": req.part_index, "pos": pos, "token_id": token, "prompt": True})
    t = req.tokens
    routes = arrays.unpack_routes(t.routed_experts)
    cols = zip(
        arrays.unpack_i32(t.ids).tolist(),
        np.frombuffer(t.mask, np.uint8).tolist(),
        arrays.unpack_f32(t.logprobs).tolist(),
        arrays.unpack_i32(t.policy_versions).tolist(),
        strict=True,
    )
    for pos, (token, m, lp, v) in enumerate(cols):
        row = {**head, "part": req.part_index, "pos": pos, "token_id": token, "mask": m, "logprob": lp, "version": v}
        if routes is not None:
            row["routed_experts"] = routes[pos].tolist()
        yield json.dumps(row)


def jsonl_append(f: int, req: capture_pb2.AppendSegmentRequest) -> None:
    """Appends one part durably (one write, one fsync), as the store does per batch."""
    os.write(f, ("\n".join(jsonl_lines(req)) + "\n").encode())
    os.fsync(f)


def jsonl_read(path: Path, trial: str) -> dict[str, npt.NDArray[np.generic]]:
    """Reads one trajectory back from the baseline file into numpy arrays."""
    ids, mask, lps, versions = [], [], [], []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row["trial_id"] != trial or row.get("prompt"):
                continue
            ids.append(row["token_id"])
            mask.append(row["mask"])
            lps.append(row["logprob"])
            versions.append(row["version"])
    return {
        "ids": np.asarray(ids, np.int32),
        "mask": np.asarray(mask, np.uint8),
        "logprobs": np.asarray(lps, np.float32),
        "versions": np.asarray(versions, np.int32),
    }
