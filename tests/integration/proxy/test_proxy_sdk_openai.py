"""Contract tests with the official ``openai`` SDK (chat completions and
responses), streaming and not, tools and not, against the real proxy, the
gateway's scripted engine and a capture store over real gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
MAIN = [
    {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]},
    {"reasoning": "The listing shows one file.", "content": "There is one file: a.txt. Done."},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("openai")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "A title"}]}, chunk_tokens=2))
    yield s
    s.stop()


def client(stack: Stack, trial: str, **spec: object) -> openai.OpenAI:
    base, token = stack.new_trial(trial, **spec)
    return openai.OpenAI(base_url=base, api_key=token, max_retries=0)


def test_tool_loop_non_streaming(stack: Stack) -> None:
    c = client(stack, "oa-1")
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "What files are here?"},
    ]
    r1 = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH])  # type: ignore[arg-type]
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    assert r1.usage is not None and r1.usage.prompt_tokens > 50 and r1.usage.completion_tokens > 5
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.txt"})
    r2 = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH])  # type: ignore[arg-type]
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "There is one file: a.txt. Done."
    assert r2.choices[0].message.reasoning_content == "The listing shows one file."  # type: ignore[attr-defined]
    summary = stack.close_trial("oa-1")
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (2, 1, 0)
    assert summary["threads"][0]["name"] == "main"
    assert summary["chat_template"] == "hermes-chatml" and len(summary["chat_template_sha256"]) == 64
    segments = stack.export("oa-1")
    assert len(segments) == 1 and segments[0]["closed"] and segments[0]["num_turns"] == 2
    assert segments[0]["chat_template_sha256"] == summary["chat_template_sha256"], "recorded with the capture"
    check_faithful(segments, stack.engine_log(), "oa-1")


def test_streaming_with_usage_is_incremental(stack: Stack) -> None:
    c = client(stack, "oa-2")
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List files."}]
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[BASH],
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
    )
    text = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert "".join(text) == "Let me look." and len(text) > 1, "text arrives in several deltas"
    pieces = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or ()]
    calls = [tc for tc in pieces if tc.id]  # a call's first delta has its id and name; its arguments follow
    args = "".join(tc.function.arguments or "" for tc in pieces)  # type: ignore[union-attr]
    assert [tc.function.name for tc in calls] == ["bash"] and json.loads(args) == {"command": "ls -la"}  # type: ignore[union-attr]
    assert len(pieces) > 2, "the arguments stream in pieces"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        "tool_calls"
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    messages.append(
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": calls[0].id, "type": "function", "function": {"name": "bash", "arguments": args}}],
        }
    )  # type: ignore[dict-item]
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "a.txt"})  # type: ignore[dict-item]
    stream = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH], stream=True)  # type: ignore[arg-type]
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in stream if ch.choices)
    assert reasoning == "The listing shows one file."
    assert stack.close_trial("oa-2")["num_segments"] == 1
    check_faithful(stack.export("oa-2"), stack.engine_log(), "oa-2")


def test_plain_chat_without_tools_is_a_side_thread(stack: Stack) -> None:
    c = client(stack, "oa-3")
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Title for: fix bug"}])
    assert r.choices[0].message.content == "A title" and r.choices[0].message.tool_calls is None
    summary = stack.close_trial("oa-3")
    assert [(t["name"], t["kind"], t["trainable"]) for t in summary["threads"]] == [("side-1", "side", False)]
    check_faithful(stack.export("oa-3"), stack.engine_log(), "oa-3")


def test_models_endpoint(stack: Stack) -> None:
    c = client(stack, "oa-4", model="policy")
    assert {m.id for m in c.models.list()} == {"policy", MODEL}


def test_responses_api_streaming_and_not(stack: Stack) -> None:
    c = client(stack, "oa-5")
    tools = [{"type": "function", "name": "bash", "description": "Run", "parameters": BASH["function"]["parameters"]}]  # type: ignore[index]
    items: list[dict[str, object]] = [{"role": "user", "content": "What files are here?"}]
    r1 = c.responses.create(model=MODEL, instructions="You are an agent.", input=items, tools=tools)  # type: ignore[arg-type]
    kinds = [o.type for o in r1.output]
    assert kinds == ["message", "function_call"], kinds
    fc = r1.output[1]
    assert fc.name == "bash" and json.loads(fc.arguments) == {"command": "ls -la"}  # type: ignore[union-attr]
    items += [o.model_dump(exclude_none=True) for o in r1.output]
    items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt"})  # type: ignore[union-attr]
    events = list(
        c.responses.create(model=MODEL, instructions="You are an agent.", input=items, tools=tools, stream=True)
    )  # type: ignore[arg-type]
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]  # type: ignore[union-attr]
    assert "".join(deltas) == "There is one file: a.txt. Done." and len(deltas) > 1
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.usage.output_tokens > 0
    summary = stack.close_trial("oa-5")
    assert (summary["num_turns"], summary["num_segments"]) == (2, 1)
    check_faithful(stack.export("oa-5"), stack.engine_log(), "oa-5")


def test_stop_strings_cut_the_text_and_the_capture_alike(stack: Stack) -> None:
    c = client(stack, "oa-6")
    messages: list[dict[str, object]] = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "Go."}]
    r1 = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH], stop=["look"])  # type: ignore[arg-type]
    assert r1.choices[0].message.content == "Let me" and r1.choices[0].finish_reason == "stop"
    assert r1.choices[0].message.tool_calls is None
    messages.append({"role": "assistant", "content": "Let me"})
    messages.append({"role": "user", "content": "Go on."})
    r2 = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH])  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "There is one file: a.txt. Done."
    summary = stack.close_trial("oa-6")
    assert (summary["num_turns"], summary["num_segments"]) == (2, 1), "the cut turn is recognised and extended"
    check_faithful(stack.export("oa-6"), stack.engine_log(), "oa-6")
