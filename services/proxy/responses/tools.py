"""The tools of a Responses request as the model is offered them, and the way back
from a call the model writes to the item the harness expects.

- ``function`` and ``custom`` tools are offered under their own names (a custom
  tool takes one string, ``input``).
- ``namespace`` tools (``{"type": "namespace", "name", "description", "tools":
  [function or custom tools]}``) are how Codex 0.171 offers the tools of each MCP
  server (``mcp__NAME``) and its sub-agent tools (``multi_agent_v1``: spawn_agent,
  send_input, wait_agent, ...). Each nested tool is offered under Codex's own
  canonical flat name, ``NAMESPACE__NAME`` (stray underscores around the ``__``
  trimmed: ``mcp__notes`` + ``secret_word`` is ``mcp__notes__secret_word``, the
  name Claude Code gives the same MCP tool). A call of a flat name is answered as
  the API does: ``name`` the nested tool's own name and ``namespace`` its
  namespace (Codex rejects a call by the flat name: "unsupported call"); a call
  item sent back with a ``namespace`` is read back to the flat name. The
  namespace's own description is not rendered (a chat template has no place for
  a group of tools; the flat name carries the namespace).
- Hosted tools, which only OpenAI's servers run: ``web_search`` is dropped, because
  Codex 0.171 sends it on every request (a 400 would stop every Codex trial); the
  drop is counted per trial and recorded as a warning among the trial's refusals
  (it does not count as a refused request). Every other hosted type
  (``file_search``, ``computer_use_preview``, ``code_interpreter``, ``mcp``,
  ``image_generation``, ``local_shell``, ...) no harness we run sends: a 400 naming
  it, never a silent drop.

Malformed tools (no name, a namespace whose ``tools`` is not a list of function or
custom tools, two tools offered under one name) are a 400 naming the param."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harnessrl.logs import kv
from services.proxy.chat.conversation import Tool
from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose

if TYPE_CHECKING:
    from services.proxy.trials import Trial

log = logging.getLogger(__name__)
CUSTOM_INPUT_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
# Hosted tools a real harness sends on every request: dropped (counted and recorded), not refused.
DROPPED_HOSTED = {"web_search": "Codex 0.171 offers it on every request"}
WARNING = "warning (not a refusal): dropped hosted tool"


class ResponsesTool(Loose):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    tools: Any = None  # a namespace's tools, checked by ``offered``


def flat_name(namespace: str, name: str) -> str:
    """The name a namespace's tool is offered under (Codex's canonical flat name)."""
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}"


@dataclass(frozen=True)
class ToolNames:
    """How a call's name (as offered) maps back to the item the harness expects."""

    custom: frozenset[str] = frozenset()  # names of custom (free-form input) tools
    spaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat name: (namespace, name)
    dropped: tuple[str, ...] = ()  # hosted tool types dropped from the request

    def wire(self, name: str) -> tuple[str, str | None]:
        """The call's ``name`` and ``namespace`` (None: a top-level tool) on the wire."""
        if name in self.spaced:
            namespace, own = self.spaced[name]
            return own, namespace
        return name, None


def _named(value: Any, param: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{what} needs a non-empty string 'name', got {value!r}", param=param)
    return value


def _nested(space: str, i: int, tools: Any) -> list[tuple[str, dict[str, Any], str]]:
    """A namespace's tools as (param, tool, own name); each must be a named function or custom tool."""
    if not isinstance(tools, list):
        raise BadRequest(
            f"namespace tool {space!r} needs 'tools', a list of function or custom tools, got {tools!r}"[:300],
            param=f"tools[{i}].tools",
        )
    out = []
    for j, t in enumerate(tools):
        param = f"tools[{i}].tools[{j}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind not in ("function", "custom"):
            raise BadRequest(
                f"namespace {space!r} may hold only function and custom tools, got type {kind!r}",
                param=f"{param}.type",
                code="unsupported_value",
            )
        out.append((param, t, _named(t.get("name"), f"{param}.name", f"a {kind} tool in namespace {space!r}")))
    return out


def offered(tools: Sequence[ResponsesTool]) -> tuple[tuple[Tool, ...], ToolNames]:
    """The tools offered to the model and how to map their calls back; a 400 for what cannot be served."""
    out: list[Tool] = []
    custom: set[str] = set()
    spaced: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    where: dict[str, str] = {}  # offered name: the param that offered it first

    def add(name: str, param: str, kind: str, description: str | None, parameters: Any) -> None:
        if name in where:
            raise BadRequest(
                f"two tools are offered to the model as {name!r}: {where[name]} and {param}", param=f"{param}.name"
            )
        where[name] = param
        schema = CUSTOM_INPUT_SCHEMA if kind == "custom" else parameters if isinstance(parameters, dict) else {}
        out.append(Tool(name, description if isinstance(description, str) else "", schema))
        if kind == "custom":
            custom.add(name)

    for i, t in enumerate(tools):
        if t.type in ("function", "custom"):
            name = _named(t.name, f"tools[{i}].name", f"a {t.type} tool")
            add(name, f"tools[{i}]", t.type, t.description, t.parameters)
        elif t.type == "namespace":
            space = _named(t.name, f"tools[{i}].name", "a namespace tool")
            for param, nested, own in _nested(space, i, t.tools):
                flat = flat_name(space, own)
                add(flat, param, nested["type"], nested.get("description"), nested.get("parameters"))
                spaced[flat] = (space, own)
        elif t.type in DROPPED_HOSTED:
            dropped.append(t.type)
        else:
            raise BadRequest(
                f"tools[{i}] is a hosted tool of type {t.type!r}, which the proxy cannot run: it serves "
                "function, custom and namespace tools (and drops web_search); omit it",
                param=f"tools[{i}].type",
                code="unsupported_value",
            )
    return tuple(out), ToolNames(frozenset(custom), spaced, tuple(dict.fromkeys(dropped)))


def note_dropped(trial: Trial, dropped: Sequence[str]) -> None:
    """Counts a request's dropped hosted tools on the trial and keeps one warning per type
    among its refusals (updated with the count), which the trial's summary carries."""
    from services.proxy.trials import MAX_REFUSALS  # trials imports this package: not at import time

    counts = trial.responses.dropped_tools
    for kind in dropped:
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] == 1:
            log.warning("dropped hosted tool", extra=kv(trial=trial.spec.trial_id, tool=kind))
        prefix = f"{WARNING} {kind!r}"
        text = (
            f"{prefix} from {counts[kind]} Responses request(s): the proxy cannot run it and the policy "
            f"never sees it ({DROPPED_HOSTED[kind]}, so it is dropped rather than refused)"
        )
        at = next((n for n, r in enumerate(trial.refusals) if r.startswith(prefix)), None)
        if at is not None:
            trial.refusals[at] = text
        elif len(trial.refusals) < MAX_REFUSALS:
            trial.refusals.append(text)
