"""Request models of OpenAI Responses and their translation to the canonical
conversation. Consecutive output items of the assistant (reasoning, message,
function calls) form one assistant turn; ids the proxy gave them (``msg_<turn>``,
``rs_<turn>``) identify the turn when the harness sends them back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import Field, StrictBool

from services.proxy.chat.conversation import Conversation, Message, ToolCall
from services.proxy.chat.toolchoice import ToolChoice, refuse_structured_output
from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose, text_of
from services.proxy.responses.tools import ResponsesTool, ToolNames, flat_name, offered


class Item(Loose):
    type: str | None = None
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    id: str | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None  # a call of a namespace's tool (``tools.py``)
    arguments: str | None = None
    input: str | None = None
    output: str | list[dict[str, Any]] | None = None
    summary: list[dict[str, Any]] | None = None


class ResponsesRequest(Loose):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    previous_response_id: str | None = Field(None, max_length=200)
    store: StrictBool = True  # OpenAI's default: a response is stored unless the request says false
    include: list[str] | None = None
    top_logprobs: Any = None  # checked by ``openai.logprobs.responses_request``
    tool_choice: str | dict[str, Any] | None = None  # checked by ``tool_choice``
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None  # ``format`` checked by ``tool_choice``; ``verbosity`` is ignored


_HOSTED = "the proxy serves function and custom tools only (also those inside namespace tools)"


def tool_choice(req: ResponsesRequest) -> ToolChoice:
    """The request's tool choice; ``text.format`` other than text is refused here too
    (no constrained decoding in the engines)."""
    if req.text is not None and req.text.get("format") is not None:
        refuse_structured_output(req.text["format"], "text.format")
    parallel = req.parallel_tool_calls is not False
    value = req.tool_choice
    if (plain := ToolChoice.of_string(value, parallel)) is not None:
        return plain
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("function", "custom"):
            name = value.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest(f"tool_choice of type {kind!r} needs a non-empty 'name'", param="tool_choice.name")
            # A namespace's tool: by its flat name, or by name and ``namespace`` (as a call item names it).
            space = value.get("namespace")
            if space is not None and (not isinstance(space, str) or not space):
                raise BadRequest(
                    f"tool_choice 'namespace' must be a non-empty string, got {space!r}", param="tool_choice.namespace"
                )
            return ToolChoice("tool", flat_name(space, name) if space else name, parallel)
        if kind == "allowed_tools":
            raise BadRequest(
                "tool_choice 'allowed_tools' is not supported: send only the allowed tools in 'tools'",
                param="tool_choice",
                code="unsupported_value",
            )
        raise BadRequest(
            f"tool_choice of type {kind!r} is not supported: {_HOSTED}", param="tool_choice", code="unsupported_value"
        )
    raise BadRequest(
        f"tool_choice must be 'none', 'auto', 'required' or an object naming a tool, got {value!r}",
        param="tool_choice",
    )


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
            name = flat_name(item.namespace, item.name or "") if item.namespace else item.name or ""
            self.assistant()["calls"].append(ToolCall(item.call_id or "", name, args or ""))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.flush()
            self.messages.append(Message("tool", text_of(item.output), tool_call_id=item.call_id or ""))
        elif kind == "message":
            self.flush()
            role = "system" if item.role in ("system", "developer") else "user"
            self.messages.append(Message(role, text_of(item.content)))
        # other item kinds (web search results, ...) carry nothing a text model renders


def input_items(req: ResponsesRequest) -> list[Item]:
    """The request's own input as items (a string input is one user message)."""
    return [Item(type="message", role="user", content=req.input)] if isinstance(req.input, str) else req.input


def to_conversation(req: ResponsesRequest, earlier: Sequence[Item] = ()) -> tuple[Conversation, ToolNames]:
    """The conversation, and how calls of its tools map back to items (``tools.py``).
    ``earlier``: the items of the chain ``previous_response_id`` names, oldest first."""
    items = [*earlier, *input_items(req)]
    builder = _Builder()
    system = [req.instructions] if req.instructions else []
    lead = 0
    while lead < len(items) and items[lead].role in ("system", "developer") and (items[lead].type in (None, "message")):
        system.append(text_of(items[lead].content))
        lead += 1
    for item in items[lead:]:
        builder.add(item)
    builder.flush()
    tools, names = offered(req.tools or ())
    return Conversation("\n\n".join(system), tuple(builder.messages), tools, protocol="responses"), names
