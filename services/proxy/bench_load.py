"""Throughput half of ``harnessrl bench proxy``: concurrent multi-turn sessions
through a proxy process versus straight to the same scripted engine.

Every service runs in its own process, as deployed (``harnessrl gateway serve``
with the scripted engine, ``harnessrl capture serve``, ``harnessrl proxy
serve``); the load comes from this process over plain HTTP/1.1 keep-alive
connections (one per session) and, for the baseline, gRPC to the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.arrays import I32
from harnessrl.localservers import free_port
from harnessrl.rpc import check_health, connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc

ADMIN = "bench-admin"
REPLY = {"content": "Checking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}
# The streamed rows: one token per chunk, so the proxy splits text and parses the
# tool call token by token, with a command long enough to span many tokens.
STREAM_REPLY = {
    "content": "Let me find the parser and run its tests.",
    "tool_calls": [
        {
            "name": "bash",
            "arguments": {
                "command": 'grep -rn "def parse" src/ | head -20 && python -m pytest tests/test_parse.py -x -q'
            },
        }
    ],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
SYSTEM = "You are a coding agent. " * 40
EPISODE = 20  # turns per trial: sessions run trials of realistic length back to back


@dataclass
class LoadRow:
    sessions: int
    turns: int
    proxy_turns_per_s: float
    direct_turns_per_s: float
    proxy_cpu_ms_per_turn: float  # CPU the proxy process spent per turn (user + system)
    mode: str = "json"  # json: whole replies; stream: SSE, the engine sending one token per chunk

    @property
    def loss(self) -> float:
        return 1.0 - self.proxy_turns_per_s / self.direct_turns_per_s


class _Http:
    """A minimal HTTP/1.1 keep-alive client: a load generator must cost less
    than what it measures."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        for _ in range(2):  # a connection idle past the server's keep-alive is closed: reopen once
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            assert self.reader is not None
            self.writer.write(head.encode() + body)
            status_line = await self.reader.readline()
            if status_line:
                break
            self.close()
        else:
            raise ConnectionError(f"{path}: the server closed the connection")
        length, chunked = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding":
                chunked = "chunked" in value.lower()
        if length or not chunked:
            return int(status_line.split()[1]), await self.reader.readexactly(length)
        parts = []  # Transfer-Encoding: chunked (a streamed response)
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return int(status_line.split()[1]), b"".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _services(tmp: Path, reply: dict[str, Any] = REPLY, chunk_tokens: int = 0) -> Iterator[tuple[int, int, int]]:
    """Starts gateway (scripted engine), capture store and proxy; yields (proxy port, gateway port, proxy pid)."""
    script = tmp / "script.json"
    threads = {"main": [reply], "*": [reply]}
    script.write_text(json.dumps({"context_window": 1_000_000, "chunk_tokens": chunk_tokens, "threads": threads}))
    with services(tmp, f'engine = "scripted:{script}"\n') as (ports, pids):
        yield ports["proxy"], ports["gateway"], pids["proxy"]


@contextmanager
def services(tmp: Path, gateway_lines: str, proxy_lines: str = "") -> Iterator[tuple[dict[str, int], dict[str, int]]]:
    """Starts gateway (its engine given by ``gateway_lines``, TOML of the [gateway] section),
    capture store and proxy (more of its settings in ``proxy_lines``) as separate processes;
    yields their ports and PIDs by noun."""
    ports = {name: free_port() for name in ("gateway", "capture", "proxy")}
    config = tmp / "bench.toml"
    config.write_text(
        f"[gateway]\nport = {ports['gateway']}\n{gateway_lines}\n"
        f'[capture_store]\nport = {ports["capture"]}\nstore_dir = "{tmp / "capture"}"\nauth_token = "c"\n\n'
        f'[proxy]\nport = {ports["proxy"]}\ngateway_target = "127.0.0.1:{ports["gateway"]}"\n'
        f'capture_target = "127.0.0.1:{ports["capture"]}"\ncapture_token = "c"\nadmin_token = "{ADMIN}"\n'
        f"max_trials = 100000\n{proxy_lines}"
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for noun in ("gateway", "capture", "proxy"):
            cmd = [sys.executable, "-m", "stack.cli", noun, "serve", "-c", str(config)]
            log = (tmp / f"{noun}.log").open("w")
            procs[noun] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        asyncio.run(check_health(f"127.0.0.1:{ports['gateway']}", wait_s=60))
        asyncio.run(check_health(f"127.0.0.1:{ports['capture']}", wait_s=60))
        asyncio.run(_wait_http(ports["proxy"]))
        yield ports, {noun: p.pid for noun, p in procs.items()}
    finally:
        for p in reversed(procs.values()):
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


async def _wait_http(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _admin(http: _Http, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, data = await http.post(path, json.dumps(body).encode(), ADMIN)
    if status not in (200, 201):
        raise RuntimeError(f"admin {path}: {status} {data[:300]!r}")
    result: dict[str, Any] = json.loads(data)
    return result


def _streamed_message(data: bytes) -> dict[str, Any]:
    """The assistant message an SDK assembles from a chat-completions event stream."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for line in data.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = tc.get("id") or call.get("id")
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
    return {"role": "assistant", "content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)]}


async def _proxy_session(port: int, trial: str, token: str, turns: int, stream: bool = False) -> None:
    http = _Http(port)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix it."}]
    try:
        for _ in range(turns):
            body = {"model": "SmolLM2-135M-Instruct", "messages": messages, "tools": TOOLS, "stream": stream}
            status, data = await http.post(f"/trials/{trial}/v1/chat/completions", json.dumps(body).encode(), token)
            if status != 200:
                raise RuntimeError(f"turn failed: {status} {data[:300]!r}")
            message = _streamed_message(data) if stream else json.loads(data)["choices"][0]["message"]
            messages.append(message)
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt\nb.txt"})
    finally:
        http.close()


async def _through_proxy(port: int, sessions: int, turns: int, tag: str, stream: bool = False) -> float:
    """``sessions`` concurrent harnesses, each running trials of at most
    EPISODE turns until it has made ``turns`` calls."""
    admin = _Http(port)
    trials: list[list[tuple[str, str]]] = [[] for _ in range(sessions)]
    for i in range(sessions):
        for j in range(-(-turns // EPISODE)):
            spec = {"trial_id": f"{tag}-{i}-{j}", "run_id": "bench", "task_id": "t", "group_id": tag}
            trials[i].append((spec["trial_id"], (await _admin(admin, "/admin/trials", spec))["token"]))

    async def harness(i: int) -> None:
        left = turns
        for trial, token in trials[i]:
            await _proxy_session(port, trial, token, min(EPISODE, left), stream)
            left -= EPISODE

    t0 = time.perf_counter()
    await asyncio.gather(*(harness(i) for i in range(sessions)))
    elapsed = time.perf_counter() - t0
    for per_session in trials:
        for trial, _ in per_session:
            await _admin(admin, f"/admin/trials/{trial}/close", {})
    admin.close()
    return sessions * turns / elapsed


async def _direct(port: int, sessions: int, turns: int, prompt: np.ndarray, tag: str) -> float:
    """The same sessions without the proxy: prompts grow by what was sampled plus a tool result."""
    tool_ids = np.arange(100, 130, dtype=I32)
    async with connect(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.RolloutGatewayStub(channel)

        async def session(i: int) -> None:
            for t in range(turns):
                if t % EPISODE == 0:
                    ids = prompt
                request = gateway_pb2.GenerateRequest(
                    request_id=f"{tag}-{i}-{t}",
                    trial_id=f"{tag}-{i}-{t // EPISODE}",
                    thread="main",
                    prompt_ids=ids.tobytes(),
                    sampling=gateway_pb2.SamplingParams(temperature=1.0, max_tokens=4096, stop_token_ids=[2]),
                )
                sampled = [np.frombuffer(c.tokens.ids, I32) async for c in stub.Generate(request)]
                ids = np.concatenate([ids, *sampled, tool_ids])

        t0 = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(sessions)))
        return sessions * turns / (time.perf_counter() - t0)


def measure_load(
    levels: tuple[int, ...], total_turns: int, prompt: np.ndarray, stream_levels: tuple[int, ...] = ()
) -> list[LoadRow]:
    """Rows for whole JSON replies at ``levels``, then streamed replies (one token per
    engine chunk, tool calls parsed as they arrive) at ``stream_levels``."""
    rows = []
    for mode, reply, chunk, at in (("json", REPLY, 0, levels), ("stream", STREAM_REPLY, 1, stream_levels)):
        if not at:
            continue
        stream = mode == "stream"
        with (
            tempfile.TemporaryDirectory(prefix="hrl-bench-proxy-") as tmp,
            _services(Path(tmp), reply, chunk) as (proxy, gateway, pid),
        ):
            asyncio.run(_through_proxy(proxy, 4, 2, "warmup", stream))
            for n in at:
                turns = max(4, total_turns // n)
                direct = asyncio.run(_direct(gateway, n, turns, prompt, f"d{n}"))
                cpu = cpu_seconds(pid)
                through = asyncio.run(_through_proxy(proxy, n, turns, f"p{n}", stream))
                ms = 1000 * (cpu_seconds(pid) - cpu) / (n * turns)
                rows.append(LoadRow(n, n * turns, through, direct, ms, mode))
    return rows
