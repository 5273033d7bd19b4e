"""Tokens sampled past a stop string are never captured (issue 37, item 3).

The scripted engine streams events of 16 tokens, as vLLM's token endpoint does.
Played twice: as an engine that cannot watch text (the local engine: the reply
runs on past the string until the proxy aborts it) and as one that ends the reply
at the token completing the string (vLLM given ``SamplingParams.stop``). Either
way the harness is given the text before the string, and so is the capture: every
mask-1 token's text lies before the stop, the next turn's prompt is exactly the
harness's conversation rendered by the chat template, and the trial counts the
tokens it dropped (``stop_cut_tokens``). The strings watched are the client's
``stop`` and, under ``tool_choice: "none"``, the tool parser's opening marker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from services.proxy.app import load_model
from services.proxy.chat.model import ChatModel
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
LS = [{"name": "bash", "arguments": {"command": "ls -la"}}]
EVENT = 16  # tokens per engine event (the script's chunk_tokens)
MAIN = [
    # 1. a client stop string: "look" begins in the first event, whose 14 other tokens lie past it
    {"content": "Let me look at the files in this directory first, then I will tell you.", "tool_calls": LS},
    # 2. tool_choice none: generation stops where the call opens, inside the first event
    {"content": "Listing now.", "tool_calls": LS},
    # 3. auto, nothing to cut
    {"content": "There is one file."},
]
SEEN = ["Let me", "Listing now.", "There is one file."]  # the text the harness is given, turn by turn


@pytest.fixture(scope="module", params=[False, True], ids=["engine-ignores-stops", "engine-honours-stops"])
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stopcut")
    path = script(tmp, {"main": MAIN}, chunk_tokens=EVENT, honour_stop_strings=request.param)
    s = Stack(tmp, path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model(stack: Stack) -> ChatModel:
    return load_model(stack.proxy.settings)


def reply(c: openai.OpenAI, messages: list[dict[str, Any]], stream: bool, **kw: Any) -> tuple[str, str, bool]:
    """(content, finish reason, whether any tool call came) of one chat call."""
    if not stream:
        r = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH], **kw)  # type: ignore[arg-type]
        choice = r.choices[0]
        return choice.message.content or "", choice.finish_reason, bool(choice.message.tool_calls)
    content, finish, calls = "", "", False
    for chunk in c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH], stream=True, **kw):  # type: ignore[arg-type]
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls = calls or bool(choice.delta.tool_calls)
            finish = choice.finish_reason or finish
    return content, finish, calls


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) of each mask-1 run: one per turn."""
    out, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tokens_past_a_stop_are_not_captured(
    stack: Stack, model: ChatModel, stream: bool, request: pytest.FixtureRequest
) -> None:
    trial = f"stopcut-{stream}"
    base, token = stack.new_trial(trial)
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "Go."}]
    asked: list[list[dict[str, Any]]] = []  # the conversation as the harness sent it, call by call
    for kw, follow_up in (({"stop": ["look"]}, "Go on."), ({"tool_choice": "none"}, "ok"), ({}, None)):
        asked.append(list(messages))
        content, finish, calls = reply(c, messages, stream, **kw)
        assert (content, finish, calls) == (SEEN[len(asked) - 1], "stop", False)
        if follow_up:
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": follow_up}]

    summary = stack.close_trial(trial)
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (3, 1, 0), summary
    segments, log = stack.export(trial), [g for g in stack.engine_log() if g["trial_id"] == trial]
    check_faithful(segments, stack.engine_log(), trial)
    tok, (seg,) = model.tokenizer, segments
    sampled = [seg["response_ids"][i:j] for i, j in runs(seg["response_mask"])]
    assert [tok.decode(ids).rstrip() for ids in sampled] == SEEN, "a captured token lies past a stop"
    assert all(g["sampled_ids"][: len(ids)] == ids for g, ids in zip(log, sampled, strict=True))
    if request.node.callspec.params["stack"]:  # the proxy gave the engine its stops: it sampled none past them
        ends = [tok.decode(g["sampled_ids"]) for g in log[:2]]
        assert ends == ["Let me look", "Listing now.\n<tool_call>"] and log[0]["finish_reason"] == "stop"
    # each stop lies in its reply's first event: what came of that event past the stop was cut
    received = [min(EVENT, len(g["sampled_ids"])) for g in log[:2]]
    assert summary["stop_cut_tokens"] == sum(r - len(ids) for r, ids in zip(received, sampled, strict=False))
    assert all(r > len(ids) for r, ids in zip(received, sampled, strict=False))
    tools = [{"type": "function", "function": BASH["function"]}]
    for g, conversation in zip(log[1:], asked[1:], strict=True):
        rendered = model.template.render(conversation, tools, add_generation_prompt=True)
        assert g["prompt_ids"] == tok.encode(rendered), "a prompt is not the conversation the harness sent"
