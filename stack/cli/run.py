"""``harnessrl run``, ``harnessrl preflight`` and ``harnessrl eval``: the
end-to-end commands over one config file (see stack/runconfig.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

ConfigArg = Annotated[Path, typer.Argument(help="Run config (TOML: [run] plus one table per service).")]


def run(
    config: ConfigArg,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue this run from its newest checkpoint.")
    ] = None,
    allow_overlap: Annotated[
        bool, typer.Option("--allow-overlap", help="Run even when train and eval tasks overlap.")
    ] = False,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Override [run] steps.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="Override [run] seed.")] = None,
    name: Annotated[str | None, typer.Option("--run-id", help="Override [run] run_id (a fresh run).")] = None,
    harness: Annotated[str | None, typer.Option("--harness", help="Override [run] harness.")] = None,
    no_preflight: Annotated[bool, typer.Option("--no-preflight", help="Skip the preflight checks.")] = False,
) -> None:
    """Train end to end: preflight, services, trials through the real harness, trainer steps, run directory.

    Exit 0 when done, 130 when stopped (Ctrl-C / SIGTERM), 1 when training failed,
    2 for a bad config or a failed preflight (nothing started)."""
    from harnessrl import logs
    from stack import runconfig
    from stack.run import EXIT_DONE, exit_now, run_blocking
    from stack.rundir import RunDirectory

    if name is not None and resume is not None:
        raise typer.BadParameter("--run-id names a fresh run; --resume the run to continue", param_hint="--run-id")
    overrides: dict[str, object] = {"steps": steps, "seed": seed, "run_id": name, "harness": harness}
    overrides["allow_overlap"] = True if allow_overlap else None
    if no_preflight:
        overrides["preflight"] = False
    cfg = runconfig.load(config, run_id=resume, overrides=overrides)
    RunDirectory(cfg).check(resume=resume is not None)  # a wrong --resume fails first, before preflight
    logs.configure("WARNING")
    outcome = run_blocking(cfg, resume=resume is not None)
    typer.echo(f"run {cfg.run_id} {outcome.status} after {outcome.steps_done} step(s): {cfg.run_dir}")
    if outcome.code != EXIT_DONE:
        exit_now(outcome.code)  # an abandoned optimizer step may still hold a worker thread
    raise typer.Exit(outcome.code)


def preflight(config: ConfigArg) -> None:
    """Check a run config in seconds (harness, template/parser, engine, sandbox, task pool, stores, disk)."""
    from harnessrl import logs
    from stack import runconfig
    from stack.evaluate import preflight_only

    cfg = runconfig.load(config)
    logs.configure("WARNING")
    report = asyncio.run(preflight_only(cfg))
    for check in report.checks:
        typer.echo(check.line())
    if not report.ok:
        typer.secho("preflight failed: fix the lines marked FAIL", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    typer.echo("preflight ok")


def evaluate(
    config: ConfigArg,
    k: Annotated[int | None, typer.Option("--k", min=1, help="Trials per task (default [run] eval_k).")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Run whose newest checkpoint to evaluate.")] = None,
) -> None:
    """Evaluate without training: eval_tasks x k trials through the same proxy; pass@k and pass^k
    per task and overall into <run>/eval.jsonl (the dashboard's validation panel)."""
    from harnessrl import logs
    from stack import runconfig
    from stack.evaluate import evaluate_run, summary_lines

    cfg = runconfig.load(config, run_id=run_id, overrides={"eval_k": k})
    logs.configure("WARNING")
    result = asyncio.run(evaluate_run(cfg))
    for line in summary_lines(result):
        typer.echo(line)
