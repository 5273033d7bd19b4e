"""What the policy does on held-out tasks, per evaluation step: computed from the
captured trajectories of the run's evaluations (run id ``<run>-eval``), never
from harness logs, plus the pass@k / pass^k rows of ``eval.jsonl`` (themselves
computed from those trajectories' rewards).

Per step:
- ``trials`` (ended for a policy reason) and ``infra`` (ended by infrastructure:
  counted, never scored);
- ``success_rate`` (reward >= threshold, over the policy trials) and the overall
  ``pass@j`` / ``pass^j`` of that step's evaluation (mean over tasks);
- ``malformed_rate``: malformed tool calls per model call;
- ``calls_per_trial``: model calls of the main thread per trial;
- ``submit_rate``: share of trials whose agent ended the episode itself (the
  harness's submit command, or a final answer: ``trajectories.SUBMIT_MARKERS``);
  None where no tokens could be decoded;
- ``response_tokens``: sampled tokens per model call;
- ``termination``: trials per termination reason.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from services.dashboard.trajectories import INFRA_REASONS

Row = dict[str, Any]


def eval_run_id(run_id: str) -> str:
    """The run id the evaluations of ``run_id`` are captured under (stack/evaluate.py)."""
    return f"{run_id}-eval"


def pass_rows(eval_rows: list[Row]) -> dict[int, dict[str, float]]:
    """The overall row (``task_id = "*"``) of each step's evaluation: its pass@j and pass^j
    (the last evaluation of a step wins)."""
    out: dict[int, dict[str, float]] = {}
    for row in eval_rows:
        step = row.get("step", 0)
        if row.get("task_id") != "*" or not isinstance(step, int):
            continue
        out[step] = {k: float(v) for k, v in row.items() if k.startswith("pass") and isinstance(v, int | float)}
    return out


def behaviour(rows: list[Row], digests: dict[str, Row], eval_rows: list[Row], threshold: float) -> dict[int, Row]:
    by_step: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        if r["finalized"]:
            by_step[r["step"]].append(r)
    passes = pass_rows(eval_rows)
    out: dict[int, Row] = {}
    for step in sorted(set(by_step) | set(passes)):
        out[step] = _step(by_step.get(step, []), digests, threshold) | {"pass": passes.get(step, {})}
    return out


def _step(rows: list[Row], digests: dict[str, Row], threshold: float) -> Row:
    policy = [r for r in rows if r["termination_reason"] not in INFRA_REASONS]
    seen = [d for r in policy if (d := digests.get(r["trial_id"])) is not None]
    calls = sum(d["calls"] for d in seen)
    submitted = [d["submitted"] for d in seen if d.get("submitted") is not None]
    return {
        "trials": len(policy),
        "infra": len(rows) - len(policy),
        "success_rate": _mean([float(r["reward"] is not None and r["reward"] >= threshold) for r in policy]),
        "malformed_rate": sum(d["malformed"] for d in seen) / calls if calls else None,
        "calls_per_trial": _mean([float(d["main_calls"] or d["calls"]) for d in seen]),
        "submit_rate": _mean([float(s) for s in submitted]),
        "response_tokens": sum(d["sampled_tokens"] for d in seen) / calls if calls else None,
        "termination": dict(Counter(r["termination_reason"] for r in rows)),
    }


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
