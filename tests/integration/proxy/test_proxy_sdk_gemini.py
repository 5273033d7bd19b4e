"""Contract tests with the official ``google-genai`` SDK (the Gemini API): plain and
streamed ``generate_content``, a function-call round trip, multi-turn chat,
``count_tokens``, against the real proxy, the scripted engine and a capture
store over gRPC; the raw wire forms (JSON-array stream, ``?key=``, Google's
error shape) with httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

BASH = types.FunctionDeclaration(
    name="bash",
    description="Run a shell command",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)
MAIN = [
    {
        "reasoning": "I should list files.",
        "content": "Listing.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
    },
    {"content": "Done: a.txt"},
]
SYSTEM = "You are Gemini CLI. Be brief."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("gemini")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "Hello from the side."}]}, chunk_tokens=3))
    yield s
    s.stop()


def client(stack: Stack, trial: str, version: str = "v1beta") -> genai.Client:
    base, token = stack.new_trial(trial)
    options = types.HttpOptions(base_url=base.removesuffix("/v1"), api_version=version)
    return genai.Client(api_key=token, http_options=options)


def config(**kw: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[types.Tool(function_declarations=[BASH])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        **kw,
    )


def result(call: types.FunctionCall, output: str, keep_id: bool = True) -> types.Content:
    response = types.FunctionResponse(id=call.id if keep_id else None, name=call.name, response={"output": output})
    return types.Content(role="user", parts=[types.Part(function_response=response)])


def test_function_call_round_trip_non_streaming(stack: Stack) -> None:
    c = client(stack, "gm-1")
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    thinking = types.ThinkingConfig(include_thoughts=True, thinking_budget=8192)
    r1 = c.models.generate_content(model=MODEL, contents=contents, config=config(thinking_config=thinking))
    parts = r1.candidates[0].content.parts  # type: ignore[index,union-attr]
    assert [(bool(p.thought), p.text is not None, p.function_call is not None) for p in parts] == [  # type: ignore[union-attr]
        (True, True, False),
        (False, True, False),
        (False, False, True),
    ]
    assert parts[0].text == "I should list files." and parts[1].text == "Listing."  # type: ignore[index]
    call = r1.function_calls[0]  # type: ignore[index]
    assert (call.name, call.args) == ("bash", {"command": "ls"}) and call.id
    assert all(p.thought_signature for p in parts)  # type: ignore[union-attr]
    assert r1.candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]
    assert r1.usage_metadata.prompt_token_count > 0 and r1.usage_metadata.candidates_token_count > 0  # type: ignore[union-attr]
    assert r1.model_version == MODEL and r1.response_id
    contents += [r1.candidates[0].content, result(call, "a.txt")]  # type: ignore[index,list-item]
    r2 = c.models.generate_content(model=MODEL, contents=contents, config=config())
    assert r2.text == "Done: a.txt" and not r2.function_calls
    summary = stack.close_trial("gm-1")
    assert (summary["num_turns"], summary["num_segments"]) == (2, 1), "the echoed turn extends the segment"
    check_faithful(stack.export("gm-1"), stack.engine_log(), "gm-1")


def test_streamed_round_trip_with_the_sdk_default_version(stack: Stack) -> None:
    c = client(stack, "gm-2", version="v1")  # the SDK's own default path (/v1/models/...)
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    thinking = types.ThinkingConfig(include_thoughts=True)
    chunks = list(
        c.models.generate_content_stream(model=MODEL, contents=contents, config=config(thinking_config=thinking))
    )
    parts = [p for ch in chunks for p in ch.candidates[0].content.parts or ()]  # type: ignore[index,union-attr]
    thoughts = [p.text for p in parts if p.thought]
    assert len(thoughts) >= 2 and "".join(thoughts) == "I should list files.", "thoughts stream in pieces, as sampled"  # type: ignore[arg-type]
    assert "".join(p.text or "" for p in parts if not p.thought) == "Listing."
    calls = [fc for ch in chunks for fc in ch.function_calls or ()]
    assert [(fc.name, fc.args) for fc in calls] == [("bash", {"command": "ls"})]
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]
    assert chunks[-1].usage_metadata.total_token_count > 0  # type: ignore[union-attr]
    # What Gemini CLI keeps of a streamed turn: the parts of every chunk but thoughts, in order.
    kept = [p for p in parts if not p.thought]
    contents += [types.Content(role="model", parts=kept), result(calls[0], "a.txt")]
    text = "".join(
        ch.text or "" for ch in c.models.generate_content_stream(model=MODEL, contents=contents, config=config())
    )
    assert text == "Done: a.txt"
    assert stack.close_trial("gm-2")["num_segments"] == 1
    check_faithful(stack.export("gm-2"), stack.engine_log(), "gm-2")


def test_a_client_that_drops_ids_and_signatures_is_matched_by_name_and_position(stack: Stack) -> None:
    c = client(stack, "gm-3")
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    r1 = c.models.generate_content(model=MODEL, contents=contents, config=config())
    call = r1.function_calls[0]  # type: ignore[index]
    # Only the name and the arguments, re-serialised: no id, no signature.
    bare = types.FunctionCall(name=call.name, args=json.loads(json.dumps(call.args, indent=1)))
    contents += [
        types.Content(role="model", parts=[types.Part(text="Listing."), types.Part(function_call=bare)]),
        result(call, "a.txt", keep_id=False),
    ]
    r2 = c.models.generate_content(model=MODEL, contents=contents, config=config())
    assert r2.text == "Done: a.txt"
    assert stack.close_trial("gm-3")["num_segments"] == 1
    check_faithful(stack.export("gm-3"), stack.engine_log(), "gm-3")


def test_multi_turn_chat_without_tools_is_a_side_thread(stack: Stack) -> None:
    c = client(stack, "gm-4")
    chat = c.chats.create(model=MODEL, config=types.GenerateContentConfig(temperature=0.5, top_p=0.9, top_k=40))
    assert chat.send_message("hi").text == "Hello from the side."
    assert chat.send_message("again").text == "Hello from the side."
    summary = stack.close_trial("gm-4")
    assert (summary["num_turns"], summary["num_segments"]) == (2, 1)
    check_faithful(stack.export("gm-4"), stack.engine_log(), "gm-4")


def test_count_tokens_matches_the_prompt_the_engine_sees(stack: Stack) -> None:
    c = client(stack, "gm-5")
    contents = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    counted = c.models.count_tokens(model=MODEL, contents=contents)
    r = c.models.generate_content(
        model=MODEL, contents=contents, config=types.GenerateContentConfig(max_output_tokens=5)
    )
    assert counted.total_tokens == r.usage_metadata.prompt_token_count > 5  # type: ignore[union-attr]
    assert r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS  # type: ignore[index]


def test_wire_forms_json_array_stream_query_key_and_errors(stack: Stack) -> None:
    base, token = stack.new_trial("gm-6")
    root = base.removesuffix("/v1")
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    url = f"{root}/v1beta/models/{MODEL}:streamGenerateContent?key={token}"
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        raw = r.read()
    elements = json.loads(raw)
    assert len(elements) >= 2 and elements[-1]["candidates"][0]["finishReason"] == "STOP"
    assert (
        "".join(p["text"] for e in elements for p in e["candidates"][0]["content"]["parts"]) == "Hello from the side."
    )
    bad = httpx.post(f"{root}/v1beta/models/{MODEL}:generateContent", json=body, headers={"x-goog-api-key": "nope"})
    assert bad.status_code == 401 and bad.json()["error"]["status"] == "UNAUTHENTICATED"
    c = client(stack, "gm-7")
    with pytest.raises(errors.ClientError) as e:
        c.models.generate_content(model=MODEL, contents="hi", config=types.GenerateContentConfig(candidate_count=2))
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT" and "candidateCount" in (e.value.message or "")
    with pytest.raises(errors.ClientError) as e:
        c.models.embed_content(model=MODEL, contents="hi")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"


def test_bad_input_over_http_is_a_google_error_and_nothing_is_captured(stack: Stack) -> None:
    base, token = stack.new_trial("gm-8")
    root, headers = base.removesuffix("/v1"), {"x-goog-api-key": token, "content-type": "application/json"}
    cases: list[tuple[str, bytes, int, str, str]] = [
        (f"models/{MODEL}:generateContent", b"{not json", 400, "INVALID_ARGUMENT", "not valid JSON"),
        (f"models/{MODEL}:generateContent", b"[]", 400, "INVALID_ARGUMENT", "expected a JSON object"),
        (f"models/{MODEL}:generateContent", b'{"contents": [{"parts": [{}]}]}', 400, "INVALID_ARGUMENT", "one of"),
        (
            f"models/{MODEL}:streamGenerateContent?alt=sse",
            b'{"contents": [], "x": 1}',
            400,
            "INVALID_ARGUMENT",
            "contents",
        ),
        (f"models/{MODEL}:embedContent", b"{}", 404, "NOT_FOUND", "embedContent"),
        (f"models/{MODEL}:countTokens", b"{}", 400, "INVALID_ARGUMENT", "contents must not be empty"),
    ]
    for path, raw, code, status, text in cases:
        r = httpx.post(f"{root}/v1beta/{path}", content=raw, headers=headers, timeout=30)
        err = r.json()["error"]
        assert (r.status_code, err["code"], err["status"]) == (code, code, status), (path, r.text)
        assert text in err["message"], (path, err)
    r = httpx.post(f"{root}/v2/models/{MODEL}:generateContent", content=b"{}", headers=headers, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    ok = httpx.post(f"{root}/v1beta/models/{MODEL}:generateContent", json={"contents": "hi"}, headers=headers)
    assert ok.status_code == 400  # still serving, still refusing
    summary = stack.close_trial("gm-8")
    # Every refusal after authentication counts against the trial (the /v2 path is no trial's method).
    assert summary["num_turns"] == 0 and summary["refused_requests"] == 7
    assert stack.export("gm-8") == [] and [g for g in stack.engine_log() if g["trial_id"] == "gm-8"] == []


def test_max_turns_is_a_failed_precondition_in_google_shape(stack: Stack) -> None:
    base, token = stack.new_trial("gm-9", max_turns=1)
    options = types.HttpOptions(base_url=base.removesuffix("/v1"), api_version="v1beta")
    c = genai.Client(api_key=token, http_options=options)
    assert c.models.generate_content(model=MODEL, contents="hi").text == "Hello from the side."
    with pytest.raises(errors.ClientError) as e:
        list(c.models.generate_content_stream(model=MODEL, contents="hi again"))
    assert (e.value.code, e.value.status) == (400, "FAILED_PRECONDITION") and "max_turns=1" in (e.value.message or "")
    summary = stack.close_trial("gm-9")
    assert summary["num_turns"] == 1 and summary["max_turns_reached"]
