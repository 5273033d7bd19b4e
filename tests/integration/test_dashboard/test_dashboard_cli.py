"""``harnessrl dashboard serve|export`` as a user runs them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harnessrl.localservers import free_port
from tests.integration.test_dashboard.recorder import RUN_ID


def cli(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", "dashboard", *args], capture_output=True, text=True, timeout=120, **kw
    )  # type: ignore[call-overload]


def test_refuses_a_non_loopback_address_without_a_token(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "HARNESSRL_DASHBOARD_AUTH_TOKEN"}
    proc = cli("serve", "--host", "0.0.0.0", "--port", str(port), "--runs-dir", str(tmp_path), env=env)
    assert proc.returncode == 2
    assert "auth_token" in proc.stderr and "0.0.0.0" in proc.stderr
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
    short = cli("serve", "--port", str(port), env={**env, "HARNESSRL_DASHBOARD_AUTH_TOKEN": "short"})
    assert short.returncode == 2 and "at least 8" in short.stderr


def test_serve_prints_a_login_url_and_stops_on_sigterm(runs_root: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stack.cli",
            "dashboard",
            "serve",
            "--run",
            str(runs_root / RUN_ID),
            "--port",
            str(port),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(rf"http://127\.0\.0\.1:{port}/runs/{RUN_ID}\?token=(\S+)", line)
        assert m, line
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5)
        assert denied.value.code == 401
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/runs/{RUN_ID}/summary", headers={"Authorization": f"Bearer {m.group(1)}"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert b'"engine_error":3' in resp.read()
        with pytest.raises(urllib.error.HTTPError) as other:  # --run serves that one run only
            urllib.request.urlopen(
                urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/runs/other", headers={"Authorization": f"Bearer {m.group(1)}"}
                ),
                timeout=5,
            )
        assert other.value.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_export_writes_a_static_copy_atomically(runs_root: Path, tmp_path: Path, web_dist: Path) -> None:
    out = tmp_path / "export"
    first = cli("export", RUN_ID, "--runs-dir", str(runs_root), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert "18 trajectories" in first.stdout
    html = (out / "index.html").read_text()
    assert '<script src="data/run.js"></script>' in html and 'src="assets/app.js"' in html
    run_js = (out / "data" / "run.js").read_text()
    assert run_js.startswith("window.HARNESSRL_STATIC = ") and '"engine_error":3' in run_js
    assert len(list((out / "data" / "traj").glob("t*.js"))) == 18
    again = cli("export", RUN_ID, "--runs-dir", str(runs_root), "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
    by_path = cli("export", str(runs_root / RUN_ID), "--out", str(out), "--force")
    assert by_path.returncode == 0, by_path.stderr
    missing = cli("export", "no-such-run", "--runs-dir", str(runs_root), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "no-such-run" in missing.stderr
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-written folder left
