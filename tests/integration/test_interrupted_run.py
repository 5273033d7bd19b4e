"""An interrupted test run stops every server its fixtures started: a real pytest run
(with a pytest-xdist worker, as scripts/test runs) of a module that holds Redis, the
S3 server and a private Docker engine is interrupted once they are up, and no
process that run started may be left, checked by PID.

How each interruption is met: SIGINT (Ctrl-C) and SIGTERM (tests/conftest.py turns
it into Ctrl-C) make pytest tear its fixtures down, so each server is stopped by its
PID; a worker killed outright runs no teardown, and its servers die with it
(``die_with_parent`` in harnessrl/localservers.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from harnessrl.rpc import RECORD_ENV

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/interrupted/servers_until_interrupted.py"
PROBE = "HRL_INTERRUPT_PROBE"


def _carrying(probe: str) -> list[psutil.Process]:
    """Every live process started under the inner run whose environment carries ``probe``
    (redis-server writes its title over its environment: it is found in the tree)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(PROBE) == probe and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _started(run: subprocess.Popen[bytes], probe: str) -> list[psutil.Process]:
    """The inner run's process tree and whatever carries its probe (a daemon that left the tree)."""
    tree = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
    return list({p.pid: p for p in [*tree, *_carrying(probe)]}.values())


def _wait_ready(run: subprocess.Popen[bytes], ready: Path, log: Path) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while not ready.exists():
        if run.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the inner run never had its servers up:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return json.loads(ready.read_text())  # type: ignore[no-any-return]


def _interrupt(how: str, run: subprocess.Popen[bytes], worker: int) -> None:
    if how == "ctrl-c":  # a terminal sends SIGINT to its whole foreground process group
        os.killpg(run.pid, signal.SIGINT)
    elif how == "sigterm-controller":  # `kill PID`, a CI timeout
        run.send_signal(signal.SIGTERM)
    elif how == "sigterm-worker":
        os.kill(worker, signal.SIGTERM)
    else:  # sigkill-worker: the worker runs nothing more; the controller then ends the run
        os.kill(worker, signal.SIGKILL)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm-controller", "sigterm-worker", "sigkill-worker"])
def test_an_interrupted_run_leaves_no_process_running(tmp_path: Path, how: str) -> None:
    probe, ready, log = uuid.uuid4().hex, tmp_path / "ready.json", tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != RECORD_ENV}
    env |= {PROBE: probe, "HRL_INTERRUPT_READY": str(ready), "HARNESSRL_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "pytest", TARGET, "-p", "no:cacheprovider", "-q", "-n", "1"]
    argv += ["--max-worker-restart=0", f"--basetemp={tmp_path / 'inner'}"]
    with log.open("wb") as out:
        run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started: list[psutil.Process] = []
    try:
        info = _wait_ready(run, ready, log)
        started = _started(run, probe)
        servers: dict[str, int] = info["servers"]  # type: ignore[assignment]
        assert set(servers) == {"redis", "s3", "dockerd"}
        assert set(servers.values()) | {run.pid, info["worker"]} <= {p.pid for p in started}
        _interrupt(how, run, info["worker"])  # type: ignore[arg-type]
        run.wait(90)
        _, alive = psutil.wait_procs(started, timeout=30)
        left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running()]
        assert not left, f"left running after {how}: {left}\n{log.read_text()[-3000:]}"
        assert not _carrying(probe), log.read_text()[-3000:]
    finally:
        for proc in [*started, *_carrying(probe)]:
            try:
                proc.kill()
            except psutil.Error:
                continue
        if run.poll() is None:
            run.kill()
            run.wait()
