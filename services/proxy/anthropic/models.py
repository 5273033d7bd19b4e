"""Request models of Anthropic Messages and their translation to the canonical
conversation; unknown fields (``cache_control``, ``context_management``,
``output_config``...) are accepted and logged."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, StrictBool

from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall
from services.proxy.chat.toolchoice import ToolChoice, refuse_structured_output
from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose, text_of

# Thinking blocks the proxy returns carry this signature prefix and the turn id;
# harnesses echo signatures verbatim, which identifies the turn (invariant 3).
SIGNATURE_PREFIX = "harnessrl:"


class Block(Loose):
    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class AnthropicMessage(Loose):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class AnthropicTool(Loose):
    name: str = Field(min_length=1)
    description: str = ""
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class AnthropicToolChoice(Loose):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool = False


class CountTokensRequest(Loose):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[AnthropicTool] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_format: dict[str, Any] | None = None  # structured outputs (beta): refused by ``tool_choice``
    output_config: dict[str, Any] | None = None  # only its ``format`` is read (Claude Code sends ``effort``)


_MODES = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}


def tool_choice(req: MessagesRequest) -> ToolChoice:
    """The request's tool choice; a structured output format is refused here too
    (no constrained decoding in the engines)."""
    if req.output_format is not None:
        refuse_structured_output(req.output_format, "output_format")
    if req.output_config is not None and req.output_config.get("format") is not None:
        refuse_structured_output(req.output_config["format"], "output_config.format")
    choice = req.tool_choice
    if choice is None:
        return ToolChoice("auto")
    if choice.type == "tool" and not choice.name:
        raise BadRequest("tool_choice.name: required when tool_choice.type is 'tool'", param="tool_choice.name")
    mode = _MODES[choice.type]
    return ToolChoice(mode, choice.name or "", not choice.disable_parallel_tool_use)  # type: ignore[arg-type]


def _blocks(content: str | list[Block]) -> list[Block]:
    return [Block(type="text", text=content)] if isinstance(content, str) else content


def _assistant(content: str | list[Block]) -> Message:
    text, reasoning, calls, ref = [], [], [], ""
    for b in _blocks(content):
        if b.type == "text" and b.text:
            text.append(b.text)
        elif b.type == "thinking":
            reasoning.append(b.thinking or "")
            if b.signature and b.signature.startswith(SIGNATURE_PREFIX):
                ref = b.signature[len(SIGNATURE_PREFIX) :]
        elif b.type in ("tool_use", "server_tool_use"):
            calls.append(ToolCall(b.id or "", b.name or "", json.dumps(b.input or {}, ensure_ascii=False)))
    return Message("assistant", "".join(text), tuple(calls), reasoning="".join(reasoning), turn_ref=ref)


def _user(role: str, content: str | list[Block]) -> list[Message]:
    """Tool results become tool messages; text between them stays user (or system) text, in order."""
    out: list[Message] = []
    text: list[str] = []
    for b in _blocks(content):
        if b.type == "tool_result":
            if text:
                out.append(Message(role, "".join(text)))
                text = []
            body = text_of(b.content)
            out.append(Message("tool", f"Error: {body}" if b.is_error else body, tool_call_id=b.tool_use_id or ""))
        else:
            text.append(text_of([b]))
    if text or not out:
        out.append(Message(role, "".join(text)))
    return out


def to_conversation(req: CountTokensRequest) -> Conversation:
    system = req.system if isinstance(req.system, str) else "\n\n".join(b.text or "" for b in req.system or ())
    messages: list[Message] = []
    for m in req.messages:
        if m.role == "assistant":
            messages.append(_assistant(m.content))
        else:
            messages.extend(_user(m.role, m.content))
    tools = tuple(Tool(t.name, t.description, t.input_schema) for t in req.tools or () if t.input_schema is not None)
    return Conversation(system, tuple(messages), tools, protocol="anthropic")
