"""Tool-call parsers: the model's text -> (content, structured calls).

A registry by name (``hermes``, ``qwen3_coder``, ``json``) or import path
(``module:Class``); the parser is chosen per model in settings, and preflight
checks that it reads back what the chat template writes. Text that looks like a
tool call but does not parse is returned to the harness as plain text and
counted as malformed, never dropped and never half-parsed.
"""

from __future__ import annotations

import importlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harnessrl.errors import ConfigError
from services.proxy.chat.conversation import Tool
from services.proxy.chat.qwen3stream import Qwen3CoderStream
from services.proxy.chat.toolstream import HermesStream, ToolStream


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParseResult:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)
    malformed: bool = False


class ToolParser(ABC):
    name: ClassVar[str]
    # Text that opens the tool-call region; streaming holds text back from here on.
    markers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse(self, text: str, tools: tuple[Tool, ...]) -> ParseResult: ...

    def holds_everything(self, text_so_far: str) -> bool:
        """True when the whole output may be a call (streaming must hold it all back)."""
        return False

    def streamer(self, tools: tuple[Tool, ...] = ()) -> ToolStream:
        """Reads the tool-call region as it arrives (see ``toolstream``); the default
        sends each call whole once the output has been parsed."""
        return ToolStream()


def _split_region(text: str, marker: str) -> tuple[str, str] | None:
    at = text.find(marker)
    return None if at < 0 else (text[:at], text[at:])


class HermesParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

    name = "hermes"
    markers = ("<tool_call>",)
    _block = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.S)

    def streamer(self, tools: tuple[Tool, ...] = ()) -> ToolStream:
        return HermesStream()

    def parse(self, text: str, tools: tuple[Tool, ...]) -> ParseResult:
        split = _split_region(text, self.markers[0])
        if split is None:
            return ParseResult(text.strip())
        head, region = split
        calls: list[ParsedCall] = []
        pos = 0
        while pos < len(region):
            m = self._block.match(region, pos)
            call = _json_call(m.group(1)) if m else None
            if m is None or call is None:
                return ParseResult(text.strip(), malformed=True)
            calls.append(call)
            pos = m.end()
        return ParseResult(head.strip(), calls)


class Qwen3CoderParser(ToolParser):
    """``<tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>``;
    values are text, converted by the tool's JSON schema where it says so."""

    name = "qwen3_coder"
    markers = ("<tool_call>",)
    _block = re.compile(r"\s*<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>\s*", re.S)
    _param = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.S)

    def streamer(self, tools: tuple[Tool, ...] = ()) -> ToolStream:
        return Qwen3CoderStream(tools)

    def parse(self, text: str, tools: tuple[Tool, ...]) -> ParseResult:
        split = _split_region(text, self.markers[0])
        if split is None:
            return ParseResult(text.strip())
        head, region = split
        schemas = {t.name: t.parameters.get("properties", {}) for t in tools}
        calls: list[ParsedCall] = []
        pos = 0
        while pos < len(region):
            m = self._block.match(region, pos)
            if m is None:
                return ParseResult(text.strip(), malformed=True)
            name, body = m.group(1).strip(), m.group(2)
            args = self._params(body, schemas.get(name, {}))
            if args is None:
                return ParseResult(text.strip(), malformed=True)
            calls.append(ParsedCall(name, args))
            pos = m.end()
        return ParseResult(head.strip(), calls)

    def _params(self, body: str, props: dict[str, Any]) -> dict[str, Any] | None:
        args: dict[str, Any] = {}
        pos = 0
        while body[pos:].strip():
            m = self._param.match(body, pos)
            if m is None:
                return None
            key = m.group(1).strip()
            args[key] = _convert(m.group(2), props.get(key, {}))
            pos = m.end()
        return args


def _convert(value: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in (None, "string") or isinstance(kind, list):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


class JsonParser(ToolParser):
    """The whole output is a JSON call object (``name`` + ``arguments``/``parameters``)
    or a list of them, optionally in a ```json fence."""

    name = "json"
    _fence = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)

    def holds_everything(self, text_so_far: str) -> bool:
        head = text_so_far.lstrip()
        return not head or head[0] in "{[`"

    def parse(self, text: str, tools: tuple[Tool, ...]) -> ParseResult:
        body = text.strip()
        fenced = self._fence.match(body)
        if fenced:
            body = fenced.group(1)
        if not body or body[0] not in "{[":
            return ParseResult(text.strip())
        try:
            value = json.loads(body)
        except ValueError:
            return ParseResult(text.strip(), malformed='"name"' in body)
        items = value if isinstance(value, list) else [value]
        calls = [_call_from_obj(item) for item in items]
        if not items or any(c is None for c in calls):
            looks_like_call = isinstance(value, dict | list) and '"name"' in body
            return ParseResult(text.strip(), malformed=looks_like_call)
        return ParseResult("", [c for c in calls if c is not None])


class FencedParser(ToolParser):
    """A fenced code block whose language is an offered tool's name, for a tool with
    one parameter (```bash\nls\n```), is a call of that tool with the block's body as
    that parameter; the reply's content is the text before the first call (text after
    the last one is dropped). Other fences are text. A tool's block opened and never
    closed is malformed. For models that write fences but no call tags (template
    ``fenced-chatml`` renders offered tools and past calls this way)."""

    name = "fenced"
    markers = ("```",)
    _block = re.compile(r"```([A-Za-z0-9_.-]+)[ \t]*\n(.*?)\n?```", re.S)

    def parse(self, text: str, tools: tuple[Tool, ...]) -> ParseResult:
        params = {t.name: p for t in tools if (p := _single_param(t)) is not None}
        calls, head = [], len(text)
        for m in self._block.finditer(text):
            if m.group(1) in params:
                head = min(head, m.start())
                calls.append(ParsedCall(m.group(1), {params[m.group(1)]: m.group(2)}))
        if calls:
            return ParseResult(text[:head].strip(), calls)
        opened = any(re.search(rf"```{re.escape(n)}[ \t]*\n", text) for n in params)
        return ParseResult(text.strip(), malformed=opened)


def _single_param(tool: Tool) -> str | None:
    """The one parameter a fenced block can carry: the only property, else the only required one."""
    props = list(tool.parameters.get("properties", {}))
    required = list(tool.parameters.get("required", []))
    if len(props) == 1:
        return str(props[0])
    return str(required[0]) if len(required) == 1 else None


def _json_call(body: str) -> ParsedCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return _call_from_obj(value)


def _call_from_obj(value: Any) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(value["name"], args)


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Qwen3CoderParser, JsonParser, FencedParser)}


def get_parser(name: str) -> ToolParser:
    """A parser by registry name or ``module.path:ClassName``; the error lists the valid names."""
    if name in PARSERS:
        return PARSERS[name]()
    if ":" in name:
        module, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"tool parser {name!r} cannot be imported: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, ToolParser)):
            raise ConfigError(f"tool parser {name!r} is not a ToolParser subclass")
        return cls()
    raise ConfigError(f"unknown tool parser {name!r}; valid names: {sorted(PARSERS)} or 'module.path:ClassName'")
