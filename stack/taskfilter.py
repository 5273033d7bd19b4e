"""Difficulty filter (``harnessrl tasks filter``): keep the tasks the current
policy solves sometimes.

A GRPO group whose G rollouts all pass or all fail has zero advantage and
teaches nothing, so a training pool should hold tasks the policy solves between
``a`` and ``b`` times out of ``k``. Each task gets ``k`` attempts through the
normal trial path: the embedded model stack of ``harnessrl trial run``
(``stack.embedded.model_stack``: capture store, gateway with the chosen
engine, proxy) and the sandbox's ``TrialRunner`` with the chosen harness.

Choices (the issue is silent on them):

* An attempt is *solved* when its reward is at least ``solve_threshold``
  (default 1.0: full marks; partial rewards from ``reward.json`` do not count).
* An attempt that ends outside the policy's outcomes (``env_setup_failed``,
  ``verifier_error``, ``verifier_timeout``, ``engine_error``, ``proxy_error``, ``cancelled``; see
  ``lifecycle.POLICY_REASONS``) is an *infra failure*: its task's count out of
  ``k`` is unknown, so the task is neither kept nor in the histogram; it is
  listed in the report with the reasons. Agent timeouts, max turns and context
  overflow are the policy's own failures and count as unsolved.
* Trial ids are ``<run_id>.<task dir name>.a<attempt>`` (attempt 0..k-1); the
  kept pool copies each kept task directory under its own directory name, so
  two input tasks with the same directory name are refused up front.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.errors import InvalidArgument
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import POLICY_REASONS, TrialSpec
from stack import pool

if TYPE_CHECKING:
    from stack.embedded import Endpoints


# The termination reason recorded when the runner itself raised (an infra failure).
RUNNER_ERROR = "runner_error"


@dataclass(frozen=True)
class FilterConfig:
    harness: str
    engine: str | None = None
    model: str | None = None
    k: int = 4
    keep: tuple[int, int] = (1, 3)
    harness_options: dict[str, str] = field(default_factory=dict)
    max_turns: int = 0
    agent_timeout_s: float = 0.0
    concurrency: int = 4
    solve_threshold: float = 1.0
    sandbox_config: Path | None = None
    temperature: float | None = None  # the policy's sampling temperature; None: the proxy's default

    def __post_init__(self) -> None:
        a, b = self.keep
        if self.k < 1:
            raise InvalidArgument(f"k must be at least 1, got {self.k}")
        if not 0 <= a <= b <= self.k:
            raise InvalidArgument(f"keep range {a}-{b} must satisfy 0 <= a <= b <= k = {self.k}")
        if self.concurrency < 1:
            raise InvalidArgument(f"concurrency must be at least 1, got {self.concurrency}")
        if self.temperature is not None and not 0 < self.temperature <= 5:
            raise InvalidArgument(f"temperature must be in (0, 5], got {self.temperature}")


def parse_keep(text: str) -> tuple[int, int]:
    """``"1-3"`` -> (1, 3); ``"2"`` -> (2, 2)."""
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise InvalidArgument(f"--keep {text!r}: expected A-B (two whole numbers, e.g. 1-3)") from None
    return a, b


@dataclass
class Attempt:
    attempt: int
    trial_id: str
    reward: float | None
    termination_reason: str
    error: str = ""


@dataclass
class TaskResult:
    path: str
    name: str
    task_id: str
    family: str
    attempts: list[Attempt] = field(default_factory=list)
    solves: int = 0
    infra_failed: bool = False
    kept: bool = False


@dataclass
class FilterReport:
    config: dict[str, Any]
    started_at: str
    # False while the run is going (the report is rewritten after each task) or when it was cut short.
    complete: bool
    tasks_planned: int
    histogram: dict[str, int]
    families: dict[str, dict[str, Any]]
    kept: list[str]
    infra_failures: list[dict[str, Any]]
    tasks: list[TaskResult]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[TaskResult, int, int], None]


def select(pools: Sequence[Path], families: Sequence[str] = ()) -> list[Path]:
    """The tasks of ``pools`` (tasks or pools, ``stack.pool.expand``), restricted to ``families`` when given."""
    paths = pool.expand(pools, families)
    names = Counter(p.name for p in paths)
    dupes = sorted(n for n, c in names.items() if c > 1)
    if dupes:
        raise InvalidArgument(f"tasks with the same directory name cannot share the kept pool: {dupes}")
    return paths


async def _attempts(paths: list[Path], cfg: FilterConfig, run_id: str, progress: Progress | None) -> list[TaskResult]:
    from stack.embedded import model_stack

    results = [TaskResult(str(p), p.name, load_task(p).task_id, pool.family(p) or "(none)") for p in paths]
    with tempfile.TemporaryDirectory(prefix="hrl-filter-") as tmp:
        async with model_stack(cfg.engine, Path(tmp), cfg.model, cfg.temperature) as ends:
            await _run_all(results, cfg, run_id, ends, progress)
    return results


async def _run_all(
    results: list[TaskResult], cfg: FilterConfig, run_id: str, ends: Endpoints, progress: Progress | None
) -> None:
    from harnessrl.config import load_section
    from services.sandbox.common.settings import Settings
    from services.sandbox.factory import build_runner

    overrides: dict[str, Any] = {"capture_target": ends.capture_target}
    if ends.proxy_url:
        overrides |= {"proxy_url": ends.proxy_url, "proxy_admin_token": ends.admin_token}
        overrides["proxy_uds_path"] = ends.proxy_uds
    runner = build_runner(load_section(Settings, cfg.sandbox_config, "sandbox", overrides))
    gate = asyncio.Semaphore(cfg.concurrency)
    done = 0

    async def one(result: TaskResult, i: int) -> Attempt:
        spec = TrialSpec(
            trial_id=f"{run_id}.{result.name}.a{i}",
            run_id=run_id,
            group_id=f"{run_id}.{result.name}",
            group_size=cfg.k,
            task_path=result.path,
            harness=cfg.harness,
            harness_options=cfg.harness_options,
            model=cfg.model or "",
            max_turns=cfg.max_turns,
            agent_timeout_s=cfg.agent_timeout_s,
        )
        async with gate:
            try:
                outcome = await runner.run(spec)
                await runner.finalize(spec, outcome)
            except Exception as e:  # noqa: BLE001 - one broken trial is a listed infra failure, not a lost run
                return Attempt(i, spec.trial_id, None, RUNNER_ERROR, f"{type(e).__name__}: {e}")
        return Attempt(i, spec.trial_id, outcome.reward, outcome.termination_reason.value, outcome.error)

    async def task(result: TaskResult) -> None:
        nonlocal done
        result.attempts = list(await asyncio.gather(*(one(result, i) for i in range(cfg.k))))
        _score(result, cfg)
        done += 1
        if progress is not None:
            progress(result, done, len(results))

    await asyncio.gather(*(task(r) for r in results))


def _score(result: TaskResult, cfg: FilterConfig) -> None:
    policy = {r.value for r in POLICY_REASONS}
    result.infra_failed = any(a.termination_reason not in policy for a in result.attempts)
    result.solves = sum(1 for a in result.attempts if a.reward is not None and a.reward >= cfg.solve_threshold)
    a, b = cfg.keep
    result.kept = not result.infra_failed and a <= result.solves <= b


def summarize(
    results: list[TaskResult], cfg: FilterConfig, started_at: str, planned: int | None = None
) -> FilterReport:
    """Histogram of solves out of k, per-family counts and rates, kept tasks, infra failures,
    over the finished tasks of ``results`` (``planned``: how many the run has in all)."""
    planned = len(results) if planned is None else planned
    results = [r for r in results if r.attempts]
    scored = [r for r in results if not r.infra_failed]
    histogram = {str(n): sum(1 for r in scored if r.solves == n) for n in range(cfg.k + 1)}
    families: dict[str, dict[str, Any]] = {}
    for fam in sorted({r.family for r in results}):
        mine = [r for r in results if r.family == fam]
        ok = [r for r in mine if not r.infra_failed]
        solves = sum(r.solves for r in ok)
        families[fam] = {
            "tasks": len(mine),
            "scored": len(ok),
            "kept": sum(1 for r in ok if r.kept),
            "infra_failed": len(mine) - len(ok),
            "solves": solves,
            "attempts": len(ok) * cfg.k,
            "solve_rate": round(solves / (len(ok) * cfg.k), 4) if ok else None,
            "histogram": {str(n): sum(1 for r in ok if r.solves == n) for n in range(cfg.k + 1)},
        }
    infra = [
        {
            "task": r.name,
            "path": r.path,
            "failures": [
                asdict(a) for a in r.attempts if a.termination_reason not in {x.value for x in POLICY_REASONS}
            ],
        }
        for r in results
        if r.infra_failed
    ]
    config = asdict(cfg) | {"sandbox_config": str(cfg.sandbox_config) if cfg.sandbox_config else None}
    kept = [r.name for r in results if r.kept]
    complete = len(results) == planned
    return FilterReport(config, started_at, complete, planned, histogram, families, kept, infra, results)


def write_pool(results: list[TaskResult], out: Path) -> None:
    """Copies each kept task directory to ``out/<name>``."""
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        if r.kept:
            shutil.copytree(r.path, out / r.name, symlinks=True)


def check_out(out: Path) -> None:
    """The kept pool goes into a new or empty directory: never over an existing pool."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"--out {out}: exists and is not an empty directory")


def run_filter(
    pools: Sequence[Path],
    cfg: FilterConfig,
    out: Path | None = None,
    families: Sequence[str] = (),
    progress: Progress | None = None,
    report: Path | None = None,
) -> FilterReport:
    """Runs k attempts per task, writes the kept pool to ``out`` and the report to ``report``
    (when given; rewritten after each finished task, so an interrupted run keeps what it measured)."""
    paths = select(pools, families)
    if out is not None:
        check_out(out)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run_id = f"filter-{uuid.uuid4().hex[:8]}"
    finished: list[TaskResult] = []

    def on_task(result: TaskResult, done: int, total: int) -> None:
        finished.append(result)
        if report is not None:
            write_report(summarize(finished, cfg, started, len(paths)), report)
        if progress is not None:
            progress(result, done, total)

    results = asyncio.run(_attempts(paths, cfg, run_id, on_task))
    if out is not None:
        write_pool(results, out)
    final = summarize(results, cfg, started)
    if report is not None:
        write_report(final, report)
    return final


def write_report(report: FilterReport, path: Path) -> None:
    """Writes the JSON report atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    tmp.replace(path)
