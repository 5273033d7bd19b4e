"""Nothing left running: the processes a test session started and did not stop.

Every process the session starts inherits ``SESSION_ENV`` (set in the session's
own environment at import), and so do their children, unless a spawn clears the
environment. A process still alive at the session's end that carries this
session's mark, or descends from one that does, was started by the session and
not stopped: the session fails and names it. Container processes do not inherit
the engine's environment, but they descend from its ``containerd-shim``, which
does. Other sessions on the same machine carry other marks and are never touched.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

SESSION_ENV = "HRL_TEST_SESSION"
_MARK = uuid.uuid4().hex
_STARTED = time.time()
# Children of the test process that live exactly as long as it does.
_OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def mark_session() -> None:
    os.environ[SESSION_ENV] = _MARK


def _marked(proc: psutil.Process) -> bool:
    try:
        return proc.environ().get(SESSION_ENV) == _MARK
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _own_helper(proc: psutil.Process, me: int) -> bool:
    try:
        return proc.ppid() == me and any(h in " ".join(proc.cmdline()) for h in _OWN_HELPERS)
    except psutil.Error:
        return False


def find() -> list[psutil.Process]:
    """The live processes this session started (marked, or under a marked one)."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["create_time", "status"]):
        if proc.pid == me or proc.info["create_time"] < _STARTED - 1:
            continue
        if proc.info["status"] == psutil.STATUS_ZOMBIE or not _marked(proc) or _own_helper(proc, me):
            continue
        try:
            found.update({p.pid: p for p in (proc, *proc.children(recursive=True))})
        except psutil.NoSuchProcess:
            continue
    return [p for p in found.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def settle(grace_s: float = 10.0) -> list[str]:
    """Waits up to ``grace_s`` for the session's processes to end, then kills what is
    left (the next session must not inherit it) and describes each one."""
    deadline = time.monotonic() + grace_s
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = find()
    described = []
    for proc in left:
        try:
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            continue
    return described
