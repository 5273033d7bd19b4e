"""tool_choice, parallel_tool_calls and structured-output formats through the
official SDKs (OpenAI chat, Anthropic messages, OpenAI responses, Gemini), each honoured
as documented in ``chat/toolchoice.py`` or refused with a clear 400.

One conversation per protocol changes its tool choice turn by turn (a named
tool, any tool, one call only, no tools, auto) and stays ONE segment: a forced
call's prefill is context (mask 0) in the prompt the engine saw, every sampled
token is checked against the engine's log, and the template re-renders each
turn exactly (``render_check``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from harnessrl.paths import default_model_dir
from services.proxy.chat.tokenizer import Tokenizer
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
EDIT_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}}
NAMED = '<tool_call>\n{"name": "bash", "arguments": '
ANY = '<tool_call>\n{"name": '
MAIN = [
    # 1. a named tool: the engine continues the prefill
    {"raw": '{"command": "ls"}}\n</tool_call>'},
    # 2. any tool: the engine writes the name too
    {"raw": '"bash", "arguments": {"command": "cat a.txt"}}\n</tool_call>'},
    # 3. one call only: the second is dropped
    {
        "content": "Two at once.",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo 1"}},
            {"name": "bash", "arguments": {"command": "echo 2"}},
        ],
    },
    # 4. no tools: generation stops where a call opens
    {"content": "No tools now.", "tool_calls": [{"name": "bash", "arguments": {"command": "rm -rf /"}}]},
    # 5. auto
    {"content": "Done."},
]
SYSTEM = "You are an agent."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("toolchoice")
    s = Stack(tmp, script(tmp, {"main": MAIN, "*": [{"content": "A title"}]}, chunk_tokens=2))
    yield s
    s.stop()


def engine_prompts(stack: Stack, trial: str) -> list[list[int]]:
    return [g["prompt_ids"] for g in stack.engine_log() if g["trial_id"] == trial]


def check_one_segment(stack: Stack, trial: str, prefills: list[str], dropped: int = 1) -> None:
    """One segment of five turns; the forced turns' prompts end with the prefill ids."""
    summary = stack.close_trial(trial)
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (5, 1, 0), summary
    assert summary["refused_requests"] == 0 and summary["malformed_tool_calls"] == 0
    assert summary["dropped_tool_calls"] == dropped, "the second call of the one-call turn"
    segments = stack.export(trial)
    check_faithful(segments, stack.engine_log(), trial)
    tok = Tokenizer(default_model_dir())
    prompts = engine_prompts(stack, trial)
    for prompt, prefill in zip(prompts, prefills, strict=False):
        ids = tok.encode(prefill) if prefill else []
        assert prompt[len(prompt) - len(ids) :] == ids and (not ids or tok.decode(prompt[-len(ids) :]) == prefill)
    # every prompt starts with the one before it plus what was sampled: one growing context
    seg = segments[0]
    context = seg["prompt_ids"] + seg["response_ids"]
    assert all(context[: len(p)] == p for p in prompts)


def test_openai_chat_choices_turn_by_turn(stack: Stack) -> None:
    base, token = stack.new_trial("tc-oa")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    bash: Any = {"type": "function", "function": {"name": "bash", "description": "Run", "parameters": PARAMS}}
    edit: Any = {"type": "function", "function": {"name": "edit", "description": "Edit", "parameters": EDIT_PARAMS}}
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is here?"}]
    choices: list[tuple[Any, dict[str, Any]]] = [
        ({"type": "function", "function": {"name": "bash"}}, {}),
        ("required", {}),
        ("auto", {"parallel_tool_calls": False}),
        ("none", {}),
        ("auto", {"response_format": {"type": "text"}}),
    ]
    got = []
    for choice, extra in choices:
        kw = {"model": MODEL, "messages": messages, "tools": [bash, edit], "tool_choice": choice, **extra}
        if "parallel_tool_calls" in extra:  # streamed: the dropped call's deltas are not sent either
            with c.chat.completions.stream(**kw) as s:
                r = s.get_final_completion()
        else:
            r = c.chat.completions.create(**kw)
        m = r.choices[0].message
        got.append(
            (
                r.choices[0].finish_reason,
                m.content,
                [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or ()],
            )
        )  # type: ignore[union-attr]
        messages.append(m.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in m.tool_calls or ()]
        if not m.tool_calls:
            messages.append({"role": "user", "content": "Go on."})
    assert got == [
        ("tool_calls", None, [("bash", {"command": "ls"})]),
        ("tool_calls", None, [("bash", {"command": "cat a.txt"})]),
        ("tool_calls", "Two at once.", [("bash", {"command": "echo 1"})]),
        ("stop", "No tools now.", []),
        ("stop", "Done.", []),
    ]
    check_one_segment(stack, "tc-oa", [NAMED, ANY, "", "", ""])


def test_anthropic_choices_turn_by_turn(stack: Stack) -> None:
    base, token = stack.new_trial("tc-an")
    c = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
    tools: Any = [
        {"name": "bash", "description": "Run", "input_schema": PARAMS},
        {"name": "edit", "description": "Edit", "input_schema": EDIT_PARAMS},
    ]
    messages: list[Any] = [{"role": "user", "content": "What is here?"}]
    choices: list[Any] = [
        {"type": "tool", "name": "bash"},
        {"type": "any"},
        {"type": "auto", "disable_parallel_tool_use": True},
        {"type": "none"},
        {"type": "auto"},
    ]
    got = []
    for i, choice in enumerate(choices):
        kw: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "system": SYSTEM, "messages": messages, "tools": tools}
        if i == 1:
            with c.messages.stream(**kw, tool_choice=choice) as s:  # streamed: the same forcing
                r = s.get_final_message()
        else:
            r = c.messages.create(**kw, tool_choice=choice)
        uses = [b for b in r.content if b.type == "tool_use"]
        text = "".join(b.text for b in r.content if b.type == "text")
        got.append((r.stop_reason, r.stop_sequence, text, [(u.name, u.input) for u in uses]))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        if uses:
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses],
                }
            )
        else:
            messages.append({"role": "user", "content": "Go on."})
    assert got == [
        ("tool_use", None, "", [("bash", {"command": "ls"})]),
        ("tool_use", None, "", [("bash", {"command": "cat a.txt"})]),
        ("tool_use", None, "Two at once.", [("bash", {"command": "echo 1"})]),
        ("end_turn", None, "No tools now.", []),
        ("end_turn", None, "Done.", []),
    ]
    check_one_segment(stack, "tc-an", [NAMED, ANY, "", "", ""])


def test_responses_choices_turn_by_turn(stack: Stack) -> None:
    base, token = stack.new_trial("tc-rs")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    tools: Any = [
        {"type": "function", "name": "bash", "description": "Run", "parameters": PARAMS},
        {"type": "function", "name": "edit", "description": "Edit", "parameters": EDIT_PARAMS},
    ]
    choices: list[tuple[Any, dict[str, Any]]] = [
        ({"type": "function", "name": "bash"}, {}),
        ("required", {}),
        ("auto", {"parallel_tool_calls": False}),
        ("none", {}),
        ("auto", {"text": {"format": {"type": "text"}}}),
    ]
    new: list[Any] = [{"role": "user", "content": "What is here?"}]
    previous = None
    got = []
    for choice, extra in choices:  # chained with previous_response_id: forcing and state together
        kw = {"previous_response_id": previous} if previous else {}
        body = {"model": MODEL, "instructions": SYSTEM, "input": new, "tools": tools, "tool_choice": choice}
        if "parallel_tool_calls" in extra:  # streamed: the dropped call's events are not sent either
            events = list(c.responses.create(**body, **kw, **extra, stream=True))
            assert [e.item.type for e in events if e.type == "response.output_item.added"] == [
                "message",
                "function_call",
            ]
            r = events[-1].response
        else:
            r = c.responses.create(**body, **kw, **extra)
        calls = [o for o in r.output if o.type == "function_call"]
        got.append((r.output_text, [(f.name, json.loads(f.arguments)) for f in calls]))  # type: ignore[union-attr]
        assert r.tool_choice == choice if isinstance(choice, str) else r.tool_choice.name == "bash"  # type: ignore[union-attr]
        new = [{"type": "function_call_output", "call_id": f.call_id, "output": "ok"} for f in calls] or [  # type: ignore[union-attr]
            {"role": "user", "content": "Go on."}
        ]
        previous = r.id
    assert got == [
        ("", [("bash", {"command": "ls"})]),
        ("", [("bash", {"command": "cat a.txt"})]),
        ("Two at once.", [("bash", {"command": "echo 1"})]),
        ("No tools now.", []),
        ("Done.", []),
    ]
    check_one_segment(stack, "tc-rs", [NAMED, ANY, "", "", ""])


def test_gemini_function_calling_modes_turn_by_turn(stack: Stack) -> None:
    """The Gemini API has no one-call switch: the third turn returns both calls."""
    base, token = stack.new_trial("tc-gm")
    options = genai_types.HttpOptions(base_url=base.removesuffix("/v1"), api_version="v1beta")
    c = genai.Client(api_key=token, http_options=options)
    decls = [
        genai_types.FunctionDeclaration(name="bash", description="Run", parameters_json_schema=PARAMS),
        genai_types.FunctionDeclaration(name="edit", description="Edit", parameters_json_schema=EDIT_PARAMS),
    ]
    modes: list[tuple[str, list[str] | None]] = [
        ("ANY", ["bash"]),
        ("ANY", None),
        ("AUTO", None),
        ("NONE", None),
        ("AUTO", None),
    ]
    contents: list[Any] = [genai_types.Content(role="user", parts=[genai_types.Part(text="What is here?")])]
    got = []
    for i, (mode, allowed) in enumerate(modes):
        calling = genai_types.FunctionCallingConfig(mode=mode, allowed_function_names=allowed)  # type: ignore[arg-type]
        config = genai_types.GenerateContentConfig(
            system_instruction=SYSTEM,
            tools=[genai_types.Tool(function_declarations=decls)],
            tool_config=genai_types.ToolConfig(function_calling_config=calling),
            automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
        )
        if i == 1:  # streamed: the same forcing
            chunks = list(c.models.generate_content_stream(model=MODEL, contents=contents, config=config))
            parts = [p for ch in chunks for p in ch.candidates[0].content.parts or ()]  # type: ignore[index,union-attr]
        else:
            r = c.models.generate_content(model=MODEL, contents=contents, config=config)
            parts = list(r.candidates[0].content.parts or ())  # type: ignore[index,union-attr]
        calls = [p.function_call for p in parts if p.function_call is not None]
        got.append(("".join(p.text or "" for p in parts), [(f.name, f.args) for f in calls]))
        contents.append(genai_types.Content(role="model", parts=parts))
        replies = [
            genai_types.Part(
                function_response=genai_types.FunctionResponse(id=f.id, name=f.name, response={"output": "ok"})
            )
            for f in calls
        ]
        contents.append(genai_types.Content(role="user", parts=replies or [genai_types.Part(text="Go on.")]))
    assert got == [
        ("", [("bash", {"command": "ls"})]),
        ("", [("bash", {"command": "cat a.txt"})]),
        ("Two at once.", [("bash", {"command": "echo 1"}), ("bash", {"command": "echo 2"})]),
        ("No tools now.", []),
        ("Done.", []),
    ]
    check_one_segment(stack, "tc-gm", [NAMED, ANY, "", "", ""], dropped=0)


def post(base: str, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "x-api-key": token}
    return httpx.post(base + path, json=body, headers=headers, timeout=30)


def test_refusals_are_clear_400s_and_reach_no_engine(stack: Stack) -> None:
    base, token = stack.new_trial("tc-bad")
    fn: Any = [{"type": "function", "function": {"name": "bash", "parameters": PARAMS}}]
    user = [{"role": "user", "content": "x"}]
    chat = {"model": MODEL, "messages": user, "tools": fn}
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        (
            "/chat/completions",
            {**chat, "tool_choice": {"type": "function", "function": {"name": "rm"}}},
            "tool_choice",
            "not among the request's tools",
        ),
        (
            "/chat/completions",
            {"model": MODEL, "messages": user, "tool_choice": "required"},
            "tool_choice",
            "offers no tools",
        ),
        ("/chat/completions", {**chat, "tool_choice": "maybe"}, "tool_choice", "tool_choice must be"),
        (
            "/chat/completions",
            {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "needs constrained decoding",
        ),
        (
            "/chat/completions",
            {**chat, "response_format": {"type": "json_object"}},
            "response_format",
            "needs constrained decoding",
        ),
        ("/chat/completions", {**chat, "parallel_tool_calls": "no"}, "", "parallel_tool_calls"),
        (
            "/responses",
            {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
            "text.format",
            "needs constrained decoding",
        ),
        (
            "/responses",
            {"model": MODEL, "input": "x", "tool_choice": {"type": "file_search"}},
            "tool_choice",
            "function and custom tools only",
        ),
    ]
    for path, body, param, match in cases:
        r = post(base, token, path, body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert match in err["message"] and (not param or err["param"] == param), (body, err)
    messages = {"model": MODEL, "max_tokens": 9, "messages": user, "tools": [{"name": "bash", "input_schema": PARAMS}]}
    for extra, match in [
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name: required"),
        ({"tool_choice": {"type": "tool", "name": "rm"}}, "not among the request's tools"),
        ({"tool_choice": {"type": "whatever"}}, "tool_choice.type"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
    ]:
        r = post(base, token, "/messages", {**messages, **extra})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and match in r.json()["error"]["message"]
    summary = stack.close_trial("tc-bad")
    assert summary["num_turns"] == 0 and summary["refused_requests"] == 12
    assert [g for g in stack.engine_log() if g["trial_id"] == "tc-bad"] == []
