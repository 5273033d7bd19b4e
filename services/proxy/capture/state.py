"""The capture state machine of one trial: threads, segments, and the rule that
decides whether a model call extends a segment or opens a new one.

Invariants (ARCHITECTURE.md 1-4) and how this module keeps them:

1. A segment's ids are ``prompt + part_1 + part_2 + ...``; each part is the
   context the harness added since the last call (mask 0) followed by exactly
   the ids the engine sampled (mask 1). ``Segment.context`` always equals what
   the engine saw last plus what it sampled, so the next prompt is
   ``context + new context`` and every mask-1 id was sampled in exactly the
   context that precedes it in the segment.
2. The new context is rendered by the model's chat template (``Renderer``);
   earlier turns of the proxy are never re-tokenized: their sampled ids are
   reused verbatim (``SampledIds``), whether the segment is extended or a new
   one is rendered from scratch.
3. A request extends a segment only if its tools are the same and its messages
   start with the segment's history, where the proxy's own turns are matched by
   tool-call id (or the echoed turn id), not by their re-serialised text. Any
   other request opens a new segment whose prompt is the rewritten context;
   the segment it rewrites is closed. A sampled turn is committed to exactly
   one segment, once.
4. Threads are keyed by the leading system prompt: a request whose system
   prompt is not the main thread's belongs to another, labelled thread.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harnessrl.logs import kv
from services.proxy.chat.conversation import Conversation, Message, Tool
from services.proxy.chat.render import Renderer, SampledIds

log = logging.getLogger(__name__)

MAIN = "main"


@dataclass(frozen=True)
class Sampled:
    """What the engine sampled in one call; arrays are LE bytes of equal length."""

    ids: bytes  # int32
    logprobs: bytes  # float32
    versions: bytes  # int32
    finish_reason: str  # the engine's: stop | length
    ended_with_eos: bool
    routes: np.ndarray | None = None  # uint8 [n, layers, top_k]

    @property
    def num_tokens(self) -> int:
        return len(self.ids) // 4


@dataclass(frozen=True)
class OurTurn:
    """An assistant turn the proxy produced, and how the harness will echo it."""

    turn_id: str
    call_ids: tuple[str, ...]
    text: str
    sampled: SampledIds


def recognises(m: Message, turn: OurTurn) -> bool:
    """Is ``m`` the harness's copy of ``turn``? By echoed turn id, else by tool-call ids,
    else (a turn without calls) by its text; never by re-serialised arguments."""
    if m.role != "assistant":
        return False
    if m.turn_ref:
        return m.turn_ref == turn.turn_id
    if turn.call_ids:
        return tuple(c.id for c in m.tool_calls) == turn.call_ids
    return not m.tool_calls and m.content.strip() == turn.text.strip()


class OurTurns:
    """Every turn of the trial, findable from the harness's copy of it."""

    def __init__(self) -> None:
        self._by_ref: dict[str, OurTurn] = {}
        self._by_call: dict[str, OurTurn] = {}
        self._by_text: dict[str, OurTurn] = {}

    def add(self, turn: OurTurn) -> None:
        self._by_ref[turn.turn_id] = turn
        for cid in turn.call_ids:
            self._by_call[cid] = turn
        if not turn.call_ids:
            self._by_text[turn.text.strip()] = turn

    def find(self, m: Message) -> OurTurn | None:
        if m.role != "assistant":
            return None
        if m.turn_ref:
            candidate = self._by_ref.get(m.turn_ref)
        elif m.tool_calls:
            candidate = self._by_call.get(m.tool_calls[0].id)
        else:
            candidate = self._by_text.get(m.content.strip())
        return candidate if candidate is not None and recognises(m, candidate) else None


Entry = Message | OurTurn


@dataclass(eq=False)
class Segment:
    index: int
    tools: tuple[Tool, ...]
    context: bytearray  # int32 LE: what the engine saw last + what it sampled
    history: list[Entry]  # the messages the context covers, our turns resolved
    ours_at: list[int]  # positions of OurTurn entries in history
    parts: int = 0
    version: int = 0
    closed: bool = False
    last_used: int = 0

    def extended_by(self, conv: Conversation) -> bool:
        """Does ``conv`` continue this segment (same tools, history as its prefix)?"""
        h, msgs = self.history, conv.messages
        if self.closed or len(msgs) < len(h) or conv.tools != self.tools:
            return False
        start = 0
        for pos in self.ours_at:
            if list(msgs[start:pos]) != h[start:pos]:
                return False
            turn = h[pos]
            assert isinstance(turn, OurTurn)
            if not recognises(msgs[pos], turn):
                return False
            start = pos + 1
        return list(msgs[start : len(h)]) == h[start:]


@dataclass(eq=False)
class Thread:
    name: str
    kind: str  # main | subagent | side
    trainable: bool
    system: str
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0

    def open_segments(self) -> list[Segment]:
        return sorted((s for s in self.segments if not s.closed), key=lambda s: -s.last_used)


@dataclass
class Plan:
    """How one model call maps onto the capture, decided before generation."""

    thread: Thread
    conv: Conversation
    prompt: bytes  # int32 LE: every id the engine will see
    extends: Segment | None
    base_version: int
    delta: bytes  # int32 LE context ids appended to ``extends``; empty for a new segment
    history: list[Entry]
    ours_at: list[int]
    rewrites: list[Segment]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) // 4


@dataclass(frozen=True)
class Part:
    """One AppendSegment: ``context`` (mask 0) then ``sampled`` (mask 1)."""

    thread: Thread
    segment_index: int
    part_index: int
    prompt: bytes | None  # only on part 0
    context: bytes
    sampled: Sampled | None  # None on a closing part
    close: bool


class TrialCapture:
    """All threads of one trial. Not thread-safe: call from one event loop."""

    def __init__(
        self,
        renderer: Renderer,
        *,
        trainable_kinds: Sequence[str] = ("main", "subagent"),
        main_requires_tools: bool = True,
        max_open_segments: int = 8,
        render_check: bool = False,
    ) -> None:
        self.renderer = renderer
        self.threads: dict[str, Thread] = {}
        self._by_system: dict[str, Thread] = {}
        self._ours = OurTurns()
        self._trainable = set(trainable_kinds)
        self._main_requires_tools = main_requires_tools
        self._max_open = max_open_segments
        self._render_check = render_check
        self._clock = itertools.count(1)
        self._counts = {"subagent": 0, "side": 0}
        self.render_mismatches = 0

    # -- planning -------------------------------------------------------------

    def plan(self, conv: Conversation) -> Plan:
        thread = self._thread_for(conv)
        seg = next((s for s in thread.open_segments() if s.extended_by(conv)), None)
        if seg is not None:
            plan = self._plan_extension(thread, seg, conv)
            if plan is not None:
                return plan
        history, ours_at = self._resolve(conv.messages)
        prompt = self.renderer.full(conv, _sampled_list(history))
        return Plan(thread, conv, prompt, None, 0, b"", history, ours_at, self._rewritten(thread, conv))

    def _plan_extension(self, thread: Thread, seg: Segment, conv: Conversation) -> Plan | None:
        new = conv.messages[len(seg.history) :]
        if any(self._ours.find(m) is not None for m in new):
            return None  # an own turn outside this segment: render from scratch to reuse it
        last = seg.history[-1]
        assert isinstance(last, OurTurn)
        delta = self.renderer.extension(last.sampled, new).tobytes()
        history = [*seg.history, *new]
        prompt = bytes(seg.context) + delta
        if self._render_check:
            full = self.renderer.full(conv, _sampled_list(history))
            if full != prompt:
                self.render_mismatches += 1
                log.warning("incremental render differs from full render", extra=kv(thread=thread.name))
                return None
        return Plan(thread, conv, prompt, seg, seg.version, delta, history, list(seg.ours_at), [])

    def _resolve(self, messages: Sequence[Message]) -> tuple[list[Entry], list[int]]:
        history: list[Entry] = []
        ours_at: list[int] = []
        for m in messages:
            turn = self._ours.find(m)
            if turn is not None:
                ours_at.append(len(history))
            history.append(turn or m)
        return history, ours_at

    def _rewritten(self, thread: Thread, conv: Conversation) -> list[Segment]:
        """The open segments a non-extending request replaces: those with the same
        first message, and on the main thread (one conversation) the latest one."""
        open_ = thread.open_segments()
        first = conv.messages[0] if conv.messages else None
        same_root = [s for s in open_ if s.history and s.history[0] == first]
        if same_root or thread.kind != MAIN:
            return same_root
        return open_[:1]

    def _thread_for(self, conv: Conversation) -> Thread:
        thread = self._by_system.get(conv.system)
        if thread is not None:
            return thread
        if MAIN not in self.threads and (conv.tools or not self._main_requires_tools):
            name = kind = MAIN
        else:
            kind = "subagent" if conv.tools else "side"
            self._counts[kind] += 1
            name = f"{kind}-{self._counts[kind]}"
        thread = Thread(name, kind, kind in self._trainable, conv.system)
        self.threads[name] = thread
        self._by_system[conv.system] = thread
        return thread

    # -- committing -----------------------------------------------------------

    def commit(self, plan: Plan, sampled: Sampled, turn: OurTurn) -> list[Part]:
        """Records a finished call; returns the parts to append, in order."""
        thread, parts = plan.thread, []
        seg = plan.extends
        if seg is not None and not seg.closed and seg.version == plan.base_version:
            parts.append(Part(thread, seg.index, seg.parts, None, plan.delta, sampled, False))
            seg.context += plan.delta
        else:
            parts.extend(self._close(thread, s) for s in plan.rewrites if not s.closed)
            seg = Segment(len(thread.segments), plan.conv.tools, bytearray(plan.prompt), [], [])
            thread.segments.append(seg)
            seg.last_used = next(self._clock)
            parts.append(Part(thread, seg.index, 0, plan.prompt, b"", sampled, False))
            parts.extend(self._close(thread, s) for s in thread.open_segments()[self._max_open :])
        seg.context += sampled.ids
        seg.history = [*plan.history, turn]
        seg.ours_at = [*plan.ours_at, len(plan.history)]
        seg.parts += 1
        seg.version += 1
        seg.last_used = next(self._clock)
        thread.calls += 1
        self._ours.add(turn)
        return parts

    @staticmethod
    def _close(thread: Thread, seg: Segment) -> Part:
        seg.closed = True
        part = Part(thread, seg.index, seg.parts, None, b"", None, True)
        seg.parts += 1
        return part

    def close_all(self) -> list[Part]:
        return [self._close(t, s) for t in self.threads.values() for s in t.segments if not s.closed]


def _sampled_list(history: Sequence[Entry]) -> list[SampledIds | None]:
    return [e.sampled if isinstance(e, OurTurn) else None for e in history]


def as_messages(history: Sequence[Entry]) -> list[Message]:
    """For diagnostics: history with our turns as plain assistant messages."""
    return [e if isinstance(e, Message) else Message("assistant", e.text) for e in history]
