"""Running commands in one trial's container: streamed output (bounded),
timeouts and cancellation that kill the processes mid-run, the kill sweep
before verify, the relay into the container's network namespace, and the
cgroup counters that tell an OOM kill or a pids limit from a plain exit.

A worker's identity (host, pid, process start time) is written on each
container it starts, so another worker on the same host can tell a dead
worker's containers from a live one's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.sandbox.backends.base import ExecResult
from services.sandbox.backends.cgroups import EventFiles, container_event_files
from services.sandbox.backends.limits import BoundedOutput
from services.sandbox.backends.netns import listen_in
from services.sandbox.common.errors import EnvSetupError, SandboxLost
from services.sandbox.common.relay import UnixRelay

# Runs as the sandbox user: counts its other processes, then kills them all
# (kill(-1) spares the caller), setsid daemons included.
KILL_USER = 'n=0; for d in /proc/[0-9]*; do [ -O "$d" ] && n=$((n+1)); done; kill -9 -1 2>/dev/null; echo $((n-1))'
_KILL_WAIT_S = 10.0
log = logging.getLogger(__name__)


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def worker_is_dead(identity: str) -> bool:
    """True only for a worker of this host that no longer runs (pid gone or reused)."""
    host, _, rest = identity.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _start_time(int(pid)) != started


@dataclass
class ContainerExec:
    client: Any
    container: Any
    cgroup_root: Path
    image: str = ""
    # The image's USER ('' is root): Harbor's verifier when the task names none.
    image_user: str = ""
    # The commit of the agent's final filesystem the verifier's container runs (removed at stop).
    verify_image: str = ""
    # A multi-step task's commits between steps (``docker_steps``), removed at stop, newest first.
    step_images: list[str] = field(default_factory=list)
    # A compose task's holder and sidecars (``docker_compose``), removed at stop.
    services: Any = None
    pristine: Path | None = None
    # A warm container's slot path (``docker_pool``): a link to the trial's directory, removed at stop.
    slot: Path | None = None
    # ``docker diff`` of the agent's container, read before the verifier's is made.
    agent_diff: list[dict[str, object]] = field(default_factory=list)
    stopped: bool = False
    relay: UnixRelay | None = None
    uploaded: set[str] = field(default_factory=set)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    events: EventFiles | None = None

    # -- root's short commands ------------------------------------------------
    async def root(self, script: str) -> bytes:
        """Runs ``script`` as root; returns its output (raises on a non-zero exit)."""
        try:
            code, out = await asyncio.to_thread(self.container.exec_run, ["sh", "-c", script], user="0")
        except Exception as e:
            raise SandboxLost(f"container {self.container.name}: {e}") from e
        if code != 0:
            raise EnvSetupError(f"container {self.container.name}: {script!r} failed: {out[-500:]!r}")
        return bytes(out or b"")

    async def kill_user(self, user: str) -> int:
        """Kills every process of ``user``; returns how many there were."""
        try:
            code, out = await asyncio.to_thread(self.container.exec_run, ["sh", "-c", KILL_USER], user=user)
        except Exception as e:
            raise SandboxLost(f"container {self.container.name}: {e}") from e
        text = out.decode(errors="replace").strip().splitlines()
        return int(text[-1]) if code == 0 and text and text[-1].lstrip("-").isdigit() else 0

    # -- the relay ------------------------------------------------------------
    async def open_relay(self, port: int, target: Path) -> None:
        pid = int(self.container.attrs["State"]["Pid"])
        listener = await asyncio.to_thread(listen_in, pid, "127.0.0.1", port)
        self.relay = await UnixRelay(None, uds=target, listener=listener).start()

    async def close_relay(self) -> None:
        if self.relay is not None:
            await self.relay.stop()
            self.relay = None

    # -- one command ----------------------------------------------------------
    async def run(
        self,
        argv: list[str],
        *,
        user: str,
        env: dict[str, str],
        workdir: str,
        stdin: bytes | None,
        timeout_s: float,
        output_limit: int,
        stop: list[asyncio.Event],
    ) -> ExecResult:
        api = self.client.api
        if stdin is not None:
            argv = await self._with_stdin(argv, stdin)
        counters = self.counters()
        started = time.monotonic()
        try:
            created = await asyncio.to_thread(
                api.exec_create, self.container.id, argv, user=user, environment=env, workdir=workdir
            )
        except Exception as e:
            raise SandboxLost(f"container {self.container.name}: exec failed: {e}") from e
        sink = BoundedOutput(output_limit)
        reader = asyncio.ensure_future(asyncio.to_thread(self._pump, created["Id"], sink))
        waiters = [asyncio.ensure_future(event.wait()) for event in stop]
        done, _ = await asyncio.wait([reader, *waiters], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if reader not in done:
            # Timed out or stopped: kill its processes mid-run; the stream then ends.
            await self.kill_user(user)
            await asyncio.wait([reader], timeout=_KILL_WAIT_S)
        if reader.done() and reader.exception() is not None:
            raise SandboxLost(f"container {self.container.name}: {reader.exception()}")
        try:
            inspect = await asyncio.to_thread(api.exec_inspect, created["Id"])
        except Exception as e:
            raise SandboxLost(f"container {self.container.name}: the engine went away mid-exec: {e}") from e
        code = inspect.get("ExitCode")
        oom, pids = self.counters()
        return ExecResult(
            exit_code=code if isinstance(code, int) else -9,
            timed_out=not done,
            output=sink.value(),
            output_bytes=sink.total,
            output_truncated=sink.truncated,
            oom_killed=oom > counters[0],
            pids_limit_hit=pids > counters[1],
            duration_s=time.monotonic() - started,
        )

    def _pump(self, exec_id: str, sink: BoundedOutput) -> None:
        for chunk in self.client.api.exec_start(exec_id, stream=True):
            sink.feed(chunk)

    async def _with_stdin(self, argv: list[str], data: bytes) -> list[str]:
        import io
        import tarfile

        name = f"stdin-{next(self.counter)}-{uuid.uuid4().hex[:6]}"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o400, 1000, 1000
            tar.addfile(info, io.BytesIO(data))
        await self.root("mkdir -p /run/harnessrl-stdin")
        await asyncio.to_thread(self.container.put_archive, "/run/harnessrl-stdin", buffer.getvalue())
        return ["sh", "-c", 'exec "$@" < "$0"', f"/run/harnessrl-stdin/{name}", *argv]

    # -- cgroup counters (v1 or v2, any driver; zeros where the cgroup is not visible) ---
    def counters(self) -> tuple[int, int]:
        """(OOM kills, pids-limit hits) of the container so far."""
        if self.events is None:
            self.events = self._event_files()
        return self.events.read()

    def _event_files(self) -> EventFiles:
        pid = int((self.container.attrs.get("State") or {}).get("Pid") or 0)
        proc = None
        if pid > 0:
            try:
                proc = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                proc = None  # another pid namespace (a worker in a container): the driver's paths remain
        files = container_event_files(self.cgroup_root, self.container.id, proc)
        if files.oom is None or files.pids is None:
            log.warning(
                "container cgroup not visible: its OOM kills or pids-limit hits will read as plain exits",
                extra={"kv": {"container": self.container.name, "cgroup_root": str(self.cgroup_root), "pid": pid}},
            )
        return files

    def upper_dir(self) -> str:
        """The container's writable layer on this host ('' when not visible)."""
        data = (self.container.attrs.get("GraphDriver") or {}).get("Data") or {}
        return str(data.get("UpperDir") or "")

    # -- the per-image pristine copy (written once, atomically) ----------------
    def pristine_lock(self, cache: Path) -> asyncio.Lock:
        return _LOCKS.setdefault(str(cache), asyncio.Lock())


_LOCKS: dict[str, asyncio.Lock] = {}
