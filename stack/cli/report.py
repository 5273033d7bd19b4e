"""``harnessrl report RUN_DIR...``: seeds and controls side by side (stack/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (each with run.json and eval.jsonl).")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for report.png, report.md, report.json, index.html.")
    ],
) -> None:
    """Held-out pass@k and behaviour per evaluation step, per run and per group of runs
    (grouped by learning rate; lr 0 is the control): mean, sd and range over seeds.

    Exit 0 when written, 2 when a folder is not a run directory or holds no evaluation."""
    from stack import report as build

    data = build.build(runs, out)
    for name, group in data["groups"].items():
        steps = group["steps"]
        last = steps[max(steps)] if steps else {}
        mean = (last.get("pass@1") or {}).get("mean")
        final = f"{mean:.3f}" if isinstance(mean, float) else "n/a"
        typer.echo(f"{name}: {len(group['runs'])} run(s), held-out pass@1 at the last evaluation {final}")
    typer.echo(f"wrote {out / 'report.png'}, {out / 'report.md'}, {out / 'report.json'}, {out / 'index.html'}")
