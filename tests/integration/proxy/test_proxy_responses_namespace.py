"""Responses ``namespace`` tools through a real proxy, gateway (scripted engine) and
capture store, with the tools codex 0.171.0 sends (an MCP server's namespace, its
multi_agent_v1 sub-agent namespace, and web_search): the model is offered every
nested tool under its flat name, its call comes back as (``name``, ``namespace``)
on every path (HTTP whole, HTTP SSE, WebSocket chain, stored previous_response_id
chain), the call item sent back resolves to the same flat name (ONE segment, no
render mismatch), web_search is dropped with a counted warning that refuses
nothing, and a malformed namespace is a 400 naming the param."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from harnessrl.paths import default_model_dir
from services.proxy.chat.tokenizer import Tokenizer
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script
from tests.integration.proxy.test_proxy_responses_ws import dial, sse_call, ws_call
from tests.unit.proxy.test_proxy_responses_namespace import CODEX_TOOLS

MAIN: list[dict[str, Any]] = [
    {"content": "Asking the notes server.", "tool_calls": [{"name": "mcp__notes__secret_word", "arguments": {}}]},
    {"content": "The word is PAPAYA-42."},
]
INPUT = [{"role": "user", "content": "What is the secret word?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("responses-namespace")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "A title"}]}, chunk_tokens=3))
    yield s
    s.stop()


def body(new_input: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "instructions": "You are an agent.", "input": new_input, "tools": CODEX_TOOLS, **extra}


def post(base: str, token: str, data: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/responses", json=data, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def answer(call: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": "The secret word is PAPAYA-42"}]


def the_call(output: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [o for o in output if o["type"] == "function_call"]
    assert len(calls) == 1, output
    call = calls[0]
    assert (call["name"], call["namespace"], call["arguments"]) == ("secret_word", "mcp__notes", "{}"), call
    return call


def play(stack: Stack, trial: str, mode: str) -> None:
    """Two turns: the model calls the MCP tool, then answers with what it returned."""
    base, token = stack.new_trial(trial)
    if mode == "ws":
        with dial(base, token) as conn:
            events = ws_call(conn, body(INPUT, store=False))
            first = events[-1]["response"]
            added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
            assert [(i["name"], i["namespace"]) for i in added if i["type"] == "function_call"] == [
                ("secret_word", "mcp__notes")
            ]
            call = the_call(first["output"])
            last = ws_call(conn, body(answer(call), store=False, previous_response_id=first["id"]))[-1]["response"]
    elif mode == "sse":
        events = sse_call(base, token, body(INPUT))
        added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [i.get("namespace") for i in added] == [None, "mcp__notes"], added
        call = the_call(done)
        assert the_call(events[-1]["response"]["output"]) == call
        history = INPUT + events[-1]["response"]["output"] + answer(call)
        last = sse_call(base, token, body(history))[-1]["response"]
    else:  # "whole": the whole input each time; "chain": previous_response_id of a stored response
        r = post(base, token, body(INPUT))
        assert r.status_code == 200, r.text
        first = r.json()
        call = the_call(first["output"])
        if mode == "chain":
            second = body(answer(call), previous_response_id=first["id"])
        else:
            second = body(INPUT + first["output"] + answer(call))
        r = post(base, token, second)
        assert r.status_code == 200, r.text
        last = r.json()
    assert last["output"][-1]["content"][0]["text"] == "The word is PAPAYA-42.", last


@pytest.mark.parametrize("mode", ["whole", "sse", "ws", "chain"])
def test_a_namespaced_call_round_trips_as_codex_expects_and_stays_one_segment(stack: Stack, mode: str) -> None:
    trial = f"ns-{mode}"
    play(stack, trial, mode)
    summary = stack.close_trial(trial)
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (2, 1, 0), summary
    assert summary["refused_requests"] == 0 and summary["proxy_errors"] == 0, summary["refusals"]
    assert summary["malformed_tool_calls"] == 0
    assert [r for r in summary["refusals"] if "web_search" in r] == [
        "warning (not a refusal): dropped hosted tool 'web_search' from 2 Responses request(s): the proxy cannot "
        "run it and the policy never sees it (Codex 0.171 offers it on every request, so it is dropped rather "
        "than refused)"
    ]
    check_faithful(stack.export(trial), stack.engine_log(), trial)
    prompts = [g["prompt_ids"] for g in stack.engine_log() if g["trial_id"] == trial]
    first = Tokenizer(default_model_dir()).decode(prompts[0], skip_special_tokens=False)
    for name in ("mcp__notes__secret_word", "multi_agent_v1__spawn_agent", "multi_agent_v1__close_agent"):
        assert f'"name": "{name}"' in first, f"{name} was not offered to the model"
    assert "web_search" not in first


def test_a_malformed_namespace_is_a_400_naming_the_param_over_http_and_the_websocket(stack: Stack) -> None:
    base, token = stack.new_trial("ns-bad")
    bad = [{"type": "namespace", "name": "mcp__notes", "tools": [{"type": "web_search"}]}]
    r = post(base, token, body(INPUT, tools=bad))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "tools[0].tools[0].type"), error
    assert "namespace 'mcp__notes' may hold only function and custom tools" in error["message"]
    with dial(base, token) as conn:
        event = ws_call(conn, body(INPUT, tools=[{"type": "namespace", "tools": []}]))[-1]
        assert event["type"] == "error" and event["status"] == 400, event
        assert event["error"]["param"] == "tools[0].name", event
        conn.send(orjson.dumps({"type": "response.create", **body(INPUT, tools=[{"type": "file_search"}])}).decode())
        event = orjson.loads(conn.recv(timeout=60))
        assert event["error"]["param"] == "tools[0].type" and "'file_search'" in event["error"]["message"], event
    summary = stack.close_trial("ns-bad")
    assert summary["refused_requests"] == 3 and summary["num_turns"] == 0, summary
