"""``CpuReading``: a process's CPU read exactly from its threads' schedstat, not in
/proc/PID/stat's 10-ms ticks; a thread that exits between two readings makes the
difference fall back to the ticks (its last slice is unknown)."""

from __future__ import annotations

import os
import threading
import time

from stack.benchstack import CpuReading


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_reading_agrees_with_the_thread_clock_to_the_millisecond() -> None:
    # As in a bench, the measured threads are blocked when read (a running thread's
    # count is brought up to date only at its next scheduler event).
    go, done, spent = threading.Event(), threading.Event(), []

    def work() -> None:
        for burn in (0.003, 0.027):  # under a tick, and not a whole number of them
            go.wait()
            go.clear()
            clock = time.thread_time()
            spin(burn)
            spent.append(time.thread_time() - clock)
            done.set()

    worker = threading.Thread(target=work)
    worker.start()
    for i in range(2):
        before = CpuReading.of(os.getpid())
        go.set()
        done.wait()
        done.clear()
        after = CpuReading.of(os.getpid())
        assert abs(after.since(before) - spent[i]) < 0.002, (after.since(before), spent)
    worker.join()


def test_a_thread_started_between_readings_counts_in_full() -> None:
    before = CpuReading.of(os.getpid())
    release = threading.Event()
    worker = threading.Thread(target=lambda: (spin(0.02), release.wait()))
    worker.start()
    time.sleep(0.1)
    after = CpuReading.of(os.getpid())
    release.set()
    worker.join()
    assert 0.02 <= after.since(before) < 0.1


def test_a_thread_that_exits_between_readings_falls_back_to_the_ticks() -> None:
    release = threading.Event()
    worker = threading.Thread(target=lambda: (release.wait(), spin(0.05)))
    worker.start()
    before = CpuReading.of(os.getpid())
    release.set()
    worker.join()
    gone = time.monotonic() + 5
    while os.path.exists(f"/proc/self/task/{worker.native_id}") and time.monotonic() < gone:
        time.sleep(0.01)  # join returns just before the OS thread is gone
    after = CpuReading.of(os.getpid())
    assert worker.native_id in before.threads_ns and worker.native_id not in after.threads_ns
    assert after.since(before) == after.ticks_s - before.ticks_s
    assert after.since(before) >= 0.03  # the exited thread's spin is in the ticks
