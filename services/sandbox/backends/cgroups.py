"""The cgroups of the local backend's execs, on cgroup v1 or v2, whichever the
host has: memory, pids and cpu limits, the OOM-kill and pids-limit counters,
and the list of an exec's processes (to kill its leftovers).

v1 (one hierarchy per controller; the development machines run v1, with the
memory and pids controllers writable): each exec gets a directory per
controller under the worker's own cgroup of that controller.

v2 (the unified hierarchy; most current distributions, systemd or not): the
worker's own cgroup (``0::/path`` in /proc/self/cgroup) is the parent. v2 lets
a cgroup hand controllers to its children only while it holds no process
itself, so when enabling them is refused (EBUSY) every process of that cgroup,
the worker included, first moves into the leaf ``<own>/harnessrl-worker``;
execs get ``<own>/harnessrl/<name>``. A worker that finds itself in such a leaf
uses its parent, so several workers sharing one cgroup agree.

A hybrid host (v1 controllers plus a controller-less cgroup2 mount for
systemd, as here) is treated as v1. ``root`` is where the hierarchy is mounted:
the cgroup2 mount itself, or the directory holding the v1 controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
LIMITS = ("memory", "pids", "cpu")
WORKER_LEAF = "harnessrl-worker"
GROUP_DIR = "harnessrl"
CPU_PERIOD_US = 100_000


def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """Parses /proc/<pid>/cgroup: (v1 controller -> cgroup path, the v2 path or None)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            v2 = path
        for controller in filter(None, controllers.split(",")):
            v1[controller] = path
    return v1, v2


def read_keyed(path: Path) -> dict[str, int]:
    """A flat keyed file (memory.events, pids.events, memory.oom_control); {} when unreadable."""
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


def under(root: Path, cgroup_path: str) -> Path:
    return root / cgroup_path.lstrip("/")


def _write(path: Path, text: str) -> None:
    """One write(2), so the kernel's errno (EBUSY, ESRCH) reaches the caller as is."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def enable_controllers(cgroup: Path, wanted: Iterable[str]) -> frozenset[str]:
    """Enables ``wanted`` controllers for the children of ``cgroup`` (v2), first moving its
    processes into the leaf ``WORKER_LEAF``: v2 lets a cgroup hand controllers to its
    children only while it holds no process. (Not only when refused: cpu and pids are
    threaded controllers, which a cgroup with processes accepts, and that makes it a
    thread root, where memory is then refused with EOPNOTSUPP, not EBUSY.)
    Returns those of ``wanted`` that are enabled; a controller the parent did not
    delegate is left out, not an error (the caller reports it)."""
    wanted = set(wanted)
    for _ in range(3):  # processes may appear while others move: move them too
        missing = sorted(wanted - _words(cgroup / "cgroup.subtree_control"))
        if not missing:
            break
        if _words(cgroup / "cgroup.procs"):
            moved = move_processes(cgroup, cgroup / WORKER_LEAF)
            log.info("moved processes into a leaf cgroup", extra={"kv": {"cgroup": str(cgroup), "moved": moved}})
        busy = False
        for controller in missing:
            try:
                _write(cgroup / "cgroup.subtree_control", f"+{controller}")
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.EOPNOTSUPP):
                    kv = {"cgroup": str(cgroup), "controller": controller, "error": str(e)}
                    log.warning("cannot enable cgroup controller", extra={"kv": kv})
                busy = busy or e.errno in (errno.EBUSY, errno.EOPNOTSUPP)
        if not busy:
            break
    return frozenset(wanted & _words(cgroup / "cgroup.subtree_control"))


def move_processes(src: Path, dst: Path) -> int:
    """Moves every process of cgroup ``src`` into ``dst`` (made if absent); returns how many."""
    dst.mkdir(exist_ok=True)
    moved = 0
    for pid in _words(src / "cgroup.procs"):
        try:
            _write(dst / "cgroup.procs", pid)
            moved += 1
        except OSError as e:
            if e.errno != errno.ESRCH:  # ESRCH: it exited meanwhile
                raise
    return moved


@dataclass
class CgroupSupport:
    """Where this worker's exec cgroups go, and which limits they enforce."""

    memory: Path | None = None  # v1: the worker's own cgroup of each controller, when writable
    pids: Path | None = None
    cpu: Path | None = None
    root: Path = CGROUP_ROOT
    unified: Path | None = None  # v2: the directory the exec groups are made in
    v2_controllers: frozenset[str] = frozenset()
    driver: str = ""
    unenforced: dict[str, str] = field(default_factory=dict)  # limit -> why not

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> CgroupSupport:
        try:
            v1_paths, v2_path = parse_proc_cgroup(proc_cgroup.read_text())
        except OSError:
            v1_paths, v2_path = {}, None
        if (root / "cgroup.controllers").exists():
            return cls._detect_v2(root, v2_path)
        support = cls(root=root)
        for controller in LIMITS:
            base = root / controller
            own = under(base, v1_paths.get(controller, "/"))
            if not (base / "cgroup.procs").exists():
                support.unenforced[controller] = f"no cgroup v1 {controller} hierarchy at {base}"
            elif not os.access(own, os.W_OK):
                support.unenforced[controller] = f"{own} is not writable by uid {os.geteuid()}"
            else:
                setattr(support, controller, own)
        return support

    @classmethod
    def _detect_v2(cls, root: Path, own_path: str | None) -> CgroupSupport:
        support = cls(root=root)
        own = under(root, own_path) if own_path is not None else None
        if own is not None and own.name == WORKER_LEAF:
            own = own.parent
        if own is None or not all(os.access(p, os.W_OK) for p in (own, own / "cgroup.procs")):
            why = f"the worker's cgroup v2 {own or '(none in /proc/self/cgroup)'} is not writable by uid {os.geteuid()}"
            support.unenforced = dict.fromkeys(LIMITS, why + " (under systemd: Delegate=yes)")
            return support
        support.driver = "systemd" if any(p.endswith((".slice", ".scope", ".service")) for p in own.parts) else ""
        delegated = _words(own / "cgroup.controllers")
        enabled = enable_controllers(own, delegated & set(LIMITS))
        try:
            _mkdir(own / GROUP_DIR)
        except OSError as e:
            support.unenforced = dict.fromkeys(LIMITS, f"cannot make {own / GROUP_DIR}: {e}")
            return support
        support.unified = own / GROUP_DIR
        support.v2_controllers = enable_controllers(support.unified, enabled)
        for controller in LIMITS:
            if controller not in delegated:
                support.unenforced[controller] = f"controller {controller} is not in {own}/cgroup.controllers"
            elif controller not in support.v2_controllers:
                support.unenforced[controller] = f"controller {controller} could not be enabled under {own}"
        return support

    @property
    def version(self) -> str:
        return "v2" if (self.root / "cgroup.controllers").exists() else "v1"

    def enforces(self, limit: str) -> bool:
        return limit not in self.unenforced

    def describe(self) -> str:
        """How each limit is enforced here, e.g. for the backend's capabilities and its errors."""
        where = f"cgroup {self.version} at {self.root}" + (f" ({self.driver})" if self.driver else "")
        if self.unified is not None:
            where += f", exec groups under {self.unified}"
        parts = [f"{limit}: {getattr(self, limit) or 'enforced'}" for limit in LIMITS if self.enforces(limit)]
        parts += [f"{limit}: not enforced ({why})" for limit, why in self.unenforced.items()]
        return f"{where}; " + "; ".join(parts)


@dataclass
class PhaseCgroup:
    """The cgroups of one exec: one per v1 controller, or one v2 group (any may be absent)."""

    name: str
    memory: Path | None = None
    pids: Path | None = None
    cpu: Path | None = None
    unified: Path | None = None
    paths: list[Path] = field(default_factory=list)

    @classmethod
    def create(
        cls, support: CgroupSupport, name: str, memory_mb: int, pids: int, cpus: float | None = None
    ) -> PhaseCgroup:
        group = cls(name=name)
        limit = str(memory_mb * 1024 * 1024)
        if support.memory is not None:
            group.memory = _mkdir(support.memory / GROUP_DIR / name)
            (group.memory / "memory.limit_in_bytes").write_text(limit)
            memsw = group.memory / "memory.memsw.limit_in_bytes"
            with contextlib.suppress(OSError):
                if memsw.exists():
                    memsw.write_text(limit)
        if support.pids is not None:
            group.pids = _mkdir(support.pids / GROUP_DIR / name)
            (group.pids / "pids.max").write_text(str(pids))
        if support.cpu is not None and cpus:
            group.cpu = _mkdir(support.cpu / GROUP_DIR / name)
            (group.cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group.cpu / "cpu.cfs_quota_us").write_text(str(_quota(cpus)))
        if support.unified is not None:
            group.unified = _mkdir(support.unified / name)
            group._limit_v2(support.v2_controllers, limit, pids, cpus)
        group.paths = [p for p in (group.memory, group.pids, group.cpu, group.unified) if p is not None]
        return group

    def _limit_v2(self, controllers: frozenset[str], memory: str, pids: int, cpus: float | None) -> None:
        assert self.unified is not None
        if "memory" in controllers:
            (self.unified / "memory.max").write_text(memory)
            # Like v1's memsw limit: no swap on top (the file is absent without swap accounting).
            with contextlib.suppress(OSError):
                (self.unified / "memory.swap.max").write_text("0")
        if "pids" in controllers:
            (self.unified / "pids.max").write_text(str(pids))
        if "cpu" in controllers and cpus:
            (self.unified / "cpu.max").write_text(f"{_quota(cpus)} {CPU_PERIOD_US}")

    @classmethod
    def existing(cls, support: CgroupSupport, prefix: str) -> list[PhaseCgroup]:
        """Cgroups this service created whose name starts with ``prefix``."""
        by_name: dict[str, PhaseCgroup] = {}
        roots = {c: getattr(support, c) / GROUP_DIR for c in LIMITS if getattr(support, c) is not None}
        if support.unified is not None:
            roots["unified"] = support.unified
        for attr, root in roots.items():
            if not root.is_dir():
                continue
            for path in root.iterdir():
                if path.is_dir() and path.name.startswith(prefix):
                    group = by_name.setdefault(path.name, cls(name=path.name))
                    setattr(group, attr, path)
                    group.paths.append(path)
        return list(by_name.values())

    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.paths]

    def pids_alive(self) -> list[int]:
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in (path / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_killed(self) -> bool:
        if self.unified is not None:
            events = read_keyed(self.unified / "memory.events")
            if events.get("oom_kill", 0) > 0 or events.get("oom", 0) > 0:
                return True
        if self.memory is None:
            return False
        if read_keyed(self.memory / "memory.oom_control").get("oom_kill", 0) > 0:
            return True
        with contextlib.suppress(OSError, ValueError):
            return int((self.memory / "memory.failcnt").read_text()) > 0 and _max_usage_hit(self.memory)
        return False

    def pids_limit_hit(self) -> bool:
        return any(
            read_keyed(path / "pids.events").get("max", 0) > 0 for path in (self.pids, self.unified) if path is not None
        )

    async def kill_all(self, timeout_s: float = 10.0, settle_s: float = 0.2) -> int:
        """SIGKILLs every process in the cgroups until none is left; returns how many it
        killed. Processes of a pid namespace whose init just exited are already being
        killed by the kernel: they get ``settle_s`` to go before they count as leftovers.
        A v2 group is killed at once through cgroup.kill (kernel 5.14+) where it has one;
        the SIGKILL loop then only waits (and covers older kernels and v1)."""
        for _ in range(int(settle_s / 0.005)):
            if not self.pids_alive():
                return 0
            await asyncio.sleep(0.005)
        killed: set[int] = set()
        deadline = time.monotonic() + timeout_s
        if self.unified is not None and (alive := self.pids_alive()):
            with contextlib.suppress(OSError):
                _write(self.unified / "cgroup.kill", "1")
                killed.update(alive)
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


def _quota(cpus: float) -> int:
    return max(1000, int(cpus * CPU_PERIOD_US))


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


@dataclass(frozen=True)
class EventFiles:
    """Where one container's OOM kills and pids-limit hits are counted (None: not visible here)."""

    oom: Path | None = None
    oom_key: str = "oom_kill"
    pids: Path | None = None

    def read(self) -> tuple[int, int]:
        oom = read_keyed(self.oom).get(self.oom_key, 0) if self.oom is not None else 0
        pids = read_keyed(self.pids).get("max", 0) if self.pids is not None else 0
        return oom, pids


def container_event_files(root: Path, container_id: str, proc_cgroup: str | None) -> EventFiles:
    """Finds a Docker container's cgroup under ``root``: first where its init process is
    (``proc_cgroup``, the text of /proc/<State.Pid>/cgroup: right for every driver and
    version), else where the cgroupfs or systemd driver puts it."""
    v1_paths, v2_path = parse_proc_cgroup(proc_cgroup or "")
    guesses = [f"/docker/{container_id}", f"/system.slice/docker-{container_id}.scope"]
    if (root / "cgroup.controllers").exists():
        found = _first_dir(root, [v2_path, *guesses])
        return EventFiles(oom=found / "memory.events" if found else None, pids=found / "pids.events" if found else None)
    memory = _first_dir(root / "memory", [v1_paths.get("memory"), *guesses])
    pids = _first_dir(root / "pids", [v1_paths.get("pids"), *guesses])
    return EventFiles(
        oom=memory / "memory.oom_control" if memory else None, pids=pids / "pids.events" if pids else None
    )


def _first_dir(base: Path, cgroup_paths: list[str | None]) -> Path | None:
    for cgroup_path in cgroup_paths:
        # "/" would be the whole host's cgroup, not the container's.
        if cgroup_path and cgroup_path != "/" and under(base, cgroup_path).is_dir():
            return under(base, cgroup_path)
    return None
