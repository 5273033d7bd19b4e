"""``harnessrl eval CONFIG``: the eval tasks x k trials through the same stack as
training (same harness, proxy, gateway, sandbox; token-faithful capture), no
training; pass@k and pass^k per task and overall.

Which policy: the run's newest trainer checkpoint when the run has one (the
gateway loads it; rows carry its step), else the base model (step 0).
Estimators over the n trials of a task that ended for a policy reason (infra
failures are counted, never scored) with c successes (reward >=
``[trainer.algo] success_threshold``): pass@j = 1 - C(n-c, j)/C(n, j) (the
unbiased estimator of the chance that at least one of j trials succeeds) and
pass^j = C(c, j)/C(n, j) (all j succeed), for j = 1 and j = k (when n >= j).
Rows go to ``<run>/eval.jsonl``: one per task plus one ``task_id = "*"`` row with
the mean over tasks (which leaves the dashboard's per-step mean unchanged). Each
row names the ``policy_versions`` its trials sampled with, read back from their
captured trajectories: an evaluation during training can straddle a weight update.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import secrets
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console

from harnessrl.captured import list_trajectories
from harnessrl.errors import ConfigError, FailedPrecondition
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from stack import preflight
from stack.embedded import services
from stack.launcher import PlannedTrial, TrialTemplate, board_update
from stack.progress import TrialBoard, heartbeat
from stack.run import check_overlap, resolve_tasks
from stack.runconfig import RunConfig
from stack.rundir import RunDirectory

log = logging.getLogger(__name__)

POLICY_REASONS = {
    records_pb2.TERMINATION_REASON_COMPLETED,
    records_pb2.TERMINATION_REASON_MAX_TURNS,
    records_pb2.TERMINATION_REASON_CONTEXT_OVERFLOW,
    records_pb2.TERMINATION_REASON_AGENT_TIMEOUT,
}


def pass_at(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k from n trials with c successes (None when n < k)."""
    if n < k or k < 1:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat(n: int, c: int, k: int) -> float | None:
    """Unbiased pass^k (all k succeed) from n trials with c successes (None when n < k)."""
    if n < k or k < 1:
        return None
    return math.comb(c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    run_dir: Path
    step: int
    k: int
    rows: list[dict[str, Any]] = field(default_factory=list)


def task_row(step: int, task: str, k: int, statuses: list[sandbox_pb2.TrialStatus], threshold: float) -> dict[str, Any]:
    """A task's row. A trial that completed with several rewards and none chosen ([run]
    reward_key / reward_weights unset) is ``unscored``: neither a success nor a failure,
    its keys' means are in ``rewards``."""
    ended = [s for s in statuses if s.termination_reason in POLICY_REASONS]
    valid = [s for s in ended if s.has_reward]
    c = sum(1 for s in valid if s.reward >= threshold)
    n = len(valid)
    reasons: dict[str, int] = {}
    for s in statuses:
        name = records_pb2.TerminationReason.Name(s.termination_reason).removeprefix("TERMINATION_REASON_").lower()
        reasons[name] = reasons.get(name, 0) + 1
    row: dict[str, Any] = {"step": step, "task_id": task, "k": k, "n": n, "successes": c}
    row["infra_failures"] = len(statuses) - len(ended)
    row["unscored"] = len(ended) - n
    keys = sorted({key for s in ended for key in s.rewards})
    if keys != ["reward"] and keys:
        row["rewards"] = {key: statistics.fmean(s.rewards[key] for s in ended if key in s.rewards) for key in keys}
    for j in sorted({1, k}):
        row[f"pass@{j}"] = pass_at(n, c, j)
        row[f"pass^{j}"] = pass_hat(n, c, j)
    row["termination"] = reasons
    return row


def overall_row(step: int, k: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "task_id": "*", "k": k, "tasks": len(rows)}
    if rows and all("policy_versions" in r for r in rows):
        out["policy_versions"] = sorted({v for r in rows for v in r["policy_versions"]})
    out["n"] = sum(r["n"] for r in rows)
    out["successes"] = sum(r["successes"] for r in rows)
    out["infra_failures"] = sum(r["infra_failures"] for r in rows)
    out["unscored"] = sum(r.get("unscored", 0) for r in rows)
    for key in rows[0] if rows else []:
        if key.startswith(("pass@", "pass^")):
            values = [r[key] for r in rows if r[key] is not None]
            out[key] = statistics.fmean(values) if values else None
    return out


def _eval_config(cfg: RunConfig, store_dir: Path | None = None) -> tuple[RunConfig, int, str]:
    """The config with the gateway on the run's newest checkpoint (if any) and the store where asked."""
    from services.trainer import checkpoint

    latest = checkpoint.latest(cfg.run_dir / "trainer")
    step, name = 0, "base"
    if latest is not None:
        state = json.loads((latest / checkpoint.STATE_FILE).read_text())
        step, name = int(state["step"]), latest.name
    update: dict[str, Any] = {}
    if cfg.gateway is not None and latest is not None:
        update["gateway"] = cfg.gateway.model_copy(update={"model_path": latest, "initial_version": step})
    if cfg.capture_store is not None and store_dir is not None and cfg.capture_store.backend == "embedded":
        update["capture_store"] = cfg.capture_store.model_copy(update={"store_dir": store_dir})
    return dataclasses.replace(cfg, **update, dashboard=None), step, name


async def evaluate_run(cfg: RunConfig, console: Console | None = None) -> EvalResult:
    train, evaluation = resolve_tasks(cfg)
    if not evaluation:
        raise ConfigError(f"{cfg.path}: [run] eval_tasks is empty: nothing to evaluate")
    check_overlap(cfg, train, evaluation)
    report = preflight.static_checks(cfg, evaluation)
    report.raise_if_failed()
    run_dir = RunDirectory(cfg)
    info = run_dir.read_info()
    if info.get("status") == "running" and info.get("pid"):
        from stack.rundir import _alive

        if _alive(int(info["pid"])):
            raise FailedPrecondition(f"run {cfg.run_id!r} is training; evaluate it when it has stopped")
    if not run_dir.info_path.exists():
        run_dir.create(resume=False)
        run_dir.write_info("done", steps_planned=0)
    eval_cfg, step, ckpt = _eval_config(cfg)
    k = cfg.run.eval_k
    board = TrialBoard()
    async with services(eval_cfg) as ends:
        assert ends.sandbox_target is not None
        lines = asyncio.ensure_future(heartbeat(board, console or Console(), cfg.run.progress_every_s, "eval of step"))
        try:
            trials = await _run_trials(eval_cfg, ends.sandbox_target, evaluation, step, k, board=board)
        finally:
            lines.cancel()
            await asyncio.gather(lines, return_exceptions=True)
        versions = await versions_seen(ends.capture_target, cfg.token(), trials)
    rows = eval_rows(cfg, step, k, evaluation, trials.statuses, ckpt, versions)
    run_dir.append_jsonl("eval.jsonl", rows)
    return EvalResult(run_dir.path, step, k, rows)


def eval_rows(
    cfg: RunConfig,
    step: int,
    k: int,
    tasks: Sequence[Path],
    statuses: dict[str, list[sandbox_pb2.TrialStatus]],
    checkpoint: str,
    versions: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    threshold = cfg.trainer.algo.success_threshold
    rows = [task_row(step, t.name, k, statuses[t.name], threshold) for t in tasks]
    if versions is not None:
        for row in rows:
            row["policy_versions"] = versions.get(row["task_id"], [])
    stamp = {"checkpoint": checkpoint, "created_at": time.time()}
    return [r | stamp for r in rows] + [overall_row(step, k, rows) | stamp]


def evaluated_steps(run_dir: RunDirectory) -> set[int]:
    """The steps whose overall row eval.jsonl holds, read as the dashboard reads them."""
    from services.dashboard import heldout, rundir

    rows, _ = rundir.read_eval(rundir.RunDir(run_dir.cfg.run_id, run_dir.path))
    return set(heldout.pass_rows(rows))


class PeriodicEval:
    """``[run] eval_every = N``: during a run, the eval tasks x k trials with the
    weights the gateway serves at steps 0, N, 2N... (through the same sandbox
    and proxy as training, alongside its rollouts); rows appended to eval.jsonl
    as ``harnessrl eval`` writes them, so the dashboard plots held-out reward per step."""

    def __init__(
        self, cfg: RunConfig, target: str, capture_target: str, tasks: Sequence[Path], run_dir: RunDirectory
    ) -> None:
        self.cfg, self.target, self.tasks, self.run_dir = cfg, target, list(tasks), run_dir
        self.capture_target = capture_target
        self.every = cfg.run.eval_every
        self.running: dict[int, asyncio.Task[None]] = {}
        self.trial_ids: list[str] = []
        self.done = evaluated_steps(run_dir)  # a resumed run does not redo them

    def maybe_start(self, step: int) -> None:
        if not self.every or not self.tasks or step % self.every or step in self.running or step in self.done:
            return
        self.start(step)

    def start(self, step: int, checkpoint: str | None = None) -> asyncio.Task[None]:
        """The evaluation at ``step``; its rows name ``checkpoint`` (default ``step-N``)."""
        task = self.running[step] = asyncio.ensure_future(self._evaluate(step, checkpoint or f"step-{step}"))
        return task

    async def _evaluate(self, step: int, checkpoint: str) -> None:
        k = self.cfg.run.eval_k
        trials = await _run_trials(self.cfg, self.target, self.tasks, step, k, self.trial_ids)
        versions = await versions_seen(self.capture_target, self.cfg.token(), trials)
        rows = eval_rows(self.cfg, step, k, self.tasks, trials.statuses, checkpoint, versions)
        self.run_dir.append_jsonl("eval.jsonl", rows)

    async def finish(self, *, wait: bool) -> None:
        """Waits for the evaluations under way (a finished run), or cancels their trials (a stopped one)."""
        if not wait:
            async with connect(self.target, self.cfg.token(), service="trainer") as channel:
                stub = sandbox_pb2_grpc.SandboxStub(channel)
                for trial_id in self.trial_ids:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub.CancelTrial(sandbox_pb2.CancelTrialRequest(trial_id=trial_id), timeout=10)
        results = await asyncio.gather(*self.running.values(), return_exceptions=True)
        for step, result in zip(self.running, results, strict=True):
            if isinstance(result, Exception):
                log.warning("evaluation at step %d failed: %s", step, result)


@dataclass
class EvalTrials:
    """The finished trials of one evaluation: statuses and group id per task name."""

    run_id: str
    step: int
    statuses: dict[str, list[sandbox_pb2.TrialStatus]]
    groups: dict[str, str]


async def _run_trials(
    cfg: RunConfig,
    target: str,
    tasks: list[Path],
    step: int,
    k: int,
    record: list[str] | None = None,
    board: TrialBoard | None = None,
) -> EvalTrials:
    eval_run = f"{cfg.run_id}-eval"
    # The run's own template (harness, limits, which reward counts) under the eval run's id.
    template = dataclasses.replace(TrialTemplate.for_run(cfg), run_id=eval_run, group_size=k)
    nonce = secrets.token_hex(3)
    specs, groups = [], {}
    for t, task in enumerate(tasks):
        gid = groups[task.name] = f"{eval_run}-s{step}-{nonce}-t{t}"
        specs += [template.spec(PlannedTrial(f"{gid}-{i}", gid, task, step, i), step) for i in range(k)]
    async with connect(target, cfg.token(), service="trainer") as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        for spec in specs:
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec), timeout=30)
            if record is not None:
                record.append(spec.trial_id)
            if board is not None:
                board.submitted(spec.trial_id, step)
        done = await _wait_done(stub, [s.trial_id for s in specs], board)
    out: dict[str, list[sandbox_pb2.TrialStatus]] = {t.name: [] for t in tasks}
    for spec in specs:
        out[Path(spec.task_path).name].append(done[spec.trial_id])
    return EvalTrials(eval_run, step, out, groups)


async def versions_seen(target: str, token: str | None, trials: EvalTrials) -> dict[str, list[int]] | None:
    """Per task, the policy versions its trials sampled with (from their captured
    trajectories; [] when none sampled a token); None, with a warning, when the
    capture store cannot say (the evaluation's other figures stand)."""
    task_of = {gid: task for task, gid in trials.groups.items()}
    seen: dict[str, set[int]] = {task: set() for task in trials.groups}
    req = capture_pb2.ListTrajectoriesRequest(run_id=trials.run_id, step=trials.step, page_size=1000)
    try:
        async with connect(target, token, service="trainer") as channel:
            async for t in list_trajectories(capture_pb2_grpc.CaptureStoreStub(channel), req, page_timeout_s=30):
                if t.group_id in task_of:  # not an earlier evaluation of the same step
                    seen[task_of[t.group_id]].update(t.policy_versions_seen)
    except grpc.aio.AioRpcError as e:
        log.warning("eval: policy versions not read from the capture store: %s %s", e.code().name, e.details())
        return None
    return {task: sorted(versions) for task, versions in seen.items()}


async def _wait_done(
    stub: sandbox_pb2_grpc.SandboxStub, ids: list[str], board: TrialBoard | None = None
) -> dict[str, sandbox_pb2.TrialStatus]:
    done: dict[str, sandbox_pb2.TrialStatus] = {}
    watch = stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=ids))
    try:
        async for status in watch:
            if board is not None:
                board_update(board, status)
            if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                done[status.trial_id] = status
                if len(done) == len(ids):
                    break
    finally:
        watch.cancel()
    return done


def summary_lines(result: EvalResult) -> list[str]:
    k = result.k
    lines = [f"eval of step {result.step} (k = {k}) -> {result.run_dir / 'eval.jsonl'}"]
    lines.append(f"{'task':<32} {'n':>3} {'ok':>3} {'pass@1':>7} {f'pass@{k}':>7} {f'pass^{k}':>7} infra")

    def f(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else "-"

    for row in result.rows:
        name = "overall" if row["task_id"] == "*" else row["task_id"]
        lines.append(
            f"{name[:32]:<32} {row['n']:>3} {row['successes']:>3} {f(row.get('pass@1')):>7} "
            f"{f(row.get(f'pass@{k}')):>7} {f(row.get(f'pass^{k}')):>7} {row['infra_failures']}"
        )
        if row.get("rewards"):  # a multi-key reward.json: each key's mean over the trials that ended
            means = ", ".join(f"{key} {value:.3f}" for key, value in row["rewards"].items())
            lines.append(f"{'':<32} rewards: {means}")
        if row.get("unscored"):
            lines.append(
                f"{'':<32} {row['unscored']} completed trial(s) with several rewards and none chosen: not in n; "
                "set [run] reward_key or reward_weights to score them"
            )
    return lines


async def preflight_only(cfg: RunConfig) -> preflight.Report:
    """``harnessrl preflight``: static checks, then the live ones against services started
    for the check (the embedded capture store in a temporary folder)."""
    train, _ = resolve_tasks(cfg)
    report = preflight.static_checks(cfg, train)
    if not report.ok:
        return report
    with tempfile.TemporaryDirectory(prefix="hrl-preflight-") as tmp:
        check_cfg, _, _ = _eval_config(cfg, Path(tmp) / "capture")
        # Nothing of the check lands in the run directory: its trials' artifacts stay in tmp too.
        sandbox = cfg.sandbox.model_copy(update={"artifacts_dir": Path(tmp) / "artifacts"})
        check_cfg = dataclasses.replace(check_cfg, gateway=cfg.gateway, run_dir=Path(tmp) / "run", sandbox=sandbox)
        try:
            async with services(check_cfg) as ends:
                assert ends.sandbox_target is not None
                live = await preflight.live_checks(
                    check_cfg, ends.gateway_target, ends.sandbox_target, train, cfg.token()
                )
        except Exception as e:  # noqa: BLE001 - any start failure is a failed check with its cause
            fix = "check the service tables and the addresses in [run]"
            report.add(preflight.Check("services", False, f"could not start: {type(e).__name__}: {e}", fix))
            return report
        report.checks += live.checks
    return report
