"""``tool_choice`` and ``parallel_tool_calls``, honoured with what the engine can do.

The engines sample freely (no constrained decoding), so a choice is carried out
in the prompt and in what the proxy does with the output:

- ``auto``: nothing changes.
- ``none``: the tools stay in the prompt (the request still extends the same
  segment) and generation stops where the model opens a tool call (the parser's
  markers act as stop strings); the text before it is the reply, no call is
  made. A parser without markers (``json``) cannot tell, so ``none`` is refused.
- ``required`` (Anthropic ``any``) and a named tool (``tool``): the assistant
  turn is prefilled with the opening of a tool call as the chat template writes
  it (for a named tool, up to and including the name). The prefill ends the
  prompt: its ids are context (mask 0), never sampled, and the turn the capture
  keeps for later renders is prefill + sampled ids, so a segment opened later
  renders that turn exactly as the engine saw it. The model's continuation is
  parsed with the prefill in front of it.
- ``parallel_tool_calls: false`` (Anthropic ``disable_parallel_tool_use``): the
  first parsed call is returned, later ones in the same turn are dropped (their
  tokens stay in the capture: they were sampled in that context).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from services.proxy.chat.conversation import Tool, tool_for_template
from services.proxy.chat.model import ChatModel
from services.proxy.errors import BadRequest

Mode = Literal["auto", "none", "required", "tool"]
_CACHE_MAX = 256
_openings: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class ToolChoice:
    """A request's tool choice, protocol-independent. ``param`` names the request
    field it came from, for error messages."""

    mode: Mode = "auto"
    name: str = ""
    parallel: bool = True
    param: str = "tool_choice"

    @staticmethod
    def of_string(value: object, parallel: bool) -> ToolChoice | None:
        """The OpenAI protocols' string forms (absent or ``auto``, ``none``, ``required``);
        None for any other value, which the protocol reads itself."""
        if value is None or value == "auto":
            return ToolChoice("auto", parallel=parallel)
        if value in ("none", "required"):
            return ToolChoice(value, parallel=parallel)  # type: ignore[arg-type]
        return None


@dataclass(frozen=True)
class ToolForcing:
    """What one model call does to honour a tool choice (``turn.CallParams.forcing``)."""

    prefill: str = ""  # text the assistant turn starts with, rendered into the prompt (mask 0)
    stops: tuple[str, ...] = ()  # text at which generation ends, not reported as a stop sequence
    max_calls: int | None = None  # calls returned per turn; None: all


def forcing(choice: ToolChoice, model: ChatModel, tools: tuple[Tool, ...]) -> ToolForcing:
    """How to carry out ``choice`` for a request offering ``tools``; a clear 400 when it cannot be."""
    max_calls = None if choice.parallel else 1
    if choice.mode == "auto" or (choice.mode == "none" and not tools):
        return ToolForcing(max_calls=max_calls)
    if choice.mode == "none":
        if not model.parser.markers:
            raise BadRequest(
                f"{choice.param} 'none' is not supported with tool parser {model.parser.name!r}: its tool calls "
                "have no opening marker to stop at; omit the tools instead",
                param=choice.param,
                code="unsupported_value",
            )
        return ToolForcing(stops=tuple(model.parser.markers), max_calls=0)
    if not tools:
        raise BadRequest(f"{choice.param} forces a tool call but the request offers no tools", param=choice.param)
    if choice.mode == "tool" and choice.name not in {t.name for t in tools}:
        raise BadRequest(
            f"{choice.param} names tool {choice.name!r}, which is not among the request's tools "
            f"{sorted(t.name for t in tools)}",
            param=choice.param,
        )
    return ToolForcing(prefill=tool_call_opening(model, choice.name, choice.param), max_calls=max_calls)


def tool_call_opening(model: ChatModel, name: str, param: str = "tool_choice") -> str:
    """The text an assistant turn starts with when it calls ``name`` (any tool if
    empty), as the model's chat template renders a call: the common prefix of two
    rendered calls that differ only after it, cut back to a whitespace boundary
    (a cut inside a JSON string or tag would be tokenized unlike anything the
    model writes)."""
    key = (model.template.sha256, model.parser.name, name)
    if key in _openings:
        return _openings[key]
    if name:
        a, b = _call_body(model, name, {}), _call_body(model, name, {"a": "x"})
    else:
        a, b = _call_body(model, "tool_a", {}), _call_body(model, "tool_b", {})
    common = _common_prefix(a, b)
    floor = 0
    if name:
        at = common.rfind(name)
        if at < 0:
            raise BadRequest(
                f"{param} names a tool, but chat template {model.template.name!r} does not write a call's name "
                "before its arguments, so the proxy cannot force it; use 'required' or 'auto'",
                param=param,
                code="unsupported_value",
            )
        floor = at + len(name)
    cut = max(floor, max((i + 1 for i, ch in enumerate(common) if ch.isspace()), default=0))
    opening = common[:cut] if cut else common
    if not opening.strip():
        raise BadRequest(
            f"chat template {model.template.name!r} writes no recognisable tool-call opening; {param} cannot be forced",
            param=param,
            code="unsupported_value",
        )
    if len(_openings) >= _CACHE_MAX:
        _openings.clear()
    _openings[key] = opening
    return opening


def _common_prefix(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


def _call_body(model: ChatModel, name: str, arguments: dict[str, Any]) -> str:
    """The template's text for an assistant turn that is one call of ``name``."""
    tools = [tool_for_template(Tool(name, "", {"type": "object", "properties": {}}))]
    user: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    try:
        prefix = model.template.render(user, tools, add_generation_prompt=True)
        full = model.template.render([*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tools, False)
    except Exception as e:
        raise BadRequest(f"chat template {model.template.name!r} cannot render a forced tool call: {e}") from e
    if not full.startswith(prefix):
        raise BadRequest(f"chat template {model.template.name!r} does not extend its generation prompt with a call")
    return full[len(prefix) :]


def refuse_structured_output(value: Any, param: str) -> None:
    """``response_format`` / ``text.format`` / Anthropic ``output_format``: plain text
    passes; a JSON object or schema would need constrained decoding, which the
    gateway's engines (vLLM pool, local, scripted) do not offer, so it is a 400
    naming the field rather than output that merely hopes to match."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    if kind in ("json_object", "json_schema"):
        raise BadRequest(
            f"{param} of type {kind!r} needs constrained decoding, which this proxy's engines do not offer; "
            "omit it or use type 'text'",
            param=param,
            code="unsupported_value",
        )
    raise BadRequest(
        f"{param} must be an object whose type is 'text', 'json_object' or 'json_schema', got {value!r}"[:300],
        param=param,
    )
