"""The capture state machine of one trial: threads, segments, and the rule that
decides whether a model call extends a segment or opens a new one.

Invariants 1-4 (docs/architecture.md) and how this module keeps them:

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
   one segment, once. A call sampled with other parameters than its segment's
   (a harness may change temperature per call) closes the segment the same
   way: the next one's prompt is the whole context, so each segment has one
   sampling distribution and the trainer one temperature per segment.
4. Threads are conversations, told apart by structure (``_place``). A request
   that extends no open segment either carries over a conversation the trial
   already holds, and then it is that conversation rewritten (its open segment
   closes, the next one opens with the rewritten context as its prompt), or it
   carries over nothing, and then it is a new conversation: a new thread.
   "Carries over" means, in this order of evidence:

   a. the same first message under the same system prompt (an injected
      reminder, a retry, a truncation that keeps the task);
   b. an assistant message that is one of the proxy's own turns of that thread,
      recognised as in 3 (a compaction that keeps recent turns, a summary kept
      as an assistant message, as OpenCode does);
   c. a message quoting a line of one of the proxy's own text turns (at
      least ``QUOTE_MIN_CHARS``, tags aside): the summary a compaction call
      produced, pasted into the new context (Claude Code's "This session is
      being continued..."). A summary sampled in a side call counts for the
      conversation that call forked from: the one it carried over (a or b),
      else the agent thread whose turn came last before it, as the harness's
      loop made it between two of that thread's turns (the OpenHands SDK's
      condenser sends the forgotten events as text, under its own prompt).

   A compaction always carries its summary over, and the summary is sampled
   here, so a compaction is a rewrite; a sub-agent starts fresh with its own
   first user message (its task, under its own or the main system prompt), so
   it is a new thread, even while the main thread waits on the tool call that
   spawned it. The main thread is the first conversation with tools (or the
   first, with ``main_requires_tools`` off) and stays the one its rewrites
   continue; later new conversations with tools are sub-agents (``subagent-N``)
   and tool-less ones side calls (``side-N``: titles, summaries). A request with
   tools never continues a side thread, and a tool-less one never continues an
   agent thread (with ``main_requires_tools`` on): a tool-less summary request
   over the main history is a side call forked from ``main``, not ``main``.
   Which prompt is longer plays no part. Known limit: a harness that forks a
   sub-agent with the parent's whole context (its turns included) is read as
   a rewrite of the parent, unless it names its threads: a request carrying
   the harness's own thread id (``Conversation.thread_hint``, Codex's
   x-codex-turn-metadata) is placed by that id first (``_plan_hinted``): one id,
   one thread; a new id after main is a new ``subagent-N`` (``parent`` set).
   A thread's segments are sequential, one open at a time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harnessrl.logs import kv
from harnessrl.v1 import records_pb2
from services.proxy.chat.conversation import Conversation, Message, ThreadHint, Tool
from services.proxy.chat.render import Renderer, SampledIds

log = logging.getLogger(__name__)

MAIN = "main"
SIDE = "side"
# A call whose client left mid-answer: the harness never received it, so it is no
# part of the trajectory the policy acted out (invariant 1). Kept for audit in a
# thread of its own, never trainable, never extended.
ABANDONED = "abandoned"
# A quoted own turn shorter than this is no evidence (``ok``, ``Done.`` recur by chance).
QUOTE_MIN_CHARS = 32
_QUOTE_SPLIT = re.compile(r"<[^<>\n]{1,40}>|\n")


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
    call_names: tuple[str, ...] = ()  # in the order of call_ids


def recognises(m: Message, turn: OurTurn) -> bool:
    """Is ``m`` the harness's copy of ``turn``? By echoed turn id, else by tool-call ids,
    else (a turn without calls) by its text; never by re-serialised arguments.

    Calls that carry no ids at all (the Gemini API makes them optional, and a client
    may drop the ones the proxy gave along with its thought signatures) are matched
    by name, in order: only where the position is known, a segment's history at the
    same index (``Segment.extended_by``); ``OurTurns.find`` cannot place them, so a
    rewrite renders them as context."""
    if m.role != "assistant":
        return False
    if m.turn_ref:
        return m.turn_ref == turn.turn_id
    calls, ids = m.tool_calls, turn.call_ids
    if ids and calls and not any(c.id for c in calls):
        return tuple(c.name for c in calls) == turn.call_names
    if ids:
        return len(calls) == len(ids) and all(c.id == i for c, i in zip(calls, ids, strict=True))
    return not calls and m.content.strip() == turn.text.strip()


class OurTurns:
    """Every turn of the trial, findable from the harness's copy of it, with the
    thread it was sampled in."""

    def __init__(self) -> None:
        self._by_ref: dict[str, OurTurn] = {}
        self._by_call: dict[str, OurTurn] = {}
        self._by_text: dict[str, OurTurn] = {}
        self.thread_of: dict[str, Thread] = {}  # turn id -> thread
        self.quotable: list[tuple[str, Thread]] = []  # text turns a summary can quote

    def add(self, turn: OurTurn, thread: Thread) -> None:
        self._by_ref[turn.turn_id] = turn
        self.thread_of[turn.turn_id] = thread
        for cid in turn.call_ids:
            self._by_call[cid] = turn
        if not turn.call_ids:
            self._by_text[turn.text.strip()] = turn
            # Harnesses quote a summary in pieces: Claude Code keeps what is inside
            # <summary>, drops <analysis>. Lines outside tags are the unit.
            pieces = (p.strip() for p in _QUOTE_SPLIT.split(turn.text))
            self.quotable += [(p, thread) for p in pieces if len(p) >= QUOTE_MIN_CHARS]

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
    # The harness's own messages of the last call (``history`` minus the turn sampled
    # since): what the next request most likely starts with, byte for byte.
    last_messages: tuple[Message, ...] = ()
    parts: int = 0
    version: int = 0
    closed: bool = False
    # What the engine sampled this segment's turns with (``sampling.Chosen.values``):
    # a call sampled otherwise opens the next segment, so a segment has one distribution.
    sampling: tuple[float, ...] = ()

    def extended_by(self, conv: Conversation) -> bool:
        """Does ``conv`` continue this segment (same tools, history as its prefix)?

        Runs on every call over the whole history. Fast path: harnesses resend
        the previous request's messages unchanged, so one C-level tuple compare
        covers them and only the turn sampled since is checked in Python."""
        h, msgs = self.history, conv.messages
        if self.closed or len(msgs) < len(h) or conv.tools != self.tools:
            return False
        k = len(self.last_messages)
        start = k if msgs[:k] == self.last_messages else 0
        for i in range(start, len(h)):
            m, e = msgs[i], h[i]
            if e.__class__ is OurTurn:
                if not recognises(m, e):  # type: ignore[arg-type]
                    return False
            elif m != e:
                return False
        return True


@dataclass(eq=False)
class Thread:
    name: str
    kind: str  # main | subagent | side
    trainable: bool
    system: str
    root: Message | None  # first message of the conversation this thread carries
    # A side call over another thread's conversation (a summary request over the
    # main history): a quote of its answer continues that thread.
    forked_from: Thread | None = None
    # The agent thread that spawned this one, as the harness said (ThreadHint).
    parent: Thread | None = None
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0

    @property
    def lineage(self) -> Thread:
        return self.forked_from or self

    @property
    def current(self) -> Segment | None:
        """The one open segment (segments of a thread are sequential)."""
        seg = self.segments[-1] if self.segments else None
        return seg if seg is not None and not seg.closed else None


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
    sampling: records_pb2.SegmentSampling | None = None  # only on part 0: what the segment was sampled with


class TrialCapture:
    """All threads of one trial. Not thread-safe: call from one event loop."""

    def __init__(
        self,
        renderer: Renderer,
        *,
        trainable_kinds: Sequence[str] = ("main", "subagent"),
        main_requires_tools: bool = True,
        render_check: bool = False,
    ) -> None:
        self.renderer = renderer
        self.threads: dict[str, Thread] = {}
        self._by_system: dict[str, list[Thread]] = {}
        self._ours = OurTurns()
        self._trainable = set(trainable_kinds)
        self._main_requires_tools = main_requires_tools
        self._render_check = render_check
        self._counts = {"subagent": 0, "side": 0, ABANDONED: 0}
        self._last_agent: Thread | None = None  # the agent thread of the latest committed turn
        self._by_hint: dict[str, Thread] = {}  # harness thread id -> thread
        self.render_mismatches = 0

    # -- planning -------------------------------------------------------------

    def plan(self, conv: Conversation) -> Plan:
        if conv.thread_hint is not None and conv.tools:
            return self._plan_hinted(conv, conv.thread_hint)
        same_system = self._by_system.get(conv.system, [])
        for thread in same_system:
            seg = thread.current
            if seg is not None and seg.extended_by(conv):
                plan = self._plan_extension(thread, seg, conv)
                if plan is not None:
                    return plan
        history = [self._ours.find(m) or m for m in conv.messages]
        thread = self._place(conv, same_system, history)
        prompt = self.renderer.full(conv, _sampled_list(history))
        return Plan(thread, conv, prompt, None, 0, b"", history)

    def _plan_hinted(self, conv: Conversation, hint: ThreadHint) -> Plan:
        """The harness names the thread: its id continues that thread (an extension,
        else a rewrite); a new id is main if there is no main yet (or main had no id
        and this is no sub-agent), else a new ``subagent-N`` under the named parent."""
        thread = self._by_hint.get(hint.thread_id)
        main = self.threads.get(MAIN)
        if thread is None and hint.source != "subagent" and main and main not in self._by_hint.values():
            thread = self._by_hint[hint.thread_id] = main
        if thread is not None:
            seg = thread.current
            if seg is not None and seg.extended_by(conv):
                plan = self._plan_extension(thread, seg, conv)
                if plan is not None:
                    return plan
        history = [self._ours.find(m) or m for m in conv.messages]
        if thread is None:
            thread = self._new_thread(conv, None)  # main if none yet, else subagent-N
            if thread.kind == "subagent":
                thread.parent = self._by_hint.get(hint.parent_id) or self.threads.get(MAIN)
            self._by_hint[hint.thread_id] = thread
            log.debug("hinted thread", extra=kv(thread=thread.name, harness_thread=hint.thread_id))
        prompt = self.renderer.full(conv, _sampled_list(history))
        return Plan(thread, conv, prompt, None, 0, b"", history)

    def _plan_extension(self, thread: Thread, seg: Segment, conv: Conversation) -> Plan | None:
        new = conv.messages[len(seg.history) :]
        if any(self._ours.find(m) is not None for m in new):
            return None  # an own turn outside this segment: render from scratch to reuse it
        last = seg.history[-1]
        assert isinstance(last, OurTurn)
        delta = self.renderer.extension(last.sampled, new).tobytes()
        history = [*seg.history, *new]
        prompt = b"".join((seg.context, delta))  # one copy of the context
        if self._render_check:
            full = self.renderer.full(conv, _sampled_list(history))
            if full != prompt:
                self.render_mismatches += 1
                log.warning("incremental render differs from full render", extra=kv(thread=thread.name))
                return None
        return Plan(thread, conv, prompt, seg, seg.version, delta, history)

    def _place(self, conv: Conversation, same_system: list[Thread], history: list[Entry]) -> Thread:
        """The thread of a request that extends no open segment (rule 4 above):
        the conversation it carries over, rewritten, else a new thread."""
        carried = self._carried_over(conv, same_system, history)
        if carried is not None and self._accepts(carried, conv):
            return carried
        return self._new_thread(conv, carried)

    def _carried_over(self, conv: Conversation, same_system: list[Thread], history: list[Entry]) -> Thread | None:
        first = conv.messages[0] if conv.messages else None
        same_root = [t for t in same_system if t.root == first]
        accepted = [t for t in same_root if self._accepts(t, conv)]
        if accepted:
            return accepted[-1]
        for e in reversed(history):
            if isinstance(e, OurTurn):
                return self._ours.thread_of[e.turn_id].lineage
        quoted = self._quoted(conv)
        if quoted is not None:
            return quoted.lineage
        return same_root[-1].lineage if same_root else None

    def _quoted(self, conv: Conversation) -> Thread | None:
        """The thread of the latest own text turn that a message quotes (a summary)."""
        if not self._ours.quotable:
            return None
        contents = [m.content for m in conv.messages if len(m.content) >= QUOTE_MIN_CHARS]
        for text, thread in reversed(self._ours.quotable):
            if any(text in c for c in contents):
                return thread
        return None

    def _accepts(self, thread: Thread, conv: Conversation) -> bool:
        """Can ``conv`` continue ``thread``? An agent's request never continues a side
        thread; a tool-less one is a side call, not the agent (``main_requires_tools``)."""
        if conv.tools:
            return thread.kind != SIDE
        return thread.kind == SIDE or not self._main_requires_tools

    def _new_thread(self, conv: Conversation, carried: Thread | None) -> Thread:
        if MAIN not in self.threads and (conv.tools or not self._main_requires_tools):
            name = kind = MAIN
        else:
            kind = "subagent" if conv.tools else SIDE
            self._counts[kind] += 1
            name = f"{kind}-{self._counts[kind]}"
        root = conv.messages[0] if conv.messages else None
        forked_from = None
        if kind == SIDE:
            forked_from = carried.lineage if carried is not None else self._last_agent
        thread = Thread(name, kind, kind in self._trainable, conv.system, root, forked_from)
        self.threads[name] = thread
        self._by_system.setdefault(conv.system, []).append(thread)
        log.debug("new thread", extra=kv(thread=name, forked_from=forked_from.name if forked_from else ""))
        return thread

    # -- committing -----------------------------------------------------------

    def commit(
        self, plan: Plan, sampled: Sampled, turn: OurTurn, sampling: records_pb2.SegmentSampling | None = None
    ) -> list[Part]:
        """Records a finished call; returns the parts to append, in order. A call
        that does not extend the thread's open segment (as planned, and still open
        and unchanged) or was sampled with other parameters closes it and opens the
        next one, whose prompt is the whole context (nothing lost, nothing trained twice)."""
        thread, parts = plan.thread, []
        seg = plan.extends
        values = _values(sampling)
        if seg is not None and seg is thread.current and seg.version == plan.base_version and seg.sampling == values:
            parts.append(Part(thread, seg.index, seg.parts, None, plan.delta, sampled, False))
            seg.context += plan.delta
        else:
            if thread.current is not None:
                parts.append(self._close(thread, thread.current))
            seg = Segment(len(thread.segments), plan.conv.tools, bytearray(plan.prompt), [], sampling=values)
            thread.segments.append(seg)
            parts.append(Part(thread, seg.index, 0, plan.prompt, b"", sampled, False, sampling))
        seg.context += sampled.ids
        seg.history = [*plan.history, turn]
        seg.last_messages = plan.conv.messages
        seg.parts += 1
        seg.version += 1
        thread.root = plan.conv.messages[0] if plan.conv.messages else None
        if thread.system != plan.conv.system:  # a rewrite under another system prompt
            self._by_system[thread.system].remove(thread)
            self._by_system.setdefault(plan.conv.system, []).append(thread)
            thread.system = plan.conv.system
        thread.calls += 1
        self._ours.add(turn, thread)
        if thread.kind != SIDE:
            self._last_agent = thread
        return parts

    def abandoned(
        self, plan: Plan, sampled: Sampled, sampling: records_pb2.SegmentSampling | None = None
    ) -> list[Part]:
        """Records a call whose client left mid-answer, for audit: a thread of its own
        (``abandoned-N``, kind ``abandoned``, not trainable whatever the config says)
        holding one closed segment, the call's whole prompt and what the engine sampled
        before the call was stopped. Nothing else changes: the thread the call was planned
        on is not extended (the harness's next request does not hold this turn), and no
        later call is planned on this one."""
        self._counts[ABANDONED] += 1
        name = f"{ABANDONED}-{self._counts[ABANDONED]}"
        root = plan.conv.messages[0] if plan.conv.messages else None
        thread = Thread(name, ABANDONED, False, plan.conv.system, root, calls=1)
        seg = Segment(0, plan.conv.tools, bytearray(), [], parts=1, sampling=_values(sampling))
        thread.segments.append(seg)
        self.threads[name] = thread
        return [Part(thread, 0, 0, plan.prompt, b"", sampled, False, sampling), self._close(thread, seg)]

    @staticmethod
    def _close(thread: Thread, seg: Segment) -> Part:
        seg.closed = True
        part = Part(thread, seg.index, seg.parts, None, b"", None, True)
        seg.parts += 1
        return part

    def close_all(self) -> list[Part]:
        return [self._close(t, s) for t in self.threads.values() for s in t.segments if not s.closed]

    def release(self) -> None:
        """Frees the token and message state of a closed trial; counts stay for its summary."""
        for thread in self.threads.values():
            for seg in thread.segments:
                seg.context, seg.history, seg.last_messages = bytearray(), [], ()
        self._ours = OurTurns()


def _values(sampling: records_pb2.SegmentSampling | None) -> tuple[float, ...]:
    """What the engine sampled with (provenance aside): equal values, same distribution."""
    if sampling is None:
        return ()
    return (sampling.temperature, sampling.top_p, float(sampling.top_k), sampling.min_p)


def _sampled_list(history: Sequence[Entry]) -> list[SampledIds | None]:
    return [e.sampled if isinstance(e, OurTurn) else None for e in history]


def as_messages(history: Sequence[Entry]) -> list[Message]:
    """For diagnostics: history with our turns as plain assistant messages."""
    return [e if isinstance(e, Message) else Message("assistant", e.text) for e in history]
