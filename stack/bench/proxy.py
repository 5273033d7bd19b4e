"""Throughput half of ``harnessrl bench proxy`` (the overhead half, in-process, is
``services/proxy/bench.py``): concurrent multi-turn sessions through a proxy
process versus straight to the same scripted engine.

Every service runs in its own process, as deployed (``stack.bench.benchstack``); the
load comes from this process over plain HTTP/1.1 keep-alive connections (one per
session) and, for the baseline, gRPC to the gateway. It starts services, so it
lives in the composition root, beside the other benches that do."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.arrays import I32
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.bench import OverheadRow, run_overhead
from services.proxy.settings import Settings as ProxySettings
from stack.bench.benchstack import BenchStack, Http, cpu_seconds

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


def scripted(root: Path, reply: dict[str, Any] = REPLY, chunk_tokens: int = 0) -> dict[str, Any]:
    """Gateway settings of the scripted engine, every thread answered with ``reply``."""
    script = root / "script.json"
    threads = {"main": [reply], "*": [reply]}
    script.write_text(json.dumps({"context_window": 1_000_000, "chunk_tokens": chunk_tokens, "threads": threads}))
    return {"engine": f"scripted:{script}"}


def proxy_stack(root: Path, gateway: dict[str, Any], **proxy: Any) -> BenchStack:
    """Gateway (its settings: ``gateway``), capture store and proxy (more of its settings:
    ``proxy``), each its own process; the proxy's admin API takes ADMIN."""
    return BenchStack(
        root,
        gateway=GatewaySettings.model_validate(gateway),
        capture=CaptureSettings.model_validate({"auth_token": "c"}),
        proxy=ProxySettings.model_validate({"admin_token": ADMIN, "max_trials": 100_000} | proxy),
    )


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


async def chat_turns(
    http: Http, url: str, token: str, turns: int, stream: bool = False, latencies: list[float] | None = None
) -> None:
    """``turns`` chat completions at ``url`` as a harness makes them (a growing conversation
    with TOOLS, one tool result per turn); each answered turn's latency goes to ``latencies``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix it."}]
    for turn in range(turns):
        body = {"model": "SmolLM2-135M-Instruct", "messages": messages, "tools": TOOLS, "stream": stream}
        started = time.perf_counter()
        status, data = await http.post(url, json.dumps(body).encode(), token)
        if status != 200:
            raise RuntimeError(f"turn {turn}: {status} {data[:300]!r}")
        if latencies is not None:
            latencies.append(time.perf_counter() - started)
        message = _streamed_message(data) if stream else json.loads(data)["choices"][0]["message"]
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]


async def _through_proxy(port: int, sessions: int, turns: int, tag: str, stream: bool = False) -> float:
    """``sessions`` concurrent harnesses, each running trials of at most
    EPISODE turns until it has made ``turns`` calls."""
    admin = Http(port)
    trials: list[list[tuple[str, str]]] = [[] for _ in range(sessions)]
    for i in range(sessions):
        for j in range(-(-turns // EPISODE)):
            spec = {"trial_id": f"{tag}-{i}-{j}", "run_id": "bench", "task_id": "t", "group_id": tag}
            trials[i].append((spec["trial_id"], (await admin.admin("/admin/trials", spec, ADMIN))["token"]))

    async def harness(i: int) -> None:
        http, left = Http(port), turns
        try:
            for trial, token in trials[i]:
                await chat_turns(http, f"/trials/{trial}/v1/chat/completions", token, min(EPISODE, left), stream)
                left -= EPISODE
        finally:
            http.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(harness(i) for i in range(sessions)))
    elapsed = time.perf_counter() - t0
    for per_session in trials:
        for trial, _ in per_session:
            await admin.admin(f"/admin/trials/{trial}/close", {}, ADMIN)
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
            proxy_stack(Path(tmp), scripted(Path(tmp), reply, chunk)) as up,
        ):
            proxy, gateway, pid = up.ports["proxy"], up.ports["gateway"], up.pids["proxy"]
            asyncio.run(_through_proxy(proxy, 4, 2, "warmup", stream))
            for n in at:
                turns = max(4, total_turns // n)
                direct = asyncio.run(_direct(gateway, n, turns, prompt, f"d{n}"))
                cpu = cpu_seconds(pid)
                through = asyncio.run(_through_proxy(proxy, n, turns, f"p{n}", stream))
                ms = 1000 * (cpu_seconds(pid) - cpu) / (n * turns)
                rows.append(LoadRow(n, n * turns, through, direct, ms, mode))
    return rows


def run(quick: bool = False) -> tuple[list[OverheadRow], list[LoadRow]]:
    """Both halves of the benchmark (``quick``: fewer turns, for a smoke run)."""
    overhead, prompt = run_overhead(quick)
    load = measure_load((1, 64, 384), 400 if quick else 1536, prompt, stream_levels=(1, 64))
    return overhead, load
