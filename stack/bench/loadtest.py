"""``harnessrl bench e2e``: many concurrent trials through the proxy, the gateway
(scripted engine) and the capture store, each service its own process, with a
baseline (one trial at a time) measured in the same run; then proof that no
record was lost.

Each trial does what a sandbox worker and a harness do, over the same public
interfaces: register with the proxy's admin API, make ``turns`` chat
completions through the proxy with tools (a growing conversation, one tool
result per turn), close the trial (every part durable), and FinalizeTrajectory
on the capture store. Every trial is in flight at once (``concurrency`` =
``trials`` unless capped): that is what the proxy, the gateway and the store
see in a 512-trial step, without 512 sandboxes on the same cores.

Zero lost records means: every turn the proxy answered 200 is in the capture
store (captured turns == acknowledged turns, per trial), every trial is
finalized with its outcome, and every group of ``group_size`` became ready.
Choices and measured figures: stack/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.benchtable import load_average, print_table
from harnessrl.captured import list_trajectories
from harnessrl.errors import InvalidArgument
from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from stack.bench.benchstack import BenchStack, Http
from stack.bench.proxy import chat_turns, scripted

ADMIN = "load-admin"
RUN = "load"


@dataclass(frozen=True)
class LoadConfig:
    trials: int = 512
    turns: int = 4
    group_size: int = 8
    concurrency: int = 0  # 0: every trial in flight at once
    distributed: bool = False
    model_dir: Path = field(default_factory=default_model_dir)
    sandbox: bool = False  # through real bubblewrap sandboxes and sandbox workers (loadtest_sandbox)

    def check(self) -> None:
        if self.trials < 1 or self.turns < 1 or self.group_size < 1 or self.concurrency < 0:
            raise InvalidArgument("trials, turns and group_size must be >= 1, concurrency >= 0")
        if self.trials % self.group_size:
            raise InvalidArgument(f"trials ({self.trials}) must be a multiple of group_size ({self.group_size})")
        if not (self.model_dir / "tokenizer.json").exists():
            raise InvalidArgument(f"{self.model_dir}: no tokenizer.json (run scripts/setup)")
        if self.sandbox and shutil.which("bwrap") is None:
            raise InvalidArgument("--sandbox needs bubblewrap (bwrap) on PATH")


@dataclass
class TrialResult:
    trial_id: str
    latencies_s: list[float] = field(default_factory=list)  # one per acknowledged turn
    error: str = ""
    group_ready: bool = False


@dataclass
class LoadResult:
    """One measured row: what was sent, how fast, and what the store holds."""

    label: str
    trials: int
    concurrency: int
    seconds: float
    latencies_s: list[float]
    acked_turns: int
    captured_turns: int
    finalized: int
    groups_ready: int
    groups: int
    errors: list[str]
    failed_trials: int = 0  # finalized with an infrastructure reason (accounted for, not lost)

    @property
    def trials_per_s(self) -> float:
        return self.trials / self.seconds if self.seconds else 0.0

    @property
    def lost_records(self) -> int:
        """Acknowledged turns missing from the store, plus trials not finalized."""
        return max(0, self.acked_turns - self.captured_turns) + (self.trials - self.finalized)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else float("nan")


# One measured phase: (config, row label, trial-id tag) -> its row.
Measure = Callable[[LoadConfig, str, str], Awaitable[LoadResult]]


async def _one_trial(
    proxy_port: int, store: capture_pb2_grpc.CaptureStoreStub, cfg: LoadConfig, tag: str, index: int
) -> TrialResult:
    """Register, ``turns`` model calls, close, finalize: one trial as a worker and a harness run it."""
    group = index // cfg.group_size
    result = TrialResult(f"{tag}-{index}")
    http = Http(proxy_port)
    try:
        spec = {"trial_id": result.trial_id, "run_id": RUN, "task_id": f"task-{group}", "group_id": f"{tag}-g{group}"}
        created = await http.admin("/admin/trials", spec, ADMIN)
        url = f"{created['base_path']}/chat/completions"
        await chat_turns(http, url, created["token"], cfg.turns, latencies=result.latencies_s)
        await http.admin(f"/admin/trials/{result.trial_id}/close", None, ADMIN)
    except Exception as e:  # noqa: BLE001 - counted and reported, the trial still finalizes
        result.error = f"{result.trial_id}: {type(e).__name__}: {e}"
    finally:
        http.close()
    reason = records_pb2.TERMINATION_REASON_ENGINE_ERROR if result.error else records_pb2.TERMINATION_REASON_COMPLETED
    finalize = capture_pb2.FinalizeTrajectoryRequest(
        run_id=RUN,
        trial_id=result.trial_id,
        task_id=f"task-{group}",
        group_id=f"{tag}-g{group}",
        group_size=cfg.group_size,
        harness="load",
        reward=float(index % 2),
        has_reward=not result.error,
        termination_reason=reason,
    )
    response = await store.FinalizeTrajectory(finalize, timeout=120, wait_for_ready=True)
    result.group_ready = response.group_ready
    return result


async def measure(
    proxy_port: int, store: capture_pb2_grpc.CaptureStoreStub, cfg: LoadConfig, label: str, tag: str
) -> LoadResult:
    """Runs ``cfg.trials`` trials at ``cfg.concurrency`` and checks the store afterwards."""
    limit = asyncio.Semaphore(cfg.concurrency or cfg.trials)

    async def bounded(i: int) -> TrialResult:
        async with limit:
            return await _one_trial(proxy_port, store, cfg, tag, i)

    started = time.perf_counter()
    results = await asyncio.gather(*(bounded(i) for i in range(cfg.trials)))
    seconds = time.perf_counter() - started
    answered = {r.trial_id: r.latencies_s for r in results}
    errors = [r.error for r in results if r.error]
    ready = sum(r.group_ready for r in results)
    return await tally(store, cfg, (label, tag), seconds, answered, errors, len(errors), ready)


async def tally(
    store: capture_pb2_grpc.CaptureStoreStub,
    cfg: LoadConfig,
    row: tuple[str, str],
    seconds: float,
    answered: dict[str, list[float]],
    errors: list[str],
    failed: int,
    groups_ready: int | None = None,
) -> LoadResult:
    """A row's figures from what each trial was answered (its turns' latencies) and
    what the store holds for the row's trials (``row``: its label and trial-id tag).
    ``failed``: trials that failed (accounted for, not lost); ``groups_ready`` None:
    the groups whose every trial the store holds."""
    label, tag = row
    captured: dict[str, int] = {}  # the row's trials in the store -> their model calls there
    finalized = 0
    listing = capture_pb2.ListTrajectoriesRequest(run_id=RUN, page_size=1000)
    async for traj in list_trajectories(store, listing, page_timeout_s=120):
        if traj.trial_id.startswith(f"{tag}-"):
            captured[traj.trial_id] = sum(s.num_turns for s in traj.segments)
            finalized += traj.finalized
    if groups_ready is None:
        trials = list(answered)
        groups = [trials[i : i + cfg.group_size] for i in range(0, len(trials), cfg.group_size)]
        groups_ready = sum(all(t in captured for t in group) for group in groups)
    errors = errors + [
        f"{t}: {len(lat)} turns acknowledged, {captured.get(t, 0)} captured"
        for t, lat in answered.items()
        if captured.get(t, 0) != len(lat)
    ]
    return LoadResult(
        label=label,
        trials=cfg.trials,
        concurrency=cfg.concurrency or cfg.trials,
        seconds=seconds,
        latencies_s=[x for lat in answered.values() for x in lat],
        acked_turns=sum(len(lat) for lat in answered.values()),
        captured_turns=sum(min(captured.get(t, 0), len(lat)) for t, lat in answered.items()),
        finalized=finalized,
        groups_ready=groups_ready,
        groups=cfg.trials // cfg.group_size,
        errors=errors,
        failed_trials=failed,
    )


def bench_stack(root: Path, cfg: LoadConfig, **more: Any) -> BenchStack:
    """Gateway (scripted engine), capture store (Redis + S3 when distributed) and proxy; ``more``: the sandbox."""
    return BenchStack(
        root,
        gateway=GatewaySettings.model_validate(scripted(root) | {"model_path": cfg.model_dir}),
        capture=CaptureSettings.model_validate({}),
        proxy=ProxySettings.model_validate({"admin_token": ADMIN, "model_dir": cfg.model_dir, "max_trials": 100_000}),
        distributed=cfg.distributed,
        **more,
    )


async def run_load(cfg: LoadConfig, progress: Callable[[str], None] = lambda _: None) -> list[LoadResult]:
    """The baseline (one trial at a time, ``group_size`` trials) then the load row, on one stack."""
    cfg.check()
    with tempfile.TemporaryDirectory(prefix="hrl-bench-e2e-") as tmp:
        async with AsyncExitStack() as exits:
            progress("starting gateway, capture store and proxy" + (" (Redis + S3)" if cfg.distributed else ""))
            if cfg.sandbox:
                from stack.bench.loadtest_sandbox import run_sandboxed

                return await run_sandboxed(Path(tmp), cfg, exits, progress)
            up = await bench_stack(Path(tmp), cfg).start()
            exits.callback(up.stop)
            proxy_port = up.ports["proxy"]
            channel = connect(up.target("capture"), tracing=False)
            exits.push_async_callback(channel.close)
            store = capture_pb2_grpc.CaptureStoreStub(channel)
            flight = f"{cfg.trials} trials, {cfg.concurrency or cfg.trials} in flight"
            one = partial(measure, proxy_port, store)
            return await phases(
                one, cfg, progress, ("baseline: one trial at a time", flight, f"{cfg.trials} concurrent")
            )


async def phases(
    measure_one: Measure, cfg: LoadConfig, progress: Callable[[str], None], lines: tuple[str, str, str]
) -> list[LoadResult]:
    """A warm-up and the baseline (``group_size`` trials, one at a time), then the load row;
    ``lines``: the baseline's progress line, the load's, and the load row's label."""
    baseline_line, load_line, label = lines
    base = replace(cfg, trials=cfg.group_size, concurrency=1)
    await measure_one(base, "warm-up", "warm")
    progress(baseline_line)
    baseline = await measure_one(base, "baseline (sequential)", "base")
    progress(load_line)
    return [baseline, await measure_one(cfg, label, "load")]


def print_report(rows: list[LoadResult], distributed: bool, sandbox: bool = False) -> None:
    from rich.console import Console

    backend = "distributed (Redis + S3)" if distributed else "embedded (SQLite + files)"
    where = "bubblewrap sandboxes (shell harness) -> " if sandbox else ""
    title = f"harnessrl bench e2e: {where}proxy + gateway (scripted) + capture store, {backend}"
    columns = ("run", "trials", "in flight", "s", "trials/s", "turns/s", "p50 ms", "p99 ms", "failed", "lost records")
    cells = [
        (
            r.label,
            r.trials,
            r.concurrency,
            f"{r.seconds:.1f}",
            f"{r.trials_per_s:.2f}",
            f"{r.acked_turns / r.seconds:.1f}" if r.seconds else "-",
            f"{r.percentile_ms(50):.1f}",
            f"{r.percentile_ms(99):.1f}",
            r.failed_trials,
            r.lost_records,
        )
        for r in rows
    ]
    base, load = rows[0], rows[-1]
    summary = (
        f"throughput x{load.trials_per_s / base.trials_per_s:.1f} vs sequential; "
        f"p99 x{load.percentile_ms(99) / base.percentile_ms(99):.1f}; "
        f"{load.acked_turns} turns acknowledged, {load.captured_turns} captured; "
        f"{load.finalized}/{load.trials} trials finalized; {load.groups_ready}/{load.groups} groups ready; "
        f"{load_average(2)}"
    )
    errors = [f"[red]{r.label}: {line}[/red]" for r in rows for line in r.errors[:10]]
    print_table(title, columns, cells, summary, *errors, left=("run",), console=Console(width=140))
