"""Runs the proxy app with uvicorn inside the caller's event loop: on a TCP
port and, optionally, a Unix socket serving the same app. Used by
``harnessrl proxy serve``, by embedders (one proxy per sandbox worker) and by
tests, which all get the bound port back."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from harnessrl import tls
from harnessrl.rpc import stop_on_signals
from services.proxy.app import create_app
from services.proxy.chat.model import ChatModel
from services.proxy.settings import Settings

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """Signals are handled by the caller, not by uvicorn. The server ticks once a
    second, not ten times (uvicorn's loop): a tick refreshes the Date header, which
    has a second's resolution, and checks for exit, which ``exit`` signals at once.
    An idle proxy so wakes once a second (each wake of a process costs CPU)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    def exit(self) -> None:
        self.should_exit = True
        self._exit.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        counter = 0  # on_tick refreshes the Date header when counter % 10 == 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 1.0)
            should_exit = await self.on_tick(counter)


@dataclass
class RunningProxy:
    settings: Settings
    port: int
    servers: list[_Server]
    tasks: list[asyncio.Task[None]]

    @property
    def url(self) -> str:
        return f"{tls.http_scheme(self.settings.tls)}://{self.settings.host}:{self.port}"

    async def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (grace), closes clients."""
        for server in self.servers:
            server.exit()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def start(settings: Settings, model: ChatModel | None = None) -> RunningProxy:
    app = create_app(settings, model)
    # proto must say TCP: asyncio disables Nagle (TCP_NODELAY) only on sockets that
    # do, and without it every response waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    port = int(sock.getsockname()[1])
    level = settings.log_level.lower()
    grace = int(settings.shutdown_grace_s)
    # TLS on the TCP port only: the Unix socket is local to the host (a sandbox's way out).
    secure = tls.uvicorn_options(settings.tls)
    tls.warn_if_plaintext("proxy", settings.host, settings.tls)
    # A WebSocket message (a Responses request) is bounded like an HTTP body: larger closes with 1009.
    ws = settings.max_body_bytes
    configs = [
        uvicorn.Config(
            app, log_level=level, timeout_graceful_shutdown=grace, access_log=False, ws_max_size=ws, **secure
        )
    ]
    if settings.uds_path is not None:
        configs.append(
            uvicorn.Config(
                app, uds=str(settings.uds_path), lifespan="off", log_level=level, access_log=False, ws_max_size=ws
            )
        )
    servers = [_Server(c) for c in configs]
    tasks = [asyncio.ensure_future(servers[0].serve(sockets=[sock]))]
    tasks += [asyncio.ensure_future(s.serve()) for s in servers[1:]]
    while not all(s.started for s in servers):
        failed = [t for t in tasks if t.done()]
        if failed:
            await failed[0]
            raise RuntimeError("proxy failed to start")
        await asyncio.sleep(0.02)
    log.info("proxy listening", extra={"kv": {"address": f"{settings.host}:{port}", "uds": settings.uds_path}})
    return RunningProxy(settings, port, servers, tasks)


async def serve_until_signal(settings: Settings, announce: bool = True) -> None:
    tls.use(settings.tls)  # this process is the proxy's: its clients dial as its settings say
    stop = stop_on_signals()  # before the first /healthz can answer
    running = await start(settings)
    if settings.gc_tuning:
        # This process is the proxy's own: move everything loaded at startup out of
        # the collector's sight and collect young objects less often. Requests
        # allocate many short-lived objects; this saves ~20% CPU per turn (bench proxy).
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)
    if announce:
        print(f"proxy listening on {settings.host}:{running.port}", file=sys.stderr, flush=True)
    await stop.wait()
    await running.stop()
