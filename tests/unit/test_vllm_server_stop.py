"""``VllmServer.stop`` ends the server's whole process group, also when the API server
has already exited and left a child behind (vLLM's engine core is one): the session's
shared server must leave nothing running (tests/leftovers.py). A shell stands in for
the server: it leaves a ``sleep`` in its group and exits."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import psutil

from stack.bench.vllm_server import VllmServer


def _gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_stop_ends_what_the_exited_server_left_in_its_group(tmp_path: Path) -> None:
    server = VllmServer.__new__(VllmServer)  # no vLLM: the process is the stand-in below
    server.log = (tmp_path / "server.log").open("wb")
    shell = "sleep 300 >/dev/null 2>&1 & echo $!"
    server.proc = subprocess.Popen(["sh", "-c", shell], stdout=subprocess.PIPE, start_new_session=True)
    assert server.proc.stdout is not None
    child = int(server.proc.stdout.readline())
    server.proc.stdout.close()
    server.proc.wait(10)
    try:
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
        server.stop()
        assert _gone(child), f"pid {child} of the server's group is still alive after stop()"
        assert server.log.closed
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(child).kill()  # what a failed stop() left


def test_stop_of_a_server_that_left_nothing_is_quiet(tmp_path: Path) -> None:
    server = VllmServer.__new__(VllmServer)
    server.log = (tmp_path / "server.log").open("wb")
    server.proc = subprocess.Popen(["true"], start_new_session=True)
    server.proc.wait(10)
    server.stop()  # its group is empty: nothing to kill, no error
    assert server.log.closed
