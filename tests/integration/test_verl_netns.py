"""The verl worker's gateway across nodes, with two network namespaces standing in for
two nodes (made here: a veth pair with 10.213.x.0/30 addresses inside them only; nothing
on this host's own interfaces; removed at the end, also on failure).

"verl node" (namespace a): verl's agent-loop build with the sandbox on the other node's
address, then the worker's gateway as ``HarnessAgentLoop.run`` starts it, bound to
0.0.0.0 (``tests/integration/verl_netns_gateway.py``). "sandbox node" (namespace b): the
real ``harnessrl proxy serve`` and ``harnessrl capture serve`` processes. This test
drives the proxy as the sandbox does (its admin API, over the proxy's Unix socket, which
the filesystem shares across namespaces): a trial named with the gateway target the
agent loop advertises, one chat call that the proxy sends across to verl's server
manager. The loopback settings are refused when verl builds the loop."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from harnessrl import paths

ROOT = Path(__file__).resolve().parents[2]
MODEL = paths.default_model_dir().name
ADMIN = "netns-admin"
CAPTURE_PORT = 50052  # inside namespace b, which has nothing else listening

pytestmark = pytest.mark.skipif(
    not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"
)


async def test_verl_builds_no_loop_whose_gateway_a_proxy_on_another_node_cannot_dial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process, this host's own network: the loop verl's worker builds (Hydra, the shipped
    agent_loops.yaml) refuses the default loopback bind when the sandbox is another host,
    and with a wildcard bind names the gateway by this host's route to it, not loopback."""
    from hydra.errors import InstantiationException
    from transformers import AutoTokenizer

    from stack.verl import address as verl_address
    from stack.verl import agent_loop as val
    from tests.verl_support import FakeServerManager, agent_loop

    peer = verl_address.first_interface_ipv4()
    if peer is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", f"{peer}:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:1")
    monkeypatch.delenv("HARNESSRL_VERL_GATEWAY_ADDRESS", raising=False)
    monkeypatch.delenv("HARNESSRL_VERL_GATEWAY_BIND", raising=False)
    with pytest.raises(InstantiationException, match=r"HARNESSRL_VERL_GATEWAY_BIND\)=127.0.0.1 is loopback"):
        agent_loop(FakeServerManager(), tokenizer, 64, 8, max_model_len=4096)
    monkeypatch.setenv("HARNESSRL_VERL_GATEWAY_BIND", "0.0.0.0")
    manager = FakeServerManager()
    loop = agent_loop(manager, tokenizer, 64, 8, max_model_len=4096)
    assert loop.gateway_address == peer, "the source address of the route to the sandbox's host"
    try:
        target, _ = await val._GATEWAY.ensure(
            manager, len(tokenizer), loop.gateway_bind, loop.gateway_address, context_window=4096
        )
    finally:
        await val._GATEWAY.close()
    assert target.rpartition(":")[0] == peer


@dataclass
class Nodes:
    verl: str  # namespace names
    sandbox: str
    verl_ip: str
    sandbox_ip: str


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    if os.geteuid() != 0:
        pytest.skip("needs root to make network namespaces (ip netns)")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2)")
    tag = str(os.getpid() % 100000)
    net = f"10.213.{os.getpid() % 250}"
    pair = Nodes(f"hrl{tag}a", f"hrl{tag}b", f"{net}.1", f"{net}.2")
    made: list[str] = []
    try:
        for ns in (pair.verl, pair.sandbox):
            r = ip("netns", "add", ns)
            if r.returncode:
                pytest.skip(f"ip netns add refused: {r.stderr.strip()}")
            made.append(ns)
        # The veth pair is created inside the namespaces, never on this host's interfaces.
        steps = [
            (
                "-n",
                pair.verl,
                "link",
                "add",
                f"v{tag}a",
                "type",
                "veth",
                "peer",
                "name",
                f"v{tag}b",
                "netns",
                pair.sandbox,
            ),
            ("-n", pair.verl, "addr", "add", f"{pair.verl_ip}/30", "dev", f"v{tag}a"),
            ("-n", pair.sandbox, "addr", "add", f"{pair.sandbox_ip}/30", "dev", f"v{tag}b"),
            ("-n", pair.verl, "link", "set", f"v{tag}a", "up"),
            ("-n", pair.sandbox, "link", "set", f"v{tag}b", "up"),
            ("-n", pair.verl, "link", "set", "lo", "up"),
            ("-n", pair.sandbox, "link", "set", "lo", "up"),
        ]
        for step in steps:
            r = ip(*step)
            if r.returncode:
                pytest.skip(f"ip {' '.join(step)} refused: {r.stderr.strip()}")
        yield pair
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            ip("netns", "del", ns)
    assert not {pair.verl, pair.sandbox} & set(ip("netns", "list").stdout.split()), "namespaces removed"


class Procs:
    """Processes started in a namespace (``ip netns exec`` execs: the PID is the program's)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, ns: str, name: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
        log = (self.tmp / f"{name}.log").open("w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, *args],
            cwd=ROOT,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdin is not None else log,
            stderr=log,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def read_json(stream: IO[str] | None, procs: Procs, guard_s: float = 180) -> dict[str, Any]:
    """The next line of a process's stdout as JSON (a daemon thread reads; the guard only
    keeps a broken run from hanging: stopping the process ends the read)."""
    assert stream is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=guard_s)
    except queue.Empty:
        line = ""
    assert line.strip(), f"no answer from the verl node\n{procs.logs()}"
    data: dict[str, Any] = json.loads(line)
    return data


def wait_for(path: Path, proc: subprocess.Popen[str], procs: Procs, guard_s: float = 180) -> None:
    deadline = time.monotonic() + guard_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"{path.name} never appeared\n{procs.logs()}"
        time.sleep(0.2)


@pytest.mark.slow  # ~40 s on 2 busy cores: three Python services start (verl, the proxy, the store)
def test_the_proxy_on_another_node_reaches_the_gateway_by_its_advertised_address(nodes: Nodes, tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[proxy]\nhost = "127.0.0.1"\nport = 0\nadmin_token = "{ADMIN}"\nuds_path = "{sock}"\n'
        f'capture_target = "127.0.0.1:{CAPTURE_PORT}"\n'
    )
    procs = Procs(tmp_path)
    try:
        procs.start(
            nodes.sandbox, "capture", "-m", "stack.cli", "capture", "serve", "--host", "127.0.0.1",
            "--port", str(CAPTURE_PORT), "--store-dir", str(tmp_path / "capture"),
        )  # fmt: skip
        proxy = procs.start(nodes.sandbox, "proxy", "-m", "stack.cli", "proxy", "serve", "-c", str(config))
        # The proxy runs with the sandbox service's workers: the agent loop names that host.
        verl = procs.start(
            nodes.verl, "verl", "-m", "tests.integration.verl_netns_gateway", f"{nodes.sandbox_ip}:50051",
            stdin=subprocess.PIPE,
        )  # fmt: skip
        started = read_json(verl.stdout, procs)
        refused = started["refused"]
        assert "HARNESSRL_VERL_GATEWAY_BIND=0.0.0.0" in refused["default_bind"], refused
        assert "HARNESSRL_VERL_GATEWAY_ADDRESS)=127.0.1.1 is loopback" in refused["address_127.0.1.1"], refused
        assert "HARNESSRL_VERL_GATEWAY_ADDRESS)=localhost is loopback" in refused["address_localhost"], refused
        assert all(f"sandbox_target {nodes.sandbox_ip}:50051 is another host" in r for r in refused.values())
        target = started["target"]
        assert target.rpartition(":")[0] == nodes.verl_ip, f"the verl node's address towards the sandbox: {target}"

        wait_for(sock, proxy, procs)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://proxy", timeout=120) as c:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            body = {"trial_id": "t1", "run_id": "verl", "task_id": "x", "gateway_target": target}
            trial = c.post("/admin/trials", json=body, headers=admin)
            assert trial.status_code == 201, trial.text
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            reply = c.post(
                f"{trial.json()['base_path']}/chat/completions",
                json=chat,
                headers={"Authorization": f"Bearer {trial.json()['token']}"},
            )
            assert reply.status_code == 200, f"{reply.text}\n{procs.logs()}"
            assert reply.json()["usage"]["completion_tokens"] == 4, "verl's server manager's 4 tokens"
            summary = c.post("/admin/trials/t1/close", headers=admin)
            assert summary.status_code == 200 and summary.json()["num_turns"] == 1, summary.text
        assert verl.stdin is not None
        verl.stdin.write("stop\n")
        verl.stdin.flush()
        calls = read_json(verl.stdout, procs)["calls"]
        assert len(calls) == 1 and calls[0].startswith("t1/"), f"the call crossed to verl's server manager: {calls}"
        assert verl.wait(60) == 0, procs.logs()
    finally:
        with contextlib.suppress(OSError):
            procs.stop()
