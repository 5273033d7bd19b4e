"""``harnessrl bench proxy``: what the proxy costs per turn and how many turns
per second one proxy process serves, each against a baseline in the same run.

1. Per-turn overhead at 1k, 32k and 200k tokens of context: the proxy's own
   work for one model call (parse the request, match the history, render and
   tokenize only the new messages, commit the capture), side by side with a
   naive proxy that re-renders and re-tokenizes the whole conversation every
   turn, in CPU time of the thread. Targets: <= 1 ms median, 200k/1k <= 1.5.
2. Throughput at 1, 64 and 384 concurrent sessions (in ``stack/bench/proxy.py``:
   it starts processes): multi-turn tool loops over HTTP through a proxy process
   (gateway with the scripted engine and the capture store in their own
   processes), versus the same sessions calling the same scripted engine's
   Generate directly. Targets: >= 500 turns/s, <= 10% loss at 384 sessions.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnessrl.arrays import F32, I32
from harnessrl.benchtable import print_table
from services.proxy.capture.state import OurTurn, Sampled, TrialCapture
from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall, message_for_template
from services.proxy.chat.model import ChatModel
from services.proxy.chat.render import SampledIds
from services.proxy.openai.models import ChatRequest, to_conversation
from services.proxy.protocol import parse

BASH = Tool("bash", "Run a shell command", {"type": "object", "properties": {"command": {"type": "string"}}})
_TOOLS_JSON = [
    {
        "type": "function",
        "function": {"name": BASH.name, "description": BASH.description, "parameters": BASH.parameters},
    }
]


def _clock() -> float:
    """CPU time of this thread: the work a turn costs, not the time other
    processes on a shared machine held the core."""
    return time.thread_time()


@dataclass
class OverheadRow:
    context_tokens: int
    proxy_median_ms: float
    proxy_p99_ms: float
    core_median_ms: float
    naive_median_ms: float
    naive_p99_ms: float


def _sampled(model: ChatModel, text: str) -> Sampled:
    ids = [*model.tokenizer.encode(text), model.tokenizer.eos_id]
    n = len(ids)
    return Sampled(
        np.asarray(ids, I32).tobytes(), np.full(n, -0.5, F32).tobytes(), np.zeros(n, I32).tobytes(), "stop", True
    )


def _request_body(messages: list[Message]) -> bytes:
    """The JSON a harness would send for this conversation (OpenAI chat)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return json.dumps({"model": "m", "messages": out, "tools": _TOOLS_JSON}).encode()


class _Session:
    """A trial whose main thread grows one tool turn at a time."""

    def __init__(self, model: ChatModel, tool_output: str) -> None:
        self.model = model
        self.capture = TrialCapture(model.renderer)
        self.messages: list[Message] = [Message("user", "Fix the failing test in this repository.")]
        self.tool_output = tool_output
        self.n = 0
        self.tokens = 0

    def turn(self, body: bytes | None = None) -> float:
        """One model call through the capture; returns seconds spent in the proxy
        (what the engine would sample is prepared outside the timed region)."""
        self.n += 1
        cid = f"call_{self.n}"
        args = json.dumps({"command": f"cat file_{self.n}.py"})
        sampled = _sampled(self.model, f'Reading.\n<tool_call>\n{{"name": "bash", "arguments": {args}}}\n</tool_call>')
        turn = OurTurn(f"t{self.n}", (cid,), "Reading.", SampledIds(sampled.ids, True))
        t0 = _clock()
        if body is not None:
            conv = to_conversation(parse(ChatRequest, body))
        else:
            conv = Conversation("You are a coding agent.", tuple(self.messages), (BASH,))
        plan = self.capture.plan(conv)
        self.capture.commit(plan, sampled, turn)
        elapsed = _clock() - t0
        self.tokens = plan.prompt_tokens + sampled.num_tokens
        self.messages.append(Message("assistant", "Reading.", (ToolCall(cid, "bash", args),)))
        self.messages.append(Message("tool", self.tool_output, tool_call_id=cid))
        return elapsed

    def naive(self) -> float:
        """What a proxy without state does each turn: render and tokenize everything."""
        t0 = _clock()
        msgs = [
            {"role": "system", "content": "You are a coding agent."},
            *(message_for_template(m) for m in self.messages),
        ]
        text = self.model.template.render(msgs, _TOOLS_JSON, add_generation_prompt=True)
        self.model.tokenizer.encode(text)
        return _clock() - t0


def _grown(model: ChatModel, size: int) -> _Session:
    """A session whose context has reached ``size`` tokens (big tool outputs),
    then continuing with typical ~200-token tool outputs."""
    s = _Session(model, "\n".join(f"    line {i}: value = compute(x, {i})" for i in range(60)))
    while s.tokens < size:
        s.turn()
    s.tool_output = "\n".join(f"    line {i}: ok" for i in range(40))
    last = s.messages[-1]
    s.messages[-1] = last._replace(content=s.tool_output)  # the next turn's new message: a typical tool output
    return s


def _snapshot(s: _Session) -> _Session:
    """A copy of the session's state (the renderer and model are shared)."""
    memo = {id(s.model): s.model, id(s.capture.renderer): s.capture.renderer}
    return copy.deepcopy(s, memo)


def measure_overhead(model: ChatModel, sizes: tuple[int, ...], turns: int) -> list[OverheadRow]:
    """Every measured turn starts from the same state, so the context is exactly
    the row's size: a fresh copy of the grown session takes one more turn."""
    rows = []
    for size in sizes:
        grown = _grown(model, size)
        proxy, naive, core = [], [], []
        for _ in range(turns):
            s = _snapshot(grown)
            body = _request_body(s.messages)
            gc.collect()  # garbage of the copies is not the proxy's
            naive.append(s.naive())
            gc.collect()
            proxy.append(s.turn(body))
            c = _snapshot(grown)
            gc.collect()
            core.append(c.turn())
        rows.append(
            OverheadRow(
                context_tokens=grown.tokens,
                proxy_median_ms=1000 * statistics.median(proxy),
                proxy_p99_ms=1000 * float(np.percentile(proxy, 99)),
                core_median_ms=1000 * statistics.median(core),
                naive_median_ms=1000 * statistics.median(naive),
                naive_p99_ms=1000 * float(np.percentile(naive, 99)),
            )
        )
    return rows


def run_overhead(quick: bool = False) -> tuple[list[OverheadRow], np.ndarray]:
    """The overhead half (``quick``: fewer turns, for a smoke run) and the prompt ids
    of the throughput half (``stack.bench.proxy``, which starts the processes)."""
    from harnessrl.config import load_section
    from services.proxy.app import load_model
    from services.proxy.settings import Settings

    model = load_model(load_section(Settings, None, "proxy"))
    overhead = measure_overhead(model, (1_000, 32_000, 200_000), 10 if quick else 50)
    prompt_msgs = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix it."},
    ]
    text = model.template.render(prompt_msgs, _TOOLS_JSON, add_generation_prompt=True)
    return overhead, np.asarray(model.tokenizer.encode(text), I32)


def print_tables(overhead: list[OverheadRow], load: list[Any]) -> None:
    title = "Per-turn proxy overhead (CPU ms) vs naive full re-tokenization"
    columns = ("context tokens", "capture core median", "request median", "request p99", "naive median", "naive p99")
    times = ("core_median_ms", "proxy_median_ms", "proxy_p99_ms", "naive_median_ms", "naive_p99_ms")
    cells = [(f"{r.context_tokens:,}", *(f"{getattr(r, t):.3f}" for t in times)) for r in overhead]
    ratio = overhead[-1].core_median_ms / overhead[0].core_median_ms
    note = (
        f"capture core: median {max(r.core_median_ms for r in overhead):.3f} ms at worst (target <= 1 ms), "
        f"200k/1k = {ratio:.2f} (target <= 1.5); 'request' adds parsing the harness's JSON, which is O(context)."
    )
    console = print_table(title, columns, cells, note)
    title = "Throughput (turns/s): through the proxy vs straight to the scripted engine"
    load_columns: tuple[str, ...] = ("mode", "sessions", "turns", "through proxy", "direct", "loss")
    load_columns += ("proxy CPU ms/turn", "turns per proxy CPU-s")
    rates = ("proxy_turns_per_s", "direct_turns_per_s")

    def cpu(r: Any) -> tuple[str, str]:
        return f"{r.proxy_cpu_ms_per_turn:.2f}", f"{1000 / r.proxy_cpu_ms_per_turn:.0f}"

    cells = [
        (r.mode, r.sessions, r.turns, *(f"{getattr(r, x):.0f}" for x in rates), f"{100 * r.loss:.0f}%", *cpu(r))
        for r in load
    ]
    whole = [r for r in load if r.mode == "json"]
    best = max(r.proxy_turns_per_s for r in whole)
    note = (
        f"best {best:.0f} turns/s per proxy process (target >= 500); loss at 384 sessions "
        f"{100 * whole[-1].loss:.0f}% (target <= 10%). 'turns per proxy CPU-s' is the capacity of one proxy "
        "process given a whole core (all services and the load generator share this machine's cores). "
        "'stream' rows: SSE replies, the engine sending one token per chunk, so text and tool-call "
        "arguments are parsed and sent token by token (a longer tool call than the json rows')."
    )
    load_line = f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    print_table(title, load_columns, cells, note, load_line, console=console)
