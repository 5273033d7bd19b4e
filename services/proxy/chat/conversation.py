"""The canonical conversation every wire protocol is translated into.

Messages and tool calls are NamedTuples on purpose: the capture state machine
compares a request's messages with the history it already holds on every turn,
and tuple equality runs in C (string contents compare with memcmp), which keeps
that check cheap at 200k tokens of context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class ToolCall(NamedTuple):
    """A call the assistant made. ``arguments`` is JSON text as the harness sent it."""

    id: str
    name: str
    arguments: str


class Message(NamedTuple):
    """One chat message.

    ``role``: system | user | assistant | tool. ``tool_call_id`` is set on tool
    results. ``turn_ref`` is an id the proxy gave one of its own turns that the
    harness echoed back (an Anthropic thinking signature, a Responses item id);
    together with tool-call ids it is how earlier turns are recognised.
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning: str = ""
    turn_ref: str = ""


class ThreadHint(NamedTuple):
    """A harness-given thread identity (Codex: ``x-codex-turn-metadata``):
    ``thread_id`` names the agent thread, ``source`` is e.g. "subagent",
    ``parent_id`` the spawning thread's id ("" when none)."""

    thread_id: str
    source: str = ""
    parent_id: str = ""


class Tool(NamedTuple):
    """A function tool offered to the model; ``parameters`` is a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Conversation:
    """What a harness asked for, independent of the protocol it spoke.

    ``system`` is the leading system prompt (it names the thread); system
    messages in the middle of the conversation stay in ``messages``.
    """

    system: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    # Set by protocol adapters for logging only.
    protocol: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # The harness's own thread identity, when it sends one (capture/state.py).
    thread_hint: ThreadHint | None = field(default=None, compare=False)


def arguments_for_template(arguments: str) -> Any:
    """Templates expect a dict (they ``tojson`` it); JSON text that is not an object stays text."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def message_for_template(m: Message) -> dict[str, Any]:
    """The HF chat-template shape of one message."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.name, "arguments": arguments_for_template(tc.arguments)},
            }
            for tc in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    return out


def tool_for_template(t: Tool) -> dict[str, Any]:
    return {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
