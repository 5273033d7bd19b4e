"""The Responses WebSocket (``ws://<base>/responses``, Codex's transport) against a
real proxy, gateway (scripted engine) and capture store, with the ``websockets``
client library: a chain of ``store: false`` calls that send only new input with
``previous_response_id`` (after a ``generate: false`` warm-up, as Codex does) is
ONE segment, token for token the capture of sending the whole input over HTTP,
and every event is the one the HTTP stream sends. Bad tokens, malformed
messages and ids that cannot be continued get clear errors; the connection
stays usable after a bad message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script
from tests.integration.proxy.test_proxy_stateful_responses import INSTRUCTIONS, MAIN, TOOLS, tokens

MAX_BODY = 64 * 1024
# What differs between two runs of the same conversation: ids, times, the chain's own fields.
VOLATILE = {"id", "item_id", "call_id", "created_at", "previous_response_id", "sequence_number"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("responses-ws")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "A title"}]}, chunk_tokens=3), max_body_bytes=MAX_BODY)
    yield s
    s.stop()


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/responses"


def dial(base: str, token: str | None, header: str = "Authorization") -> ClientConnection:
    headers = {header: f"Bearer {token}" if header == "Authorization" else token} if token else {}
    return connect(ws_url(base), additional_headers=headers, proxy=None, open_timeout=30)


def request(new_input: list[dict[str, Any]], previous: str | None = None, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": new_input, "tools": TOOLS, "store": False}
    return {**body, **({"previous_response_id": previous} if previous else {}), **extra}


def ws_call(conn: ClientConnection, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Sends one response.create; its events, up to the one that ends it."""
    conn.send(orjson.dumps({"type": "response.create", **body}).decode())
    events = []
    while True:
        event = orjson.loads(conn.recv(timeout=60))
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


def sse_call(base: str, token: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("POST", f"{base}/responses", json={**body, "stream": True}, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def next_input(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [o for o in response["output"] if o["type"] == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": f"out of {c['name']}"} for c in calls
    ]
    return outputs or [{"role": "user", "content": "Thanks."}]


def stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def test_a_chain_over_the_websocket_is_one_segment_and_the_http_stream_event_for_event(stack: Stack) -> None:
    base, token = stack.new_trial("ws-chain")
    first = [{"role": "user", "content": "What does a.txt say?"}]
    chained: list[list[dict[str, Any]]] = []
    with dial(base, token) as conn:
        warm = ws_call(conn, request(first, generate=False))  # Codex's warm-up: nothing generated
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        previous, new = warm[-1]["response"]["id"], []
        for _ in MAIN:
            conn.send(orjson.dumps({"type": "response.processed", "response_id": previous}).decode())
            events = ws_call(conn, request(new, previous))
            assert events[-1]["type"] == "response.completed", events[-1]
            assert events[0]["response"]["previous_response_id"] == previous
            chained.append(events)
            previous, new = events[-1]["response"]["id"], next_input(events[-1]["response"])
    live = stack.admin("GET", "/trials/ws-chain").json()
    assert (live["websocket_connections"], live["chained_responses"], live["stored_responses"]) == (1, 4, 0)
    summary = stack.close_trial("ws-chain")
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (4, 1, 0)
    assert summary["refused_requests"] == 0 and summary["proxy_errors"] == 0, summary["refusals"]
    segments = stack.export("ws-chain")
    check_faithful(segments, stack.engine_log(), "ws-chain")

    base, token = stack.new_trial("http-whole")
    history, streamed = list(first), []
    for _ in MAIN:
        events = sse_call(base, token, request(history))
        streamed.append(events)
        history += events[-1]["response"]["output"] + next_input(events[-1]["response"])
    stack.close_trial("http-whole")
    assert tokens(segments) == tokens(stack.export("http-whole")), "the chain resolves to exactly the whole input"
    assert stable(chained) == stable(streamed), "the WebSocket sends the HTTP stream's events"


def test_store_true_responses_outlive_the_connection_store_false_ones_do_not(stack: Stack) -> None:
    base, token = stack.new_trial("ws-scope")
    with dial(base, token) as conn:
        kept = ws_call(conn, request([{"role": "user", "content": "Go."}], store=True))[-1]["response"]
        cached = ws_call(conn, request([{"role": "user", "content": "Go."}]))[-1]["response"]
    with dial(base, token) as conn:
        error = ws_call(conn, request([{"role": "user", "content": "x"}], cached["id"]))[-1]
        assert error["type"] == "error" and error["status"] == 400, error
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["error"]["param"] == "previous_response_id"
        assert "a WebSocket connection keeps only its own store=false responses" in error["error"]["message"]
        done = ws_call(conn, request(next_input(kept), kept["id"]))[-1]  # the trial's store, from any connection
        assert done["type"] == "response.completed", done
    r = httpx.get(f"{base}/responses/{kept['id']}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200 and r.json()["id"] == kept["id"]
    summary = stack.close_trial("ws-scope")
    assert (summary["websocket_connections"], summary["refused_requests"], summary["num_turns"]) == (2, 1, 3)


def test_bad_tokens_are_refused_at_the_upgrade_with_the_http_status(stack: Stack) -> None:
    base, token = stack.new_trial("ws-auth")
    _, other = stack.new_trial("ws-auth-other")
    for bad, status, match in [
        (None, 401, "missing or invalid API key"),
        ("nope", 401, "missing or invalid API key"),
        (other, 403, "belongs to another trial"),
    ]:
        with pytest.raises(InvalidStatus) as e:
            dial(base, bad)
        assert e.value.response.status_code == status
        assert match in orjson.loads(e.value.response.body or b"{}")["error"]["message"]
    with pytest.raises(InvalidStatus) as e:
        dial(base.replace("ws-auth", "no-such-trial"), token)
    assert e.value.response.status_code == 404
    with dial(base, token, header="x-api-key") as conn:  # the Anthropic-style header works too
        assert ws_call(conn, request([{"role": "user", "content": "Go."}]))[-1]["type"] == "response.completed"
    stack.close_trial("ws-auth")
    stack.close_trial("ws-auth-other")


def test_malformed_messages_are_error_events_and_the_connection_stays_usable(stack: Stack) -> None:
    base, token = stack.new_trial("ws-bad")
    bad: list[tuple[str | bytes, str]] = [
        ("not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"type": "response.cancel"}', "unknown message type 'response.cancel'"),
        ('{"model": "m", "input": "x"}', "unknown message type None"),
        ('{"type": "response.create", "input": "x"}', "invalid response.create: model: Field required"),
        ('{"type": "response.create", "model": "m", "input": "x", "store": "yes"}', "store"),
        ('{"type": "response.create", "model": "m", "input": "x", "generate": "no"}', "'generate' must be"),
        ('{"type": "response.create", "model": "m", "input": "x", "previous_response_id": "resp_nope"}', "not found"),
        (b'{"type": "response.create"}', "invalid response.create"),  # a binary frame is read the same
    ]
    with dial(base, token) as conn:
        for raw, match in bad:
            conn.send(raw)
            event = orjson.loads(conn.recv(timeout=30))
            assert event["type"] == "error" and event["status"] == 400, event
            assert match in event["error"]["message"], (raw, event)
            assert event["error"]["type"] == "invalid_request_error"
        done = ws_call(conn, request([{"role": "user", "content": "Go."}]))[-1]
        assert done["type"] == "response.completed", done
    summary = stack.close_trial("ws-bad")
    assert (summary["refused_requests"], summary["proxy_errors"], summary["num_turns"]) == (len(bad), 0, 1)


def test_a_closed_trial_or_an_oversized_message_closes_the_connection_clearly(stack: Stack) -> None:
    base, token = stack.new_trial("ws-close")
    with dial(base, token) as conn:
        conn.send(orjson.dumps({"type": "response.create", "model": MODEL, "input": "x" * MAX_BODY}).decode())
        with pytest.raises(ConnectionClosed) as e:
            conn.recv(timeout=30)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1009, "message too big"
    with dial(base, token) as conn:
        stack.close_trial("ws-close")
        event = ws_call(conn, request([{"role": "user", "content": "Go."}]))[-1]
        assert event["type"] == "error" and event["status"] == 401 and "trial is closed" in event["error"]["message"]
        with pytest.raises(ConnectionClosed) as e:
            conn.recv(timeout=30)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1008
    assert stack.engine_log() == [] or all(g["trial_id"] != "ws-close" for g in stack.engine_log())


def test_a_client_that_leaves_mid_turn_is_no_proxy_error(stack: Stack) -> None:
    base, token = stack.new_trial("ws-leave")
    for _ in range(3):
        with dial(base, token) as conn:
            conn.send(
                orjson.dumps({"type": "response.create", **request([{"role": "user", "content": "Go."}])}).decode()
            )
    with dial(base, token) as conn:  # the proxy still serves the trial
        assert ws_call(conn, request([{"role": "user", "content": "Go."}]))[-1]["type"] == "response.completed"
    summary = stack.close_trial("ws-leave")
    assert summary["proxy_errors"] == 0 and summary["refused_requests"] == 0, summary["refusals"]
    assert summary["num_turns"] + summary["aborted_turns"] == 4, summary
