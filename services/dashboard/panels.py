"""The run page's panels, computed from the run's trajectories (capture store),
the trainer's per-step metrics and eval rows. Pure functions over plain data:
the same code feeds the live backend and the static export.

Per-step series are dicts keyed by step (JSON object keys are strings), so a
step with no data is absent, never a made-up zero.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from typing import Any

from services.dashboard.rundir import StepRecord
from services.dashboard.settings import AlertSettings
from services.dashboard.trajectories import INFRA_REASONS, POLICY_REASONS, STAGES

# Names of the same quantity across trainers (the first one present wins).
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "reward": ("reward/mean", "critic/score/mean"),
    "entropy": ("loss/entropy", "actor/entropy", "entropy/mean"),
    "kl": ("loss/kl", "loss/ppo_kl", "actor/ppo_kl", "kl/mean"),
    "clip_fraction": ("loss/pg_clipfrac", "loss/clipfrac", "actor/pg_clipfrac", "loss/is_clipped_frac"),
    "grad_norm": ("optim/grad_norm", "actor/grad_norm"),
    "step_seconds": ("step/seconds", "timing_s/step"),
    "policy_tokens": ("batch/policy_tokens",),
    "policy_version": ("step/policy_version",),
    "idle_fraction": ("trainer/idle_fraction",),
    "queue_depth": ("queue/depth", "queue/groups_pending", "trainer/groups_pending"),
    # verl's agent loop (stack/verl/hooks.py): rows out of the loss, segments verl could not take.
    "masked_rows": ("harnessrl/masked_rows",),
    "dropped_segments": ("harnessrl/dropped_segments",),
}
MASKED_PREFIX = "harnessrl/masked/"


# metrics.jsonl (and the trainer's Metrics RPC, and verl's file logger) key a record by the
# optimizer step that wrote it, 1, 2, ...: step k trains on the rollouts enqueued at step
# k - 1. Every chart uses the rollout step (README "Steps"), so a record moves back one.
TRAINER_STEP_OFFSET = 1


def on_rollout_axis(metrics: list[StepRecord]) -> list[StepRecord]:
    """The trainer's records keyed by the rollout step whose batch each one trained on."""
    return [StepRecord(m.step - TRAINER_STEP_OFFSET, m.wall_time, m.values) for m in metrics]


def metrics_json(metrics: list[StepRecord]) -> list[dict[str, Any]]:
    """The records as the page gets them: ``step`` on the rollout axis, ``trainer_step`` as written."""
    return [{**m.as_json(), "step": m.step - TRAINER_STEP_OFFSET, "trainer_step": m.step} for m in metrics]


def agreement_gaps(metrics: list[StepRecord]) -> dict[int, str]:
    """Why a step (rollout axis) has no train/inference agreement, from what the trainer recorded.

    The trainer measures agreement only on tokens sampled by the very weights it is
    training (services/trainer/agreement.py): a batch sampled entirely by older weights
    (staleness >= 1) records ``agreement/tokens = 0`` and no Pearson."""
    if not any(metric(m.values, "agreement/pearson") is not None for m in metrics):
        return {}  # the trainer records none at all: the panel says so once
    out: dict[int, str] = {}
    for m in metrics:
        v = m.values
        if metric(v, "agreement/pearson") is not None:
            continue
        if v.get("agreement/tokens") == 0:
            stale = v.get("staleness/mean")
            behind = f"; mean staleness {stale:g} versions" if stale else ""
            out[m.step] = f"no token of this batch was sampled by the weights being trained (all stale{behind})"
        elif "skipped/zero_variance_groups" in v and "batch/samples" not in v:
            out[m.step] = "no optimizer update: every group's rewards were equal, nothing was trained"
        else:
            out[m.step] = "the trainer recorded no agreement for this step"
    return out


def metric(values: dict[str, float], name: str) -> float | None:
    for key in METRIC_ALIASES.get(name, (name,)):
        if key in values:
            return values[key]
    return None


def series(metrics: list[StepRecord], name: str) -> dict[int, float]:
    return {m.step: v for m in metrics if (v := metric(m.values, name)) is not None}


def success(row: dict[str, Any], threshold: float) -> bool:
    return row["reward"] is not None and row["termination_reason"] in POLICY_REASONS and row["reward"] >= threshold


def termination(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_step: dict[int, Counter[str]] = defaultdict(Counter)
    for r in rows:
        by_step[r["step"]][r["termination_reason"]] += 1
    reasons = sorted({reason for c in by_step.values() for reason in c})
    infra_share = {
        s: sum(n for reason, n in c.items() if reason in INFRA_REASONS) / max(1, sum(c.values()))
        for s, c in by_step.items()
    }
    return {
        "reasons": reasons,
        "infra_reasons": sorted(INFRA_REASONS),
        "by_step": {s: dict(c) for s, c in sorted(by_step.items())},
        "infra_share": dict(sorted(infra_share.items())),
    }


def groups(rows: list[dict[str, Any]], threshold: float, default_g: int | None) -> dict[str, Any]:
    """Successes out of G per group per step; G is the group's recorded size (the run's if unset)."""
    by_group: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_group[(r["step"], r["group_id"])].append(r)
    out: list[dict[str, Any]] = []
    dist: dict[int, Counter[str]] = defaultdict(Counter)
    zero: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for (step, gid), members in sorted(by_group.items()):
        g = members[0]["group_size"] or default_g or len(members)
        valid = [m for m in members if m["finalized"] and m["termination_reason"] in POLICY_REASONS]
        wins = sum(success(m, threshold) for m in members)
        rewards = {m["reward"] for m in valid}
        complete = all(m["finalized"] for m in members) and len(members) >= g
        zero_var = complete and len(valid) > 0 and len(rewards) == 1
        out.append(
            {
                "step": step,
                "group_id": gid,
                "task_id": members[0]["task_id"],
                "G": g,
                "successes": wins,
                "valid": len(valid),
                "finished": sum(m["finalized"] for m in members),
                "complete": complete,
                "zero_variance": zero_var,
            }
        )
        if complete:
            dist[step][f"{wins}/{g}"] += 1
            zero[step][0] += zero_var
            zero[step][1] += 1
    sizes = sorted({x["G"] for x in out})
    return {
        "groups": out,
        "sizes": sizes,
        "distribution": {s: dict(c) for s, c in sorted(dist.items())},
        "zero_variance_share": {s: z / n for s, (z, n) in sorted(zero.items()) if n},
    }


def success_rate(rows: list[dict[str, Any]], threshold: float) -> dict[int, float]:
    """Share of a step's finished policy-outcome trials that succeeded (infra failures excluded)."""
    by_step: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        if r["finalized"] and r["termination_reason"] in POLICY_REASONS:
            by_step[r["step"]].append(success(r, threshold))
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}


def task_grid(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    cells: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in rows:
        if r["finalized"]:
            cell = cells[r["task_id"]][r["step"]]
            cell[0] += success(r, threshold)
            cell[1] += 1
    steps = sorted({s for t in cells.values() for s in t})
    return {
        "steps": steps,
        "tasks": {
            task: {s: {"solved": w, "trials": n, "rate": w / n} for s, (w, n) in sorted(by_step.items())}
            for task, by_step in sorted(cells.items())
        },
    }


def behaviour(rows: list[dict[str, Any]], digests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    mix: dict[int, Counter[str]] = defaultdict(Counter)
    malformed: Counter[int] = Counter()
    turns: dict[int, list[int]] = defaultdict(list)
    length: dict[int, list[int]] = defaultdict(list)
    decoded = 0
    for r in rows:
        s = r["step"]
        length[s].append(r["completion_tokens"])
        d = digests.get(r["trial_id"])
        turns[s].append(d["main_calls"] or d["calls"] if d is not None else r["main_turns"] or r["turns"])
        if d is not None:
            mix[s].update(d["tool_calls"])
            malformed[s] += d["malformed"]
            decoded += d["decoded"]
    return {
        "tool_calls": {s: dict(c) for s, c in sorted(mix.items())},
        "tools": sorted({t for c in mix.values() for t in c}),
        "malformed": {s: malformed[s] for s in sorted(turns)},
        "mean_turns": {s: statistics.fmean(v) for s, v in sorted(turns.items())},
        "mean_response_tokens": {s: statistics.fmean(v) for s, v in sorted(length.items())},
        "decoded_trajectories": decoded,
    }


def failures(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Trials that did not succeed, by the stage they failed in and infra vs policy."""
    by_step: dict[int, Counter[str]] = defaultdict(Counter)
    for r in rows:
        reason = r["termination_reason"]
        if not r["finalized"] or success(r, threshold) or reason not in STAGES:
            continue
        by_step[r["step"]][f"{STAGES[reason]}/{'infra' if reason in INFRA_REASONS else 'policy'}"] += 1
    return {"by_step": {s: dict(c) for s, c in sorted(by_step.items())}}


def integrity(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step: the sandbox's tamper events (a plant the file guards reverted before the
    verifier) and suspicious events (a reward-hack pattern in the agent's change, counted or
    zeroed by ``[sandbox.integrity] suspicious``), from each trajectory's metadata counts,
    how many trials had any, and how many trials each step had. A trajectory recorded before
    these counts existed adds none."""
    tamper: Counter[int] = Counter()
    suspicious: Counter[int] = Counter()
    flagged: Counter[int] = Counter()
    trials: Counter[int] = Counter()
    for r in rows:
        meta = r.get("metadata") or {}
        s = r["step"]
        trials[s] += 1
        t, q = _count(meta.get("tamper_events")), _count(meta.get("suspicious_events"))
        tamper[s] += t
        suspicious[s] += q
        flagged[s] += int(bool(t or q))
    order = sorted(trials)
    return {
        "tamper": {s: tamper[s] for s in order},
        "suspicious": {s: suspicious[s] for s in order},
        "flagged_trials": {s: flagged[s] for s in order},
        "trials": {s: trials[s] for s in order},
    }


def _count(value: object) -> int:
    try:
        return max(0, int(str(value))) if value is not None else 0
    except ValueError:
        return 0


def staleness(rows: list[dict[str, Any]], metrics: list[StepRecord]) -> dict[str, int]:
    """How many versions the trainer was ahead of a trajectory's oldest token when it
    was finalized (the trainer's version then: the last step recorded before)."""
    marks = sorted((m.wall_time, v) for m in metrics if (v := metric(m.values, "policy_version")) is not None)
    hist: Counter[int] = Counter()
    for r in rows:
        if not r["policy_versions"] or not r["finalized_at"] or not marks:
            continue
        current = max((v for t, v in marks if t <= r["finalized_at"]), default=marks[0][1])
        hist[max(0, int(current) - min(r["policy_versions"]))] += 1
    return {str(k): v for k, v in sorted(hist.items())}


def validation(eval_rows: list[dict[str, Any]]) -> dict[int, float]:
    """Validation score per step: mean over tasks of pass@1 (else the smallest pass@k)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for row in eval_rows:
        keys = sorted((k for k in row if k.startswith("pass@")), key=lambda k: int(k[5:]) if k[5:].isdigit() else 99)
        value = row.get("pass@1", row.get(keys[0]) if keys else row.get("score"))
        if isinstance(value, int | float) and isinstance(row.get("step", 0), int):
            by_step[row.get("step", 0)].append(float(value))
    return {s: statistics.fmean(v) for s, v in sorted(by_step.items())}


def rollout_throughput(rows: list[dict[str, Any]], metrics: list[StepRecord]) -> dict[int, float]:
    """Sampled tokens per second between consecutive trainer steps (what the engines delivered).

    A window counts only while rollouts ran in it: it ends at the last finalized
    trajectory. Rollouts one step ahead of the optimizer all finish before the last
    step does, and that step's window would otherwise read as a measured 0."""
    out: dict[int, float] = {}
    done = sorted((r["finalized_at"], r["completion_tokens"]) for r in rows if r["finalized_at"])
    if not done:
        return out  # no trajectories: not a measured zero
    last = done[-1][0]
    for prev, cur in itertools.pairwise(metrics):
        end = min(cur.wall_time, last)
        span = end - prev.wall_time
        if span > 0:
            out[cur.step] = sum(n for t, n in done if prev.wall_time < t <= end) / span
    return out


def masking(metrics: list[StepRecord]) -> dict[str, Any]:
    """Per step, the rows verl trained with weight 0 (by reason) and the segments it
    dropped; empty series when the trainer is not verl's (nothing recorded)."""
    reasons = sorted({k[len(MASKED_PREFIX) :] for m in metrics for k in m.values if k.startswith(MASKED_PREFIX)})
    return {
        "masked_rows": series(metrics, "masked_rows"),
        "dropped_segments": series(metrics, "dropped_segments"),
        "by_reason": {r: series(metrics, MASKED_PREFIX + r) for r in reasons},
    }


def alerts(summary: dict[str, Any], metrics: list[StepRecord], cfg: AlertSettings) -> list[dict[str, Any]]:
    """The anomaly list: termination spikes, agreement drops, turn collapse, zero-variance growth."""
    out: list[dict[str, Any]] = []
    shares = summary["termination"]["infra_share"]
    seen: list[float] = []
    for step, share in shares.items():
        base = statistics.median(seen) if seen else 0.0
        if share > cfg.infra_share and (not seen or share >= cfg.infra_spike_factor * max(base, 1e-9)):
            message = f"infrastructure failures ended {share:.0%} of step {step}'s trials"
            out.append(_alert("infra_spike", step, message))
        seen.append(share)
    for step, p in series(metrics, "agreement/pearson").items():
        if p < cfg.min_pearson:
            out.append(_alert("agreement_drop", step, f"train/inference Pearson {p:.4f} < {cfg.min_pearson}"))
    best = 0.0
    for step, mean in summary["behaviour"]["mean_turns"].items():
        if best >= 2 and mean < cfg.turn_collapse_ratio * best:
            out.append(_alert("turn_collapse", step, f"mean turns {mean:.1f} fell below half their best ({best:.1f})"))
        best = max(best, mean)
    zv = list(summary["groups"]["zero_variance_share"].items())
    if len(zv) >= 2 and zv[-1][1] - zv[0][1] >= cfg.zero_variance_growth:
        message = f"zero-variance groups grew from {zv[0][1]:.0%} to {zv[-1][1]:.0%}"
        out.append(_alert("zero_variance_growth", zv[-1][0], message))
    return out


def _alert(kind: str, step: int, message: str) -> dict[str, Any]:
    return {"kind": kind, "step": step, "message": message}


def summarize(
    rows: list[dict[str, Any]],
    digests: dict[str, dict[str, Any]],
    metrics: list[StepRecord],
    eval_rows: list[dict[str, Any]],
    *,
    threshold: float,
    group_size: int | None,
    alert_cfg: AlertSettings,
) -> dict[str, Any]:
    """Every panel's data; per-step series are keyed by the rollout step (``on_rollout_axis``)."""
    axis = on_rollout_axis(metrics)
    summary: dict[str, Any] = {
        "metrics": metrics_json(metrics),
        "agreement_gaps": agreement_gaps(axis),
        "termination": termination(rows),
        "groups": groups(rows, threshold, group_size),
        "tasks": task_grid(rows, threshold),
        "behaviour": behaviour(rows, digests),
        "integrity": integrity(rows),
        "failures": failures(rows, threshold),
        "staleness_hist": staleness(rows, axis),
        "masking": masking(axis),
        "validation": validation(eval_rows),
        "rollout_tokens_per_s": rollout_throughput(rows, axis),
        "success_threshold": threshold,
        "success_rate": success_rate(rows, threshold),
        "trajectories": len(rows),
        "finalized": sum(r["finalized"] for r in rows),
    }
    summary["alerts"] = alerts(summary, axis, alert_cfg)
    return summary
