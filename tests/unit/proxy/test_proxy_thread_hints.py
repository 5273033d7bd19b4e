"""A harness-given thread identity (Codex's x-codex-turn-metadata thread_id)
decides the thread: a sub-agent that starts like main is its own thread."""

from __future__ import annotations

import dataclasses

from services.proxy.chat.conversation import Conversation, Message, ThreadHint
from tests.unit.proxy.capture_harness import Harness, conv

ENV = Message("user", "<environment_context><cwd>/app</cwd></environment_context>")
TASK = Message("user", "Create hello.txt containing hello")
MAIN_HINT = ThreadHint("t-main", "", "")
SUB_HINT = ThreadHint("t-sub", "subagent", "t-main")


def hinted(c: Conversation, hint: ThreadHint) -> Conversation:
    return dataclasses.replace(c, thread_hint=hint)


def test_a_hinted_sub_agent_starting_with_mains_first_message_is_subagent_1(harness: Harness) -> None:
    a1, p1 = harness.call(hinted(conv(ENV, TASK), MAIN_HINT))
    assert p1.thread.name == "main"
    s1, sp = harness.call(hinted(conv(ENV, Message("user", "explore the repo")), SUB_HINT))
    assert sp.thread.name == "subagent-1" and sp.thread.kind == "subagent" and sp.thread.trainable
    assert sp.thread.parent is harness.capture.threads["main"]
    _, sp2 = harness.call(
        hinted(
            conv(ENV, Message("user", "explore the repo"), s1, Message("tool", "x", tool_call_id="call_1")), SUB_HINT
        )
    )
    assert sp2.thread.name == "subagent-1" and sp2.extends is not None
    _, mp = harness.call(hinted(conv(ENV, TASK, a1, Message("tool", "r", tool_call_id="call_1")), MAIN_HINT))
    assert mp.thread.name == "main" and mp.extends is not None
    harness.check_invariants()


def test_mains_compaction_with_the_same_id_stays_main(harness: Harness) -> None:
    harness.call(hinted(conv(ENV, TASK), MAIN_HINT))
    _, p = harness.call(hinted(conv(ENV, Message("user", "summary of earlier work, compacted")), MAIN_HINT))
    assert p.thread.name == "main" and p.extends is None
    assert set(harness.capture.threads) == {"main"}
    harness.check_invariants()


def test_without_a_hint_a_same_start_request_is_read_as_a_rewrite_of_main(harness: Harness) -> None:
    harness.call(conv(ENV, TASK))
    _, p = harness.call(conv(ENV, Message("user", "explore the repo")))
    assert p.thread.name == "main"  # today's rule (the known limit), unchanged


def test_malformed_metadata_is_ignored_and_counted() -> None:
    from services.proxy.responses import thread_hint as th

    before = th.malformed
    assert th.thread_hint({th.KEY: "{not json"}) is None
    assert th.thread_hint({th.KEY: "x" * (th.MAX_CHARS + 1)}) is None
    assert th.thread_hint({th.KEY: '{"thread_id": 5}'}) is None
    assert th.malformed == before + 3
    assert th.thread_hint(None) is None and th.thread_hint({}) is None
    meta = '{"thread_id":"t2","thread_source":"subagent","parent_thread_id":"t1","turn_id":"x"}'
    assert th.thread_hint({th.KEY: meta}) == ThreadHint("t2", "subagent", "t1")
    assert th.thread_hint({th.KEY: {"thread_id": "t1"}}) == ThreadHint("t1", "", "")
