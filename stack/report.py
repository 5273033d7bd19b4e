"""``harnessrl report RUN_DIR...``: several runs side by side, for a reader who asks
whether the rise is more than seed noise and what the policy changed.

Each run is read the way the dashboard reads it (its run directory and its
embedded or remote capture store): held-out pass@j / pass^j per evaluation step
from ``eval.jsonl`` and the behaviour per evaluation step from the evaluations'
captured trajectories (``services/dashboard/heldout.py``). Runs are grouped by
their learning rate (``[trainer.optim] lr``; 0, or ``[run] evaluate_only``, is the control),
and per group and evaluation step the report gives the mean, the standard
deviation and the range over the group's runs (its seeds).

It writes ``report.json`` (everything), ``report.md`` (the tables), ``report.png``
(held-out pass@1 per evaluation step: each group's mean, its range as a band,
each seed as a thin line) and ``index.html`` (a static page with both, nothing
fetched: it opens from disk).
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from services.dashboard import rundir
from services.dashboard.service import DashboardService
from services.dashboard.settings import Settings as DashboardSettings
from services.trainer.settings import OptimSettings
from stack.dashboard import EmbeddedCaptureOpener
from stack.report_plot import plot

# The behaviour columns, in order: (key in a held-out step, title, percent?).
COLUMNS = (
    ("submit_rate", "submit", True),
    ("malformed_rate", "malformed / call", True),
    ("calls_per_trial", "calls / trial", False),
    ("response_tokens", "tokens / call", False),
)


@dataclass
class RunReport:
    path: Path
    run_id: str
    seed: int | None
    lr: float
    heldout: dict[int, dict[str, Any]]
    problems: list[str] = field(default_factory=list)
    # A run directory ``harnessrl eval`` made (no training step planned): the weights it was given.
    evaluation_only: bool = False

    def value(self, step: int, key: str) -> float | None:
        row = self.heldout.get(step)
        if row is None:
            return None
        value = row["pass"].get(key) if key.startswith("pass") else row.get(key)
        return float(value) if isinstance(value, int | float) else None


def group_name(run: RunReport) -> str:
    if run.evaluation_only:
        return "evaluation only (no training)"
    return "control (lr 0)" if run.lr == 0 else f"learning (lr {run.lr:g})"


def read_run(path: Path) -> RunReport:
    if not rundir.is_run_dir(path):
        raise ConfigError(f"{path}: not a run directory (no run.json)")
    path = path.resolve()
    summary = asyncio.run(_summary(path))
    opened = rundir.open_run(path.parent, path.name)
    cfg = opened.config()
    evaluation_only = opened.info is not None and opened.info.steps_planned == 0
    lr = float(cfg.get("trainer", {}).get("optim", {}).get("lr", OptimSettings.model_fields["lr"].default))
    if cfg.get("run", {}).get("evaluate_only") or evaluation_only:
        lr = 0.0  # a control that only evaluates moves no weight, whatever its optimizer says
    seed = cfg.get("run", {}).get("seed")
    heldout = {int(s): row for s, row in summary["heldout"].items()}
    seed = seed if isinstance(seed, int) else None
    return RunReport(path, path.name, seed, lr, heldout, summary["problems"], evaluation_only)


async def _summary(path: Path) -> dict[str, Any]:
    service = DashboardService(DashboardSettings.model_validate({"run_dir": path}), EmbeddedCaptureOpener())
    try:
        return await service.summary(path.name)
    finally:
        await service.close()


def stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def aggregate(runs: list[RunReport]) -> dict[str, Any]:
    """Per group, per evaluation step: mean / sd / range over the group's runs of
    every pass@j, pass^j and behaviour column."""
    groups: dict[str, list[RunReport]] = {}
    for run in sorted(runs, key=_order):
        groups.setdefault(group_name(run), []).append(run)
    out: dict[str, Any] = {}
    for name, members in groups.items():
        steps = sorted({s for r in members for s in r.heldout})
        keys = sorted({k for r in members for row in r.heldout.values() for k in row["pass"]}, key=_pass_order)
        table = {}
        for step in steps:
            cell = {}
            for key in [*keys, *(c[0] for c in COLUMNS)]:
                cell[key] = stats([v for r in members if (v := r.value(step, key)) is not None])
            reasons: Counter[str] = Counter()
            for r in members:
                reasons.update(r.heldout.get(step, {}).get("termination", {}))
            table[step] = cell | {"termination": dict(reasons)}
        out[name] = {"runs": [str(r.path) for r in members], "seeds": [r.seed for r in members], "steps": table}
    return out


def _order(r: RunReport) -> tuple[bool, bool, float, int]:
    """Evaluations first, then the control, then learning runs by lr, each by seed."""
    return (not r.evaluation_only, r.lr != 0, r.lr, r.seed if r.seed is not None else -1)


def _pass_order(key: str) -> tuple[int, int]:
    digits = key[5:]
    return (0 if key.startswith("pass@") else 1, int(digits) if digits.isdigit() else 0)


def markdown(runs: list[RunReport], groups: dict[str, Any]) -> str:
    lines = ["# Held-out evaluation", ""]
    for name, g in groups.items():
        seeds = ", ".join(str(s) for s in g["seeds"])
        lines += [f"## {name}: {len(g['runs'])} runs (seeds {seeds})", ""]
        keys = [k for k in next(iter(g["steps"].values()), {}) if k.startswith("pass")]
        head = ["step", *keys, *(c[1] for c in COLUMNS)]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for step, cell in g["steps"].items():
            row = [str(step), *(_cell(cell.get(k), False) for k in keys)]
            row += [_cell(cell.get(key), pct) for key, _, pct in COLUMNS]
            lines.append("| " + " | ".join(row) + " |")
        ends = "; ".join(
            f"step {step}: " + ", ".join(f"{r} {n}" for r, n in sorted(cell["termination"].items()))
            for step, cell in g["steps"].items()
        )
        lines += ["", f"Termination reasons (trials, all runs): {ends}", ""]
    lines += ["## Per run: held-out pass@1 by evaluation step", ""]
    for r in runs:
        curve = ", ".join(f"{s}: {_num(r.value(s, 'pass@1'))}" for s in sorted(r.heldout))
        lines.append(f"- {r.run_id} ({group_name(r)}, seed {r.seed}): {curve}")
    return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _cell(s: dict[str, float] | None, percent: bool) -> str:
    """mean ± sd [min-max] (a single run: its value)."""
    if s is None:
        return "n/a"
    f = (lambda v: f"{100 * v:.0f}%") if percent else (lambda v: f"{v:.2f}")
    if s["n"] == 1:
        return f(s["mean"])
    return f"{f(s['mean'])} ± {f(s['sd'])} [{f(s['min'])}-{f(s['max'])}]"


def page(md: str, png: bytes) -> str:
    """A static page: the plot inline and the tables rendered from the markdown (raw HTML in
    it is escaped, not passed through)."""
    from markdown_it import MarkdownIt

    image = base64.b64encode(png).decode()
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(md)
    return (
        "<!doctype html><meta charset=utf-8><title>harnessrl report</title>"
        "<style>body{font-family:sans-serif;max-width:72rem;margin:2rem auto}"
        "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:right}</style>"
        f'<img alt="held-out pass@1 per evaluation step" src="data:image/png;base64,{image}">\n'
        f"{body}"
    )


def build(paths: list[Path], out: Path) -> dict[str, Any]:
    """Reads every run, then writes the four files into ``out``; returns report.json's content."""
    if not paths:
        raise ConfigError("report needs at least one run directory")
    runs = [read_run(p) for p in paths]
    empty = [r.run_id for r in runs if not r.heldout]
    if empty:
        raise ConfigError(f"no held-out evaluation in {', '.join(empty)} (set [run] eval_every and eval_tasks)")
    groups = aggregate(runs)
    md = markdown(runs, groups)
    curves = {
        name: [(r.run_id, {s: r.value(s, "pass@1") for s in r.heldout}) for r in runs if group_name(r) == name]
        for name in groups
    }
    png = plot(curves)
    data = {"runs": [_run_json(r) for r in runs], "groups": groups}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1))
    (out / "report.md").write_text(md)
    (out / "report.png").write_bytes(png)
    (out / "index.html").write_text(page(md, png))
    return data


def _run_json(r: RunReport) -> dict[str, Any]:
    return {
        "path": str(r.path),
        "run_id": r.run_id,
        "seed": r.seed,
        "lr": r.lr,
        "evaluation_only": r.evaluation_only,
        "heldout": r.heldout,
        "problems": r.problems,
    }
