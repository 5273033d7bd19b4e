"""Request models of OpenAI Chat Completions and their translation to the
canonical conversation; unknown fields are accepted and logged."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, StrictBool

from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall
from services.proxy.chat.toolchoice import ToolChoice, refuse_structured_output
from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose, text_of


class ContentPart(Loose):
    type: str
    text: str | None = None


class FunctionCall(Loose):
    name: str
    arguments: str | dict[str, Any] = ""


class ChatToolCall(Loose):
    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class FunctionDef(Loose):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ChatTool(Loose):
    type: str = "function"
    function: FunctionDef


class StreamOptions(Loose):
    include_usage: bool = False


class ChatRequest(Loose):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None  # checked by ``tool_choice``
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None  # checked by ``tool_choice``
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension (-1: off), sent by some harnesses
    stop: str | list[str] | None = None
    # Checked by ``openai.logprobs.chat_request`` for OpenAI's own 400s.
    logprobs: Any = None
    top_logprobs: Any = None


def tool_choice(req: ChatRequest) -> ToolChoice:
    """The request's tool choice; a ``response_format`` other than text is refused
    here too (no constrained decoding in the engines)."""
    if req.response_format is not None:
        refuse_structured_output(req.response_format, "response_format")
    parallel = req.parallel_tool_calls is not False
    value = req.tool_choice
    if (plain := ToolChoice.of_string(value, parallel)) is not None:
        return plain
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.function.name must be a non-empty string", param="tool_choice")
        return ToolChoice("tool", name, parallel)
    if isinstance(value, dict) and value.get("type") in ("allowed_tools", "custom"):
        raise BadRequest(
            f"tool_choice of type {value['type']!r} is not supported: name one function tool, or send only the "
            "allowed tools",
            param="tool_choice",
            code="unsupported_value",
        )
    raise BadRequest(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}, "
        f"got {value!r}"[:300],
        param="tool_choice",
    )


def _arguments(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def to_conversation(req: ChatRequest) -> Conversation:
    msgs = req.messages
    lead = 0
    while lead < len(msgs) and msgs[lead].role in ("system", "developer"):
        lead += 1
    system = "\n\n".join(text_of(m.content) for m in msgs[:lead])
    out: list[Message] = []
    for i, m in enumerate(msgs[lead:], lead):
        role = "system" if m.role == "developer" else "tool" if m.role == "function" else m.role
        if role == "tool" and not (m.tool_call_id or m.name):
            raise BadRequest(f"messages.{i}: a tool message needs tool_call_id")
        calls = tuple(ToolCall(c.id, c.function.name, _arguments(c.function.arguments)) for c in m.tool_calls or ())
        out.append(
            Message(
                role,
                text_of(m.content),
                calls if role == "assistant" else (),
                m.tool_call_id or "",
                m.reasoning_content or "",
            )
        )
    tools = tuple(
        Tool(t.function.name, t.function.description, t.function.parameters)
        for t in req.tools or ()
        if t.type == "function"
    )
    return Conversation(system, tuple(out), tools, protocol="openai")
