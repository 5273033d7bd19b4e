"""tool_choice / parallel_tool_calls / structured output formats: each protocol's
values parse into one ToolChoice or a clear 400, and a forced call's prefill is
the opening the model's real chat template writes, which the parser reads back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harnessrl.paths import default_model_dir
from services.proxy.anthropic.models import MessagesRequest
from services.proxy.anthropic.models import tool_choice as anthropic_choice
from services.proxy.chat.conversation import Tool
from services.proxy.chat.model import ChatModel
from services.proxy.chat.toolchoice import ToolChoice, forcing, refuse_structured_output, tool_call_opening
from services.proxy.chat.toolparsers import JsonParser
from services.proxy.errors import BadRequest
from services.proxy.openai.models import ChatRequest
from services.proxy.openai.models import tool_choice as openai_choice
from services.proxy.responses.models import ResponsesRequest
from services.proxy.responses.models import tool_choice as responses_choice

BASH = Tool("bash", "Run", {"type": "object", "properties": {"command": {"type": "string"}}})
EDIT = Tool("edit", "Edit", {"type": "object", "properties": {}})


@pytest.fixture(scope="module")
def model() -> ChatModel:
    return ChatModel.load(
        default_model_dir(), [], "auto", {default_model_dir().name: "hermes-chatml"}, "hermes", reasoning=True
    )


def chat(**kw: Any) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], **kw})


def messages(**kw: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], **kw}
    )


def responses(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "x", **kw})


def test_each_protocol_parses_to_one_choice() -> None:
    fn = {"type": "function", "function": {"name": "bash"}}
    assert openai_choice(chat()) == ToolChoice("auto")
    assert openai_choice(chat(tool_choice="none")) == ToolChoice("none")
    assert openai_choice(chat(tool_choice="required", parallel_tool_calls=False)) == ToolChoice("required", "", False)
    assert openai_choice(chat(tool_choice=fn, response_format={"type": "text"})) == ToolChoice("tool", "bash")
    assert anthropic_choice(messages(tool_choice={"type": "any"})) == ToolChoice("required")
    assert anthropic_choice(messages(tool_choice={"type": "none"})) == ToolChoice("none")
    named = {"type": "tool", "name": "bash", "disable_parallel_tool_use": True}
    assert anthropic_choice(messages(tool_choice=named)) == ToolChoice("tool", "bash", False)
    assert anthropic_choice(messages(output_config={"effort": "high"})) == ToolChoice("auto")
    assert responses_choice(responses(tool_choice={"type": "function", "name": "bash"})) == ToolChoice("tool", "bash")
    assert responses_choice(responses(tool_choice={"type": "custom", "name": "apply_patch"})).name == "apply_patch"
    assert responses_choice(responses(text={"verbosity": "low"}, parallel_tool_calls=False)).parallel is False


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: openai_choice(chat(tool_choice="sometimes")), "tool_choice must be"),
        (lambda: openai_choice(chat(tool_choice={"type": "function"})), "function.name must be"),
        (lambda: openai_choice(chat(tool_choice={"type": "allowed_tools"})), "'allowed_tools' is not supported"),
        (lambda: openai_choice(chat(response_format={"type": "json_object"})), "response_format of type 'json_o"),
        (lambda: openai_choice(chat(response_format={"type": "json_schema"})), "needs constrained decoding"),
        (lambda: openai_choice(chat(response_format={"type": "yaml"})), "response_format must be an object"),
        (lambda: anthropic_choice(messages(tool_choice={"type": "tool"})), "tool_choice.name: required"),
        (lambda: anthropic_choice(messages(output_format={"type": "json_schema"})), "output_format of type"),
        (lambda: anthropic_choice(messages(output_config={"format": {"type": "json_schema"}})), "output_config"),
        (lambda: responses_choice(responses(tool_choice={"type": "function"})), "needs a non-empty 'name'"),
        (lambda: responses_choice(responses(tool_choice={"type": "web_search_preview"})), "function and custom"),
        (lambda: responses_choice(responses(tool_choice="any")), "tool_choice must be"),
        (lambda: responses_choice(responses(text={"format": {"type": "json_schema"}})), "text.format of type"),
    ],
)
def test_malformed_or_unsupported_values_are_clear_400s(make: Any, match: str) -> None:
    with pytest.raises(BadRequest, match=match) as e:
        make()
    assert e.value.http_status == 400 and e.value.param


@pytest.mark.parametrize(
    "body",
    [
        lambda: chat(parallel_tool_calls="yes"),
        lambda: messages(tool_choice={"type": "sometimes"}),
        lambda: messages(tool_choice={"type": "auto", "disable_parallel_tool_use": "no"}),
        lambda: responses(store="false"),
        lambda: responses(parallel_tool_calls=1),
        lambda: responses(tool_choice=7),
    ],
)
def test_wrong_types_fail_validation(body: Any) -> None:
    with pytest.raises(ValueError):  # pydantic's ValidationError: the route's parse() makes it a 400
        body()


def test_forced_openings_come_from_the_template_and_parse_back(model: ChatModel) -> None:
    named = tool_call_opening(model, "bash")
    anyone = tool_call_opening(model, "")
    assert named == '<tool_call>\n{"name": "bash", "arguments": '
    assert anyone == '<tool_call>\n{"name": '
    result = model.parser.parse(named + '{"command": "ls"}}\n</tool_call>', (BASH,))
    assert [(c.name, c.arguments) for c in result.calls] == [("bash", {"command": "ls"})]
    result = model.parser.parse(anyone + '"edit", "arguments": {}}\n</tool_call>', (BASH, EDIT))
    assert [c.name for c in result.calls] == ["edit"] and not result.malformed


def test_forcing_per_mode(model: ChatModel) -> None:
    tools = (BASH, EDIT)
    assert forcing(ToolChoice("auto"), model, tools).prefill == ""
    assert forcing(ToolChoice("auto", parallel=False), model, tools).max_calls == 1
    none = forcing(ToolChoice("none"), model, tools)
    assert none.stops == ("<tool_call>",) and none.max_calls == 0 and none.prefill == ""
    assert forcing(ToolChoice("none"), model, ()).stops == ()  # nothing to keep the model from
    assert forcing(ToolChoice("tool", "edit"), model, tools).prefill.endswith('"edit", "arguments": ')
    assert forcing(ToolChoice("required", parallel=False), model, tools).max_calls == 1
    with pytest.raises(BadRequest, match=r"names tool 'rm', which is not among the request's tools \['bash', 'edit'\]"):
        forcing(ToolChoice("tool", "rm"), model, tools)
    with pytest.raises(BadRequest, match="forces a tool call but the request offers no tools"):
        forcing(ToolChoice("required", param="tool_choice"), model, ())
    json_model = dataclasses.replace(model, parser=JsonParser())
    with pytest.raises(BadRequest, match="'none' is not supported with tool parser 'json'"):
        forcing(ToolChoice("none"), json_model, tools)


def test_refuse_structured_output_passes_text_only() -> None:
    refuse_structured_output({"type": "text"}, "response_format")
    with pytest.raises(BadRequest, match="x of type 'json_schema'"):
        refuse_structured_output({"type": "json_schema", "json_schema": {}}, "x")
    with pytest.raises(BadRequest, match="must be an object"):
        refuse_structured_output("json", "x")
