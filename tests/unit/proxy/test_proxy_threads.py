"""Threads by structure (invariant 4): which conversation a request that extends
no open segment belongs to. A rewrite carries the conversation over (its first
message, an own turn, or a quoted summary); a new conversation carries nothing."""

from __future__ import annotations

from services.proxy.capture.state import QUOTE_MIN_CHARS, TrialCapture
from services.proxy.chat.conversation import Message, ToolCall
from services.proxy.chat.render import Renderer
from tests.unit.proxy.capture_harness import Harness, conv

SUMMARY = "Summary: the user asked for hello.txt; ls showed an empty directory; next, write the file."
TASK = Message("user", "Create hello.txt containing hello")


def two_main_turns(harness: Harness) -> tuple[Message, ...]:
    """The main loop's first two calls; returns the history its third call sends."""
    a1, _ = harness.call(conv(TASK))
    t1 = Message("tool", "r1", tool_call_id="call_1")
    a2, _ = harness.call(conv(TASK, a1, t1))
    return (TASK, a1, t1, a2, Message("tool", "r2", tool_call_id="call_2"))


def segments_of(harness: Harness, thread: str) -> list[int]:
    return sorted({p.segment_index for p in harness.parts if p.thread.name == thread})


def test_a_sub_agent_under_the_main_system_prompt_is_its_own_thread(harness: Harness) -> None:
    """The old rule folded this into main as a rewrite and fragmented main."""
    history = two_main_turns(harness)
    sub_task = Message("user", "Explore the repository and report the layout")
    s1, sp1 = harness.call(conv(sub_task))  # same system prompt, same tools, fresh conversation
    assert sp1.thread.name == "subagent-1" and sp1.thread.kind == "subagent" and sp1.thread.trainable
    _, sp2 = harness.call(conv(sub_task, s1, Message("tool", "tree", tool_call_id="call_3")))
    assert sp2.thread.name == "subagent-1" and sp2.extends is not None
    _, mp = harness.call(conv(*history))  # main resumes where it was: no fragment
    assert mp.thread.name == "main" and mp.extends is not None
    assert segments_of(harness, "main") == [0] and segments_of(harness, "subagent-1") == [0]
    harness.check_invariants()


def test_parallel_sub_agents_under_the_main_prompt_are_separate(harness: Harness) -> None:
    history = two_main_turns(harness)
    a = [harness.call(conv(Message("user", f"sub-task {k}"))) for k in range(3)]
    assert [p.thread.name for _, p in a] == ["subagent-1", "subagent-2", "subagent-3"]
    _, mp = harness.call(conv(*history))
    assert mp.thread.name == "main" and mp.extends is not None
    harness.check_invariants()


def test_compaction_that_keeps_recent_turns_rewrites_main(harness: Harness, renderer: Renderer) -> None:
    history = two_main_turns(harness)
    rewritten = conv(Message("user", "Earlier work, summarised by the harness itself"), *history[3:])
    _, plan = harness.call(rewritten)
    assert plan.thread.name == "main" and plan.extends is None
    assert plan.prompt == renderer.full(rewritten, [None, plan.history[1].sampled, None])  # type: ignore[union-attr]
    assert segments_of(harness, "main") == [0, 1]
    harness.check_invariants()


def test_compaction_through_a_tool_less_summary_call_claude_code_shape(harness: Harness) -> None:
    """The summary request is the main history plus an instruction, without tools:
    a side call forked from main. The compacted context quotes its answer: main."""
    history = two_main_turns(harness)
    ask = Message("user", "Your task is to create a detailed summary of the conversation so far.")
    _, sp = harness.call(conv(*history, ask, tools=()), with_tool=False, text=SUMMARY)
    assert (sp.thread.name, sp.thread.kind, sp.thread.trainable) == ("side-1", "side", False)
    assert sp.thread.forked_from is harness.capture.threads["main"]
    assert harness.capture.threads["main"].current is not None, "the summary call does not touch main"
    compacted = conv(Message("user", f"This session is being continued. {SUMMARY}"), Message("user", "go on"))
    _, mp = harness.call(compacted)
    assert mp.thread.name == "main" and mp.extends is None and segments_of(harness, "main") == [0, 1]
    echo = (harness_turn(harness), Message("tool", "ok", tool_call_id="call_4"))
    _, mp2 = harness.call(conv(*compacted.messages, *echo))
    assert mp2.thread.name == "main" and mp2.extends is not None, "the new segment is extended as usual"
    harness.check_invariants()


def harness_turn(harness: Harness) -> Message:
    """The harness's echo of the last turn (a call to bash with id call_<n>)."""
    n = harness.n
    return Message("assistant", f"text {n}", (ToolCall(f"call_{n}", "bash", f'{{"command": "echo {n}"}}'),))


def test_compaction_whose_summary_main_sampled_itself(harness: Harness) -> None:
    """The summary request carries the tools: it extends main (the top-level loop
    sampled it); the compacted context quoting it is main's next segment."""
    history = two_main_turns(harness)
    tagged = f"<analysis>The user wants a file.</analysis>\n<summary>{SUMMARY}</summary>"
    _, sp = harness.call(conv(*history, Message("user", "Summarise.")), with_tool=False, text=tagged)
    assert sp.thread.name == "main" and sp.extends is not None
    # Claude Code keeps what is inside <summary> and drops the <analysis> block
    _, mp = harness.call(conv(Message("user", f"Previously:\n{SUMMARY}\nGo on.")))
    assert mp.thread.name == "main" and mp.extends is None and set(harness.capture.threads) == {"main"}
    harness.check_invariants()


def test_a_short_quote_is_no_evidence(harness: Harness) -> None:
    harness.call(conv(TASK), with_tool=False, text="Done.")
    assert len("Done.") < QUOTE_MIN_CHARS
    _, plan = harness.call(conv(Message("user", "Check whether it is Done. Then report.")))
    assert plan.thread.name == "subagent-1"


def test_tools_decide_between_agent_and_side_threads(harness: Harness) -> None:
    """A title request with the task as its first message comes first: the agent's
    request with the same first message is still the main thread, not the side one."""
    _, title = harness.call(conv(TASK, tools=()), with_tool=False)
    _, main = harness.call(conv(TASK))
    _, retry = harness.call(conv(TASK, tools=()), with_tool=False)
    assert (title.thread.name, main.thread.name, retry.thread.name) == ("side-1", "main", "side-1")
    harness.check_invariants()


def test_a_rewrite_under_a_changed_system_prompt_stays_main(harness: Harness) -> None:
    """A harness that refreshes its system prompt (a date, an environment block)
    and keeps its turns rewrites main; later calls extend the new segment."""
    history = two_main_turns(harness)
    _, p1 = harness.call(conv(*history, system="S, refreshed"))
    assert p1.thread.name == "main" and p1.extends is None
    echo = (harness_turn(harness), Message("tool", "r3", tool_call_id="call_3"))
    _, p2 = harness.call(conv(*history, *echo, system="S, refreshed"))
    assert p2.thread.name == "main" and p2.extends is not None
    harness.check_invariants()


def test_side_threads_follow_trainable_kinds(renderer: Renderer) -> None:
    h = Harness(TrialCapture(renderer, trainable_kinds=("main", "subagent", "side")))
    h.call(conv(TASK))
    _, side = h.call(conv(Message("user", "A title for this"), system="titles", tools=()), with_tool=False)
    assert side.thread.kind == "side" and side.thread.trainable
    h.check_invariants()


def test_compaction_through_a_summary_call_that_carries_nothing_openhands_shape(harness: Harness) -> None:
    """The OpenHands SDK's condenser sends the forgotten events as text under its own
    prompt: nothing carried over, so the call forks from the agent thread whose turn
    came last. The condensed view (the summary, the last event) quotes the summary:
    main's next segment, not a new sub-agent."""
    history = two_main_turns(harness)
    events = Message("user", "<EVENT>ran ls</EVENT><EVENT>wrote the file</EVENT> Summarise these events.")
    _, sp = harness.call(conv(events, system="", tools=()), with_tool=False, text=SUMMARY)
    assert sp.thread.kind == "side" and sp.thread.forked_from is harness.capture.threads["main"]
    _, mp = harness.call(conv(Message("user", SUMMARY), history[-1]))
    assert mp.thread.name == "main" and mp.extends is None
    assert set(harness.capture.threads) == {"main", "side-1"}
    harness.check_invariants()


def test_a_side_call_before_any_agent_turn_forks_from_nothing(harness: Harness) -> None:
    _, side = harness.call(
        conv(Message("user", "Summarise the repository"), system="s", tools=()), with_tool=False, text=SUMMARY
    )
    assert side.thread.forked_from is None
    _, p = harness.call(conv(Message("user", SUMMARY)))  # the first agent call is main whatever it quotes
    assert p.thread.name == "main"
    _, q = harness.call(
        conv(Message("user", f"Also: {SUMMARY}"))
    )  # a side thread's quote never makes a sub-agent main's
    assert q.thread.name == "subagent-1"
