"""``harnessrl bench capture``: bytes per token on disk, append throughput with
concurrent writers over gRPC, and read-back time of a 200k-token trajectory,
side by side with a naive JSONL-per-token baseline measured in the same run.

Here: what runs in one process (the store in-process for bytes per token, the
baseline, the workloads, the tables). The store under test over gRPC is a real
server process (``harnessrl capture serve``) pinned to one core, the load
generator on another; the distributed backend runs against real Redis and
SeaweedFS servers. Those are started by ``stack/bench/capture.py``, which also
drives the whole bench: a service starts no other process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl import arrays
from harnessrl.benchtable import print_table
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store import bench_data as data
from services.capture_store.server import open_backend
from services.capture_store.service import CaptureService
from services.capture_store.settings import Settings

TOKEN = "bench-token"
TARGETS = {"bytes": 6.0, "tokens_s": 1_000_000.0, "readback_ms": 200.0}


@dataclass
class BenchConfig:
    backends: tuple[str, ...] = ("embedded", "distributed")
    writers: int = 64
    tokens: int = 3_000_000  # appended in the throughput phase
    turns: int = 12  # parts per trajectory
    readback_tokens: int = 200_000
    baseline_tokens: int = 300_000  # the JSONL baseline appends this prefix of the same workload
    storage_trials: int = 12
    storage_turns: int = 30
    pin: bool = True
    seed: int = 0


@dataclass
class Results:
    corpus: str = ""
    rows: dict[str, dict[str, float | None]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, metric: str, column: str, value: float | None) -> None:
        self.rows.setdefault(metric, {})[column] = value


# --- storage ---------------------------------------------------------------


def _dataset(corpus: data.Corpus, cfg: BenchConfig, shape: data.Shape) -> list[list[capture_pb2.AppendSegmentRequest]]:
    rng = np.random.default_rng(cfg.seed)
    return [
        list(data.trajectory(corpus, rng, "bench", f"s{t}", cfg.storage_turns, shape))
        for t in range(cfg.storage_trials)
    ]


async def _store_dataset(settings: Settings, trials: list[list[capture_pb2.AppendSegmentRequest]]) -> CaptureService:
    service = CaptureService(settings, open_backend(settings))
    await service.start()

    async def one(reqs: list[capture_pb2.AppendSegmentRequest]) -> None:
        for req in reqs:
            await service.append(req)

    await asyncio.gather(*(one(t) for t in trials))
    return service


def _disk_bytes(settings: Settings) -> tuple[int, int]:
    """(blob bytes, index bytes) of an embedded store."""
    import sqlite3

    with sqlite3.connect(settings.resolved_sqlite_path()) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    blobs = sum(p.stat().st_size for p in settings.resolved_blob_dir().rglob("*.dat"))
    return blobs, settings.resolved_sqlite_path().stat().st_size


def measure_storage(corpus: data.Corpus, cfg: BenchConfig, work: Path, res: Results) -> None:
    variants = {
        "bytes/token: ids+mask+logprobs+versions": (data.Shape(), "float32"),
        "bytes/token: every token sampled (worst case)": (data.Shape(all_sampled=True), "float32"),
        "bytes/token: float16 logprobs": (data.Shape(), "float16"),
        f"bytes/token: + routed experts ({data.MOE_LAYERS}x{data.MOE_TOP_K})": (data.Shape(routes=True), "float32"),
    }
    for i, (metric, (shape, dtype)) in enumerate(variants.items()):
        trials = _dataset(corpus, cfg, shape)
        tokens = sum(data.tokens_of(r) for t in trials for r in t)
        settings = Settings.model_validate({"store_dir": work / f"storage-{i}", "logprob_dtype": dtype})
        asyncio.run(_store_and_close(settings, trials))
        blobs, index = _disk_bytes(settings)
        res.put(metric, "embedded", blobs / tokens)
        if i == 0:
            res.put("bytes/token: index (SQLite / Redis)", "embedded", index / tokens)
            sampled = sum(int(np.frombuffer(r.tokens.mask, np.uint8).sum()) for t in trials for r in t)
            res.notes.append(f"storage set: {tokens:,} tokens, {sampled / tokens:.0%} sampled (mask 1)")
        if metric.startswith("bytes/token: ids") or "routed" in metric:
            jsonl = sum(len(line) + 1 for t in trials for r in t for line in data.jsonl_lines(r))
            res.put(metric, "JSONL baseline", jsonl / tokens)
        if "routed" in metric:
            sampled = sum(int(np.frombuffer(r.tokens.mask, np.uint8).sum()) for t in trials for r in t)
            res.notes.append(
                f"routes: {blobs / sampled:.0f} B per sampled token on disk vs "
                f"{data.MOE_LAYERS * data.MOE_TOP_K} B raw (uniform top-8 of 128 experts: near-incompressible)"
            )


async def _store_and_close(settings: Settings, trials: list[list[capture_pb2.AppendSegmentRequest]]) -> None:
    service = await _store_dataset(settings, trials)
    await service.close()


def measure_distributed_storage(corpus: data.Corpus, cfg: BenchConfig, store: Settings, s3: Any, res: Results) -> None:
    """Bytes per token of the distributed backend ``store`` names; ``s3``: a boto3 client of its S3."""
    import redis

    assert store.redis_url
    r = redis.Redis.from_url(store.redis_url)
    before = int(r.info("memory")["used_memory"])
    trials = _dataset(corpus, cfg, data.Shape())
    tokens = sum(data.tokens_of(q) for t in trials for q in t)
    asyncio.run(_store_and_close(store, trials))
    after = int(r.info("memory")["used_memory"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=store.s3_bucket, Prefix="harnessrl/runs/bench/")
    blobs = sum(o["Size"] for page in pages for o in page.get("Contents", []))
    res.put("bytes/token: ids+mask+logprobs+versions", "distributed", blobs / tokens)
    res.put("bytes/token: index (SQLite / Redis)", "distributed", (after - before) / tokens)
    r.close()


# --- throughput and read-back over gRPC (the server: stack/bench/capture.py) ---


def workload(corpus: data.Corpus, cfg: BenchConfig) -> list[list[capture_pb2.AppendSegmentRequest]]:
    rng = np.random.default_rng(cfg.seed + 1)
    per_writer = cfg.tokens // cfg.writers
    out = []
    for w in range(cfg.writers):
        reqs: list[capture_pb2.AppendSegmentRequest] = []
        n, t = 0, 0
        while n < per_writer:
            for req in data.trajectory(corpus, rng, "load", f"w{w}-t{t}", cfg.turns, data.Shape()):
                reqs.append(req)
                n += data.tokens_of(req)
            t += 1
        out.append(reqs)
    return out


async def append_all(target: str, work: list[list[capture_pb2.AppendSegmentRequest]]) -> float:
    async with connect(target, TOKEN) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)

        async def writer(reqs: list[capture_pb2.AppendSegmentRequest]) -> None:
            for req in reqs:
                await stub.AppendSegment(req, timeout=120)

        start = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in work))
        return time.perf_counter() - start


async def readback(target: str, reqs: list[capture_pb2.AppendSegmentRequest]) -> tuple[float, float]:
    """Median GetTrajectory time (ms, numpy arrays included) of an open segment,
    then of the same trajectory once finalized (and compacted where the backend does)."""
    async with connect(target, TOKEN) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        for req in reqs:
            await stub.AppendSegment(req)
        k = reqs[0].key
        expected = sum(len(r.tokens.ids) // 4 for r in reqs)
        get = capture_pb2.GetTrajectoryRequest(run_id=k.run_id, trial_id=k.trial_id, include_tokens=True)

        async def median_ms(repeats: int = 6) -> float:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                seg = (await stub.GetTrajectory(get, timeout=60)).segments[0]
                ids = arrays.unpack_i32(seg.response.ids)
                arrays.unpack_f32(seg.response.logprobs)
                times.append(time.perf_counter() - start)
                if len(ids) != expected:
                    raise RuntimeError(f"read back {len(ids)} tokens, appended {expected}")
            return statistics.median(times[1:]) * 1000

        open_ms = await median_ms()
        final = capture_pb2.FinalizeTrajectoryRequest(
            run_id=k.run_id, trial_id=k.trial_id, task_id=reqs[0].task_id, group_id=reqs[0].group_id,
            group_size=1, termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
        )  # fmt: skip
        await stub.FinalizeTrajectory(final)
        await asyncio.sleep(3)  # compaction runs in the background after finalize
        return open_ms, await median_ms()


def long_trajectory(corpus: data.Corpus, cfg: BenchConfig) -> list[capture_pb2.AppendSegmentRequest]:
    rng = np.random.default_rng(cfg.seed + 2)
    shape = data.Shape(context=(1500, 2100), sampled=(100, 400))
    turns = cfg.readback_tokens // 2000 + 2
    reqs, total = [], 0
    for req in data.trajectory(corpus, rng, "readback", "long", turns, shape):
        reqs.append(req)
        total += data.tokens_of(req)
        if total >= cfg.readback_tokens:
            req.close = True
            break
    return reqs


def measure_baseline(corpus: data.Corpus, cfg: BenchConfig, work: Path, res: Results) -> None:
    load = workload(corpus, cfg)
    path = work / "baseline.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    tokens, start = 0, time.perf_counter()
    try:
        for reqs in zip(*load, strict=False):  # interleave writers like concurrent appends
            for req in reqs:
                data.jsonl_append(fd, req)
                tokens += data.tokens_of(req)
            if tokens >= cfg.baseline_tokens:
                break
        elapsed = time.perf_counter() - start
        for req in long_trajectory(corpus, cfg):
            data.jsonl_append(fd, req)
    finally:
        os.close(fd)
    res.put("append: tokens/s (64 writers, gRPC)", "JSONL baseline", tokens / elapsed)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        data.jsonl_read(path, "long")
        times.append(time.perf_counter() - t0)
    res.put("read-back 200k-token trajectory (ms)", "JSONL baseline", statistics.median(times) * 1000)
    res.notes.append(f"JSONL baseline: one writer, one fsync per part, first {tokens:,} tokens of the same load")


def table_rows(res: Results) -> list[list[Any]]:
    columns = ["embedded", "distributed", "JSONL baseline"]
    out = []
    for metric, values in res.rows.items():
        target = _target(metric)
        out.append([metric, *(_fmt(values.get(c)) for c in columns), target])
    return out


def _target(metric: str) -> str:
    if metric == "bytes/token: ids+mask+logprobs+versions":
        return f"<= {TARGETS['bytes']:g}"
    if metric.startswith("append: tokens per server"):
        return ">= 1,000,000"
    if metric.startswith("read-back 200k-token"):
        return f"<= {TARGETS['readback_ms']:g}"
    return ""


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def print_results(res: Results) -> None:
    columns = ("metric", "embedded", "distributed", "JSONL baseline", "target")
    notes = [f"token ids: {res.corpus}", *(f"- {note}" for note in res.notes)]
    print_table("harnessrl bench capture", columns, table_rows(res), *notes, left=("metric",))
