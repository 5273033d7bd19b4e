"""Preflight's task pool check: each task's oracle must score 1 and a no-op 0 (results
cached by the task's content digest, with the oracle's reward keys), and a task whose
verifier writes several rewards without 'reward' is refused unless the run chooses what
trains ([run] reward_key / reward_weights): its trials would complete with no reward."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import grpc

from harnessrl.rpc import connect
from harnessrl.v1 import records_pb2, sandbox_pb2, sandbox_pb2_grpc
from stack.preflight import Check, cache_dir, task_digest
from stack.runconfig import RunConfig


async def check_pool(cfg: RunConfig, sandbox_target: str, tasks: Sequence[Path], token: str | None) -> Check:
    """A no-op trial per task proves the backend runs; the oracle must score 1, no-op 0.
    A task whose verifier writes several rewards (none named ``reward``) gives no trial
    reward unless the run chooses one: refused here, naming tasks and keys, before any
    training (its trials would complete and train on nothing)."""
    cache = cache_dir()
    choice = _reward_choice(cfg)
    known = {t: _cached(cache, t) for t in tasks}
    todo = [t for t, entry in known.items() if entry is None]
    results: list[tuple[Path, str, sandbox_pb2.TrialStatus]] = []
    if todo:
        run_id = f"{cfg.run_id}-preflight"
        async with connect(sandbox_target, token, service="trainer") as channel:
            stub = sandbox_pb2_grpc.SandboxStub(channel)
            jobs: list[Awaitable[tuple[Path, str, sandbox_pb2.TrialStatus]]] = []
            for i, task in enumerate(todo):
                for harness in ("oracle", "nop"):
                    trial_id = f"{run_id}-{i}-{harness}-{int(time.time())}"
                    jobs.append(trial(stub, run_id, trial_id, task, harness, choice))
            try:
                results = list(await asyncio.gather(*jobs))
            except grpc.aio.AioRpcError as e:
                fix = f"start the sandbox service at {sandbox_target} or correct [run] sandbox_target"
                return Check("task pool", False, f"sandbox {sandbox_target}: {e.code().name}: {e.details()}", fix)
    keys = {t: list(entry.get("keys", [])) for t, entry in known.items() if entry is not None}
    keys |= {t: sorted(s.rewards) for t, harness, s in results if harness == "oracle"}
    if not choice:
        multi = {t: k for t, k in keys.items() if len(k) > 1 and "reward" not in k}
        if multi:
            shown = "; ".join(f"{t.name}: {', '.join(k)}" for t, k in sorted(multi.items())[:5])
            return Check(
                "task pool",
                False,
                f"{len(multi)} task(s) write several rewards and none named 'reward', so a trial has no reward to "
                f"train on: {shown}",
                'choose what trains in [run]: reward_key = "KEY" or reward_weights = {KEY = 1.0, ...}',
            )
    if not results:
        return Check("task pool", True, f"{len(tasks)} task(s) validated (cached)")
    return _judge(results, cache, len(tasks))


def _reward_choice(cfg: RunConfig) -> dict[str, Any]:
    run = cfg.run
    if run.reward_weights:
        return {"reward_weights": dict(run.reward_weights)}
    return {"reward_key": run.reward_key} if run.reward_key else {}


def _cached(cache: Path, task: Path) -> dict[str, Any] | None:
    path = cache / f"{task_digest(task)}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # An entry written before the oracle's reward keys were kept says nothing of them: checked again.
    return entry if isinstance(entry, dict) and entry.get("ok") and "keys" in entry else None


def _judge(results: list[tuple[Path, str, sandbox_pb2.TrialStatus]], cache: Path, total: int) -> Check:
    problems: dict[Path, list[str]] = {}
    expected = {"oracle": 1.0, "nop": 0.0}
    for task, harness, status in results:
        reason = records_pb2.TerminationReason.Name(status.termination_reason).removeprefix("TERMINATION_REASON_")
        if status.termination_reason != records_pb2.TERMINATION_REASON_COMPLETED:
            problems.setdefault(task, []).append(f"{harness} ended {reason.lower()}: {status.error[:200]}")
        elif not status.has_reward or status.reward != expected[harness]:
            got = status.reward if status.has_reward else None
            problems.setdefault(task, []).append(f"{harness} scored {got}, expected {expected[harness]:g}")
    cache.mkdir(parents=True, exist_ok=True)
    keys = {task: sorted(status.rewards) for task, harness, status in results if harness == "oracle"}
    for task in {t for t, _, _ in results} - set(problems):
        entry = {"task": str(task), "ok": True, "keys": keys.get(task, [])}
        (cache / f"{task_digest(task)}.json").write_text(json.dumps(entry))
    if problems:
        shown = "; ".join(f"{t.name}: {', '.join(p)}" for t, p in sorted(problems.items())[:3])
        fix = "fix the named task(s) (solution/solve.sh must pass, tests must fail untouched) or remove them"
        if any("verify_network" in p for ps in problems.values() for p in ps):
            fix = "the backend cannot give a public verifier a network: change the verify_network named above; " + fix
        elif any("env_setup_failed" in p for ps in problems.values() for p in ps):
            fix = "the sandbox backend cannot run a trial: check bubblewrap and the [sandbox] settings; " + fix
        return Check("task pool", False, f"{len(problems)} of {total} task(s) rejected: {shown}", fix)
    return Check("task pool", True, f"{total} task(s): oracle 1, no-op 0")


async def trial(
    stub: sandbox_pb2_grpc.SandboxStub,
    run_id: str,
    trial_id: str,
    task: Path,
    harness: str,
    choice: dict[str, Any] | None = None,
) -> tuple[Path, str, sandbox_pb2.TrialStatus]:
    spec = sandbox_pb2.TrialSpec(
        trial_id=trial_id,
        run_id=run_id,
        task_path=str(task),
        harness=harness,
        group_id=trial_id,
        group_size=1,
        **(choice or {}),
    )
    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec), timeout=30)
    watch = stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=[trial_id]), timeout=600)
    async for status in watch:
        if status.state == sandbox_pb2.TRIAL_STATE_DONE:
            watch.cancel()
            return task, harness, status
    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "watch ended")
