"""``harnessrl capture``: serve the capture store, export and retire captured trajectories.

Commands other than ``serve`` reach a store one of three ways (exactly one;
``export`` with none of them finds the trial's run under ``$HARNESSRL_RUNS_DIR``,
default ``$HARNESSRL_HOME/runs``: a ``trial run`` trial or a run's trial):
``--target HOST:PORT`` talks gRPC to a running store (with ``--token`` and, if
the store fences runs, ``--run-token``); ``--store DIR`` opens an embedded
store directory directly; ``--config FILE`` opens the store its
``[capture_store]`` section names (embedded or distributed). ``sweep`` has no
RPC and needs ``--store`` or ``--config``. Opening a store directly for
``delete-run``/``sweep`` takes its writer lock, so it refuses while a server
serves that directory: use ``--target`` then.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from harnessrl.errors import InvalidArgument
from stack.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Capture store: serve, export and inspect captured trajectories.", no_args_is_help=True)
T = TypeVar("T")

TargetOption = Annotated[str | None, typer.Option("--target", help="HOST:PORT of a running capture store (gRPC).")]
StoreOption = Annotated[Path | None, typer.Option("--store", help="Embedded store directory, opened directly.")]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="HARNESSRL_CAPTURE_TOKEN", help="Service token (with --target).")
]
RunTokenOption = Annotated[
    str | None,
    typer.Option("--run-token", envvar="HARNESSRL_CAPTURE_RUN_TOKEN", help="Run token, if the store fences runs."),
]
RunOption = Annotated[str, typer.Option("--run", help="Run id.")]
OutOption = Annotated[Path, typer.Option("--out", help="Output file (written atomically).")]


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    backend: Annotated[str | None, typer.Option(help="embedded (default) or distributed.")] = None,
    store_dir: Annotated[Path | None, typer.Option(help="Embedded store directory.")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (distributed).")] = None,
    s3_endpoint: Annotated[str | None, typer.Option(help="S3 endpoint URL (distributed).")] = None,
    s3_bucket: Annotated[str | None, typer.Option(help="S3 bucket (distributed).")] = None,
    logprob_dtype: Annotated[str | None, typer.Option(help="float32 (default) or float16.")] = None,
) -> None:
    """Serve the capture_store gRPC service until SIGTERM.

    S3 keys and tokens come from the config file or HARNESSRL_CAPTURE_STORE_*
    variables, never from flags."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings

    overrides: dict[str, object] = {
        "host": host,
        "port": port,
        "backend": backend,
        "store_dir": store_dir,
        "redis_url": redis_url,
        "s3_endpoint": s3_endpoint,
        "s3_bucket": s3_bucket,
        "logprob_dtype": logprob_dtype,
    }
    serve_grpc(Settings, "capture_store", config, overrides, create_server)


def _with_client(
    target: str | None,
    store: Path | None,
    config: Path | None,
    token: str | None,
    run_token: str | None,
    writer: bool,
    fn: Callable[[Any], Awaitable[T]],
) -> T:
    from services.capture_store.client import GrpcClient, LocalClient

    if sum(x is not None for x in (target, store, config)) != 1:
        raise InvalidArgument("give exactly one of --target HOST:PORT, --store DIR or --config FILE")
    if store is not None and not (store / "index.sqlite3").exists():
        raise InvalidArgument(f"{store} is not a capture store directory (no index.sqlite3)")

    async def run() -> T:
        if target:
            client: Any = GrpcClient(target, token, run_token)
        else:
            client = LocalClient(_settings(store, config), writer=writer)
        try:
            return await fn(client)
        finally:
            await client.close()

    return asyncio.run(run())


def _settings(store: Path | None, config: Path | None) -> Any:
    from harnessrl.config import load_section
    from services.capture_store.settings import Settings

    if store is not None:
        return load_section(Settings, None, "capture_store", {"backend": "embedded", "store_dir": store})
    return load_section(Settings, config, "capture_store")


@app.command()
def export(
    trial: Annotated[str, typer.Option("--trial", help="Trial id.")],
    out: OutOption,
    run: Annotated[str | None, typer.Option("--run", help="Run id (found by trial id with --store/--config).")] = None,
    routes: Annotated[bool, typer.Option(help="Include routed experts.")] = False,
    target: TargetOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    run_token: RunTokenOption = None,
) -> None:
    """Write one JSON object per segment of a trajectory (JSONL), with its reward and termination.

    Without --target/--store/--config, the trial is looked up by its id in the run
    directories ('harnessrl trial run' keeps each trial as one)."""
    from services.capture_store.export import segment_objects, write_jsonl

    _check_out(out)
    if target is None and store is None and config is None:
        store, run = _local_store_of(trial, run)

    async def go(client: Any) -> int:
        run_id = run or await _find_run(client, trial)
        traj = await client.get(run_id, trial, True)
        return write_jsonl(segment_objects(traj, with_routes=routes), out)

    count = _with_client(target, store, config, token, run_token, False, go)
    typer.echo(f"wrote {count} segment(s) of trial {trial} to {out}")


def _local_store_of(trial: str, run: str | None) -> tuple[Path, str]:
    """The embedded store and run id of a trial under the runs directory."""
    from harnessrl.errors import NotFound
    from harnessrl.paths import runs_dir
    from services.dashboard.rundir import open_run, runs_holding

    root = runs_dir()
    found = []
    for run_id in [run] if run else runs_holding(root, trial):
        try:
            store = open_run(root, run_id).capture_dir()
        except NotFound:
            continue
        if store is not None and (store / "index.sqlite3").exists():
            found.append((store, run_id))
    if not found:
        where = f"run {run!r}" if run else "run"
        raise InvalidArgument(
            f"no {where} under {root} holds a trial {trial!r} (single-trial runs and run artifacts searched); "
            "give exactly one of --target HOST:PORT, --store DIR or --config FILE"
        )
    if len(found) > 1:
        raise InvalidArgument(f"trial {trial!r} is in runs {[r for _, r in found]}; pick one with --run")
    return found[0]


def _local_store_of_run(run: str) -> Path:
    """The embedded store of run directory ``run`` under the runs directory."""
    from harnessrl.errors import NotFound
    from harnessrl.paths import runs_dir
    from services.dashboard.rundir import open_run

    root = runs_dir()
    hint = "give exactly one of --target HOST:PORT, --store DIR or --config FILE"
    try:
        opened = open_run(root, run)
    except NotFound as e:
        raise InvalidArgument(f"no run {run!r} under {root}; {hint}") from e
    store = opened.capture_dir()
    if store is None or not (store / "index.sqlite3").exists():
        raise InvalidArgument(f"run {run!r} under {root} has no embedded capture store; {hint}")
    return store


async def _find_run(client: Any, trial: str) -> str:
    runs = await client.runs_with_trial(trial)
    if not runs:
        raise InvalidArgument(f"no run holds a trial {trial!r}")
    if len(runs) > 1:
        raise InvalidArgument(f"trial {trial!r} exists in runs {runs}; pick one with --run")
    return str(runs[0])


@app.command("export-parquet")
def export_parquet(
    run: RunOption,
    out: OutOption,
    target: TargetOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    run_token: RunTokenOption = None,
) -> None:
    """Write one row of metadata per trajectory of a run (Parquet, for notebooks).

    Without --target/--store/--config, the run is looked up by its id in the run
    directories (a run's or a single trial's embedded store)."""
    from services.capture_store.export import metadata_table, write_parquet

    _check_out(out)
    if target is None and store is None and config is None:
        store = _local_store_of_run(run)

    async def go(client: Any) -> int:
        table = metadata_table([t async for t in client.list_all(run)])
        write_parquet(table, out)
        return int(table.num_rows)

    rows = _with_client(target, store, config, token, run_token, False, go)
    typer.echo(f"wrote {rows} trajectories of run {run} to {out}")


@app.command("delete-run")
def delete_run(
    run: RunOption,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the run's data cannot be recovered.")] = False,
    target: TargetOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    run_token: RunTokenOption = None,
) -> None:
    """Delete every record and blob of a run."""
    if not yes:
        raise InvalidArgument(f"deleting run {run!r} cannot be undone; add --yes")
    count = _with_client(target, store, config, token, run_token, True, lambda c: c.delete_run(run))
    typer.echo(f"deleted run {run}: {count} trajectories")


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> seconds."""
    match = _AGE.match(text.strip())
    if not match:
        raise typer.BadParameter(f"{text!r}: use a number and a unit, e.g. 30d, 12h, 90m, 45s, 2w")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@app.command()
def sweep(
    older_than: Annotated[str, typer.Option("--older-than", help="Age, e.g. 30d, 12h, 90m.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted.")] = False,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Delete every run whose last write is older than --older-than (logged)."""
    from harnessrl import logs

    age = parse_age(older_than)
    logs.configure("INFO")
    if store is None and config is None:
        raise InvalidArgument("sweep opens the store directly: give --store DIR or --config FILE")
    swept = _with_client(None, store, config, None, None, not dry_run, lambda c: c.service.sweep(age, dry_run))
    verb = "would delete" if dry_run else "deleted"
    for run, _, count in swept:
        typer.echo(f"{verb} run {run} ({count} trajectories)")
    typer.echo(f"{verb} {len(swept)} run(s) older than {older_than}")


@app.command("run-token")
def run_token_cmd(run: RunOption, config: ConfigOption = None) -> None:
    """Print the token that grants access to one run (needs run_token_key in the settings)."""
    from services.capture_store.auth import run_token

    settings = _settings(None, config)
    if settings.run_token_key is None:
        raise InvalidArgument("run_token_key is not set ([capture_store] or HARNESSRL_CAPTURE_STORE_RUN_TOKEN_KEY)")
    from services.capture_store.validate import check_run

    typer.echo(run_token(settings.run_token_key.get_secret_value(), check_run(run)))


def _check_out(out: Path) -> None:
    if not out.parent.is_dir():
        raise InvalidArgument(f"{out.parent} is not a directory")
    if out.is_dir():
        raise InvalidArgument(f"{out} is a directory; give a file name")


# `harnessrl capture agreement` is the name users look for when a run looks
# wrong; the command itself lives with the trainer, whose forward pass it uses.
def _register_agreement() -> None:
    from stack.cli.train import agreement

    app.command("agreement", help="Recompute train/inference agreement for a captured run (= train agreement).")(
        agreement
    )


_register_agreement()
