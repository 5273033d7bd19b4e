"""``harnessrl bench capture``: bytes per token on disk, append throughput with
concurrent writers over gRPC, and read-back time of a 200k-token trajectory,
side by side with a naive JSONL-per-token baseline measured in the same run.

The store under test is a real server subprocess (``harnessrl capture
serve``) pinned to one core; the load generator runs in this process on
another core. The distributed backend runs against real Redis and SeaweedFS
servers started here (they float on the remaining cores).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl import arrays
from harnessrl.localservers import RedisServer, S3Server, free_port
from harnessrl.rpc import check_health, connect
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


def measure_distributed_storage(corpus: data.Corpus, cfg: BenchConfig, env: dict[str, str], res: Results) -> None:
    import boto3
    import redis
    from botocore.config import Config

    r = redis.Redis.from_url(env["HARNESSRL_CAPTURE_STORE_REDIS_URL"])
    before = int(r.info("memory")["used_memory"])
    trials = _dataset(corpus, cfg, data.Shape())
    tokens = sum(data.tokens_of(q) for t in trials for q in t)
    settings = _distributed_settings(env)
    asyncio.run(_store_and_close(settings, trials))
    after = int(r.info("memory")["used_memory"])
    s3 = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        aws_access_key_id=env["HARNESSRL_CAPTURE_STORE_S3_ACCESS_KEY"],
        aws_secret_access_key=env["HARNESSRL_CAPTURE_STORE_S3_SECRET_KEY"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket, Prefix="harnessrl/runs/bench/")
    blobs = sum(o["Size"] for page in pages for o in page.get("Contents", []))
    res.put("bytes/token: ids+mask+logprobs+versions", "distributed", blobs / tokens)
    res.put("bytes/token: index (SQLite / Redis)", "distributed", (after - before) / tokens)
    r.close()


def _distributed_settings(env: dict[str, str]) -> Settings:
    prefix = "HARNESSRL_CAPTURE_STORE_"
    fields = {k.removeprefix(prefix).lower(): v for k, v in env.items() if k.startswith(prefix)}
    fields.pop("auth_token", None)
    return Settings.model_validate(fields)


# --- throughput and read-back over gRPC -----------------------------------


@contextmanager
def serve(backend: str, work: Path, env: dict[str, str], pin: bool) -> Iterator[tuple[str, int]]:
    """A real ``harnessrl capture serve`` subprocess, pinned to CPU 0; yields (target, pid)."""
    port = free_port()
    cmd = [sys.executable, "-m", "stack.cli", "capture", "serve", "--port", str(port)]
    if backend == "embedded":
        cmd += ["--store-dir", str(work / "served")]
    full_env = {**os.environ, **env, "HARNESSRL_CAPTURE_STORE_AUTH_TOKEN": TOKEN}
    preexec: Callable[[], None] | None = (lambda: os.sched_setaffinity(0, {0})) if pin else None
    proc = subprocess.Popen(cmd, env=full_env, preexec_fn=preexec, stderr=subprocess.DEVNULL)
    try:
        asyncio.run(check_health(f"127.0.0.1:{port}", "harnessrl.v1.CaptureStore", wait_s=60))
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workload(corpus: data.Corpus, cfg: BenchConfig) -> list[list[capture_pb2.AppendSegmentRequest]]:
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


async def _append_all(target: str, work: list[list[capture_pb2.AppendSegmentRequest]]) -> float:
    async with connect(target, TOKEN) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)

        async def writer(reqs: list[capture_pb2.AppendSegmentRequest]) -> None:
            for req in reqs:
                await stub.AppendSegment(req, timeout=120)

        start = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in work))
        return time.perf_counter() - start


async def _readback(target: str, reqs: list[capture_pb2.AppendSegmentRequest]) -> tuple[float, float]:
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


def _long_trajectory(corpus: data.Corpus, cfg: BenchConfig) -> list[capture_pb2.AppendSegmentRequest]:
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


def measure_serving(
    backend: str, corpus: data.Corpus, cfg: BenchConfig, work: Path, env: dict[str, str], res: Results
) -> None:
    load = _workload(corpus, cfg)
    tokens = sum(data.tokens_of(r) for w in load for r in w)
    parts = sum(len(w) for w in load)
    segments = sum(1 for w in load for r in w if r.close)
    with serve(backend, work, env, cfg.pin) as (target, pid):
        cpu0 = _cpu_seconds(pid)
        elapsed = asyncio.run(_append_all(target, load))
        cpu = _cpu_seconds(pid) - cpu0
        open_ms, final_ms = asyncio.run(_readback(target, _long_trajectory(corpus, cfg)))
    res.put("append: tokens/s (64 writers, gRPC)", backend, tokens / elapsed)
    res.put("append: tokens per server CPU-second", backend, tokens / cpu)
    res.put("append: parts/s", backend, parts / elapsed)
    res.put("append: segments/s", backend, segments / elapsed)
    res.put("read-back 200k-token trajectory (ms)", backend, open_ms)
    res.put("read-back 200k, finalized/compacted (ms)", backend, final_ms)
    res.notes.append(f"{backend}: {tokens:,} tokens in {parts:,} parts / {segments} segments, {elapsed:.1f}s wall")


def measure_baseline(corpus: data.Corpus, cfg: BenchConfig, work: Path, res: Results) -> None:
    load = _workload(corpus, cfg)
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
        for req in _long_trajectory(corpus, cfg):
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


# --- driver ---------------------------------------------------------------


@contextmanager
def distributed_env(work: Path) -> Iterator[dict[str, str]]:
    """Real Redis (appendonly) and SeaweedFS servers, as settings environment variables."""
    for sub in ("redis", "s3"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    with RedisServer(appendonly=True, dir=work / "redis") as redis_server, S3Server(dir=work / "s3") as s3:
        bucket = f"bench-{os.getpid()}"
        s3.client().create_bucket(Bucket=bucket)
        import redis

        with redis.Redis.from_url(redis_server.url) as client:  # durable before the reply, like production
            client.config_set("appendfsync", "always")
        yield {
            "HARNESSRL_CAPTURE_STORE_BACKEND": "distributed",
            "HARNESSRL_CAPTURE_STORE_REDIS_URL": redis_server.url,
            "HARNESSRL_CAPTURE_STORE_S3_ENDPOINT": s3.endpoint,
            "HARNESSRL_CAPTURE_STORE_S3_BUCKET": bucket,
            "HARNESSRL_CAPTURE_STORE_S3_ACCESS_KEY": s3.access_key,
            "HARNESSRL_CAPTURE_STORE_S3_SECRET_KEY": s3.secret_key,
        }


def run(cfg: BenchConfig, progress: Callable[[str], None] = lambda _: None) -> Results:
    res = Results()
    work = Path(tempfile.mkdtemp(prefix="hrl-bench-capture-"))
    original = os.sched_getaffinity(0)
    pin = cfg.pin and len(original) >= 2
    cfg.pin = pin
    try:
        progress("tokenizing the corpus")
        corpus = data.load_corpus()
        res.corpus = corpus.source
        progress("measuring bytes per token")
        measure_storage(corpus, cfg, work, res)
        progress("JSONL baseline")
        measure_baseline(corpus, cfg, work, res)
        if pin:
            os.sched_setaffinity(0, {1})  # the load generator stays off the server's core
        if "embedded" in cfg.backends:
            progress("embedded: appends and read-back over gRPC")
            measure_serving("embedded", corpus, cfg, work / "embedded", {}, res)
        if "distributed" in cfg.backends:
            with distributed_env(work) as env:
                progress("distributed: appends and read-back over gRPC")
                measure_serving("distributed", corpus, cfg, work / "distributed", env, res)
                measure_distributed_storage(corpus, cfg, env, res)
        res.notes.append(f"server pinned to one core: {pin}; machine has {os.cpu_count()} cores (shared)")
    finally:
        os.sched_setaffinity(0, original)
        shutil.rmtree(work, ignore_errors=True)
    return res


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
    from rich.console import Console
    from rich.table import Table

    table = Table(title="harnessrl bench capture")
    for name in ("metric", "embedded", "distributed", "JSONL baseline", "target"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in table_rows(res):
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"token ids: {res.corpus}")
    for note in res.notes:
        console.print(f"- {note}")
