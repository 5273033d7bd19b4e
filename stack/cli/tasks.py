"""``harnessrl tasks``: check Harbor-format tasks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from stack.cli.common import ConfigOption

app = typer.Typer(
    help="Harbor-format tasks and pools: validate, check disjointness, filter by difficulty.", no_args_is_help=True
)


@app.command()
def validate(
    dirs: Annotated[list[Path], typer.Argument(help="Task directories or pools (folders of tasks).")],
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Run each task's oracle (must score 1) and a no-op agent (must score 0) in the sandbox."""
    from harnessrl.config import load_section
    from services.sandbox.common.settings import Settings
    from services.sandbox.factory import build_runner
    from services.sandbox.validate import validate_task

    settings = load_section(Settings, config, "sandbox")
    runner = build_runner(settings)
    tasks = _tasks_or_pools(dirs)

    async def run() -> list:  # type: ignore[type-arg]
        return [await validate_task(runner, d) for d in tasks]

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


def _tasks_or_pools(paths: list[Path]) -> list[Path]:
    """Each path, or a pool's tasks in its place (``stack.pool``); anything else stays,
    so its report says what is wrong with it."""
    from stack import pool

    out: list[Path] = []
    for path in paths:
        is_pool = path.is_dir() and not pool.is_task(path) and any(pool.is_task(p) for p in path.iterdir())
        out += pool.tasks_of(path) if is_pool else [path]
    return out


@app.command("list")
def list_(
    pools: Annotated[
        list[Path] | None, typer.Argument(help="Tasks or pools (default: the built-in pools, tasks/builtin/*).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pools as JSON.")] = False,
) -> None:
    """List task pools and their families, with counts (the built-in pools when no path is given)."""
    from stack.pool import pool_summary

    rows = [pool_summary(p) for p in (pools or _builtin_pools())]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        typer.echo(f"{row['path']}  {row['tasks']} task(s)")
        for name, count in row["families"].items():
            typer.echo(f"  {name or '(no family)':12} {count:4}")
    typer.echo("train on one: [run] train_tasks = [POOL] and families = [FAMILY] (examples/quickstart.toml)")


def _builtin_pools() -> list[Path]:
    from harnessrl.errors import NotFound
    from harnessrl.paths import PROJECT_ROOT

    root = PROJECT_ROOT / "tasks" / "builtin"
    found = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not found:
        raise NotFound(f"no built-in pools under {root}; name a pool: harnessrl tasks list POOL")
    return found


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


@app.command("filter")
def filter_(
    pools: Annotated[list[Path], typer.Argument(help="Tasks or pools to filter.")],
    harness: Annotated[str, typer.Option(help="Harness that runs the attempts (mini-swe-agent, shell, ...).")],
    out: Annotated[Path, typer.Option(help="New (or empty) directory for the kept pool.")],
    report: Annotated[Path, typer.Option(help="Where to write the JSON report (rewritten after each task).")],
    engine: Annotated[
        str | None,
        typer.Option(help="local | vllm | scripted:FILE | module:Class (default local for model harnesses)."),
    ] = None,
    k: Annotated[int, typer.Option("--k", help="Attempts per task.")] = 4,
    keep: Annotated[str, typer.Option(help="Keep tasks solved A to B times out of k (A-B).")] = "1-3",
    model: Annotated[
        str | None, typer.Option(help="Model name the harness is told to use (default: the served model's).")
    ] = None,
    harness_option: Annotated[
        list[str] | None, typer.Option("--harness-option", "-o", help="KEY=VALUE passed to the harness (repeatable).")
    ] = None,
    family: Annotated[list[str] | None, typer.Option(help="Only tasks of this family (repeatable).")] = None,
    max_turns: Annotated[int, typer.Option(min=0, help="Turn limit (0: the harness's own).")] = 0,
    agent_timeout: Annotated[float, typer.Option(min=0, help="Agent timeout in seconds (0: the task's).")] = 0.0,
    concurrency: Annotated[int, typer.Option(help="Attempts running at once.")] = 4,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature of the policy (a run's [run] temperature).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Run k attempts per task through the normal trial path and keep the tasks solved A..B times."""
    from harnessrl.errors import InvalidArgument
    from services.sandbox.harnesses import ModelAccess, get_harness
    from stack.taskfilter import FilterConfig, check_out, parse_keep, run_filter

    options: dict[str, str] = {}
    for item in harness_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--harness-option {item!r}: expected KEY=VALUE")
        options[key] = value
    if engine is None and get_harness(harness).model_access == ModelAccess.REQUIRED:
        engine = "local"
    if model is None and engine is not None:
        from harnessrl.paths import default_model_dir

        model = default_model_dir().name  # the name the embedded proxy serves
    if report.exists() and report.is_dir():
        raise InvalidArgument(f"--report {report}: is a directory")
    check_out(out)
    cfg = FilterConfig(
        harness=harness,
        engine=engine,
        model=model,
        k=k,
        keep=parse_keep(keep),
        harness_options=options,
        max_turns=max_turns,
        agent_timeout_s=agent_timeout,
        concurrency=concurrency,
        sandbox_config=config,
        temperature=temperature,
    )

    def progress(result: Any, done: int, total: int) -> None:
        mark = "infra failure" if result.infra_failed else f"{result.solves}/{k}" + (" kept" if result.kept else "")
        typer.echo(f"[{done}/{total}] {result.name}: {mark}", err=True)

    result = run_filter(pools, cfg, out=out, families=family or (), progress=progress, report=report)
    typer.echo(f"solves out of {k}: " + "  ".join(f"{n}:{c}" for n, c in result.histogram.items()))
    for fam, row in result.families.items():
        typer.echo(f"{fam:12} tasks {row['tasks']:3}  kept {row['kept']:3}  solve rate {row['solve_rate']}")
    if result.infra_failures:
        typer.secho(f"{len(result.infra_failures)} task(s) excluded for infra failures (see the report)", err=True)
    typer.echo(f"kept {len(result.kept)} task(s) in {out}; report {report}")


@app.command()
def convert(
    records: Annotated[Path, typer.Option(help="SWE-bench-style records: a .jsonl or .parquet file.")],
    repos: Annotated[Path, typer.Option(help="Folder of local git clones (owner__name, owner/name or name).")],
    out: Annotated[Path, typer.Option(help="New (or empty) directory for the converted tasks.")],
) -> None:
    """Convert SWE-bench-style records into Harbor tasks built from local clones (nothing is downloaded)."""
    from services.sandbox.pools.swe import convert as convert_records

    written = convert_records(records, repos, out)
    typer.echo(f"wrote {len(written)} task(s) under {out}")


def oracle_reward_keys(task: Path) -> list[str] | None:
    """The reward keys the task's oracle wrote in the last preflight of this content, if any."""
    from stack.preflight import cache_dir, task_digest

    try:
        entry = json.loads((cache_dir() / f"{task_digest(task)}.json").read_text())
    except (OSError, ValueError):
        return None
    keys = entry.get("keys") if isinstance(entry, dict) else None
    return [str(k) for k in keys] if isinstance(keys, list) else None


@app.command("check-harbor")
def check_harbor(
    dirs: Annotated[list[Path], typer.Argument(help="Harbor task folders or dataset folders of tasks.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every field, not only refused ones.")] = False,
) -> None:
    """Which fields of each Harbor task run as in Harbor, run mapped differently, or are refused
    (docs/harbor.md). Exit 1 when any task would be refused; nothing is built or started."""
    from services.sandbox.task.harbor_check import check, format_report

    reports = check(dirs)
    for r in reports:  # the reward keys of each task whose oracle a preflight ran (its cache)
        r.reward_keys = oracle_reward_keys(Path(r.path))
    if as_json:
        typer.echo(json.dumps([r.as_json() for r in reports], indent=1))
    else:
        for r in reports:
            typer.echo("\n".join(format_report(r, verbose=verbose)))
        refused = sum(not r.runs for r in reports)
        typer.echo(f"{len(reports) - refused} of {len(reports)} task(s) run; {refused} refused")
    if not all(r.runs for r in reports):
        raise typer.Exit(1)
