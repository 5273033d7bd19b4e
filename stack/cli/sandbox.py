"""``harnessrl sandbox``: Sandbox service: serve the trial API and run workers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from harnessrl.rpc import stop_on_signals
from stack.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Sandbox service: serve the trial API and run workers.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the sandbox gRPC service until SIGTERM (with memory:// it also runs a worker)."""
    from services.sandbox.common.settings import Settings
    from services.sandbox.server import create_server

    serve_grpc(Settings, "sandbox", config, {"host": host, "port": port}, create_server)


@app.command()
def worker(
    config: ConfigOption = None,
    queue_url: Annotated[str | None, typer.Option(help="redis://host:port/db (the service's queue).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Trials run at once.")] = None,
    name: Annotated[str | None, typer.Option(help="Worker name (default host-pid-random).")] = None,
) -> None:
    """Run trials from the queue until SIGTERM, then finish the running ones."""
    from harnessrl import logs, telemetry, tls
    from harnessrl.config import load_section
    from harnessrl.errors import ConfigError
    from services.sandbox.common.settings import Settings
    from services.sandbox.factory import build_worker
    from services.sandbox.queue.base import create_queue

    settings = load_section(Settings, config, "sandbox", {"queue_url": queue_url, "concurrency": concurrency})
    if settings.queue_url.startswith("memory://"):
        raise ConfigError("a standalone worker needs a shared queue: set queue_url = 'redis://...'")
    logs.configure(settings.log_level)
    tls.use(settings.tls)
    # The worker's trial spans (sandbox.trial, its client calls) continue the submitter's
    # trace, and the proxy joins it through the traceparent of the trial's registration.
    telemetry.configure("sandbox", settings.otlp_endpoint)

    async def run() -> None:
        queue = create_queue(settings.queue_url)
        w = build_worker(settings, queue, name)
        stop = stop_on_signals()
        typer.echo(f"sandbox worker {w.name} serving {settings.queue_url}", err=True)
        try:
            await w.run(stop)
        finally:
            await queue.close()
            telemetry.flush()

    asyncio.run(run())


@app.command("base-images")
def base_images(
    docker_host: Annotated[
        str | None, typer.Option(help="Engine to import into (default: DOCKER_HOST or the default socket).")
    ] = None,
    image: Annotated[
        list[str] | None,
        typer.Option(help="Only this image name (repeatable), e.g. ubuntu:24.04; default: every one."),
    ] = None,
    rebuild: Annotated[bool, typer.Option(help="Build the rootfs again even if it is cached.")] = False,
    build_only: Annotated[bool, typer.Option(help="Only build the rootfs tars; import into no engine.")] = False,
) -> None:
    """Build the offline base images (Debian and Ubuntu root filesystems from their archives'
    packages) and import them into a Docker engine under the names task Dockerfiles use in FROM."""
    from services.sandbox import baseimages
    from services.sandbox.common.errors import EnvSetupError

    try:
        bases = {baseimages.base_of(name): None for name in image} if image else dict.fromkeys(baseimages.BASES)
    except EnvSetupError as e:
        typer.echo(f"error: --image: {e}", err=True)
        raise typer.Exit(2) from e
    client = None if build_only else _engine(docker_host)
    for base in bases:
        fs = baseimages.rootfs(base=base, rebuild=rebuild)
        typer.echo(f"rootfs {fs.tar} ({fs.tar.stat().st_size / 1e6:.0f} MB)")
        if client is None:
            continue
        names = tuple(n for n in base.names if not image or n in image)
        tagged = baseimages.ensure_imported(client, fs, names)
        for name in names:
            typer.echo(f"{name}: {'imported' if name in tagged else 'present'}")


def _engine(docker_host: str | None) -> Any:
    """A docker SDK client of an engine that answers, or exit 2 naming the engine."""
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        client.ping()
    except Exception as e:  # any failure to reach the engine
        typer.echo(f"no Docker engine reachable ({docker_host or 'DOCKER_HOST/default'}): {e}", err=True)
        raise typer.Exit(2) from e
    return client


@app.command()
def conformance(
    target: Annotated[str | None, typer.Option(help="The Sandbox service to check, host:port.")] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token the target requires.", envvar="HARNESSRL_SANDBOX_TOKEN")
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the conformance tasks as the target's workers see it (see --write-tasks); "
            "default: written to a temporary folder here (workers on this filesystem)."
        ),
    ] = None,
    write_tasks: Annotated[
        Path | None, typer.Option(help="Only write the conformance tasks into this folder, to copy to the workers.")
    ] = None,
    check: Annotated[list[str] | None, typer.Option(help="Run only this check (repeatable).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one trial may take.", min=1)] = 180.0,
    connect_timeout: Annotated[float, typer.Option(help="Seconds the target may take to answer.", min=0.1)] = 5.0,
) -> None:
    """Check that TARGET keeps the Sandbox contract (services/sandbox/CONTRACT.md): exit 0 when every
    check passes, 1 when one fails, 2 when the target is unreachable or is not a Sandbox service."""
    from harnessrl.errors import HarnessError
    from services.sandbox import conformance as conf

    if write_tasks is not None:
        typer.echo(f"conformance tasks written to {conf.write_tasks(write_tasks)}: {sorted(conf.TASKS)}")
        return
    if target is None:
        typer.echo("error: --target HOST:PORT is required (or --write-tasks DIR)", err=True)
        raise typer.Exit(2)
    try:
        results = asyncio.run(
            conf.run_conformance(
                target, token, tasks_dir=tasks, only=check, timeout_s=timeout, connect_timeout_s=connect_timeout
            )
        )
    except HarnessError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    for r in results:
        typer.echo(f"{'PASS' if r.ok else 'FAIL'}  {r.name:<34} {r.seconds:6.1f}s  {r.detail}")
    failed = [r.name for r in results if not r.ok]
    typer.echo(f"{len(results) - len(failed)}/{len(results)} checks passed against {target}", err=True)
    if failed:
        raise typer.Exit(1)
