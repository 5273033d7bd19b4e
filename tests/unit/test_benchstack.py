"""The config a bench stack writes: one file, every service's own Settings read
back from it, targets wired to the ports given out, secrets in the clear."""

from __future__ import annotations

import os
from pathlib import Path

from harnessrl.config import load_section
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from services.sandbox.settings import Settings as SandboxSettings
from stack.benchstack import BenchStack, cpu_seconds


def test_config_wires_every_target_and_reads_back(tmp_path: Path) -> None:
    up = BenchStack(
        tmp_path,
        gateway=GatewaySettings.model_validate({"engine": "scripted:/x.json"}),
        capture=CaptureSettings.model_validate({"auth_token": "c"}),
        proxy=ProxySettings.model_validate({"admin_token": "a", "max_trials": 7}),
        sandbox=SandboxSettings.model_validate({"lease_s": 120}),
    )
    config = up.write_config()
    assert config == tmp_path / "stack.toml" and "port = {" not in config.read_text()
    gateway = load_section(GatewaySettings, config, "gateway")
    capture = load_section(CaptureSettings, config, "capture_store")
    proxy = load_section(ProxySettings, config, "proxy")
    sandbox = load_section(SandboxSettings, config, "sandbox")
    assert len(set(up.ports.values())) == 4
    assert (gateway.port, capture.port, proxy.port, sandbox.port) == tuple(up.ports[n] for n in up.ports)
    assert gateway.engine == "scripted:/x.json" and capture.store_dir == tmp_path / "capture"
    assert (proxy.gateway_target, proxy.capture_target) == (up.target("gateway"), up.target("capture"))
    assert proxy.max_trials == 7 and proxy.admin_token and proxy.admin_token.get_secret_value() == "a"
    assert proxy.capture_token and proxy.capture_token.get_secret_value() == "c"
    assert sandbox.proxy_url == f"http://{up.target('proxy')}" and sandbox.capture_target == up.target("capture")
    assert sandbox.proxy_admin_token and sandbox.proxy_admin_token.get_secret_value() == "a"
    assert sandbox.lease_s == 120 and sandbox.queue_url == "memory://"  # no workers: no Redis queue


def test_a_stack_of_one_service_has_no_targets(tmp_path: Path) -> None:
    up = BenchStack(tmp_path, capture=CaptureSettings.model_validate({"store_dir": tmp_path / "s"}))
    assert "gateway_target" not in up.write_config().read_text()
    assert list(up.ports) == ["capture"] and up.pids == {}


def test_cpu_seconds_of_a_tree_includes_the_process() -> None:
    alone = cpu_seconds(os.getpid())
    assert cpu_seconds(os.getpid(), tree=True) >= alone > 0
