"""``harnessrl dashboard``: serve the dashboard over a run (or a runs root), export a run."""

from __future__ import annotations

import asyncio
import secrets
import socket
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from harnessrl import logs, tls
from harnessrl.config import load_section
from stack.cli.common import ConfigOption, HostOption, PortOption, _Server

app = typer.Typer(help="The dashboard (HTTP): live runs, trajectories, static exports.", no_args_is_help=True)

RunDirOption = Annotated[Path | None, typer.Option("--run", help="Serve this one run directory.")]
RunsDirOption = Annotated[
    Path | None, typer.Option("--runs-dir", help="Serve every run under this root (default $HARNESSRL_HOME/runs).")
]


def _settings(config: Path | None, overrides: dict[str, object]):  # type: ignore[no-untyped-def]
    from services.dashboard.settings import Settings

    return load_section(Settings, config, "dashboard", overrides)


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    run: RunDirOption = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Serve the dashboard until SIGTERM. Without a configured token, one is made up
    and printed in the login URL (the dashboard never runs open)."""
    from services.dashboard.app import create_app
    from stack.dashboard import EmbeddedCaptureOpener

    overrides: dict[str, object] = {"host": host, "port": port, "run_dir": run, "runs_dir": runs_dir}
    settings = _settings(config, overrides)
    if settings.run_dir is not None and not settings.run_dir.is_dir():
        raise typer.BadParameter(f"{settings.run_dir} is not a directory", param_hint="--run")
    token = settings.auth_token.get_secret_value() if settings.auth_token else secrets.token_urlsafe(18)
    settings = settings.model_copy(update={"auth_token": _secret(token)})
    logs.configure(settings.log_level)
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    bound = sock.getsockname()[1]
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    page = f"/runs/{settings.run_dir.name}" if settings.run_dir is not None else "/"
    scheme = tls.http_scheme(settings.tls)
    typer.echo(f"dashboard listening on {scheme}://{shown}:{bound}{page}?token={token}", err=True)
    tls.use(settings.tls)  # its clients (capture store, trainer) dial as its settings say
    tls.warn_if_plaintext("dashboard", settings.host, settings.tls)
    config_ = uvicorn.Config(
        create_app(settings, EmbeddedCaptureOpener()),
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        access_log=False,
        **tls.uvicorn_options(settings.tls),
    )
    asyncio.run(_Server(config_).serve(sockets=[sock]))


def _secret(token: str):  # type: ignore[no-untyped-def]
    from pydantic import SecretStr

    return SecretStr(token)


@app.command()
def export(
    run: Annotated[str, typer.Argument(help="A run directory, or a run id under --runs-dir.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write; opens from disk (index.html).")],
    config: ConfigOption = None,
    runs_dir: RunsDirOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out.")] = False,
) -> None:
    """Write a self-contained static copy of RUN that opens from disk without a backend."""
    from services.dashboard.export import export_run
    from services.dashboard.service import DashboardService
    from stack.dashboard import EmbeddedCaptureOpener

    as_path = Path(run)
    overrides: dict[str, object] = {"runs_dir": runs_dir}
    if as_path.is_dir():
        overrides["run_dir"] = as_path.resolve()
        run = as_path.resolve().name
    settings = _settings(config, overrides)
    logs.configure(settings.log_level)

    async def go() -> None:
        service = DashboardService(settings, EmbeddedCaptureOpener())
        try:
            result = await export_run(service, run, out, force=force)
        finally:
            await service.close()
        for line in result.skipped:
            typer.echo(f"skipped {line}", err=True)
        typer.echo(
            f"exported {run}: {result.trajectories} trajectories, {result.bytes / 1e6:.1f} MB -> {out}/index.html"
        )

    asyncio.run(go())
