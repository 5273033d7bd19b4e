"""The config a bench stack writes: one file, every service's own Settings read
back from it, targets wired to the ports given out, secrets in the clear."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from harnessrl.config import load_section
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from services.sandbox.common.settings import Settings as SandboxSettings
from stack.bench.benchstack import BenchStack, Http, cpu_seconds


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


async def test_concurrent_requests_on_one_client_each_get_their_own_answer() -> None:
    """One connection: a second caller waits for the first answer instead of
    interleaving its request (which once read "server closed the connection")."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
            body = await reader.readexactly(length)
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    client = Http(server.sockets[0].getsockname()[1])
    try:
        answers = await asyncio.gather(*(client.post_json("/echo", {"n": n}, "t") for n in range(5)))
    finally:
        client.close()
        server.close()
    assert answers == [(200, {"n": n}) for n in range(5)]
