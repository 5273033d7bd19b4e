"""The capture state machine (invariants 1-4), scenario by scenario and as a
property over random harness behaviour."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.proxy.capture.state import OurTurn, Sampled, TrialCapture
from services.proxy.chat.conversation import Message, Tool, ToolCall
from services.proxy.chat.render import Renderer, SampledIds
from tests.unit.proxy.capture_harness import BASH, EDIT, Harness, conv, i32, ids


def test_first_turn_renders_prompt_and_later_turns_extend(harness: Harness, renderer: Renderer) -> None:
    u = Message("user", "do it")
    a1, p1 = harness.call(conv(u))
    assert p1.extends is None and p1.prompt == renderer.full(conv(u), [None])
    t1 = Message("tool", "out 1", tool_call_id="call_1")
    a2, p2 = harness.call(conv(u, a1, t1))
    assert p2.extends is not None
    # the extension tokenizes only the tail and the new message
    assert renderer.tokenizer.decode(ids(p2.delta), skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\nout 1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    harness.call(conv(u, a1, t1, a2, Message("tool", "out 2", tool_call_id="call_2")), with_tool=False)
    parts = [(p.thread.name, p.segment_index, p.part_index) for p in harness.parts]
    assert parts == [("main", 0, 0), ("main", 0, 1), ("main", 0, 2)]
    assert harness.capture.render_mismatches == 0
    harness.check_invariants()


def test_reserialised_arguments_and_renamed_tools_still_extend(harness: Harness) -> None:
    u = Message("user", "go")
    _a1, _ = harness.call(conv(u))
    # Claude Code echoes the call with other whitespace and another tool name.
    echoed = Message("assistant", "", (ToolCall("call_1", "Bash", '{\n  "command":"echo 1"\n}'),))
    _, p2 = harness.call(conv(u, echoed, Message("tool", "1", tool_call_id="call_1")))
    assert p2.extends is not None
    harness.check_invariants()


def test_text_only_turn_is_recognised_by_text(harness: Harness) -> None:
    u = Message("user", "hi")
    _a1, _ = harness.call(conv(u), with_tool=False)
    _, p2 = harness.call(conv(u, Message("assistant", "  text 1\n"), Message("user", "and?")))
    assert p2.extends is not None
    harness.check_invariants()


@pytest.mark.parametrize("rewrite", ["reminder", "compaction", "tools", "retry", "foreign_assistant"])
def test_rewrites_close_the_segment_and_open_a_new_one(harness: Harness, rewrite: str) -> None:
    u = Message("user", "task")
    a1, _ = harness.call(conv(u))
    t1 = Message("tool", "r1", tool_call_id="call_1")
    a2, _ = harness.call(conv(u, a1, t1))
    t2 = Message("tool", "r2", tool_call_id="call_2")
    tools: tuple[Tool, ...] = (BASH,)
    if rewrite == "reminder":
        msgs = (Message("user", "task\n<system-reminder>x</system-reminder>"), a1, t1, a2, t2)
    elif rewrite == "compaction":
        msgs = (Message("user", "Summary of the conversation so far: ..."), a2, t2)  # keeps the last turn
    elif rewrite == "tools":
        msgs, tools = (u, a1, t1, a2, t2), (BASH, EDIT)
    elif rewrite == "retry":
        msgs = (u, a1, t1)  # the harness dropped turn 2 and asks again
    else:
        msgs = (u, Message("assistant", "I was never sampled"), t1)
    _, plan = harness.call(conv(*msgs, tools=tools))
    assert plan.extends is None
    names = [(p.segment_index, p.part_index, p.close) for p in harness.parts]
    assert (0, 2, True) in names and (1, 0, False) in names
    assert names.index((0, 2, True)) < names.index((1, 0, False)), "the old segment closes first"
    harness.check_invariants()


def test_new_segment_reuses_own_turns_verbatim_in_its_prompt(harness: Harness) -> None:
    u = Message("user", "task")
    a1, _ = harness.call(conv(u))
    t1 = Message("tool", "r1", tool_call_id="call_1")
    _, plan = harness.call(conv(Message("user", "task <system-reminder>"), a1, t1))
    assert plan.extends is None
    first_sample = ids(harness.calls[0][1].ids)
    prompt = ids(plan.prompt)
    assert any(prompt[i : i + len(first_sample)] == first_sample for i in range(len(prompt)))
    harness.check_invariants()


def test_threads_by_system_prompt(harness: Harness) -> None:
    harness.call(conv(Message("user", "title for: fix bug"), system="You write titles", tools=()), with_tool=False)
    harness.call(conv(Message("user", "fix bug")))
    harness.call(conv(Message("user", "explore"), system="You are a sub-agent"))
    threads = {name: (t.kind, t.trainable) for name, t in harness.capture.threads.items()}
    assert threads == {"side-1": ("side", False), "main": ("main", True), "subagent-1": ("subagent", True)}
    harness.check_invariants()


def test_parallel_conversations_under_one_system_prompt_are_separate_threads(harness: Harness) -> None:
    ua, ub = Message("user", "agent A"), Message("user", "agent B")
    sys = "sub-agent prompt"
    harness.call(conv(Message("user", "main")))
    a1, _ = harness.call(conv(ua, system=sys))
    b1, _ = harness.call(conv(ub, system=sys))
    _, pa = harness.call(conv(ua, a1, Message("tool", "x", tool_call_id="call_2"), system=sys))
    _, pb = harness.call(conv(ub, b1, Message("tool", "y", tool_call_id="call_3"), system=sys))
    assert pa.extends is not None and pb.extends is not None
    assert (pa.thread.name, pb.thread.name) == ("subagent-1", "subagent-2")
    # a retry of A's first request rewrites A's thread, not B's
    _, retry = harness.call(conv(ua, system=sys))
    assert retry.thread.name == "subagent-1" and retry.extends is None
    harness.check_invariants()


def test_each_side_request_is_its_own_thread_and_segments_stay_sequential(harness: Harness) -> None:
    for i in range(10):
        harness.call(conv(Message("user", f"title for {i}"), system="", tools=()), with_tool=False)
    harness.parts += harness.capture.close_all()
    assert len(harness.capture.threads) == 10
    harness.check_invariants()


def test_concurrent_calls_on_one_segment_never_share_it(harness: Harness) -> None:
    u = Message("user", "go")
    a1, _ = harness.call(conv(u))
    c = conv(u, a1, Message("tool", "r", tool_call_id="call_1"))
    cap = harness.capture
    plan_a, plan_b = cap.plan(c), cap.plan(c)  # two requests in flight at once
    assert plan_a.extends is plan_b.extends is not None
    for n, plan in ((100, plan_a), (200, plan_b)):
        sampled = Sampled(i32([n, 2]), np.zeros(2, "<f4").tobytes(), i32([1, 1]), "stop", True)
        turn = OurTurn(f"t{n}", (f"c{n}",), "", SampledIds(sampled.ids, True))
        harness.parts += cap.commit(plan, sampled, turn)
        harness.calls.append((plan, sampled))
    assert [p.segment_index for p in harness.parts[-2:]] == [0, 1]
    harness.check_invariants()


def test_truncated_turn_without_eos_gets_the_template_end_of_turn_as_context(
    harness: Harness, renderer: Renderer
) -> None:
    u = Message("user", "go")
    a1, _ = harness.call(conv(u), eos=False)
    _, p2 = harness.call(conv(u, a1, Message("tool", "r", tool_call_id="call_1")))
    assert renderer.tokenizer.decode(ids(p2.delta)[:2], skip_special_tokens=False) == "<|im_end|>\n"
    harness.check_invariants()


def test_close_all_closes_every_open_segment_once(harness: Harness) -> None:
    harness.call(conv(Message("user", "a")))
    harness.call(conv(Message("user", "b"), system="other"))
    closing = harness.capture.close_all()
    assert sorted((p.thread.name, p.part_index, p.close, p.sampled) for p in closing) == [
        ("main", 1, True, None),
        ("subagent-1", 1, True, None),
    ]
    assert harness.capture.close_all() == []


# -- property: random harness behaviour never breaks invariants 1-4 ---------------

OPS = ["tool", "user", "reminder", "compact", "retry", "reserialise", "side", "subagent", "tools", "no_eos"]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=14), seed=st.integers(0, 2**16))
def test_random_harness_behaviour_keeps_invariants(renderer: Renderer, ops: list[str], seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(TrialCapture(renderer, render_check=True))
    msgs: list[Message] = [Message("user", "task")]
    tools: tuple[Tool, ...] = (BASH,)
    last, _ = h.call(conv(*msgs, tools=tools))
    main_calls = 1
    for op in ops:
        if op in ("side", "subagent"):
            system = "titles" if op == "side" else f"sub {rng.randint(0, 1)}"
            h.call(conv(Message("user", f"q{rng.random()}"), system=system, tools=() if op == "side" else (BASH,)))
            continue
        main_calls += 1
        if op == "retry":
            h.call(conv(*msgs, tools=tools), with_tool=rng.random() < 0.5)
            continue
        msgs.append(last)
        if op == "reserialise" and last.tool_calls:
            c = last.tool_calls[0]
            msgs[-1] = Message(
                "assistant", "", (ToolCall(c.id, c.name.upper(), json.dumps(json.loads(c.arguments), indent=2)),)
            )
        if last.tool_calls:
            msgs.append(Message("tool", f"result {rng.random()}", tool_call_id=last.tool_calls[0].id))
        if op == "user" or not last.tool_calls:
            msgs.append(Message("user", f"more {rng.random()}"))
        if op == "reminder":
            msgs[0] = Message("user", msgs[0].content + "<system-reminder>r</system-reminder>")
        if op == "compact":  # a summary, then the last turn kept (how it is known to be main)
            msgs = [Message("user", f"summary {rng.random()}"), *msgs[-2:]]
        if op == "tools":
            tools = (BASH, EDIT) if tools == (BASH,) else (BASH,)
        last, _ = h.call(conv(*msgs, tools=tools), with_tool=rng.random() < 0.8, eos=op != "no_eos")
    h.parts += h.capture.close_all()
    h.check_invariants()
    assert h.capture.render_mismatches == 0
    assert all(seg["closed"] for seg in h.segments().values())
    assert h.capture.threads["main"].calls == main_calls, "every call of the top-level loop is main's"


def test_bench_overhead_rows_are_well_formed(renderer: Renderer) -> None:
    """The benchmark's code path (not its timings): a session grows, turns extend."""
    from harnessrl.paths import default_model_dir
    from services.proxy.bench import measure_overhead
    from services.proxy.chat.model import ChatModel

    model = ChatModel.load(default_model_dir(), [], "auto", {"SmolLM2-135M-Instruct": "hermes-chatml"}, "hermes", True)
    [row] = measure_overhead(model, (600,), 2)
    assert row.context_tokens >= 600 and row.core_median_ms > 0 and row.naive_median_ms > 0


def test_a_tool_less_call_under_the_main_prompt_is_a_side_call(harness: Harness) -> None:
    u = Message("user", "task")
    a1, _ = harness.call(conv(u))
    _, side = harness.call(conv(Message("user", "Summarize the session in 5 words"), tools=()), with_tool=False)
    assert side.thread.name == "side-1"
    _, p3 = harness.call(conv(u, a1, Message("tool", "r", tool_call_id="call_1")))
    assert p3.extends is not None and p3.thread.name == "main", "the main segment was not disturbed"
    harness.check_invariants()


def test_an_abandoned_call_is_its_own_untrainable_thread_and_the_retry_extends_as_if_it_never_was(
    harness: Harness,
) -> None:
    u = Message("user", "task")
    a1, _ = harness.call(conv(u))
    asked = conv(u, a1, Message("tool", "r1", tool_call_id="call_1"))
    left = harness.capture.plan(asked)  # the client leaves mid-answer: nothing committed on main
    half = Sampled(i32([43001, 43002]), np.full(2, -0.5, "<f4").tobytes(), i32([7, 7]), "abort", False)
    kept = harness.capture.abandoned(left, half)
    thread = kept[0].thread
    assert (thread.name, thread.kind, thread.trainable) == ("abandoned-1", "abandoned", False)
    assert [(p.part_index, p.prompt == left.prompt, p.sampled is half, p.close) for p in kept] == [
        (0, True, True, False),
        (1, False, False, True),
    ]
    _, retry = harness.call(asked)  # the harness retries the same request
    assert retry.thread.name == "main" and retry.extends is not None and retry.prompt == left.prompt
    assert {t.name for t in harness.capture.threads.values()} == {"main", "abandoned-1"}
    harness.check_invariants()
