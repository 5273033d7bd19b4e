"""Helpers of the tests of the second Sandbox implementation: the remote executor
(``python -m services.sandbox.executor``) as its own process on 127.0.0.1, and the
remote front (``services/sandbox_remote``) in this process, dialling it over HTTP."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from harnessrl.localservers import die_with_parent
from services.sandbox_remote.server import RemoteSandboxServer, create_remote_server
from services.sandbox_remote.settings import Settings as RemoteSettings

ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(rb"sandbox executor (\S+) listening on https?://([\d.]+):(\d+)")


class Executor:
    """One executor process; ``kill`` is SIGKILL (a crashed machine), ``stop`` SIGTERM."""

    def __init__(self, tmp: Path, env: dict[str, str], port: int = 0) -> None:
        self.tmp, self.env, self.port = tmp, env, port
        self.log = tmp / f"executor-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> Executor:
        cmd = [sys.executable, "-m", "services.sandbox.executor", "--port", str(self.port)]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log.read_bytes())
            if match:
                self.name, self.port = match.group(1).decode(), int(match.group(3))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the executor did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def executor_env(tmp: Path, **settings: Any) -> dict[str, str]:
    """The executor's environment: its [sandbox] settings as HARNESSRL_SANDBOX_* variables."""
    fields = {
        "work_dir": tmp / "trials",
        "cache_dir": tmp / "cache",
        "artifacts_dir": tmp / "artifacts",
        "default_agent_timeout_s": 30,
        "default_verifier_timeout_s": 30,
        "local__verify_network": "none",  # the tests' verifiers need no network (as settings_for)
        **settings,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESSRL_SANDBOX_")}
    return env | {f"HARNESSRL_SANDBOX_{k.upper()}": str(v) for k, v in fields.items()}


@contextlib.contextmanager
def executor(tmp: Path, port: int = 0, **settings: Any) -> Iterator[Executor]:
    tmp.mkdir(parents=True, exist_ok=True)
    proc = Executor(tmp, executor_env(tmp, **settings), port).start()
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.asynccontextmanager
async def remote_front(executor_url: str, **settings: Any) -> AsyncIterator[RemoteSandboxServer]:
    fields = {"executor_url": executor_url, "poll_s": 0.2, **settings}
    server = await create_remote_server(RemoteSettings.model_validate(fields))
    try:
        yield server
    finally:
        await server.stop(0)
