"""Stateful Responses with the official ``openai`` SDK: a ``previous_response_id``
chain that sends only new input each call is captured as ONE segment, token for
token the capture of a harness that sends the whole input; stored responses are
retrievable and deletable, per trial, bounded, and dropped at close; every id
that cannot be continued is a clear 400 (404 for GET)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS: Any = [{"type": "function", "name": "bash", "description": "Run", "parameters": PARAMS}]
MAIN = [
    {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
    {
        "reasoning": "One file.",
        "content": "Reading it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.txt"}}],
    },
    {"content": "It says hello. Done."},
    {"content": "You are welcome."},
]
INSTRUCTIONS = "You are an agent."
MAX_STORED = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stateful")
    s = Stack(
        tmp,
        script(tmp, {"main": MAIN, "*": [{"content": "A title"}]}, chunk_tokens=3),
        responses_store_max_count=MAX_STORED,
    )
    yield s
    s.stop()


def client(stack: Stack, trial: str) -> openai.OpenAI:
    base, token = stack.new_trial(trial)
    return openai.OpenAI(base_url=base, api_key=token, max_retries=0)


def call(c: openai.OpenAI, new_input: list[dict[str, Any]], previous: str | None, stream: bool = False) -> Any:
    kw: dict[str, Any] = {"model": MODEL, "instructions": INSTRUCTIONS, "input": new_input, "tools": TOOLS}
    if previous is not None:
        kw["previous_response_id"] = previous
    if not stream:
        return c.responses.create(**kw)
    events = list(c.responses.create(**kw, stream=True))
    assert events[-1].type == "response.completed"
    return events[-1].response


def output_of(fc: Any) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": fc.call_id,
        "output": f"out of {json.loads(fc.arguments)['command']}",
    }


def play(c: openai.OpenAI, chained: bool) -> list[Any]:
    """Four calls of one conversation: only new input with previous_response_id
    (the second one streamed), or the whole input each time."""
    history: list[dict[str, Any]] = []
    replies: list[Any] = []
    new: list[dict[str, Any]] = [{"role": "user", "content": "What does a.txt say?"}]
    previous = None
    for i in range(4):
        history += new
        r = call(c, new if chained else history, previous, stream=chained and i == 1)
        replies.append(r)
        history += [o.model_dump(exclude_none=True) for o in r.output]
        calls = [o for o in r.output if o.type == "function_call"]
        new = [output_of(fc) for fc in calls] or [{"role": "user", "content": "Thanks."}]
        previous = r.id if chained else None
    return replies


def tokens(segments: list[dict[str, Any]]) -> list[tuple[list[int], list[int], list[int]]]:
    return [(s["prompt_ids"], s["response_ids"], s["response_mask"]) for s in segments]


def test_a_chain_of_four_is_one_segment_identical_to_sending_the_whole_input(stack: Stack) -> None:
    chained = play(client(stack, "chain-1"), chained=True)
    assert [o.type for o in chained[0].output] == ["message", "function_call"]
    assert chained[2].output_text == "It says hello. Done." and chained[3].output_text == "You are welcome."
    assert [r.previous_response_id for r in chained] == [None, *(r.id for r in chained[:3])]  # one streamed
    assert all(r.store is True for r in chained)
    summary = stack.close_trial("chain-1")
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (4, 1, 0)
    assert summary["refused_requests"] == 0 and summary["stored_responses"] == 0, "dropped at close"
    segments = stack.export("chain-1")
    check_faithful(segments, stack.engine_log(), "chain-1")
    play(client(stack, "whole-1"), chained=False)
    stack.close_trial("whole-1")
    assert tokens(segments) == tokens(stack.export("whole-1")), "the chain resolves to exactly the whole input"


def test_retrieve_and_delete_a_stored_response(stack: Stack) -> None:
    c = client(stack, "get-1")
    r1 = call(c, [{"role": "user", "content": "Go."}], None)
    got = c.responses.retrieve(r1.id)
    assert got.id == r1.id and [o.type for o in got.output] == ["message", "function_call"]
    assert stack.admin("GET", "/trials/get-1").json()["stored_responses"] == 1
    c.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError, match="No response found"):
        c.responses.retrieve(r1.id)
    with pytest.raises(openai.BadRequestError, match="not found") as e:
        call(c, [{"role": "user", "content": "Again."}], r1.id)
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    stack.close_trial("get-1")


def test_ids_that_cannot_be_continued_are_clear_400s(stack: Stack) -> None:
    a, b = client(stack, "ids-a"), client(stack, "ids-b")
    ra = call(a, [{"role": "user", "content": "Go."}], None)
    with pytest.raises(openai.BadRequestError, match=r"'resp_nope' not found: no response with this id"):
        call(a, [{"role": "user", "content": "x"}], "resp_nope")
    with pytest.raises(openai.BadRequestError, match="ids are per trial"):
        call(b, [{"role": "user", "content": "x"}], ra.id)  # another trial's response
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(ra.id)
    unstored = a.responses.create(model=MODEL, input="Hi.", tools=TOOLS, store=False)
    with pytest.raises(openai.BadRequestError, match="store=false is not stored"):
        call(a, [{"role": "user", "content": "x"}], unstored.id)
    assert stack.close_trial("ids-b")["num_turns"] == 0, "nothing reached the engine"
    assert [g for g in stack.engine_log() if g["trial_id"] == "ids-b"] == []
    stack.close_trial("ids-a")


def test_the_bound_evicts_least_recently_used_and_refuses_clearly(stack: Stack) -> None:
    c = client(stack, "bound-1")
    replies = play(c, chained=True)  # 4 stored, bound 3: the chain's root went
    summary = stack.admin("GET", "/trials/bound-1").json()
    assert (summary["stored_responses"], summary["responses_evicted"]) == (MAX_STORED, 1)
    with pytest.raises(openai.BadRequestError, match="it was evicted"):
        call(c, [{"role": "user", "content": "x"}], replies[0].id)
    with pytest.raises(openai.BadRequestError, match=r"its chain reaches 'resp_\w+', which is no longer stored"):
        call(c, [{"role": "user", "content": "x"}], replies[3].id)
    stack.close_trial("bound-1")


def test_malformed_state_fields_are_400s(stack: Stack) -> None:
    base, token = stack.new_trial("bad-state")
    headers = {"Authorization": f"Bearer {token}"}
    for body, match in [
        ({"store": "yes"}, "store"),
        ({"previous_response_id": 5}, "previous_response_id"),
        ({"previous_response_id": "r" * 201}, "previous_response_id"),
    ]:
        r = httpx.post(f"{base}/responses", json={"model": MODEL, "input": "x", **body}, headers=headers, timeout=30)
        assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    r = httpx.delete(f"{base}/responses/resp_x", headers=headers, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    r = httpx.get(f"{base}/responses/resp_x", timeout=30)
    assert r.status_code == 401
    stack.close_trial("bad-state")
