"""A Gemini request as the canonical conversation, and the thought signature that
marks the proxy's own turns.

Roles: ``model`` is the assistant; ``user`` (and ``function``, the older name of a
turn of function responses) holds text and ``functionResponse`` parts, which become
tool messages in order. Thought parts (``thought: true``) sent back are the turn's
reasoning. Media and code-execution parts become a placeholder for a text model."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic.alias_generators import to_camel

from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall
from services.proxy.errors import BadRequest
from services.proxy.gemini.models import PART_KINDS, FunctionResponse, GenerateContentRequest, Part

# The proxy's own turns carry this thought signature (base64 of prefix + turn id)
# on every part; clients echo signatures verbatim, which identifies the turn
# (invariant 3) whether or not they keep function call ids.
SIGNATURE_PREFIX = b"harnessrl:"

_GEMINI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}


def json_schema(value: Any) -> Any:
    """Gemini's OpenAPI-style schema (``"type": "OBJECT"``) as JSON Schema, which chat
    templates render and tool parsers read: upper-case type names lower-cased."""
    if isinstance(value, list):
        return [json_schema(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k == "type" and isinstance(v, str) and v in _GEMINI_TYPES:
            out[k] = v.lower()
        elif k == "type" and isinstance(v, list):
            out[k] = [t.lower() if isinstance(t, str) and t in _GEMINI_TYPES else t for t in v]
        else:
            out[k] = json_schema(v)
    return out


def signature(turn_id: str) -> str:
    return base64.urlsafe_b64encode(SIGNATURE_PREFIX + turn_id.encode()).decode()


def turn_of(sig: str | None) -> str:
    """The proxy's turn id in an echoed thought signature; "" for anyone else's
    (Gemini CLI sends ``skip_thought_signature_validator``, not base64 at all)."""
    if not sig:
        return ""
    text = sig.replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return ""
    return raw[len(SIGNATURE_PREFIX) :].decode("ascii", "replace") if raw.startswith(SIGNATURE_PREFIX) else ""


def _placeholder(p: Part) -> str:
    kind = next(k for k in PART_KINDS if getattr(p, k) is not None)
    return f"[{to_camel(kind)} omitted]"


def _assistant(parts: list[Part]) -> Message:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    ref = ""
    for p in parts:
        ref = ref or turn_of(p.thought_signature)
        if p.function_call is not None:
            fc = p.function_call
            calls.append(ToolCall(fc.id or "", fc.name, json.dumps(fc.args or {}, ensure_ascii=False)))
        elif p.text is not None:
            (reasoning if p.thought else text).append(p.text)
        elif p.function_response is None:
            text.append(_placeholder(p))
        else:
            raise BadRequest("a functionResponse part belongs to a user turn, not a model turn")
    return Message("assistant", "".join(text), tuple(calls), reasoning="".join(reasoning), turn_ref=ref)


def _result_text(fr: FunctionResponse) -> str:
    """A function's result as the model reads it: Gemini CLI's ``{"output": ...}``
    (or ``{"error": ...}``) as its text, any other object as JSON."""
    resp = fr.response or {}
    if len(resp) == 1 and isinstance(resp.get("output"), str):
        return str(resp["output"])
    if len(resp) == 1 and isinstance(resp.get("error"), str):
        return f"Error: {resp['error']}"
    return json.dumps(resp, ensure_ascii=False)


def _user(parts: list[Part]) -> list[Message]:
    """Function responses become tool messages; text between them stays user text, in order."""
    out: list[Message] = []
    text: list[str] = []
    for p in parts:
        if p.function_response is not None:
            if text:
                out.append(Message("user", "".join(text)))
                text = []
            fr = p.function_response
            out.append(Message("tool", _result_text(fr), tool_call_id=fr.id or ""))
        elif p.function_call is not None:
            raise BadRequest("a functionCall part belongs to a model turn, not a user turn")
        else:
            text.append(p.text if p.text is not None else _placeholder(p))
    if text or not out:
        out.append(Message("user", "".join(text)))
    return out


def tools_of(req: GenerateContentRequest) -> tuple[Tool, ...]:
    decls = [d for tool in req.tools or () for d in tool.function_declarations or ()]
    seen: set[str] = set()
    for d in decls:
        if d.name in seen:
            raise BadRequest(f"tools: function {d.name!r} is declared twice", param="tools")
        seen.add(d.name)
    schema = {"type": "object", "properties": {}}
    return tuple(
        Tool(d.name, d.description, json_schema(d.parameters_json_schema or d.parameters or schema)) for d in decls
    )


def to_conversation(req: GenerateContentRequest) -> Conversation:
    si = req.system_instruction
    system = "".join(p.text or "" for p in si.parts) if si is not None else ""
    messages: list[Message] = []
    for c in req.contents:
        if c.role == "model":
            messages.append(_assistant(c.parts))
        else:  # user, function (the older name of a function-response turn), or unset
            messages.extend(_user(c.parts))
    return Conversation(system, tuple(messages), tools_of(req), protocol="gemini")
