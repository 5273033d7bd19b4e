"""CPU-seconds by component, measured in this process (issue 48: where a step's CPU goes).

Every figure is the kernel's own count of user + system time; nothing is estimated:

- **engine**, **trainer**: the threads that run the model's forward passes and the
  optimizer name themselves (``name_thread``). Linux copies a thread's name to the
  threads it creates, so torch's OpenMP workers, which each master thread starts on its
  first parallel op, carry the same name and count with it. Read per thread from
  /proc/self/task/*/schedstat (the scheduler's nanoseconds on CPU).
- **harness**: the process trees of the sandbox's agent phases, from ``wait4``'s rusage
  when each exec's process is reaped (its own CPU and that of every descendant reaped
  inside it: the sandbox's pid 1 reaps them all, services/sandbox/backends/bwrap.py
  ``INIT``). Recorded by ``reap``; counted when the exec ends. It includes what wraps
  the harness in the sandbox (bubblewrap, its pid 1, the proxy forwarder).
- **sandbox**: every other child process of this process (the sandbox's setup copies,
  verifiers, layer builds, healthchecks): ``RUSAGE_CHILDREN`` less the harness.
- **services**: the rest of this process: the event loop, which serves the proxy, the
  capture store, the gateway's front and the sandbox worker, and gRPC's and helper
  threads (process total less the named threads).

What it misses: CPU of a named thread that has exited (it moves to ``services``: the
named threads live as long as the run); processes that outlive their exec without being
reaped by it (only with the sandbox's ``kill_agent_processes`` off); and whatever runs
in another process or container (a distributed service, a Docker or Kubernetes
sandbox: those execs are not this process's children, so ``harness`` stays 0 there).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import threading
from pathlib import Path

COMPONENTS = ("engine", "trainer", "harness", "sandbox", "services")
THREAD_COMPONENTS = ("engine", "trainer")
PREFIX = "hrl-"
_PR_SET_NAME = 15
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_TASKS = Path("/proc/self/task")

_lock = threading.Lock()
_reaped: dict[str, float] = {}


def name_thread(component: str) -> None:
    """Names the calling OS thread after ``component`` (engine or trainer); threads it starts
    later (torch's OpenMP workers) inherit the name. Call it before the thread's first torch op."""
    if component not in THREAD_COMPONENTS:
        raise ValueError(f"component {component!r}: a thread is one of {', '.join(THREAD_COMPONENTS)}")
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the thread stays unnamed
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, (PREFIX + component).encode(), 0, 0, 0)


def reap(pid: int, component: str) -> tuple[int, float]:
    """Waits for child ``pid`` to exit, reaps it and adds its process tree's CPU-seconds to
    ``component`` (harness or sandbox); returns (exit code as ``subprocess`` gives it, seconds).
    Blocking: call it from a thread. The reap and the record happen under one lock that
    ``snapshot`` takes too, so no snapshot sees one without the other."""
    if component not in ("harness", "sandbox"):
        raise ValueError(f"component {component!r}: a process tree is harness or sandbox")
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    with _lock:
        _, status, usage = os.wait4(pid, 0)
        seconds = usage.ru_utime + usage.ru_stime
        _reaped[component] = _reaped.get(component, 0.0) + seconds
    return os.waitstatus_to_exitcode(status), seconds


def thread_seconds() -> dict[str, float]:
    """CPU-seconds of this process's live threads, by the component their name says: the
    scheduler's nanoseconds on CPU (schedstat), or the clock ticks of stat without it."""
    found = dict.fromkeys(THREAD_COMPONENTS, 0.0)
    for task in _TASKS.iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            comm = (task / "comm").read_text().rstrip("\n")
            if not (comm.startswith(PREFIX) and comm[len(PREFIX) :] in found):
                continue
            found[comm[len(PREFIX) :]] += _seconds(task)
    return found


def _seconds(task: Path) -> float:
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        text = (task / "stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def snapshot() -> dict[str, float]:
    """This process's CPU-seconds so far, by component (cumulative; see the module docstring)."""
    with _lock:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        harness = _reaped.get("harness", 0.0)
    own = resource.getrusage(resource.RUSAGE_SELF)
    threads = thread_seconds()
    total = own.ru_utime + own.ru_stime
    return {
        **threads,
        "harness": harness,
        "sandbox": max(0.0, children.ru_utime + children.ru_stime - harness),
        # The threads and the process total are read one after the other: never below 0.
        "services": max(0.0, total - sum(threads.values())),
    }


class Meter:
    """CPU-seconds by component between one ``lap`` and the next (a step's window), and
    their sum since the meter was made (``total``: laps taken while the threads lived)."""

    def __init__(self) -> None:
        self.last = snapshot()
        self.total = dict.fromkeys(COMPONENTS, 0.0)

    def lap(self) -> dict[str, float]:
        now = snapshot()
        # A component's count never goes down, but for a named thread that exited: clamp.
        spent = {c: round(max(0.0, now[c] - self.last[c]), 3) for c in COMPONENTS}
        self.last = now
        for c, seconds in spent.items():
            self.total[c] += seconds
        return spent
