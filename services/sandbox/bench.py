"""``harnessrl bench sandbox``: what the local sandbox costs.

1. Overhead per trial with a warm layer cache: the full sandboxed trial of a
   small task (shell harness: ``echo hello > hello.txt``; verifier: test.sh)
   against a baseline measured in the same run, the same commands with no
   sandbox (copy the workspace, run the agent command, run the verifier, delete).
   Setup + teardown are reported on their own (the issue's target: <= 150 ms).
2. Trials per minute at concurrency 1, 4 and 16 through the real queue and
   worker, next to the same baseline commands run at the same concurrency.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from services.sandbox.backends.local import LocalBackend
from services.sandbox.lifecycle import TrialSpec, TrialState
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.runner import TrialRunner
from services.sandbox.settings import Settings
from services.sandbox.worker import Worker

TASK = Path(__file__).with_name("examples") / "hello"
AGENT = "echo hello > hello.txt"


@dataclass
class OverheadRow:
    sandbox_ms: float
    baseline_ms: float
    setup_ms: float
    teardown_ms: float
    agent_ms: float
    verify_ms: float


@dataclass
class ThroughputRow:
    concurrency: int
    trials: int
    sandbox_per_min: float
    baseline_per_min: float


def _settings(root: Path, concurrency: int = 1) -> Settings:
    return Settings.model_validate(
        {
            "work_dir": root / "trials",
            "cache_dir": root / "cache",
            "artifacts_dir": root / "artifacts",
            "concurrency": concurrency,
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


async def overhead(root: Path, trials: int) -> OverheadRow:
    settings = _settings(root)
    runner = TrialRunner(settings, LocalBackend(settings))
    await runner.run(_spec(-1))  # warm the layer cache
    workspace = next((settings.cache_dir / "layers").glob("*-v*[0-9]")) / "root" / "app"
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
        sandbox_ms=med(t for t, _ in rows) * 1000,
        baseline_ms=med(baseline) * 1000,
        setup_ms=med(tm.setup_s for _, tm in rows) * 1000,
        teardown_ms=med(tm.teardown_s for _, tm in rows) * 1000,
        agent_ms=med(tm.agent_s for _, tm in rows) * 1000,
        verify_ms=med(tm.verify_s for _, tm in rows) * 1000,
    )


async def throughput(root: Path, concurrency: int, trials: int) -> ThroughputRow:
    settings = _settings(root, concurrency)
    queue = MemoryQueue()
    worker = Worker(settings, queue, TrialRunner(settings, LocalBackend(settings)), name="bench")
    await TrialRunner(settings, LocalBackend(settings)).run(_spec(-1))
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
    workspace = next((settings.cache_dir / "layers").glob("*-v*[0-9]")) / "root" / "app"
    base_root = root / f"baseline-{concurrency}"
    base_root.mkdir()
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            await _baseline_trial(base_root, workspace)

    base_started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(trials)))
    base_elapsed = time.perf_counter() - base_started
    return ThroughputRow(concurrency, trials, trials / elapsed * 60, trials / base_elapsed * 60)


async def run_bench(
    trials: int = 20, concurrencies: tuple[int, ...] = (1, 4, 16)
) -> tuple[OverheadRow, list[ThroughputRow]]:
    with tempfile.TemporaryDirectory(prefix="hrl-bench-sandbox-") as tmp:
        root = Path(tmp)
        row = await overhead(root / "overhead", trials)
        rates = [await throughput(root / f"c{c}", c, max(trials, 2 * c)) for c in concurrencies]
    return row, rates


def print_report(row: OverheadRow, rates: list[ThroughputRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="local sandbox: one small trial (median, warm layer cache)")
    for col in ("", "sandboxed", "baseline (no sandbox)", "overhead"):
        table.add_column(col, justify="right")
    table.add_row(
        "whole trial",
        f"{row.sandbox_ms:.1f} ms",
        f"{row.baseline_ms:.1f} ms",
        f"{row.sandbox_ms - row.baseline_ms:.1f} ms",
    )
    table.add_row("setup + teardown", f"{row.setup_ms + row.teardown_ms:.1f} ms", "", "target <= 150 ms")
    table.add_row("  setup / teardown", f"{row.setup_ms:.1f} / {row.teardown_ms:.1f} ms", "", "")
    table.add_row("  agent / verify phases", f"{row.agent_ms:.1f} / {row.verify_ms:.1f} ms", "", "")
    console.print(table)
    rate = Table(title="throughput (shell harness, queue + worker)")
    for col in ("concurrency", "trials", "sandboxed trials/min", "baseline trials/min"):
        rate.add_column(col, justify="right")
    for r in rates:
        rate.add_row(str(r.concurrency), str(r.trials), f"{r.sandbox_per_min:.0f}", f"{r.baseline_per_min:.0f}")
    console.print(rate)
