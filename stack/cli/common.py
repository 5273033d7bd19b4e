"""Helpers shared by the CLI groups: config options and running a gRPC service."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Annotated, TypeVar

import typer
import uvicorn

from harnessrl import logs, tls
from harnessrl.config import ServiceSettings, load_section
from harnessrl.rpc import RunningServer, stop_on_signals

S = TypeVar("S", bound=ServiceSettings)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file; the service reads its own [section].", exists=False),
]
HostOption = Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")]
PortOption = Annotated[int | None, typer.Option(help="Port (0 picks a free one).")]


def serve_grpc(
    settings_cls: type[S],
    section: str,
    config: Path | None,
    overrides: dict[str, object],
    create: Callable[[S], Awaitable[RunningServer]],
) -> None:
    """Loads settings (errors name file and field, before anything starts), starts
    the server, prints its address and serves until SIGTERM/SIGINT."""
    settings = load_section(settings_cls, config, section, overrides)
    logs.configure(settings.log_level)
    tls.use(settings.tls)  # the service's clients dial as its settings say

    async def run() -> None:
        stop = stop_on_signals()
        running = await create(settings)
        typer.echo(f"{section} listening on {settings.host}:{running.port}", err=True)
        await running.wait_for_signal(stop)

    asyncio.run(run())


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown (exit -15); this one
    stops the same way and exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(self, "should_exit", True))
        yield
