"""``CpuReading``: a process's CPU read exactly from its threads' schedstat, not in
/proc/PID/stat's 10-ms ticks; a thread that exits between two readings makes the
difference fall back to the ticks (its last slice is unknown)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from stack.bench.benchstack import CpuReading


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


CHILD = """
import sys, threading, time
def spin(seconds, out):
    clock = time.thread_time()
    end = clock + seconds
    while time.thread_time() < end:
        pass
    out.append(time.thread_time() - clock)
print("ready", flush=True)
for line in sys.stdin:
    out = []
    if line.startswith("thread "):  # in a new thread, which then blocks for good
        done = threading.Event()
        work = lambda: (spin(float(line.split()[1]), out), done.set(), threading.Event().wait())
        threading.Thread(target=work, daemon=True).start()
        done.wait()
    else:
        spin(float(line), out)
    print(out[0], flush=True)
"""


def spent_in_child(child: subprocess.Popen[str], command: str) -> tuple[float, float]:
    """(what CpuReading saw, what the child's thread clock saw) for one command."""
    assert child.stdin is not None and child.stdout is not None
    before = CpuReading.of(child.pid)
    child.stdin.write(f"{command}\n")
    child.stdin.flush()
    spent = float(child.stdout.readline())
    return CpuReading.of(child.pid).since(before), spent


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # started: what follows is the spin alone
    yield proc
    proc.kill()
    proc.wait()


def test_a_reading_of_another_process_agrees_with_its_thread_clock_to_the_millisecond(child) -> None:
    # As in a bench: another process, read while it is blocked (a running thread's
    # count is brought up to date only at its next scheduler event).
    for burn in ("0.003", "0.027"):  # under a tick, and not a whole number of them
        seen, spent = spent_in_child(child, burn)
        assert abs(seen - spent) < 0.002, (seen, spent)


def test_a_thread_started_between_readings_counts_in_full(child) -> None:
    seen, spent = spent_in_child(child, "thread 0.017")
    assert abs(seen - spent) < 0.002, (seen, spent)


def test_a_thread_that_exits_between_readings_falls_back_to_the_ticks() -> None:
    release = threading.Event()

    def work() -> None:
        release.wait()
        spin(0.05)

    worker = threading.Thread(target=work)
    worker.start()
    before = CpuReading.of(os.getpid())
    release.set()
    worker.join()
    gone = time.monotonic() + 5
    while os.path.exists(f"/proc/self/task/{worker.native_id}") and time.monotonic() < gone:
        time.sleep(0.01)  # join returns just before the OS thread is gone
    after = CpuReading.of(os.getpid())
    assert before.threads_ns is not None and after.threads_ns is not None
    assert worker.native_id in before.threads_ns and worker.native_id not in after.threads_ns
    assert after.since(before) == after.ticks_s - before.ticks_s
    assert after.since(before) >= 0.03  # the exited thread's spin is in the ticks


def test_a_reading_in_ticks_only_gives_the_ticks(child) -> None:
    before = CpuReading.ticks(child.pid, tree=True)  # vLLM's tree: totals only
    spent_in_child(child, "0.03")
    after = CpuReading.ticks(child.pid, tree=True)
    assert after.threads_ns is None and after.since(before) == after.ticks_s - before.ticks_s >= 0.02
