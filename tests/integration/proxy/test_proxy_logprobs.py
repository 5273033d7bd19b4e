"""Logprobs to OpenAI clients that ask, with the official ``openai`` SDK against
the real proxy, the gateway's scripted engine and the capture store: chat
completions (``logprobs`` / ``top_logprobs``) and Responses (``include``), streamed
and not, match the captured segment token for token; bad values get OpenAI's 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.responses import (
    FunctionToolParam,
    ResponseCompletedEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from harnessrl.paths import default_model_dir
from services.proxy.chat.tokenizer import Tokenizer
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
BASH: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "bash", "description": "Run a shell command", "parameters": PARAMETERS},
}
RESPONSES_BASH: FunctionToolParam = {
    "type": "function",
    "name": "bash",
    "description": "Run",
    "parameters": PARAMETERS,
    "strict": False,
}
TEXT = "Voilà: naïve café 😀 done."
MAIN = [
    {"reasoning": "Think ✓ first.", "content": TEXT, "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
]
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Go."},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("logprobs")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "Titre 😀"}]}, chunk_tokens=2))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(default_model_dir())


def client(stack: Stack, trial: str) -> openai.OpenAI:
    base, token = stack.new_trial(trial)
    return openai.OpenAI(base_url=base, api_key=token, max_retries=0)


def captured(stack: Stack, trial: str) -> tuple[list[int], list[float]]:
    """The sampled ids and logprobs of the trial's one turn, read back from the capture store."""
    stack.close_trial(trial)
    segments = stack.export(trial)
    check_faithful(segments, stack.engine_log(), trial)
    assert len(segments) == 1 and set(segments[0]["response_mask"]) == {1}
    return segments[0]["response_ids"], segments[0]["response_logprobs"]


def text_part(item: object) -> ResponseOutputText:
    assert isinstance(item, ResponseOutputMessage) and isinstance(item.content[0], ResponseOutputText)
    return item.content[0]


def piece(tok: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """OpenAI's token text: the token's bytes as text, or ``bytes:\\xNN`` when not valid UTF-8."""
    raw = tok.token_bytes(token_id)
    try:
        return raw.decode(), list(raw)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def check_entries(entries: list[Any], ids: list[int], logprobs: list[float], tok: Tokenizer, top: int) -> None:
    """One entry per captured token, in order: the engine's logprob, the token's bytes and
    its decoded text; ``top_logprobs`` the engine's alternatives (the scripted engine
    reports the sampled token first, then the next ids, each 0.5 nats less likely)."""
    assert [e.logprob for e in entries] == logprobs, "exactly the captured logprobs"
    assert [(e.token, e.bytes) for e in entries] == [piece(tok, i) for i in ids]
    assert b"".join(bytes(e.bytes) for e in entries).decode() == tok.decode(ids, skip_special_tokens=False)
    for e, token_id in zip(entries, ids, strict=True):
        expected = [(*piece(tok, token_id + j), float(np.float32(e.logprob - 0.5 * j))) for j in range(top)]
        assert [(t.token, t.bytes, t.logprob) for t in e.top_logprobs] == expected
    assert any(e.token.startswith("bytes:") for e in entries), "the emoji is split across byte-level tokens"
    assert entries[-1].token == tok.eos_text


def test_chat_non_streaming_logprobs_match_the_capture(stack: Stack, tok: Tokenizer) -> None:
    c = client(stack, "lp-1")
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[BASH], logprobs=True, top_logprobs=5)
    choice = r.choices[0]
    assert choice.message.content == TEXT and choice.finish_reason == "tool_calls"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    check_entries(choice.logprobs.content, *captured(stack, "lp-1"), tok, top=5)


def test_chat_streaming_logprobs_arrive_per_chunk_and_match_the_capture(stack: Stack, tok: Tokenizer) -> None:
    c = client(stack, "lp-2")
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=[BASH],
            logprobs=True,
            top_logprobs=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    per_chunk = [ch.choices[0].logprobs.content or [] for ch in chunks if ch.choices and ch.choices[0].logprobs]
    assert sum(1 for p in per_chunk if p) > 3, "logprobs stream with the deltas"
    text_chunks = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert all(ch.choices[0].logprobs and ch.choices[0].logprobs.content for ch in text_chunks)
    check_entries([e for p in per_chunk for e in p], *captured(stack, "lp-2"), tok, top=3)


def test_no_logprobs_unless_asked(stack: Stack) -> None:
    c = client(stack, "lp-3")
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Title?"}], logprobs=False)
    assert r.choices[0].message.content == "Titre 😀" and r.choices[0].logprobs is None
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Title?"}], stream=True)
    assert all(ch.choices[0].logprobs is None for ch in stream if ch.choices)
    c2 = client(stack, "lp-3b")
    r2 = c2.responses.create(model=MODEL, input="Title?")
    assert text_part(r2.output[0]).logprobs is None


def test_responses_non_streaming_logprobs_match_the_capture(stack: Stack, tok: Tokenizer) -> None:
    c = client(stack, "lp-4")
    r = c.responses.create(
        model=MODEL,
        instructions="You are an agent.",
        input="Go.",
        tools=[RESPONSES_BASH],
        include=["message.output_text.logprobs", "reasoning.encrypted_content"],
        top_logprobs=2,
    )
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    part = text_part(r.output[1])
    assert part.text == TEXT and part.logprobs is not None
    check_entries(part.logprobs, *captured(stack, "lp-4"), tok, top=2)


def test_responses_streaming_logprobs_match_the_capture(stack: Stack, tok: Tokenizer) -> None:
    c = client(stack, "lp-5")
    events = list(
        c.responses.create(
            model=MODEL,
            instructions="You are an agent.",
            input="Go.",
            tools=[RESPONSES_BASH],
            include=["message.output_text.logprobs"],
            stream=True,
        )
    )
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert "".join(e.delta for e in deltas) == TEXT and sum(1 for e in deltas if e.logprobs) > 3
    ids, logprobs = captured(stack, "lp-5")
    check_entries([lp for e in deltas for lp in e.logprobs], ids, logprobs, tok, top=0)
    done = next(e for e in events if isinstance(e, ResponseTextDoneEvent))
    check_entries(done.logprobs, ids, logprobs, tok, top=0)
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    check_entries(text_part(final.response.output[1]).logprobs or [], ids, logprobs, tok, top=0)


@pytest.mark.parametrize(
    ("kw", "param", "code", "words"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value", "<= 20, but got 21"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "integer_below_min_value", ">= 0, but got -1"),
        ({"logprobs": True, "top_logprobs": "3"}, "top_logprobs", "invalid_type", "expected an integer"),
        ({"top_logprobs": 3}, "top_logprobs", "invalid_value", "only allowed when 'logprobs' is true"),
        ({"logprobs": False, "top_logprobs": 3}, "top_logprobs", "invalid_value", "only allowed when"),
        ({"logprobs": 5}, "logprobs", "invalid_type", "expected a boolean"),
    ],
)
def test_chat_bad_logprob_values_are_a_clear_400(
    stack: Stack, kw: dict[str, Any], param: str, code: str, words: str
) -> None:
    trial = "lp-bad-" + "-".join(f"{k}{v}" for k, v in kw.items())
    c = client(stack, trial)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[BASH], extra_body=kw)
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == param and body["code"] == code, body
    assert words in body["message"] and body["type"] == "invalid_request_error"
    assert stack.export(trial) == [] and not [g for g in stack.engine_log() if g["trial_id"] == trial]
    ok = c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[BASH], logprobs=True)
    assert ok.choices[0].logprobs is not None, "the trial keeps working"


def test_responses_bad_top_logprobs_is_a_clear_400(stack: Stack) -> None:
    c = client(stack, "lp-bad-responses")
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="Go.", include=["message.output_text.logprobs"], top_logprobs=30)
    body = e.value.body
    assert isinstance(body, dict) and (body["param"], body["code"]) == ("top_logprobs", "integer_above_max_value")
    assert stack.export("lp-bad-responses") == []
