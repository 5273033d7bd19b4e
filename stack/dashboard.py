"""Composition for the dashboard: give it a gRPC capture store for runs whose
store is an embedded directory.

The dashboard (a service) only speaks gRPC to a capture store. A finished
embedded run has no server, and a live one is held by its writer process; so
this opens the directory *read-only* (no writer lock; SQLite WAL readers see the
writer's commits) in a capture store server on 127.0.0.1 with a private token
that only this dashboard holds, one per directory, stopped with the dashboard.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from harnessrl.errors import Unavailable
from services.capture_store.server import CaptureServer, create_server
from services.capture_store.settings import Settings as CaptureSettings
from services.dashboard.rundir import RunDir
from services.dashboard.sources import CaptureEndpoint, TargetOpener


class EmbeddedCaptureOpener:
    """Opens embedded capture stores on demand; distributed ones go to ``fallback``."""

    def __init__(self, fallback: TargetOpener | None = None) -> None:
        self._fallback = fallback or TargetOpener()
        self._servers: dict[Path, tuple[CaptureServer, str]] = {}
        self._lock = asyncio.Lock()

    async def target_for(self, run: RunDir) -> CaptureEndpoint:
        store = run.capture_dir()
        if store is None:
            return await self._fallback.target_for(run)
        if not (store / "index.sqlite3").exists():
            raise Unavailable(f"capture store directory {store} is missing or empty")
        async with self._lock:
            if store not in self._servers:
                self._servers[store] = await _serve_read_only(store)
            server, token = self._servers[store]
        return CaptureEndpoint(f"127.0.0.1:{server.port}", token)

    async def close(self) -> None:
        async with self._lock:
            for server, _ in self._servers.values():
                await server.stop(0)  # drains, then closes the store
            self._servers.clear()


async def _serve_read_only(store: Path) -> tuple[CaptureServer, str]:
    token = secrets.token_urlsafe(24)
    settings = CaptureSettings.model_validate({"store_dir": store, "host": "127.0.0.1", "port": 0, "auth_token": token})
    return await create_server(settings, writer=False), token
