"""``harnessrl bench sandbox``: what a sandbox backend costs (local bubblewrap
always; ``--backend docker`` adds the Docker backend, on the engine named by
``--docker-host`` or a private one the bench starts, printed beside it).

1. Overhead per trial with a warm layer/image cache: the full sandboxed trial of a
   small task (shell harness: ``echo hello > hello.txt``; verifier: test.sh)
   against a baseline measured in the same run, the same commands with no
   sandbox (copy the workspace, run the agent command, run the verifier, delete).
   Setup + teardown are reported on their own (the issue's target: <= 150 ms).
2. Trials per minute at concurrency 1, 4 and 16 through the real queue and
   worker, next to the same baseline commands run at the same concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.benchtable import print_table
from services.sandbox.backends import create_backend
from services.sandbox.common.settings import Settings
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.trial.lifecycle import TrialSpec, TrialState
from services.sandbox.trial.runner import TrialRunner
from services.sandbox.worker import Worker

TASK = Path(__file__).with_name("examples") / "hello"
AGENT = "echo hello > hello.txt"


@dataclass
class OverheadRow:
    backend: str
    sandbox_ms: float
    baseline_ms: float
    setup_ms: float
    teardown_ms: float
    agent_ms: float
    verify_ms: float


@dataclass
class ThroughputRow:
    backend: str
    concurrency: int
    trials: int
    sandbox_per_min: float
    baseline_per_min: float


def _settings(root: Path, concurrency: int = 1, backend: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate(
        {
            "work_dir": root / "trials",
            "cache_dir": root / "cache",
            "artifacts_dir": root / "artifacts",
            "concurrency": concurrency,
            **(backend or {"backend": "local"}),
        }
    )


def _spec(i: int) -> TrialSpec:
    return TrialSpec(
        trial_id=f"bench-{i}-{uuid.uuid4().hex[:6]}",
        task_path=str(TASK),
        harness="shell",
        harness_options={"script": AGENT},
    )


async def _baseline_trial(root: Path, workspace: Path) -> float:
    """The same work with no sandbox: copy, agent command, verifier command, delete."""
    started = time.perf_counter()
    trial = root / f"b-{uuid.uuid4().hex[:8]}"
    os.makedirs(trial)
    proc = await asyncio.create_subprocess_exec("cp", "-a", f"{workspace}/.", str(trial / "ws"))
    await proc.wait()
    verify = f'[ "$(cat hello.txt)" = hello ] && echo 1 > {trial}/reward.txt || echo 0 > {trial}/reward.txt'
    for script in (AGENT, verify):
        proc = await asyncio.create_subprocess_exec("/bin/bash", "-c", script, cwd=trial / "ws")
        await proc.wait()
    await asyncio.to_thread(shutil.rmtree, trial)
    return time.perf_counter() - started


def _workspace(cache_dir: Path) -> Path:
    """The hello task's workspace as the local backend's layer cache holds it."""
    return next((cache_dir / "layers").glob("*-v*[0-9]")) / "root" / "app"


async def overhead(root: Path, trials: int, backend: dict[str, Any], workspace: Path | None) -> OverheadRow:
    """``workspace`` None: the local backend's layer, measured first, is the baseline's."""
    settings = _settings(root, backend=backend)
    runner = TrialRunner(settings, create_backend(settings))
    await runner.run(_spec(-1))  # warm the layer or image cache
    workspace = workspace or _workspace(settings.cache_dir)
    rows = []
    for i in range(trials):
        started = time.perf_counter()
        outcome = await runner.run(_spec(i))
        total = time.perf_counter() - started
        assert outcome.reward == 1.0, outcome
        rows.append((total, outcome.timings))
    base_root = root / "baseline"
    base_root.mkdir()
    for _ in range(2):
        await _baseline_trial(base_root, workspace)  # warm the page cache like the sandbox's warm-up
    baseline = [await _baseline_trial(base_root, workspace) for _ in range(trials)]
    med = statistics.median
    return OverheadRow(
        backend=settings.backend,
        sandbox_ms=med(t for t, _ in rows) * 1000,
        baseline_ms=med(baseline) * 1000,
        setup_ms=med(tm.setup_s for _, tm in rows) * 1000,
        teardown_ms=med(tm.teardown_s for _, tm in rows) * 1000,
        agent_ms=med(tm.agent_s for _, tm in rows) * 1000,
        verify_ms=med(tm.verify_s for _, tm in rows) * 1000,
    )


async def throughput(
    root: Path, concurrency: int, trials: int, backend: dict[str, Any], workspace: Path
) -> ThroughputRow:
    settings = _settings(root, concurrency, backend)
    queue = MemoryQueue()
    sandboxes = create_backend(settings)
    worker = Worker(settings, queue, TrialRunner(settings, sandboxes), name="bench")
    await TrialRunner(settings, sandboxes).run(_spec(-1))
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    specs = [_spec(i) for i in range(trials)]
    started = time.perf_counter()
    for spec in specs:
        await queue.submit(spec)
    pending = {s.trial_id for s in specs}
    async for record in queue.watch("", list(pending)):
        if record.state == TrialState.DONE:
            pending.discard(record.trial_id)
            if not pending:
                break
    elapsed = time.perf_counter() - started
    stop.set()
    await serving
    base_root = root / f"baseline-{concurrency}"
    base_root.mkdir()
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            await _baseline_trial(base_root, workspace)

    base_started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(trials)))
    base_elapsed = time.perf_counter() - base_started
    return ThroughputRow(settings.backend, concurrency, trials, trials / elapsed * 60, trials / base_elapsed * 60)


async def run_bench(
    trials: int = 20,
    concurrencies: tuple[int, ...] = (1, 4, 16),
    backends: tuple[str, ...] = ("local",),
    docker_host: str | None = None,
) -> tuple[list[OverheadRow], list[ThroughputRow]]:
    with tempfile.TemporaryDirectory(prefix="hrl-bench-sandbox-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        kinds: dict[str, dict[str, Any]] = {"local": {"backend": "local"}}
        if "docker" in backends:
            kinds["docker"] = {"backend": "docker", "docker": {"host": docker_host or _private_engine(stack)}}
        local = await overhead(root / "overhead-local", trials, kinds["local"], None)
        workspace = _workspace(root / "overhead-local" / "cache")
        rows = [local] + [
            await overhead(root / f"overhead-{name}", trials, kind, workspace)
            for name, kind in kinds.items()
            if name != "local"
        ]
        rates = [
            await throughput(root / f"{name}-c{c}", c, max(trials, 2 * c), kind, workspace)
            for name, kind in kinds.items()
            for c in concurrencies
        ]
    return rows, rates


def _private_engine(stack: contextlib.ExitStack) -> str:
    """A private dockerd for the bench (no bridge), with the offline base images."""
    import docker

    from harnessrl.localservers import DockerEngine
    from services.sandbox import baseimages

    engine = stack.enter_context(DockerEngine())
    client = docker.DockerClient(base_url=engine.host)
    baseimages.ensure_imported(client, baseimages.rootfs())
    client.close()
    return engine.host


def print_report(rows: list[OverheadRow], rates: list[ThroughputRow]) -> None:
    def overhead_cells(row: OverheadRow) -> tuple[str, ...]:
        target = "<= 150 ms" if row.backend == "local" else "<= 500 ms"
        return (
            row.backend,
            f"{row.sandbox_ms:.1f} ms",
            f"{row.baseline_ms:.1f} ms",
            f"{row.sandbox_ms - row.baseline_ms:.1f} ms",
            f"{row.setup_ms + row.teardown_ms:.1f} ms (target {target})",
            f"{row.setup_ms:.1f} / {row.teardown_ms:.1f} ms",
        )

    title = "one small trial per backend (median, warm layer/image cache)"
    columns = ("backend", "whole trial", "baseline (no sandbox)", "overhead", "setup + teardown", "setup / teardown")
    console = print_table(title, columns, map(overhead_cells, rows))
    rate_columns = ("backend", "concurrency", "trials", "sandboxed trials/min", "baseline trials/min")
    cells = [
        (r.backend, r.concurrency, r.trials, f"{r.sandbox_per_min:.0f}", f"{r.baseline_per_min:.0f}") for r in rates
    ]
    print_table("throughput (shell harness, queue + worker)", rate_columns, cells, console=console)
