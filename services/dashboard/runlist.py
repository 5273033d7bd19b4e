"""The runs list: what each run directory under the root is, and the facts its row shows.

Three kinds of directory share the root (``$HARNESSRL_HOME/runs``):
- ``run``: a training run (``harnessrl run``, or a verl run's ``metrics.jsonl``);
- ``eval``: ``harnessrl eval`` of a config that never trained (run.json ``steps_planned = 0``);
- ``trial``: one ``harnessrl trial run`` (run.json ``kind = "trial"``; run id = trial id).

Training runs come first (newest first), then evaluations, then single trials: a
newcomer's one training run must not sink under the trials made while trying things
out. Every row is read from files (run.json, metrics.jsonl, eval.jsonl, the trial's
``result.json``): no capture store is opened to draw the list.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from services.dashboard import heldout, panels, rundir
from services.dashboard.rundir import RunDir

RunKind = Literal["run", "eval", "trial"]
KIND_ORDER: dict[str, int] = {"run": 0, "eval": 1, "trial": 2}


def run_kind(run: RunDir) -> RunKind:
    info = run.info
    if info is not None and info.kind == "trial":
        return "trial"
    if info is not None and info.steps_planned == 0:
        return "eval"
    return "run"


def row(run: RunDir) -> dict[str, Any]:
    """One row of the list; fields a kind does not have are None."""
    info = run.info.model_dump(mode="json") if run.info else {}
    kind = run_kind(run)
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "kind": kind,
        "status": info.get("status", "unknown"),
        "created_at": info.get("created_at"),
        "model": info.get("model"),
        "harness": info.get("harness"),
        "engine": info.get("engine"),
        "steps": None,
        "steps_planned": info.get("steps_planned"),
        "reward": None,
        "validation": None,
        "task_id": None,
        "termination_reason": None,
        "error": info.get("error"),
        "problems": len(run.problems),
    }
    if kind == "trial":
        out |= _trial_facts(run, info)
        return out
    metrics, _ = rundir.read_metrics(run)
    if metrics:
        # Optimizer updates done (the trainer's own step count), not a chart's rollout step.
        out["steps"] = metrics[-1].step
        out["reward"] = panels.metric(metrics[-1].values, "reward")
    evals, _ = rundir.read_eval(run)
    passes = heldout.pass_rows(evals)
    if passes:
        last = passes[max(passes)]
        out["validation"] = last.get("pass@1")
        out["evaluated_steps"] = sorted(passes)
    return out


def _trial_facts(run: RunDir, info: dict[str, Any]) -> dict[str, Any]:
    """Outcome of a single trial: run.json's (written when it ends), else the sandbox's
    ``result.json`` in its artifacts; the task only the latter names."""
    result = _result_json(run)
    reward = info.get("reward", result.get("reward"))
    return {
        "task_id": result.get("task_id") or info.get("task_id"),
        "reward": reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
        "termination_reason": info.get("termination_reason") or result.get("termination_reason"),
    }


def _result_json(run: RunDir) -> dict[str, Any]:
    # artifacts/ is the trial's folder; single trials kept before that nested it as artifacts/<id>/<id>/.
    for path in (run.path / "artifacts", run.path / "artifacts" / run.run_id / run.run_id):
        try:
            data = json.loads((path / "result.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        return data if isinstance(data, dict) else {}
    return {}


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training runs, evaluations, single trials; each newest first (run.json's
    created_at, Unix seconds; none last), then by name."""

    def key(r: dict[str, Any]) -> tuple[int, float, str]:
        created = r["created_at"]
        newest = -float(created) if isinstance(created, int | float) else 0.0
        return (KIND_ORDER[r["kind"]], newest, r["run_id"])

    return sorted(rows, key=key)
