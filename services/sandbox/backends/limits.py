"""Resource limits of the local backend: cgroup v1 memory and pids controllers
where writable (else rlimits), a disk watchdog, and bounded output capture.

cgroup v1 is what these machines have (FACTS.md); each exec gets its own
cgroup under the worker's, so leftovers can be found and killed by listing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(controller: str) -> Path | None:
    """The worker's own cgroup directory for ``controller`` if it is writable (v1)."""
    base = CGROUP_ROOT / controller
    if not (base / "cgroup.procs").exists():
        return None
    rel = "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                rel = path
    own = base / rel.lstrip("/")
    return own if os.access(own, os.W_OK) else None


@dataclass
class CgroupSupport:
    memory: Path | None
    pids: Path | None
    cpu: Path | None = None

    @classmethod
    def detect(cls) -> CgroupSupport:
        return cls(memory=_own_cgroup("memory"), pids=_own_cgroup("pids"), cpu=_own_cgroup("cpu"))


@dataclass
class PhaseCgroup:
    """The memory and pids cgroups of one exec (either may be absent)."""

    name: str
    memory: Path | None = None
    pids: Path | None = None
    cpu: Path | None = None
    paths: list[Path] = field(default_factory=list)

    @classmethod
    def create(
        cls, support: CgroupSupport, name: str, memory_mb: int, pids: int, cpus: float | None = None
    ) -> PhaseCgroup:
        group = cls(name=name)
        if support.memory is not None:
            group.memory = _mkdir(support.memory / "harnessrl" / name)
            limit = str(memory_mb * 1024 * 1024)
            (group.memory / "memory.limit_in_bytes").write_text(limit)
            memsw = group.memory / "memory.memsw.limit_in_bytes"
            with contextlib.suppress(OSError):
                if memsw.exists():
                    memsw.write_text(limit)
        if support.pids is not None:
            group.pids = _mkdir(support.pids / "harnessrl" / name)
            (group.pids / "pids.max").write_text(str(pids))
        if support.cpu is not None and cpus:
            group.cpu = _mkdir(support.cpu / "harnessrl" / name)
            period = 100_000
            (group.cpu / "cpu.cfs_period_us").write_text(str(period))
            (group.cpu / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * period))))
        group.paths = [p for p in (group.memory, group.pids, group.cpu) if p is not None]
        return group

    @classmethod
    def existing(cls, support: CgroupSupport, prefix: str) -> list[PhaseCgroup]:
        """Cgroups this service created whose name starts with ``prefix``."""
        by_name: dict[str, PhaseCgroup] = {}
        for controller, base in (("memory", support.memory), ("pids", support.pids), ("cpu", support.cpu)):
            root = base / "harnessrl" if base is not None else None
            if root is None or not root.is_dir():
                continue
            for path in root.iterdir():
                if path.is_dir() and path.name.startswith(prefix):
                    group = by_name.setdefault(path.name, cls(name=path.name))
                    setattr(group, controller, path)
                    group.paths.append(path)
        return list(by_name.values())

    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.paths]

    def pids_alive(self) -> list[int]:
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (path / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_killed(self) -> bool:
        if self.memory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
            return int((self.memory / "memory.failcnt").read_text()) > 0 and _max_usage_hit(self.memory)
        return False

    def pids_limit_hit(self) -> bool:
        if self.pids is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in (self.pids / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max" and int(value) > 0:
                    return True
        return False

    async def kill_all(self, timeout_s: float = 10.0, settle_s: float = 0.2) -> int:
        """SIGKILLs every process in the cgroups until none is left; returns how many it
        killed. Processes of a pid namespace whose init just exited are already being
        killed by the kernel: they get ``settle_s`` to go before they count as leftovers."""
        for _ in range(int(settle_s / 0.005)):
            if not self.pids_alive():
                return 0
            await asyncio.sleep(0.005)
        killed: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while True:
            alive = self.pids_alive()
            if not alive:
                return len(killed)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            if time.monotonic() > deadline:
                log.warning("processes survive SIGKILL", extra={"kv": {"cgroup": self.name, "pids": alive}})
                return len(killed)
            await asyncio.sleep(0.01)

    def remove(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()


def _max_usage_hit(memory: Path) -> bool:
    try:
        limit = int((memory / "memory.limit_in_bytes").read_text())
        peak = int((memory / "memory.max_usage_in_bytes").read_text())
    except (OSError, ValueError):
        return False
    return peak >= limit * 0.98


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


class BoundedOutput:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts the rest,
    so a harness that floods its output costs bounded memory and disk."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def value(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        skipped = self.total - len(self.head) - len(self.tail)
        return bytes(self.head) + f"\n[... {skipped} bytes dropped ...]\n".encode() + bytes(self.tail)


async def drain(stream: asyncio.StreamReader, sink: BoundedOutput) -> None:
    while chunk := await stream.read(1 << 16):
        sink.feed(chunk)


def disk_usage(paths: list[Path], stop_after: int) -> int:
    """Bytes used under ``paths`` (allocated blocks), stopping once past ``stop_after``."""
    total = 0
    stack = list(paths)
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
        if total > stop_after:
            return total
    return total


async def watch_disk(paths: list[Path], limit_bytes: int, interval_s: float, on_exceeded: asyncio.Event) -> None:
    """Sets ``on_exceeded`` once the paths use more than ``limit_bytes``."""
    while not on_exceeded.is_set():
        await asyncio.sleep(interval_s)
        used = await asyncio.to_thread(disk_usage, paths, limit_bytes)
        if used > limit_bytes:
            on_exceeded.set()
