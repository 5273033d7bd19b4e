"""``harnessrl tasks``: check Harbor-format tasks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from harnessrl.cli.common import ConfigOption

app = typer.Typer(help="Harbor-format tasks and pools: validate, check disjointness.", no_args_is_help=True)


@app.command()
def validate(
    dirs: Annotated[list[Path], typer.Argument(help="Task directories.")],
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Run each task's oracle (must score 1) and a no-op agent (must score 0) in the sandbox."""
    from harnessrl.config import load_section
    from services.sandbox.factory import build_runner
    from services.sandbox.settings import Settings
    from services.sandbox.validate import validate_task

    settings = load_section(Settings, config, "sandbox")
    runner = build_runner(settings)

    async def run() -> list:  # type: ignore[type-arg]
        return [await validate_task(runner, d) for d in dirs]

    reports = asyncio.run(run())
    if as_json:
        out = [{"path": r.path, "task_id": r.task_id, "ok": r.ok, "reasons": r.reasons} for r in reports]
        typer.echo(json.dumps(out, indent=1))
    else:
        for r in reports:
            status = typer.style("ok", fg=typer.colors.GREEN) if r.ok else typer.style("REJECTED", fg=typer.colors.RED)
            typer.echo(f"{status}  {r.task_id or r.path}")
            for reason in r.reasons:
                typer.echo(f"    {reason}")
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


@app.command()
def disjoint(
    train: Annotated[list[Path], typer.Argument(help="Training tasks or pools.")],
    evaluation: Annotated[list[Path], typer.Option("--eval", help="Evaluation tasks or pools (repeatable).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the overlaps as JSON.")] = False,
) -> None:
    """Check that no evaluation task overlaps a training task (same id or content: instance level;
    same [metadata] repo: repository level). Exit 1 with a listing when they overlap."""
    from stack.disjoint import find_overlaps, format_overlaps, task_dirs

    overlaps = find_overlaps(train, evaluation)
    if as_json:
        typer.echo(json.dumps([vars(o) for o in overlaps], indent=1))
    elif overlaps:
        typer.echo(format_overlaps(overlaps))
        typer.secho(f"{len(overlaps)} overlap(s)", fg=typer.colors.RED, err=True)
    else:
        n_train, n_eval = len(task_dirs(train)), len(task_dirs(evaluation))
        typer.echo(f"disjoint: {n_train} training and {n_eval} evaluation tasks share no instance or repository")
    if overlaps:
        raise typer.Exit(1)
