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
import os
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

from harnessrl.captured import list_trajectories
from harnessrl.errors import InvalidArgument
from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from stack.bench_proxy import TOOLS, scripted
from stack.benchstack import BenchStack, Http

ADMIN = "load-admin"
RUN = "load"
# The same scripted turn and tool list as the proxy's own load bench (bench_proxy).
SYSTEM = "You are a coding agent working in a repository. " * 20


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
    acked_turns: int = 0
    latencies_s: list[float] = field(default_factory=list)
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
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix it."}]
        for _ in range(cfg.turns):
            body = {"model": cfg.model_dir.name, "messages": messages, "tools": TOOLS}
            started = time.perf_counter()
            status, reply = await http.post_json(f"{created['base_path']}/chat/completions", body, created["token"])
            if status != 200:
                raise RuntimeError(f"turn {result.acked_turns}: {status} {str(reply)[:200]}")
            result.latencies_s.append(time.perf_counter() - started)
            result.acked_turns += 1
            message = reply["choices"][0]["message"]
            messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
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


async def _captured_turns(store: capture_pb2_grpc.CaptureStoreStub, tag: str) -> tuple[dict[str, int], int]:
    """Per trial of this row, the model calls the store holds; and how many are finalized."""
    turns: dict[str, int] = {}
    finalized = 0
    req = capture_pb2.ListTrajectoriesRequest(run_id=RUN, page_size=1000)
    async for traj in list_trajectories(store, req, page_timeout_s=120):
        if traj.trial_id.startswith(f"{tag}-"):
            turns[traj.trial_id] = sum(s.num_turns for s in traj.segments)
            finalized += traj.finalized
    return turns, finalized


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
    captured, finalized = await _captured_turns(store, tag)
    errors = [r.error for r in results if r.error]
    errors += [
        f"{r.trial_id}: {r.acked_turns} turns acknowledged, {captured.get(r.trial_id, 0)} captured"
        for r in results
        if captured.get(r.trial_id, 0) != r.acked_turns
    ]
    return LoadResult(
        label=label,
        trials=cfg.trials,
        concurrency=cfg.concurrency or cfg.trials,
        seconds=seconds,
        latencies_s=[x for r in results for x in r.latencies_s],
        acked_turns=sum(r.acked_turns for r in results),
        captured_turns=sum(min(captured.get(r.trial_id, 0), r.acked_turns) for r in results),
        finalized=finalized,
        groups_ready=sum(r.group_ready for r in results),
        groups=cfg.trials // cfg.group_size,
        errors=errors,
        failed_trials=sum(bool(r.error) for r in results),
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
                from stack.loadtest_sandbox import run_sandboxed

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
    from rich.table import Table

    backend = "distributed (Redis + S3)" if distributed else "embedded (SQLite + files)"
    where = "bubblewrap sandboxes (shell harness) -> " if sandbox else ""
    table = Table(title=f"harnessrl bench e2e: {where}proxy + gateway (scripted) + capture store, {backend}")
    columns = ("run", "trials", "in flight", "s", "trials/s", "turns/s", "p50 ms", "p99 ms", "failed", "lost records")
    for column in columns:
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        table.add_row(
            r.label,
            str(r.trials),
            str(r.concurrency),
            f"{r.seconds:.1f}",
            f"{r.trials_per_s:.2f}",
            f"{r.acked_turns / r.seconds:.1f}" if r.seconds else "-",
            f"{r.percentile_ms(50):.1f}",
            f"{r.percentile_ms(99):.1f}",
            str(r.failed_trials),
            str(r.lost_records),
        )
    console = Console(width=140)
    console.print(table)
    base, load = rows[0], rows[-1]
    console.print(
        f"throughput x{load.trials_per_s / base.trials_per_s:.1f} vs sequential; "
        f"p99 x{load.percentile_ms(99) / base.percentile_ms(99):.1f}; "
        f"{load.acked_turns} turns acknowledged, {load.captured_turns} captured; "
        f"{load.finalized}/{load.trials} trials finalized; {load.groups_ready}/{load.groups} groups ready; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    for r in rows:
        for line in r.errors[:10]:
            console.print(f"[red]{r.label}: {line}[/red]")
