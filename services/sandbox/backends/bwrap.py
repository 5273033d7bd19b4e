"""Builds and runs one bubblewrap invocation: the host system read-only, the
given directories bound in, sensitive host files hidden, a fresh /tmp, all
namespaces unshared, a non-root uid with no capabilities.

The sandbox's ``/`` is bubblewrap's own tmpfs (what is written there outside
the mounts vanishes with the exec) unless ``root`` names a host directory:
the Dockerfile replay binds a capture directory there so that it can see, and
keep or refuse, whatever a RUN step wrote outside the layer's roots.

With ``host_uid`` set and a root worker, the sandbox also drops to that
unprivileged host uid (``setpriv``), so an escape would land on a uid that owns
nothing; every mounted path must then be traversable by it (bubblewrap 0.8
resolves bind sources as the calling user). The chain is::

    sh (joins the exec's cgroups) -> prlimit -> setpriv -> bwrap -> command
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.sandbox.backends import spawn
from services.sandbox.backends.limits import BoundedOutput, drain
from services.sandbox.common.settings import LocalBackendSettings

SANDBOX_UID = 1000
SANDBOX_USER = "agent"
# Plain directories ``build`` creates in the sandbox's / (not mounts: what is written in them stays in /).
MADE_DIRS = ("/run",)
# pid 1 of an exec's pid namespace, in place of bubblewrap's own init: it runs the command
# (pid 2, as under bubblewrap's init), reaps what is orphaned while it waits, and exits with
# the command's status; the kernel then kills what is left. Bubblewrap's outer process
# returns without reaping its own init, so the CPU of the sandbox's processes never
# reached the worker; this pid 1 is reaped by it, and with it the whole tree's CPU
# (harnessrl.cpu). Its own messages ("Killed") go to /dev/null, the command's stderr not.
INIT = ["/bin/sh", "-c", 'exec 3>&2 2>/dev/null; ("$@" 2>&3 3>&-); exit $?', "sh"]


@dataclass(frozen=True)
class Mount:
    src: Path
    dest: str
    writable: bool = False


@dataclass
class Invocation:
    argv: list[str]
    pass_fds: list[int] = field(default_factory=list)

    def close_fds(self) -> None:
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pass_fds = []


@dataclass
class RunOutcome:
    exit_code: int
    timed_out: bool
    output: BoundedOutput
    duration_s: float
    cancelled_by: str = ""
    cpu_s: float = 0.0  # user + system of the process tree (wait4's rusage)


def host_uid(settings: LocalBackendSettings) -> int | None:
    """The unprivileged host uid to drop to before bwrap (root workers with ``host_uid`` set), else None:
    the sandbox's uid 1000 then maps to the worker's own uid, still with no capabilities."""
    return settings.host_uid if os.geteuid() == 0 and settings.host_uid is not None else None


def build(
    settings: LocalBackendSettings,
    *,
    argv: list[str],
    mounts: list[Mount],
    env: dict[str, str],
    cwd: str,
    uid_inside: int = SANDBOX_UID,
    share_net: bool = False,
    unshare_pid: bool = True,
    tmp_size_mb: int = 512,
    cgroup_procs: list[str] | None = None,
    rlimits: dict[str, int] | None = None,
    root: Path | None = None,
    tmp_dir: Path | None = None,
) -> Invocation:
    """The argv (and file descriptors to pass) for one sandboxed command. ``root``: a host
    directory bound writable as ``/`` under every other mount (else a tmpfs); ``tmp_dir``: a
    host directory bound as ``/tmp`` (else a fresh tmpfs of ``tmp_size_mb``)."""
    inv = Invocation(argv=[])
    prefix: list[str] = []
    if cgroup_procs:
        joins = " ".join(f"echo $$ > {shlex.quote(p)};" for p in cgroup_procs)
        prefix += ["/bin/sh", "-c", f'{joins} exec "$@"', "sh"]
    limits = {"core": 0, **(rlimits or {})}
    prefix += ["prlimit", *(f"--{name}={value}" for name, value in sorted(limits.items())), "--"]
    uid = host_uid(settings)
    if uid is not None:
        prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    args = [settings.bwrap, "--unshare-user", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if unshare_pid:
        args += ["--unshare-pid", "--as-pid-1"]
    if not share_net:
        args.append("--unshare-net")
    args += ["--uid", str(uid_inside), "--gid", str(uid_inside), "--cap-drop", "ALL"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    if root is not None:
        args += ["--bind", str(root), "/"]  # first: every later mount lands on top of it
    args += _system_mounts(settings)
    args += ["--dev", "/dev", "--proc", "/proc"]
    if tmp_dir is not None:
        args += ["--bind", str(tmp_dir), "/tmp"]
    else:
        args += ["--size", str(tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    for made in MADE_DIRS:
        args += ["--dir", made]
    for hidden in settings.hidden_paths:
        if os.path.isdir(hidden):
            args += ["--tmpfs", hidden]
        elif os.path.lexists(hidden):
            args += ["--ro-bind", "/dev/null", hidden]
    for mount in mounts:
        args += ["--bind" if mount.writable else "--ro-bind", str(mount.src), mount.dest]
    args += ["--chdir", cwd, "--", *(INIT if unshare_pid else []), *argv]
    inv.argv = prefix + args
    return inv


def mount_points(settings: LocalBackendSettings, mounts: list[Mount]) -> set[str]:
    """Every path ``build`` mounts something on (system paths and their symlinks, /dev, /proc,
    /tmp, hidden files, ``mounts``): under a ``root`` these are bubblewrap's mount points, the
    rest of what is left in it, but for ``MADE_DIRS`` themselves, was written by the command."""
    points = {"/dev", "/proc", "/tmp", *(m.dest for m in mounts)}
    points.update(p for p in (*settings.system_paths, *settings.extra_ro_paths) if os.path.lexists(p))
    points.update(p for p in settings.hidden_paths if os.path.lexists(p))
    return points


def _system_mounts(settings: LocalBackendSettings) -> list[str]:
    args: list[str] = []
    for raw in (*settings.system_paths, *settings.extra_ro_paths):
        path = Path(raw)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), raw]
        elif path.exists():
            args += ["--ro-bind", raw, raw]
    return args


async def run(
    inv: Invocation,
    *,
    timeout_s: float,
    output_limit: int,
    stdin: bytes | None = None,
    stop: list[asyncio.Event] | None = None,
    component: str = "sandbox",
) -> RunOutcome:
    """Runs the invocation, capturing bounded stdout+stderr, killing it on timeout
    or when one of ``stop`` is set (or the caller is cancelled). Returns once the
    main process has exited and is reaped; its process tree's CPU-seconds count
    toward ``component`` (``harnessrl.cpu``: harness or sandbox)."""
    started = time.monotonic()
    sink = BoundedOutput(output_limit)
    try:
        child = await spawn.start(inv.argv, stdin=stdin, pass_fds=inv.pass_fds, component=component)
    finally:
        inv.close_fds()
    reader = asyncio.ensure_future(drain(child.stdout, sink))
    stoppers = [asyncio.ensure_future(event.wait()) for event in stop or []]
    waited: set[asyncio.Future[Any]] = {child.exited, *stoppers}
    try:
        done, _ = await asyncio.wait(waited, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        _kill_group(child.pid)
        child.close()
        raise
    finally:
        for stopper in stoppers:
            stopper.cancel()
    timed_out = not done
    cancelled_by = "stop" if done and child.exited not in done else ""
    if child.exited not in done:
        _kill_group(child.pid)
    code, cpu_s = await child.exited
    try:
        await asyncio.wait_for(reader, timeout=5)
    except TimeoutError:
        reader.cancel()  # a leftover holds the pipe open; the caller kills it
    child.close()
    return RunOutcome(code, timed_out, sink, time.monotonic() - started, cancelled_by, cpu_s)


def _kill_group(pid: int) -> None:
    """Kills the wrapper's process group; bwrap's --die-with-parent takes the sandbox with it."""
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
