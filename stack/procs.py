"""Services as separate processes, as deployed: each ``harnessrl <noun> serve``
(or ``sandbox worker``) runs from one shared config file on a fixed port, so a
service that is killed and restarted comes back at the same address and its
clients reconnect. Used by the load test (``harnessrl bench e2e``) and the
chaos test, which SIGKILLs and restarts them one at a time.

Each process is started and stopped by its handle (PID), never by name; its
stdout and stderr go to ``<root>/<name>.log`` (appended across restarts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from harnessrl.rpc import check_health

# The gRPC service each ``serve`` noun registers: readiness asks for it by name, so
# another server on the same port never passes for this one.
SERVICE_NAMES = {
    "gateway": "harnessrl.v1.RolloutGateway",
    "capture": "harnessrl.v1.CaptureStore",
    "sandbox": "harnessrl.v1.Sandbox",
    "train": "harnessrl.v1.Trainer",
}


@dataclass
class ServiceProcess:
    """One service process: ``argv`` after ``python -m stack.cli``, and how to tell it is up."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    port: int | None = None
    http: bool = False
    grpc_service: str = ""
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    cpus: set[int] | None = None  # pinned to these CPUs from its first instruction (benches)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid if self.proc else '?'})")
        cpus = self.cpus
        with self.log.open("ab") as out:
            out.write(f"\n=== start {self.starts + 1} of {self.name} at {time.time():.3f}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stack.cli", *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C of the test does not hit it first
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        self.starts += 1

    async def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the service answers (gRPC health SERVING, or HTTP /healthz 200)."""
        if self.port is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if await self._answers():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not come up in {timeout_s}s: {self.tail()}")
            await asyncio.sleep(0.2)

    async def _answers(self) -> bool:
        if self.http:
            return await asyncio.to_thread(_http_ok, f"http://{self.target}/healthz")
        try:
            return await check_health(self.target, self.grpc_service, wait_s=0.5) == "SERVING"
        except grpc.aio.AioRpcError:  # not up yet (check_health retries within wait_s, then raises)
            return False

    def kill(self) -> None:
        """SIGKILL: no graceful stop, no flush (the fault the chaos test injects)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class ProcessStack:
    """Named service processes sharing one config file under ``root``."""

    root: Path
    config: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    services: dict[str, ServiceProcess] = field(default_factory=dict)

    def add(
        self, name: str, argv: Sequence[str], port: int | None = None, http: bool = False, grpc_service: str = ""
    ) -> ServiceProcess:
        svc = ServiceProcess(name, list(argv), self.root / f"{name}.log", self.env, port, http, grpc_service)
        self.services[name] = svc
        return svc

    def add_server(self, name: str, noun: str, port: int) -> ServiceProcess:
        """``harnessrl <noun> serve -c CONFIG --port PORT``."""
        argv = [noun, "serve", "-c", str(self.config), "--port", str(port)]
        return self.add(name, argv, port, noun == "proxy", SERVICE_NAMES.get(noun, ""))

    def __getitem__(self, name: str) -> ServiceProcess:
        return self.services[name]

    async def start(self, *names: str, timeout_s: float = 120) -> None:
        """Spawns the named services (all when none is named) and waits until each answers."""
        chosen = [self.services[n] for n in names] if names else list(self.services.values())
        for svc in chosen:
            svc.spawn()
        await asyncio.gather(*(svc.wait_ready(timeout_s) for svc in chosen))

    async def restart(self, name: str, timeout_s: float = 120) -> None:
        svc = self.services[name]
        svc.kill()
        svc.spawn()
        await svc.wait_ready(timeout_s)

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM to every service, newest first; returns the exit codes."""
        codes = {}
        for name, svc in reversed(list(self.services.items())):
            codes[name] = svc.stop()
        return codes

    def logs(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {n}\n{s.tail(chars)}" for n, s in self.services.items())


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
