"""Bad input and failures at every public entry point of the proxy: a clear
status in the caller's SDK shape, nothing captured, and the proxy keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.integration.proxy.stack import ADMIN, MODEL, Stack, check_faithful, script

SUB_SYSTEM = "You are a sub-agent."
LONG = "word " * 300
THREADS = {
    "main": [
        {"content": "Hi.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
        {"content": "Done."},
    ],
    "side-1": [{"raw": 'Sure. <tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>'}],
    "subagent-1": [{"content": LONG}],
    "*": [{"content": "Title"}],
}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("bad")
    path = script(tmp, THREADS, context_window=1024, chunk_tokens=1, chunk_delay_s=0.01)
    s = Stack(tmp, path, max_body_bytes=64 * 1024, capture_retries=30)
    yield s
    s.stop()


def post(
    url: str, token: str | None, body: Any, raw: bytes | None = None, path: str = "/chat/completions"
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={**headers, "content-type": "application/json"}, timeout=30)


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}


def nothing_captured(stack: Stack, trial: str) -> None:
    assert stack.export(trial) == []
    assert [g for g in stack.engine_log() if g["trial_id"] == trial] == []


def test_auth_wrong_missing_other_trial_unknown_and_closed(stack: Stack) -> None:
    base_a, token_a = stack.new_trial("auth-a")
    base_b, token_b = stack.new_trial("auth-b")
    assert post(base_a, None, chat()).status_code == 401
    r = post(base_a, "not-a-token", chat())
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert post(base_a, token_b, chat()).status_code == 403
    assert post(base_a.replace("auth-a", "nobody"), token_a, chat()).status_code == 404
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base_a.removesuffix("/v1"), api_key="bad", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    nothing_captured(stack, "auth-a")
    stack.close_trial("auth-b")
    assert post(base_b, token_b, chat()).status_code == 401, "a closed trial's token is refused"
    nothing_captured(stack, "auth-b")


def test_admin_api(stack: Stack) -> None:
    body = {"trial_id": "adm-1", "run_id": "r", "task_id": "t", "group_id": "g", "model": "", "max_turns": 0}
    assert httpx.post(f"{stack.url}/admin/trials", json=body).status_code == 401
    bad = httpx.post(f"{stack.url}/admin/trials", json=body, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    first = stack.admin("POST", "/trials", json=body)
    again = stack.admin("POST", "/trials", json=body)
    assert first.status_code == again.status_code == 201 and first.json() == again.json(), "idempotent"
    assert first.json()["base_path"] == "/trials/adm-1/v1"
    assert stack.admin("POST", "/trials", json={**body, "task_id": "other"}).status_code == 409
    for broken in (
        {"trial_id": "x"},
        {**body, "trial_id": "has space"},
        {**body, "max_turns": -1},
        {**body, "extra": 1},
    ):
        r = stack.admin("POST", "/trials", json=broken)
        assert r.status_code == 400 and "invalid request" in r.json()["error"]["message"], r.text
    assert stack.admin("POST", "/trials", content=b"{not json").status_code == 400
    summary = stack.admin("GET", "/trials/adm-1").json()
    assert (summary["num_turns"], summary["closed"], summary["context_overflow"]) == (0, False, False)
    closed = stack.close_trial("adm-1")
    assert closed["closed"] and stack.close_trial("adm-1") == closed, "close is idempotent"
    assert stack.admin("POST", "/trials/nobody/close").status_code == 404
    assert stack.admin("GET", "/trials/nobody").status_code == 404


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        (b"{not json", 400, "invalid request"),
        (b"", 400, "empty"),
        (json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"model": MODEL, "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": MODEL}).encode(), 400, "messages"),
        (json.dumps(chat(n=2)).encode(), 400, "n"),
        (json.dumps(chat(temperature="hot")).encode(), 400, "temperature"),
        (json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}).encode(), 400, "tool_call_id"),
        (json.dumps(chat(padding="x" * 70_000)).encode(), 413, "exceeds"),
    ],
)
def test_malformed_requests_get_clear_4xx(stack: Stack, raw: bytes, status: int, needle: str) -> None:
    base, token = stack.new_trial(f"bad-{abs(hash(raw)) % 10**8}")
    r = post(base, token, None, raw)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert "x-should-retry" not in r.headers
    nothing_captured(stack, base.split("/")[-2])


def test_anthropic_malformed_request_has_anthropic_shape(stack: Stack) -> None:
    base, token = stack.new_trial("bad-anthropic")
    r = httpx.post(
        f"{base}/messages", json={"model": MODEL, "messages": [{"role": "user"}]}, headers={"x-api-key": token}
    )
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(
        f"{base}/messages", json={"model": MODEL, "max_tokens": 0, "messages": []}, headers={"x-api-key": token}
    )
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_context_overflow_is_the_error_each_sdk_understands(stack: Stack) -> None:
    base, token = stack.new_trial("overflow")
    big = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(openai.BadRequestError) as oe:
        openai.OpenAI(base_url=base, api_key=token, max_retries=0).chat.completions.create(model=MODEL, messages=big)  # type: ignore[arg-type]
    assert oe.value.code == "context_length_exceeded" and "maximum context length is 1024" in str(oe.value)
    with pytest.raises(anthropic.BadRequestError) as ae:
        anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0).messages.create(
            model=MODEL,
            max_tokens=10,
            messages=big,  # type: ignore[arg-type]
        )
    assert "prompt is too long" in str(ae.value)
    summary = stack.close_trial("overflow")
    assert summary["context_overflow"] is True and summary["num_turns"] == 0
    nothing_captured(stack, "overflow")


def test_malformed_tool_call_is_returned_as_text_and_counted(stack: Stack) -> None:
    base, token = stack.new_trial("malformed")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}])
    msg = r.choices[0].message
    assert msg.tool_calls is None and msg.content is not None and msg.content.startswith("Sure. <tool_call>")
    assert r.choices[0].finish_reason == "stop"
    summary = stack.close_trial("malformed")
    assert summary["malformed_tool_calls"] == 1 and summary["num_turns"] == 1
    check_faithful(stack.export("malformed"), stack.engine_log(), "malformed")


def test_client_gone_mid_stream_records_no_half_turn(stack: Stack) -> None:
    base, token = stack.new_trial("gone")
    main = {"model": MODEL, "tools": TOOLS, "messages": [{"role": "user", "content": "main"}]}
    assert post(base, token, main).status_code == 200
    body = {
        "model": MODEL,
        "stream": True,
        "tools": TOOLS,
        "messages": [{"role": "system", "content": SUB_SYSTEM}, {"role": "user", "content": "x"}],
    }
    with httpx.stream("POST", f"{base}/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= 5:
                break
    summary = stack.admin("GET", "/trials/gone").json()
    for _ in range(100):
        if summary["aborted_turns"]:
            break
        httpx.get(f"{stack.url}/healthz")
        summary = stack.admin("GET", "/trials/gone").json()
    assert summary["aborted_turns"] == 1 and summary["num_turns"] == 1 and summary["abandoned_turns"] == 1
    closed = stack.close_trial("gone")
    threads = {t["name"]: (t["kind"], t["trainable"], t["num_segments"]) for t in closed["threads"]}
    assert threads == {
        "main": ("main", True, 1),
        "subagent-1": ("subagent", True, 0),
        "abandoned-1": ("abandoned", False, 1),
    }
    finishes = [(g["thread"], g["finish_reason"]) for g in stack.engine_log() if g["trial_id"] == "gone"]
    assert finishes == [("main", "stop"), ("subagent-1", "abort")]
    # The turn the client never received is kept for audit, not trainable: what the engine
    # had sent before it was stopped, in the prompt it was sampled in.
    main, kept = stack.export("gone")
    aborted = [g for g in stack.engine_log() if g["trial_id"] == "gone"][1]
    assert main["thread"] == "main" and (kept["thread_kind"], kept["trainable"]) == ("abandoned", False)
    assert kept["finish_reason"] == "abort" and kept["closed"] and kept["num_turns"] == 1
    assert kept["prompt_ids"] == list(aborted["prompt_ids"]) and summary["abandoned_tokens"] == len(
        kept["response_ids"]
    )
    n = len(kept["response_ids"])
    assert 0 < n <= len(aborted["sampled_ids"]) and kept["response_ids"] == list(aborted["sampled_ids"][:n])
    assert kept["response_logprobs"] == pytest.approx(list(aborted["logprobs"][:n]), abs=0)


def test_unix_socket_serves_the_same_app(stack: Stack) -> None:
    base, token = stack.new_trial("uds")
    path = base.removeprefix(stack.url)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(stack.tmp / "proxy.sock"))) as c:
        r = c.post(f"http://proxy{path}/chat/completions", json=chat(), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("Sure.")
    assert stack.close_trial("uds")["num_turns"] == 1


def test_capture_store_restart_is_retried_and_stored_once(stack: Stack) -> None:
    base, token = stack.new_trial("blip")
    stack.run(stack.stop_store())
    try:
        assert post(base, token, chat()).status_code == 200, "the harness is not held up by the store"
    finally:
        stack.run(stack.start_store())
    summary = stack.close_trial("blip")
    assert summary["capture_error"] is None and summary["parts_appended"] == 2
    [segment] = stack.export("blip")
    assert segment["closed"] and segment["num_turns"] == 1
    check_faithful([segment], stack.engine_log(), "blip")


def test_capture_store_down_fails_close_loudly(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, THREADS), capture_retries=2, capture_try_timeout_s=1.0)
    try:
        base, token = stack.new_trial("store-down")
        stack.run(stack.stop_store())
        assert post(base, token, chat()).status_code == 200
        r = stack.admin("POST", "/trials/store-down/close")
        assert r.status_code == 503 and "not durable" in r.json()["error"]["message"]
        assert httpx.get(f"{stack.url}/healthz").status_code == 200
    finally:
        stack.run(stack.start_store())
        stack.stop()


def test_a_trial_left_open_whose_capture_fails_is_one_warning_at_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its sandbox gave up on the close (and finalized it): the proxy, shutting down, closes
    # it; its last parts cannot be stored, and that is a warning naming the trial, not a
    # lifespan traceback ("Application shutdown failed") that skips the other trials.
    stack = Stack(tmp_path, script(tmp_path, THREADS), capture_retries=1, capture_try_timeout_s=1.0)
    stopped = False
    try:
        base, token = stack.new_trial("left-open")
        assert post(base, token, chat()).status_code == 200
        base, token = stack.new_trial("also-open")
        assert post(base, token, chat()).status_code == 200
        stack.run(stack.stop_store())
        with caplog.at_level("WARNING"):
            stack.stop()
            stopped = True
        messages = [r.getMessage() for r in caplog.records]
        assert not any("shutdown failed" in m for m in messages), messages
        warned = [r for r in caplog.records if r.getMessage() == "trial closed at shutdown without its last parts"]
        named = " ".join(str(r.__dict__.get("kv")) for r in warned)
        assert "left-open" in named and "also-open" in named, messages  # the first did not stop the second
    finally:
        if not stopped:
            stack.stop()


def test_max_turns(stack: Stack) -> None:
    base, token = stack.new_trial("maxturns", max_turns=1)
    assert post(base, token, chat()).status_code == 200
    r = post(base, token, chat())
    assert r.status_code == 400 and r.json()["error"]["code"] == "max_turns_reached"
    assert stack.close_trial("maxturns")["max_turns_reached"] is True


def test_admin_token_is_required_even_for_reads(stack: Stack) -> None:
    assert httpx.get(f"{stack.url}/admin/trials/x", headers={"Authorization": f"Bearer {ADMIN}x"}).status_code == 401


def test_closed_trials_release_their_state_and_old_summaries_are_dropped(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, THREADS), keep_closed_trials=1)
    try:
        for trial in ("old", "new"):
            base, token = stack.new_trial(trial)
            assert post(base, token, chat()).status_code == 200
            assert stack.close_trial(trial)["num_turns"] == 1
        assert stack.admin("GET", "/trials/old").status_code == 404
        assert stack.admin("GET", "/trials/new").json()["num_turns"] == 1
        core = stack.proxy.servers[0].config.app.state.core  # type: ignore[attr-defined]
        seg = next(iter(core.get("new").capture.threads.values())).segments[0]
        assert seg.context == bytearray() and seg.history == [], "a closed trial holds no token state"
        assert [s["thread"] for s in stack.export("old")] == ["side-1"], "what was captured stays in the store"
    finally:
        stack.stop()
