"""harnessrl.cpu: CPU-seconds by component, from the kernel's counts. A named thread and the
threads it starts (torch's OpenMP workers) count as its component; a reaped process tree's
CPU, grandchildren included, counts as the component its reaper names, and only there."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from harnessrl import cpu

# A child that starts a grandchild burning 0.3 s of CPU, and waits for it.
BURN = "import time\nwhile time.process_time() < 0.3: pass\n"
TREE = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}], check=True)"


def names() -> dict[int, str]:
    found = {}
    for task in Path("/proc/self/task").iterdir():
        text = (task / "stat").read_text()
        found[int(task.name)] = text[text.index("(") + 1 : text.rindex(")")]
    return found


def test_a_named_thread_and_its_openmp_workers_count_as_its_component() -> None:
    before = cpu.thread_seconds()["engine"]
    started, release = threading.Event(), threading.Event()
    own: list[int] = []

    def work() -> None:
        cpu.name_thread("engine")
        own.append(threading.get_native_id())
        torch.set_num_threads(2)
        a = torch.randn(256, 256)
        while time.thread_time() < 0.3:
            a = torch.tanh(a @ a)  # parallel ops: the OpenMP team starts from this thread
        started.set()
        release.wait()

    thread = threading.Thread(target=work)
    existing = set(names())
    thread.start()
    try:
        assert started.wait(120)
        new = {tid: name for tid, name in names().items() if tid not in existing}
        assert new[own[0]] == "hrl-engine"
        assert set(new.values()) == {"hrl-engine"}, new  # every thread it started took its name
        assert cpu.thread_seconds()["engine"] - before >= 0.3  # the master's own, then its workers'
        assert cpu.snapshot()["engine"] >= cpu.thread_seconds()["engine"] - 0.05
    finally:
        release.set()
        thread.join()


def test_a_reaped_tree_counts_as_harness_and_not_as_sandbox() -> None:
    before = cpu.snapshot()
    proc = subprocess.Popen([sys.executable, "-c", TREE])
    code, seconds = cpu.reap(proc.pid, "harness")
    proc.returncode = code
    after = cpu.snapshot()
    assert code == 0 and seconds >= 0.3  # the grandchild's CPU is in its parent's rusage
    assert after["harness"] - before["harness"] == pytest.approx(seconds)
    assert after["sandbox"] - before["sandbox"] < 0.3  # the tree is not counted twice


def test_other_children_count_as_sandbox() -> None:
    before = cpu.snapshot()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    after = cpu.snapshot()
    assert after["sandbox"] - before["sandbox"] >= 0.3
    assert after["harness"] == before["harness"]


def test_exit_codes_as_subprocess_gives_them() -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 3"])
    assert cpu.reap(proc.pid, "sandbox")[0] == 3
    proc = subprocess.Popen(["sh", "-c", "kill -9 $$"])
    assert cpu.reap(proc.pid, "sandbox")[0] == -9
    proc.returncode = -9


def test_meter_laps_are_non_negative_and_name_every_component() -> None:
    meter = cpu.Meter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    lap = meter.lap()
    assert set(lap) == set(cpu.COMPONENTS) and all(v >= 0 for v in lap.values())
    assert lap["sandbox"] > 0 and lap["services"] >= 0
    second = meter.lap()
    assert meter.total == {c: pytest.approx(lap[c] + second[c]) for c in cpu.COMPONENTS}


def test_unknown_components_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="component 'proxy': a thread is one of engine, trainer"):
        cpu.name_thread("proxy")
    with pytest.raises(ValueError, match="component 'engine': a process tree is harness or sandbox"):
        cpu.reap(os.getpid(), "engine")
