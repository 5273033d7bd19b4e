"""``harnessrl proxy serve`` (TCP and Unix socket, config file, SIGTERM) and
``harnessrl proxy preflight`` as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harnessrl.localservers import free_port


def harnessrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stack.cli", *args], capture_output=True, text=True, timeout=120)


def test_preflight_passes_for_the_default_model_and_names_a_mismatch() -> None:
    ok = harnessrl("proxy", "preflight")
    assert ok.returncode == 0, ok.stderr
    assert "template=hermes-chatml" in ok.stdout and "parser=hermes" in ok.stdout and "sha256=" in ok.stdout
    bad = harnessrl("proxy", "preflight", "--tool-parser", "qwen3_coder")
    assert bad.returncode == 2 and "does not read the tool calls" in bad.stderr
    unknown = harnessrl("proxy", "preflight", "--tool-parser", "nope")
    assert unknown.returncode == 2 and "valid names" in unknown.stderr


def test_serve_from_config_on_tcp_and_unix_socket(tmp_path: Path) -> None:
    port, sock = free_port(), tmp_path / "proxy.sock"
    config = tmp_path / "proxy.toml"
    config.write_text(f'[proxy]\nport = {port}\nadmin_token = "adm"\nuds_path = "{sock}"\ntool_parser = "hermes"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "proxy", "serve", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stdout.read().decode() if proc.stdout else ""
            )
            time.sleep(0.2)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as c:
            r = c.post(
                "http://proxy/admin/trials",
                json={"trial_id": "t1", "run_id": "r"},
                headers={"Authorization": "Bearer adm"},
            )
        assert r.status_code == 201 and r.json()["base_path"] == "/trials/t1/v1"
        summary = httpx.get(f"http://127.0.0.1:{port}/admin/trials/t1", headers={"Authorization": "Bearer adm"})
        assert summary.json()["num_turns"] == 0, "TCP and the socket serve the same trials"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0
