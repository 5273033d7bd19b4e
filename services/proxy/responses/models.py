"""Request models of OpenAI Responses and their translation to the canonical
conversation. Consecutive output items of the assistant (reasoning, message,
function calls) form one assistant turn; ids the proxy gave them (``msg_<turn>``,
``rs_<turn>``) identify the turn when the harness sends them back."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall
from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose, text_of

CUSTOM_INPUT_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


class Item(Loose):
    type: str | None = None
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    id: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None
    output: str | list[dict[str, Any]] | None = None
    summary: list[dict[str, Any]] | None = None


class ResponsesTool(Loose):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(Loose):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    previous_response_id: str | None = None
    include: list[str] | None = None
    top_logprobs: Any = None  # checked by ``openai.logprobs.responses_request``


def _ref(item_id: str | None) -> str:
    for prefix in ("msg_", "rs_"):
        if item_id and item_id.startswith(prefix):
            return item_id[len(prefix) :]
    return ""


class _Builder:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._turn: dict[str, Any] | None = None

    def assistant(self) -> dict[str, Any]:
        if self._turn is None:
            self._turn = {"text": [], "reasoning": [], "calls": [], "ref": ""}
        return self._turn

    def flush(self) -> None:
        t, self._turn = self._turn, None
        if t is not None:
            msg = Message("assistant", "".join(t["text"]), tuple(t["calls"]), reasoning="".join(t["reasoning"]))
            self.messages.append(msg._replace(turn_ref=t["ref"]))

    def add(self, item: Item) -> None:
        kind = item.type or ("message" if item.role else "")
        if kind == "message" and item.role == "assistant":
            t = self.assistant()
            t["text"].append(text_of(item.content))
            t["ref"] = t["ref"] or _ref(item.id)
        elif kind == "reasoning":
            t = self.assistant()
            t["reasoning"].append("".join(s.get("text", "") for s in item.summary or ()))
            t["ref"] = t["ref"] or _ref(item.id)
        elif kind in ("function_call", "custom_tool_call"):
            args = item.arguments if kind == "function_call" else json.dumps({"input": item.input or ""})
            self.assistant()["calls"].append(ToolCall(item.call_id or "", item.name or "", args or ""))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.flush()
            self.messages.append(Message("tool", text_of(item.output), tool_call_id=item.call_id or ""))
        elif kind == "message":
            self.flush()
            role = "system" if item.role in ("system", "developer") else "user"
            self.messages.append(Message(role, text_of(item.content)))
        # other item kinds (web search results, ...) carry nothing a text model renders


def to_conversation(req: ResponsesRequest) -> tuple[Conversation, set[str]]:
    """The conversation, and the names of custom (free-form input) tools."""
    if req.previous_response_id:
        raise BadRequest("previous_response_id is not supported: send the whole input (store=false)")
    items = [Item(type="message", role="user", content=req.input)] if isinstance(req.input, str) else req.input
    builder = _Builder()
    system = [req.instructions] if req.instructions else []
    lead = 0
    while lead < len(items) and items[lead].role in ("system", "developer") and (items[lead].type in (None, "message")):
        system.append(text_of(items[lead].content))
        lead += 1
    for item in items[lead:]:
        builder.add(item)
    builder.flush()
    tools, custom = [], set()
    for t in req.tools or ():
        if t.type == "function" and t.name:
            tools.append(Tool(t.name, t.description or "", t.parameters or {}))
        elif t.type == "custom" and t.name:
            tools.append(Tool(t.name, t.description or "", CUSTOM_INPUT_SCHEMA))
            custom.add(t.name)
    return Conversation("\n\n".join(system), tuple(builder.messages), tuple(tools), protocol="responses"), custom
