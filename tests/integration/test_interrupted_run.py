"""An interrupted test run stops every server its fixtures started: a real pytest run
(with a pytest-xdist worker, as scripts/test runs) of a module that holds Redis, the
S3 server and a private Docker engine is interrupted once they are up, and no
process that run started may be left, checked by PID.

How each interruption is met: SIGINT (Ctrl-C) and SIGTERM (tests/conftest.py turns
it into Ctrl-C) make pytest tear its fixtures down, so each server is stopped by its
PID; a worker killed outright runs no teardown, and its servers die with it
(``die_with_parent`` in harnessrl/localservers.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

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


def _interrupted_run(tmp_path: Path, how: str) -> list[str]:
    """Starts the inner run, interrupts it ``how`` once its servers are up, and returns
    what it started that is still running once it is over (killed here after)."""
    tmp_path.mkdir()
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
        left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in [*alive, *_carrying(probe)] if p.is_running()]
        return [*left, log.read_text()[-2000:]] if left else []
    finally:
        for proc in [*started, *_carrying(probe)]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if run.poll() is None:
            run.kill()
            run.wait()


HOW = ("ctrl-c", "sigterm-controller", "sigterm-worker", "sigkill-worker")


def test_an_interrupted_run_leaves_no_process_running(tmp_path: Path) -> None:
    """Each way at once, in runs of their own (most of each is waiting on servers)."""
    with ThreadPoolExecutor(len(HOW)) as pool:
        left = dict(zip(HOW, pool.map(lambda how: _interrupted_run(tmp_path / how, how), HOW), strict=True))
    assert not any(left.values()), left
