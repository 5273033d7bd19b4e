"""Responses ``namespace`` tools (Codex 0.171's MCP servers and sub-agent tools) are
offered to the model under Codex's flat names and a call of one goes back as
(``name``, ``namespace``); hosted tools are dropped with a recorded warning
(web_search, which Codex sends on every request) or refused by name; malformed
tools are a 400 naming the param. The shapes below are those of a request the real
codex 0.171.0 binary sent (captured with an MCP server ``notes`` configured)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from services.proxy.chat.conversation import ToolCall
from services.proxy.chat.toolchoice import ToolChoice
from services.proxy.errors import BadRequest
from services.proxy.responses.models import ResponsesRequest, to_conversation, tool_choice
from services.proxy.responses.routes import _call_item
from services.proxy.responses.store import ResponseStore
from services.proxy.responses.tools import WARNING, flat_name, note_dropped
from services.proxy.turn import ToolCallOut

OBJ = {"type": "object", "properties": {}, "additionalProperties": False}
TARGET = {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]}
CODEX_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "description": "Run", "strict": False, "parameters": OBJ},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Tools for spawning and managing sub-agents.",
        "tools": [
            {"type": "function", "name": "spawn_agent", "description": "Spawn", "strict": False, "parameters": OBJ},
            {"type": "function", "name": "close_agent", "description": "Close", "parameters": TARGET},
        ],
    },
    {
        "type": "namespace",
        "name": "mcp__notes",
        "description": "Tools in the mcp__notes namespace.",
        "tools": [
            {"type": "function", "name": "secret_word", "description": "Returns the secret word.", "parameters": OBJ}
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


def req(tools: list[dict[str, Any]], **kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "go", "tools": tools, **kw})


def test_every_nested_tool_is_offered_under_its_flat_name_and_maps_back() -> None:
    conv, names = to_conversation(req(CODEX_TOOLS))
    offered = {t.name: t for t in conv.tools}
    assert list(offered) == [
        "exec_command",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__close_agent",
        "mcp__notes__secret_word",
    ]
    assert offered["mcp__notes__secret_word"].description == "Returns the secret word."
    assert offered["multi_agent_v1__close_agent"].parameters == TARGET
    assert names.wire("mcp__notes__secret_word") == ("secret_word", "mcp__notes")
    assert names.wire("multi_agent_v1__spawn_agent") == ("spawn_agent", "multi_agent_v1")
    assert names.wire("exec_command") == ("exec_command", None)
    assert names.dropped == ("web_search",)


def test_flat_names_trim_stray_underscores_around_the_delimiter_as_codex_does() -> None:
    assert flat_name("mcp__notes", "secret_word") == "mcp__notes__secret_word"
    assert flat_name("ns_", "_tool") == "ns__tool"


def test_a_call_of_a_nested_tool_is_answered_with_its_name_and_namespace() -> None:
    _, names = to_conversation(req(CODEX_TOOLS))
    item = _call_item(ToolCallOut("c1", "mcp__notes__secret_word", "{}"), names)
    assert (item["type"], item["name"], item["namespace"], item["arguments"]) == (
        "function_call",
        "secret_word",
        "mcp__notes",
        "{}",
    )
    plain = _call_item(ToolCallOut("c2", "exec_command", "{}"), names)
    assert plain["name"] == "exec_command" and "namespace" not in plain


def test_a_nested_custom_tool_takes_free_form_input_and_keeps_its_namespace() -> None:
    tools = [{"type": "namespace", "name": "ed", "tools": [{"type": "custom", "name": "patch", "description": "P"}]}]
    conv, names = to_conversation(req(tools))
    assert conv.tools[0].name == "ed__patch" and conv.tools[0].parameters["required"] == ["input"]
    item = _call_item(ToolCallOut("c1", "ed__patch", '{"input": "*** Begin"}'), names)
    assert (item["type"], item["name"], item["namespace"], item["input"]) == (
        "custom_tool_call",
        "patch",
        "ed",
        "*** Begin",
    )


def test_a_call_item_sent_back_with_its_namespace_is_the_flat_name_in_the_conversation() -> None:
    # As codex 0.171 echoes it on its next request (its id kept, its namespace kept).
    history = [
        {"role": "user", "content": "go"},
        {
            "type": "function_call",
            "id": "fc_0",
            "name": "secret_word",
            "namespace": "mcp__notes",
            "arguments": "{}",
            "call_id": "c0",
        },
        {"type": "function_call_output", "call_id": "c0", "output": "The secret word is PAPAYA-42"},
    ]
    conv, _ = to_conversation(ResponsesRequest.model_validate({"model": "m", "input": history, "tools": CODEX_TOOLS}))
    assert conv.messages[1].tool_calls == (ToolCall("c0", "mcp__notes__secret_word", "{}"),)


def test_tool_choice_may_name_a_nested_tool_by_flat_name_or_with_its_namespace() -> None:
    spaced = {"type": "function", "name": "secret_word", "namespace": "mcp__notes"}
    assert tool_choice(req(CODEX_TOOLS, tool_choice=spaced)) == ToolChoice("tool", "mcp__notes__secret_word")
    flat = {"type": "function", "name": "mcp__notes__secret_word"}
    assert tool_choice(req(CODEX_TOOLS, tool_choice=flat)) == ToolChoice("tool", "mcp__notes__secret_word")
    with pytest.raises(BadRequest, match="'namespace' must be a non-empty string") as e:
        tool_choice(req(CODEX_TOOLS, tool_choice={**spaced, "namespace": 3}))
    assert e.value.param == "tool_choice.namespace"


NS = {"type": "namespace", "name": "mcp__notes"}


@pytest.mark.parametrize(
    ("tools", "param", "match"),
    [
        ([{"type": "namespace", "tools": []}], "tools[0].name", "a namespace tool needs a non-empty string 'name'"),
        ([{**NS, "name": ""}], "tools[0].name", "needs a non-empty string 'name'"),
        ([NS], "tools[0].tools", "needs 'tools', a list of function or custom tools"),
        ([{**NS, "tools": {"name": "x"}}], "tools[0].tools", "needs 'tools'"),
        ([{**NS, "tools": [{"type": "web_search"}]}], "tools[0].tools[0].type", "only function and custom tools"),
        ([{**NS, "tools": ["secret_word"]}], "tools[0].tools[0].type", "only function and custom tools"),
        ([{**NS, "tools": [{"type": "function"}]}], "tools[0].tools[0].name", "in namespace 'mcp__notes' needs"),
        (
            [{"type": "function", "name": "mcp__notes__x"}, {**NS, "tools": [{"type": "function", "name": "x"}]}],
            "tools[1].tools[0].name",
            "two tools are offered to the model as 'mcp__notes__x': tools\\[0\\] and tools\\[1\\].tools\\[0\\]",
        ),
        (
            [{**NS, "tools": [{"type": "function", "name": "x"}, {"type": "custom", "name": "x"}]}],
            "tools[0].tools[1].name",
            "two tools are offered",
        ),
        ([{"type": "function", "description": "no name"}], "tools[0].name", "a function tool needs"),
        ([{"type": "file_search", "vector_store_ids": []}], "tools[0].type", "hosted tool of type 'file_search'"),
        ([CODEX_TOOLS[0], {"type": "computer_use_preview"}], "tools[1].type", "'computer_use_preview', which the"),
    ],
)
def test_malformed_or_unservable_tools_are_a_400_naming_the_param(
    tools: list[dict[str, Any]], param: str, match: str
) -> None:
    with pytest.raises(BadRequest, match=match) as e:
        to_conversation(req(tools))
    assert e.value.http_status == 400 and e.value.param == param


def test_a_dropped_hosted_tool_is_counted_and_recorded_once_among_the_trials_refusals() -> None:
    trial: Any = SimpleNamespace(spec=SimpleNamespace(trial_id="t1"), responses=ResponseStore(4, 1000), refusals=[])
    trial.refusals.append("400 responses: something else")
    for _ in range(3):
        note_dropped(trial, to_conversation(req(CODEX_TOOLS))[1].dropped)
    note_dropped(trial, ())
    assert trial.responses.dropped_tools == {"web_search": 3}
    assert trial.refusals[0] == "400 responses: something else"
    assert len(trial.refusals) == 2 and trial.refusals[1].startswith(
        f"{WARNING} 'web_search' from 3 Responses request(s)"
    )
