"""The real services a proxy test talks to, on 127.0.0.1 free ports in a
background event loop: the gateway with the scripted engine (real tokenizer,
JSONL generation log), the real capture store (embedded backend) over gRPC
with a service credential, and the proxy itself (HTTP and a Unix socket). Tests are synchronous and use
the official SDKs against it, as harnesses do."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx

from harnessrl.localservers import free_port
from harnessrl.paths import default_model_dir
from services.capture_store.server import create_server as create_store
from services.capture_store.settings import Settings as StoreSettings
from services.gateway.engines.scripted import read_generation_log
from services.gateway.server import create_server as create_gateway
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.server import RunningProxy
from services.proxy.server import start as start_proxy
from services.proxy.settings import Settings as ProxySettings
from stack.conformance.proxy_stack import check_faithful, read_segments

__all__ = ["MODEL", "Stack", "check_faithful", "script"]
T = TypeVar("T")
ADMIN = "admin-secret"
CAPTURE_TOKEN = "capture-secret"
MODEL = default_model_dir().name


def script(tmp: Path, threads: dict[str, list[dict[str, Any]]], **extra: Any) -> Path:
    path = tmp / "script.json"
    path.write_text(json.dumps({"context_window": 65536, "threads": threads, **extra}))
    return path


class Stack:
    def __init__(
        self,
        tmp: Path,
        script_path: Path | None,
        engine: str | None = None,
        gateway: dict[str, Any] | None = None,
        **proxy_settings: Any,
    ) -> None:
        """``engine``: the gateway's engine selection; default ``scripted:<script_path>``;
        ``gateway``: more gateway settings (a vLLM engine's ``vllm_urls``)."""
        self.tmp = tmp
        self.log_path = tmp / "engine.jsonl"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.run(self._start(engine or f"scripted:{script_path}", gateway or {}, proxy_settings))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout=120)

    async def _start(self, engine: str, gateway: dict[str, Any], proxy_settings: dict[str, Any]) -> None:
        settings = GatewaySettings(engine=engine, scripted_log_path=self.log_path, **gateway)
        self.gateway = await create_gateway(settings)
        self.store_port = free_port()
        await self.start_store()
        base: dict[str, Any] = {
            "gateway_target": f"127.0.0.1:{self.gateway.port}",
            "capture_target": f"127.0.0.1:{self.store_port}",
            "capture_token": CAPTURE_TOKEN,
            "admin_token": ADMIN,
            "uds_path": self.tmp / "proxy.sock",
            "render_check": True,
        }
        settings = ProxySettings(**{**base, **proxy_settings})
        self.proxy: RunningProxy = await start_proxy(settings)

    @property
    def url(self) -> str:
        return self.proxy.url

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        return httpx.request(method, f"{self.url}/admin{path}", headers=headers, timeout=60, **kw)

    def new_trial(self, trial_id: str, **spec: Any) -> tuple[str, str]:
        """Returns (OpenAI-style base URL ending in /v1, token)."""
        body = {"trial_id": trial_id, "run_id": "run-1", "task_id": "task-1", "group_id": "g-1", **spec}
        resp = self.admin("POST", "/trials", json=body)
        assert resp.status_code == 201, resp.text
        data = resp.json()
        return f"{self.url}{data['base_path']}", data["token"]

    def close_trial(self, trial_id: str) -> dict[str, Any]:
        resp = self.admin("POST", f"/trials/{trial_id}/close")
        assert resp.status_code == 200, resp.text
        result: dict[str, Any] = resp.json()
        return result

    async def start_store(self) -> None:
        """(Re)starts the capture store on its port, over the same files."""
        settings = StoreSettings(
            port=self.store_port, store_dir=self.tmp / "capture", fsync=False, auth_token=CAPTURE_TOKEN
        )
        self.capture_server = await create_store(settings)

    async def stop_store(self) -> None:
        await self.capture_server.stop(0)

    def export(self, trial_id: str, run_id: str = "run-1") -> list[dict[str, Any]]:
        """Every segment of a trial, read back from the capture store (GetTrajectory)."""
        return self.run(read_segments(f"127.0.0.1:{self.store_port}", CAPTURE_TOKEN, run_id, trial_id))

    def engine_log(self) -> list[dict[str, Any]]:
        return read_generation_log(self.log_path) if self.log_path.exists() else []

    def stop(self) -> None:
        async def _stop() -> None:
            await self.proxy.stop()
            await self.capture_server.stop(0)  # idempotent if a test stopped it
            await self.gateway.stop(0)

        self.run(_stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
