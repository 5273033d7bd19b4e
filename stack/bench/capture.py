"""``harnessrl bench capture``: its driver, and appends and read-back over gRPC
against a real ``harnessrl capture serve`` process pinned to CPU 0 (the load on
CPU 1), embedded or on real Redis and SeaweedFS servers. It starts processes, so
it is in the composition root; the in-process half (bytes per token, the JSONL
baseline, the workloads, the tables) is ``services/capture_store/bench.py``."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from services.capture_store import bench
from services.capture_store import bench_data as data
from services.capture_store.bench import BenchConfig, Results
from services.capture_store.settings import Settings
from stack.bench.benchstack import BenchStack, cpu_seconds


def measure_serving(backend: str, corpus: data.Corpus, cfg: BenchConfig, work: Path, res: Results) -> None:
    load = bench.workload(corpus, cfg)
    tokens = sum(data.tokens_of(r) for w in load for r in w)
    parts = sum(len(w) for w in load)
    segments = sum(1 for w in load for r in w if r.close)
    distributed = backend == "distributed"
    capture = Settings.model_validate({"auth_token": bench.TOKEN})
    pin = {"capture": {0}} if cfg.pin else {}
    with BenchStack(work, capture=capture, distributed=distributed, redis_fsync=True, pin=pin) as up:
        target, pid = up.target("capture"), up.pids["capture"]
        cpu0 = cpu_seconds(pid)
        elapsed = asyncio.run(bench.append_all(target, load))
        cpu = cpu_seconds(pid) - cpu0
        open_ms, final_ms = asyncio.run(bench.readback(target, bench.long_trajectory(corpus, cfg)))
        if distributed and up.procs and up.capture and up.s3:
            up.procs["capture"].stop()  # the same Redis and S3, this process the only client
            store = up.capture.model_copy(update={"auth_token": None})
            bench.measure_distributed_storage(corpus, cfg, store, up.s3.client(), res)
    res.put("append: tokens/s (64 writers, gRPC)", backend, tokens / elapsed)
    res.put("append: tokens per server CPU-second", backend, tokens / cpu)
    res.put("append: parts/s", backend, parts / elapsed)
    res.put("append: segments/s", backend, segments / elapsed)
    res.put("read-back 200k-token trajectory (ms)", backend, open_ms)
    res.put("read-back 200k, finalized/compacted (ms)", backend, final_ms)
    res.notes.append(f"{backend}: {tokens:,} tokens in {parts:,} parts / {segments} segments, {elapsed:.1f}s wall")


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
        bench.measure_storage(corpus, cfg, work, res)
        progress("JSONL baseline")
        bench.measure_baseline(corpus, cfg, work, res)
        if pin:
            os.sched_setaffinity(0, {1})  # the load generator stays off the server's core
        for backend in ("embedded", "distributed"):
            if backend in cfg.backends:
                progress(f"{backend}: appends and read-back over gRPC")
                measure_serving(backend, corpus, cfg, work / backend, res)
        res.notes.append(f"server pinned to one core: {pin}; machine has {os.cpu_count()} cores (shared)")
    finally:
        os.sched_setaffinity(0, original)
        shutil.rmtree(work, ignore_errors=True)
    return res
