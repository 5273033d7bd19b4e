"""The embedded stack: every service in this process on 127.0.0.1 free ports,
or a connection to it when its address is configured (distributed mode).

Services never import each other; here they meet through their public gRPC and
HTTP clients, exactly as when deployed apart. ``Services`` starts what the run
needs in dependency order (capture store, gateway, proxy, sandbox server + worker,
dashboard) and stops it in reverse; ``model_stack`` is the smaller set one trial
needs (``harnessrl trial run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from harnessrl import tls
from stack.runconfig import RunConfig

log = logging.getLogger(__name__)


@dataclass
class Endpoints:
    """Where the services of a run are."""

    capture_target: str
    gateway_target: str | None = None
    sandbox_target: str | None = None
    proxy_url: str | None = None
    proxy_uds: Path | None = None
    admin_token: str | None = None
    trainer_target: str | None = None
    dashboard_url: str | None = None
    started: list[str] = field(default_factory=list)


async def start_capture(settings: Any) -> Any:
    from services.capture_store.server import create_server

    return await create_server(settings)


async def start_gateway(settings: Any) -> Any:
    from services.gateway.server import create_server

    return await create_server(settings)


async def start_proxy(settings: Any, gateway_target: str, capture_target: str, uds: Path) -> tuple[Any, str]:
    """The proxy on TCP and on ``uds`` (bound into sandboxes); returns it and its admin token."""
    from pydantic import SecretStr

    from services.proxy.server import start

    admin = settings.admin_token.get_secret_value() if settings.admin_token else secrets.token_urlsafe(16)
    update = {"gateway_target": gateway_target, "capture_target": capture_target, "admin_token": SecretStr(admin)}
    proxy = await start(settings.model_copy(update=update | {"uds_path": uds}))
    return proxy, admin


def sandbox_settings_for(settings: Any, ends: Endpoints, token: str | None = None) -> Any:
    """The sandbox worker's settings pointed at this stack's proxy and capture store."""
    from pydantic import SecretStr

    update: dict[str, Any] = {"capture_target": ends.capture_target}
    if ends.proxy_url:
        update |= {"proxy_url": ends.proxy_url, "proxy_admin_token": SecretStr(ends.admin_token or "")}
        update["proxy_uds_path"] = ends.proxy_uds
    if token and settings.capture_token is None:
        update["capture_token"] = SecretStr(token)
    return settings.model_copy(update=update)


class _QuietServer(uvicorn.Server):
    """The run handles SIGINT/SIGTERM itself; uvicorn must not take them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DashboardServer:
    """The dashboard app served in this process over the runs directory."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.token = settings.auth_token.get_secret_value() if settings.auth_token else secrets.token_urlsafe(18)
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self, run_id: str) -> str:
        from pydantic import SecretStr

        from services.dashboard.app import create_app
        from stack.dashboard import EmbeddedCaptureOpener

        settings = self.settings.model_copy(update={"auth_token": SecretStr(self.token)})
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
        port = sock.getsockname()[1]
        tls.warn_if_plaintext("dashboard", settings.host, settings.tls)
        config = uvicorn.Config(
            create_app(settings, EmbeddedCaptureOpener()),
            log_level="warning",
            access_log=False,
            lifespan="on",
            **tls.uvicorn_options(settings.tls),
        )
        self._server = _QuietServer(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("dashboard failed to start")
            await asyncio.sleep(0.02)
        self.url = f"{tls.http_scheme(settings.tls)}://{settings.host}:{port}/runs/{run_id}?token={self.token}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)


class _Stopper:
    """Adapts anything with an async ``stop()`` (grace argument or not)."""

    def __init__(self, name: str, obj: Any, grace: float | None = None) -> None:
        self.name, self.obj, self.grace = name, obj, grace

    async def stop(self) -> None:
        try:
            if self.grace is None:
                await self.obj.stop()
            else:
                await self.obj.stop(self.grace)
        except Exception:  # broad: one service failing to stop must not keep the others running
            log.exception("stopping %s failed", self.name)


@contextlib.asynccontextmanager
async def services(cfg: RunConfig, *, dashboard: bool = False) -> AsyncIterator[Endpoints]:
    """Starts (or connects to) every service of ``cfg`` except the trainer; stops them all on exit.

    Order: capture store, gateway, proxy, sandbox server (+ a local worker when the
    queue is Redis; the in-process queue's server runs its own), dashboard."""
    stoppers: list[_Stopper] = []
    sock_dir = Path(tempfile.mkdtemp(prefix="hrl-"))  # Unix socket paths must stay short
    try:
        ends = Endpoints(capture_target=cfg.run.capture_target or "")
        if cfg.capture_store is not None:
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            capture = await start_capture(cfg.capture_store)
            stoppers.append(_Stopper("capture store", capture, 2.0))
            ends.capture_target = f"127.0.0.1:{capture.port}"
            ends.started.append("capture_store")
        ends.gateway_target = cfg.run.gateway_target
        if cfg.gateway is not None:
            gateway = await start_gateway(cfg.gateway)
            stoppers.append(_Stopper("gateway", gateway, 1.0))
            ends.gateway_target = f"127.0.0.1:{gateway.port}"
            ends.started.append("gateway")
        ends.sandbox_target = cfg.run.sandbox_target
        if cfg.run.sandbox_target is None:
            assert cfg.proxy is not None and ends.gateway_target is not None
            proxy, admin = await start_proxy(
                _with_tokens(cfg.proxy, cfg.token()), ends.gateway_target, ends.capture_target, sock_dir / "p.sock"
            )
            stoppers.append(_Stopper("proxy", proxy))
            ends.proxy_url, ends.proxy_uds, ends.admin_token = proxy.url, sock_dir / "p.sock", admin
            ends.started.append("proxy")
            sandbox = await _start_sandbox(cfg, ends, stoppers)
            ends.sandbox_target = f"127.0.0.1:{sandbox.port}"
            ends.started.append("sandbox")
        if dashboard and cfg.dashboard is not None:
            dash = DashboardServer(cfg.dashboard)
            ends.dashboard_url = await dash.start(cfg.run_id)
            stoppers.append(_Stopper("dashboard", dash))
            ends.started.append("dashboard")
        yield ends
    finally:
        for stopper in reversed(stoppers):
            await stopper.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _with_tokens(proxy_settings: Any, token: str | None) -> Any:
    """The proxy's credentials for a remote gateway / capture store: the run's service token unless set."""
    from pydantic import SecretStr

    if not token:
        return proxy_settings
    update = {
        name: SecretStr(token) for name in ("gateway_token", "capture_token") if getattr(proxy_settings, name) is None
    }
    return proxy_settings.model_copy(update=update)


async def _start_sandbox(cfg: RunConfig, ends: Endpoints, stoppers: list[_Stopper]) -> Any:
    from services.sandbox.factory import build_worker
    from services.sandbox.server import create_sandbox_server

    settings = sandbox_settings_for(cfg.sandbox, ends, cfg.token())
    server = await create_sandbox_server(settings)
    if not settings.queue_url.startswith("memory://"):
        worker = build_worker(settings, server.queue)
        stop = asyncio.Event()
        task = asyncio.ensure_future(worker.run(stop))
        stoppers.append(_Stopper("sandbox server", server, 1.0))
        stoppers.append(_Stopper("sandbox worker", _WorkerHandle(stop, task)))
    else:
        stoppers.append(_Stopper("sandbox server", server, 1.0))
    return server


@dataclass
class _WorkerHandle:
    stop_event: asyncio.Event
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.stop_event.set()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def model_stack(
    engine: str | None,
    workdir: Path,
    model: str | None,
    temperature: float | None = None,
    capture_dir: Path | None = None,
    proxy_fields: dict[str, Any] | None = None,
    gateway_fields: dict[str, Any] | None = None,
) -> AsyncIterator[Endpoints]:
    """One trial's services: the capture store (embedded in ``capture_dir``, default
    ``workdir/capture``) always; the gateway with ``engine`` and the proxy (sampling at
    ``temperature``, unset: the proxy's default; its socket in ``workdir``) when an
    engine is given. ``proxy_fields`` / ``gateway_fields``: more settings (a trial's config)."""
    from services.capture_store.settings import Settings as CaptureSettings

    stoppers: list[_Stopper] = []
    try:
        capture = await start_capture(
            CaptureSettings.model_validate({"port": 0, "store_dir": capture_dir or workdir / "capture"})
        )
        stoppers.append(_Stopper("capture store", capture))
        ends = Endpoints(capture_target=f"127.0.0.1:{capture.port}")
        if engine is not None:
            from services.gateway.settings import Settings as GatewaySettings
            from services.proxy.settings import Settings as ProxySettings

            gateway_table = {**(gateway_fields or {}), "port": 0, "engine": engine}
            gateway = await start_gateway(GatewaySettings.model_validate(gateway_table))
            stoppers.append(_Stopper("gateway", gateway))
            ends.gateway_target = f"127.0.0.1:{gateway.port}"
            fields: dict[str, Any] = {**(proxy_fields or {}), "port": 0}
            if model:
                fields["served_model_names"] = [model]
            if temperature is not None:
                fields["temperature"] = temperature
            proxy, admin = await start_proxy(
                ProxySettings.model_validate(fields), ends.gateway_target, ends.capture_target, workdir / "proxy.sock"
            )
            stoppers.append(_Stopper("proxy", proxy))
            ends.proxy_url, ends.proxy_uds, ends.admin_token = proxy.url, workdir / "proxy.sock", admin
        yield ends
    finally:
        for stopper in reversed(stoppers):
            await stopper.stop()
