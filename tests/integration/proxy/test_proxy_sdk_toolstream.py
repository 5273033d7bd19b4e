"""Tool-call arguments stream as the engine samples them, through the official
``openai`` (chat completions and responses) and ``anthropic`` SDKs, against the
real proxy, the gateway's scripted engine sending one token per chunk (with a
pause between chunks) and a capture store over gRPC.

For each protocol: the call's name comes first, its arguments arrive in many
deltas, the first long before the engine has sampled the last token, the
deltas reassemble (and the SDK's own accumulator assembles) exactly the
arguments of the call in the capture (the sampled tokens read back and parsed),
and the next turn, sent back with the streamed call id, extends the same
segment. A call the model never closes ends as text and is counted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from harnessrl.paths import default_model_dir
from services.proxy.chat.conversation import Tool
from services.proxy.chat.tokenizer import Tokenizer
from services.proxy.chat.toolparsers import HermesParser
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

DELAY = 0.01  # seconds between the engine's chunks (one token each)
COMMAND = 'grep -rn "def parse" src/ | head -20 && echo "{done}" && python -m pytest tests/test_parse.py -x -q'
CALLS = [
    {"name": "bash", "arguments": {"command": COMMAND, "timeout": 30}},
    {"name": "bash", "arguments": {"command": 'cat "a b".txt'}},
]
MAIN = [{"content": "Let me look.", "tool_calls": CALLS}, {"content": "Both done."}]
UNCLOSED = 'Sure. <tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /tmp'
PARAMS = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}
OPENAI_BASH = {"type": "function", "function": {"name": "bash", "description": "Run", "parameters": PARAMS}}
RESPONSES_BASH = {"type": "function", "name": "bash", "description": "Run", "parameters": PARAMS}
ANTHROPIC_BASH = {"name": "bash", "description": "Run", "input_schema": PARAMS}
EXPECTED = [json.dumps(c["arguments"]) for c in CALLS]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("toolstream")
    threads = {"main": MAIN, "unclosed": [{"raw": UNCLOSED}], "*": [{"raw": UNCLOSED}]}
    s = Stack(tmp, script(tmp, threads, chunk_tokens=1, chunk_delay_s=DELAY))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(default_model_dir())


def captured_calls(stack: Stack, trial: str, tok: Tokenizer) -> list[str]:
    """The arguments of the first turn's calls as the capture holds them: its sampled
    tokens read back from the store, decoded and parsed; the trial is one segment."""
    summary = stack.close_trial(trial)
    segments = stack.export(trial)
    check_faithful(segments, stack.engine_log(), trial)
    assert summary["num_segments"] == 1 and len(segments) == 1, "the streamed call id was recognised"
    seg = segments[0]
    first_run = seg["response_ids"][: seg["response_mask"].index(0)]
    text = tok.decode(first_run, skip_special_tokens=True)
    tools = (Tool("bash", "", PARAMS),)
    return [json.dumps(c.arguments, ensure_ascii=False) for c in HermesParser().parse(text, tools).calls]


def streamed_well(times: list[float], end: float, deltas: int) -> None:
    """Many deltas, the first while the engine still had most of the call to sample."""
    assert deltas > 10, f"arguments arrived in only {deltas} deltas"
    remaining = sum(1 for t in times if t > times[0])
    assert end - times[0] > 0.5 * DELAY * remaining, "the first delta came long before the end"


def test_openai_chat_tool_arguments_stream(stack: Stack, tok: Tokenizer) -> None:
    base, token = stack.new_trial("ts-chat")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the parser."}]
    args: dict[int, list[tuple[float, str]]] = {}
    starts: list[tuple[int, str, str]] = []
    with c.chat.completions.stream(model=MODEL, messages=messages, tools=[OPENAI_BASH]) as stream:  # type: ignore[list-item, arg-type]
        for event in stream:
            if event.type != "chunk" or not event.chunk.choices:
                continue
            delta = event.chunk.choices[0].delta
            assert not (delta.content and starts), "text comes before the calls"
            for tc in delta.tool_calls or ():
                if tc.id:
                    assert tc.function is not None and tc.function.name and not tc.function.arguments
                    starts.append((tc.index, tc.id, tc.function.name))
                elif tc.function and tc.function.arguments:
                    assert starts and starts[-1][0] >= tc.index, "arguments after their call's start"
                    args.setdefault(tc.index, []).append((time.monotonic(), tc.function.arguments))
        end = time.monotonic()
        final = stream.get_final_completion()
    assert [(i, n) for i, _, n in starts] == [(0, "bash"), (1, "bash")]
    assert ["".join(p for _, p in args[i]) for i in (0, 1)] == EXPECTED
    streamed_well([t for t, _ in args[0]], end, len(args[0]))
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and message.content == "Let me look."
    sdk_calls = message.tool_calls or []
    assert [(tc.id, tc.function.arguments) for tc in sdk_calls] == list(
        zip([s[1] for s in starts], EXPECTED, strict=True)
    )  # type: ignore[union-attr]
    messages.append(message.model_dump(exclude_none=True))
    for tc in sdk_calls:
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": "ok"})
    r2 = c.chat.completions.create(model=MODEL, messages=messages, tools=[OPENAI_BASH])  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "Both done."
    assert captured_calls(stack, "ts-chat", tok) == EXPECTED


def test_anthropic_input_json_deltas_stream(stack: Stack, tok: Tokenizer) -> None:
    base, token = stack.new_trial("ts-anthropic")
    c = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the parser."}]
    blocks: list[str] = []
    partial: dict[int, list[tuple[float, str]]] = {}
    with c.messages.stream(model=MODEL, max_tokens=1000, messages=messages, tools=[ANTHROPIC_BASH]) as stream:  # type: ignore[arg-type, list-item]
        for event in stream:
            if event.type == "content_block_start":
                blocks.append(event.content_block.type)
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                assert blocks[event.index] == "tool_use", "input arrives inside its tool_use block"
                partial.setdefault(event.index, []).append((time.monotonic(), event.delta.partial_json))
        end = time.monotonic()
        final = stream.get_final_message()
    assert blocks == ["text", "tool_use", "tool_use"]
    assert ["".join(p for _, p in partial[i]) for i in (1, 2)] == EXPECTED
    streamed_well([t for t, _ in partial[1]], end, len(partial[1]))
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [b.input for b in uses] == [c["arguments"] for c in CALLS]  # the SDK's own assembly
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in uses]
    messages.append({"role": "user", "content": results})
    r2 = c.messages.create(model=MODEL, max_tokens=1000, messages=messages, tools=[ANTHROPIC_BASH])  # type: ignore[arg-type, list-item]
    assert r2.content[0].type == "text" and r2.content[0].text == "Both done."
    assert captured_calls(stack, "ts-anthropic", tok) == EXPECTED


def test_responses_function_call_arguments_stream(stack: Stack, tok: Tokenizer) -> None:
    base, token = stack.new_trial("ts-responses")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find the parser."}]
    deltas: dict[str, list[tuple[float, str]]] = {}
    added: list[str] = []
    done: dict[str, str] = {}
    with c.responses.stream(model=MODEL, input=items, tools=[RESPONSES_BASH]) as stream:  # type: ignore[arg-type, list-item]
        for event in stream:
            if event.type == "response.output_item.added":
                added.append(event.item.type)
            elif event.type == "response.function_call_arguments.delta":
                assert added[event.output_index] == "function_call"
                deltas.setdefault(event.item_id, []).append((time.monotonic(), event.delta))
            elif event.type == "response.function_call_arguments.done":
                done[event.item_id] = event.arguments
        end = time.monotonic()
        final = stream.get_final_response()
    assert added == ["message", "function_call", "function_call"]
    ids = list(deltas)
    assert ["".join(p for _, p in deltas[i]) for i in ids] == EXPECTED == [done[i] for i in ids]
    streamed_well([t for t, _ in deltas[ids[0]]], end, len(deltas[ids[0]]))
    calls = [o for o in final.output if o.type == "function_call"]
    assert [o.arguments for o in calls] == EXPECTED and [o.id for o in calls] == ids
    items += [o.model_dump(exclude_none=True) for o in final.output]
    items += [{"type": "function_call_output", "call_id": o.call_id, "output": "ok"} for o in calls]
    r2 = c.responses.create(model=MODEL, input=items, tools=[RESPONSES_BASH])  # type: ignore[arg-type, list-item]
    assert r2.output_text == "Both done."
    assert captured_calls(stack, "ts-responses", tok) == EXPECTED


def test_an_unclosed_call_ends_as_text_and_is_counted(stack: Stack) -> None:
    base, token = stack.new_trial("ts-unclosed")
    # Without tools the call is a side thread: it plays the unclosed reply.
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}], stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    pieces = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or ()]
    assert content == UNCLOSED, "the whole text comes back as text, as unstreamed"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    streamed = "".join(tc.function.arguments or "" for tc in pieces if tc.function)
    with pytest.raises(ValueError):
        json.loads(streamed)  # what streamed of the call never parses
    a = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
    with a.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "go"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[-1].type == "text"
    assert final.content[-1].text.endswith('"ls -la /tmp')
    summary = stack.close_trial("ts-unclosed")
    assert summary["malformed_tool_calls"] == 2
