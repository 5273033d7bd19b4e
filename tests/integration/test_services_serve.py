"""Each service starts with ``harnessrl <noun> serve``, answers its health
check, and stops gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harnessrl.localservers import free_port
from harnessrl.rpc import check_health

GRPC_SERVICES = [
    ("gateway", "harnessrl.v1.RolloutGateway"),
    ("capture", "harnessrl.v1.CaptureStore"),
    ("sandbox", "harnessrl.v1.Sandbox"),
    ("train", "harnessrl.v1.Trainer"),
]
HTTP_SERVICES = ["proxy", "dashboard"]


def start(noun: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "stack.cli", noun, "serve", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HARNESSRL_SKIP_WARMUP": "1"},
    )


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


@pytest.mark.parametrize(("noun", "service"), GRPC_SERVICES)
def test_grpc_service_serves_health_and_stops_on_sigterm(noun: str, service: str) -> None:
    port = free_port()
    proc = start(noun, port)
    try:
        status = asyncio.run(check_health(f"127.0.0.1:{port}", service, wait_s=60))
        assert status == "SERVING"
    finally:
        code = stop(proc)
    assert code == 0, proc.stdout.read().decode() if proc.stdout else ""


@pytest.mark.parametrize("noun", HTTP_SERVICES)
def test_http_service_serves_healthz_and_stops_on_sigterm(noun: str) -> None:
    port = free_port()
    proc = start(noun, port)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
    finally:
        code = stop(proc)
    assert code == 0


@pytest.mark.parametrize("noun", [n for n, _ in GRPC_SERVICES] + HTTP_SERVICES)
def test_bad_config_names_field_and_file_and_starts_nothing(noun: str, tmp_path: Path) -> None:
    section = {"capture": "capture_store", "train": "trainer"}.get(noun, noun)
    config = tmp_path / "bad.toml"
    config.write_text(f"[{section}]\nno_such_setting = 1\n")
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", noun, "serve", "-c", str(config), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert str(config) in proc.stderr and "no_such_setting" in proc.stderr
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
