"""Contract tests with the official ``anthropic`` SDK: messages streaming and
not, tools and thinking blocks, count_tokens, ``?beta=true``, against the real
proxy, the scripted engine and a capture store over gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

BASH = {
    "name": "bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
MAIN = [
    {
        "reasoning": "I should list files.",
        "content": "Listing.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
    },
    {"content": "Done: a.txt"},
]
SYSTEM = [
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Be brief."},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("anthropic")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "Title"}]}, chunk_tokens=3))
    yield s
    s.stop()


def client(stack: Stack, trial: str) -> anthropic.Anthropic:
    base, token = stack.new_trial(trial)
    return anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)


def echo(content: list[Any]) -> list[dict[str, Any]]:
    """What Claude Code sends back: the blocks, arguments re-serialised, tool renamed."""
    out = []
    for b in content:
        d = b.model_dump(exclude_none=True)
        if d["type"] == "tool_use":
            d["name"] = d["name"].capitalize()
        out.append(d)
    return out


def test_tool_loop_non_streaming_with_thinking(stack: Stack) -> None:
    c = client(stack, "an-1")
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What files?"}]
    r1 = c.messages.create(model=MODEL, max_tokens=4000, system=SYSTEM, messages=msgs, tools=[BASH])  # type: ignore[arg-type]
    assert [b.type for b in r1.content] == ["thinking", "text", "tool_use"]
    assert r1.stop_reason == "tool_use"
    thinking, text, tool = r1.content
    assert thinking.thinking == "I should list files." and thinking.signature  # type: ignore[union-attr]
    assert text.text == "Listing." and tool.name == "bash" and tool.input == {"command": "ls"}  # type: ignore[union-attr]
    msgs.append({"role": "assistant", "content": echo(r1.content)})
    msgs.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool.id, "content": [{"type": "text", "text": "a.txt"}]},  # type: ignore[union-attr]
                {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
            ],
        }
    )
    r2 = c.messages.create(model=MODEL, max_tokens=4000, system=SYSTEM, messages=msgs, tools=[BASH])  # type: ignore[arg-type]
    assert [b.type for b in r2.content] == ["text"] and r2.stop_reason == "end_turn"
    assert r2.usage.output_tokens > 0 and r2.usage.input_tokens > 0
    summary = stack.close_trial("an-1")
    assert (summary["num_turns"], summary["num_segments"]) == (2, 1), "the echoed turn extends the segment"
    check_faithful(stack.export("an-1"), stack.engine_log(), "an-1")


def test_streaming_event_stream_with_beta_query(stack: Stack) -> None:
    c = client(stack, "an-2")
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What files?"}]
    with c.beta.messages.stream(model=MODEL, max_tokens=64000, system=SYSTEM, messages=msgs, tools=[BASH]) as s:  # type: ignore[arg-type]
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert deltas.count("thinking_delta") >= 2 and deltas.count("text_delta") >= 1
    assert "signature_delta" in deltas and "input_json_delta" in deltas
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"command": "ls"} and final.stop_reason == "tool_use"  # type: ignore[union-attr]
    msgs.append({"role": "assistant", "content": echo(final.content)})
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": final.content[2].id, "content": "a.txt"}]}
    )  # type: ignore[union-attr]
    with c.messages.stream(model=MODEL, max_tokens=100, system=SYSTEM, messages=msgs, tools=[BASH]) as s:  # type: ignore[arg-type]
        text = "".join(s.text_stream)
    assert text == "Done: a.txt"
    assert stack.close_trial("an-2")["num_segments"] == 1
    check_faithful(stack.export("an-2"), stack.engine_log(), "an-2")


def test_count_tokens_matches_the_prompt_the_engine_sees(stack: Stack) -> None:
    c = client(stack, "an-3")
    msgs = [{"role": "user", "content": "What files?"}]
    counted = c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=msgs, tools=[BASH])  # type: ignore[arg-type]
    r = c.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=msgs, tools=[BASH])  # type: ignore[arg-type]
    assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 100


def test_head_probe_and_x_api_key(stack: Stack) -> None:
    base, token = stack.new_trial("an-4")
    assert httpx.head(f"{stack.url}/").status_code == 200
    assert httpx.head(base.removesuffix("/v1")).status_code == 200
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{base}/messages?beta=true", json=body, headers={"x-api-key": token}, timeout=30)
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_stop_sequences(stack: Stack) -> None:
    c = client(stack, "an-5")
    msgs = [{"role": "user", "content": "What files?"}]
    r = c.messages.create(
        model=MODEL, max_tokens=100, system=SYSTEM, messages=msgs, tools=[BASH], stop_sequences=["files"]
    )  # type: ignore[arg-type]
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "files"
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].thinking == "I should list"  # type: ignore[union-attr]
    assert stack.close_trial("an-5")["num_turns"] == 1
    check_faithful(stack.export("an-5"), stack.engine_log(), "an-5", stopped=True)  # the last call was cut
