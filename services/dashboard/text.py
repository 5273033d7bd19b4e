"""Captured token ids -> text: the tokenizer of the run's model, the chat
transcript as the engine saw it, and tool calls parsed back out of the
sampled text (the same formats the proxy parses; malformed ones are counted).

The capture store keeps ids only (invariant 1: nothing retokenized), so the
dashboard decodes them for people; nothing decoded here feeds training.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harnessrl import paths
from harnessrl.errors import ConfigError

log = logging.getLogger(__name__)

# ChatML (SmolLM2, Qwen...) message markers; other templates fall back to mask runs.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: int = 0


class ToolParser(ABC):
    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str) -> Parsed: ...


class HermesParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after the content."""

    name = "hermes"
    _block = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.S)

    def parse(self, text: str) -> Parsed:
        at = text.find("<tool_call>")
        if at < 0:
            return Parsed(text.strip())
        head, region, pos = text[:at], text[at:], 0
        calls: list[ToolCall] = []
        while pos < len(region):
            m = self._block.match(region, pos)
            call = _json_call(m.group(1)) if m else None
            if m is None or call is None:
                return Parsed(text.strip(), malformed=1)
            calls.append(call)
            pos = m.end()
        return Parsed(head.strip(), calls)


class Qwen3CoderParser(ToolParser):
    """``<tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>``."""

    name = "qwen3_coder"
    _call = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*</tool_call>", re.S)
    _param = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)

    def parse(self, text: str) -> Parsed:
        at = text.find("<tool_call>")
        if at < 0:
            return Parsed(text.strip())
        calls = [ToolCall(m.group(1), dict(self._param.findall(m.group(2)))) for m in self._call.finditer(text)]
        opened = text.count("<tool_call>")
        return Parsed(text[:at].strip(), calls, malformed=int(opened != len(calls)))


class JsonParser(ToolParser):
    """The whole reply is one JSON call object (or a list of them)."""

    name = "json"

    def parse(self, text: str) -> Parsed:
        stripped = text.strip()
        if not stripped.startswith(("{", "[")):
            return Parsed(stripped)
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            return Parsed(stripped, malformed=1)
        items = data if isinstance(data, list) else [data]
        calls = [_as_call(item) for item in items]
        if any(c is None for c in calls):
            return Parsed(stripped, malformed=1)
        return Parsed("", [c for c in calls if c is not None])


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Qwen3CoderParser, JsonParser)}


def tool_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ConfigError(f"unknown tool parser {name!r}; valid: {sorted(PARSERS)}") from None


def _json_call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    return _as_call(data)


def _as_call(data: Any) -> ToolCall | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    return ToolCall(data["name"], data.get("arguments", data.get("parameters", {})))


class Decoder:
    """Decodes ids with the model's ``tokenizer.json`` (the Rust tokenizers library)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        file = model_dir / "tokenizer.json"
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as e:  # any load failure means: no text, and the page says why
            raise ConfigError(f"cannot load tokenizer {file}: {e}") from e
        self.model_dir = model_dir

    def text(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def pieces(self, ids: list[int]) -> list[str]:
        """One string per token (a piece cut inside a UTF-8 character shows as U+FFFD)."""
        return [str(s) for s in self._tok.decode_batch([[i] for i in ids], skip_special_tokens=False)]


def resolve_model_dir(configured: Path | None, model: str | None) -> Path | None:
    """The tokenizer folder: the setting, else the run's model as a path or a name under the home."""
    if configured is not None:
        return configured
    if not model:
        return None
    as_path = Path(model).expanduser()
    if as_path.is_absolute() or as_path.exists():
        return as_path
    return paths.models_dir() / model


@functools.lru_cache(maxsize=8)
def load_decoder(model_dir: Path) -> Decoder:
    return Decoder(model_dir)


@dataclass
class Message:
    """One chat message as the engine saw it; ``source`` is prompt, context or sampled."""

    role: str
    text: str
    source: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: int = 0
    tool_results: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "text": self.text,
            "source": self.source,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in self.calls],
            "malformed_tool_calls": self.malformed,
            "tool_results": self.tool_results,
        }


_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


def transcript(chunks: list[tuple[str, str]], parser: ToolParser) -> list[Message]:
    """Splits decoded ``(source, text)`` chunks into chat messages.

    ChatML text is cut at its markers; a message takes the source of the chunk it
    starts in (a sampled reply starts in the sampled run right after the template's
    ``<|im_start|>assistant`` header, so the header's chunk is folded forward)."""
    full = "".join(t for _, t in chunks)
    if IM_START not in full:
        return [_message("assistant" if s == "sampled" else "context", t, s, parser) for s, t in chunks if t]
    starts: list[tuple[int, str]] = []
    pos = 0
    for source, text in chunks:
        starts.append((pos, source))
        pos += len(text)
    messages: list[Message] = []
    for block in _chatml_blocks(full):
        begin, role, body = block
        source = _source_at(starts, begin, body_offset=len(IM_START) + len(role) + 1)
        messages.append(_message(role, body, source, parser))
    return messages


def _chatml_blocks(full: str) -> list[tuple[int, str, str]]:
    out = []
    pos = full.find(IM_START)
    while pos >= 0:
        header_end = full.find("\n", pos)
        nxt = full.find(IM_START, pos + len(IM_START))
        end_marker = full.find(IM_END, pos)
        stop = min(x for x in (end_marker, nxt, len(full)) if x >= 0)
        if header_end < 0 or header_end > stop:
            role, body = full[pos + len(IM_START) : stop].strip(), ""
        else:
            role, body = full[pos + len(IM_START) : header_end].strip(), full[header_end + 1 : stop]
        out.append((pos, role or "unknown", body))
        pos = nxt
    return out


def _source_at(starts: list[tuple[int, str]], begin: int, body_offset: int) -> str:
    """The source of the chunk holding the message body's first character."""
    at = begin + body_offset
    source = starts[0][1]
    for offset, s in starts:
        if offset <= at:
            source = s
        else:
            break
    return source


def _message(role: str, text: str, source: str, parser: ToolParser) -> Message:
    if role == "assistant":
        parsed = parser.parse(text)
        return Message(role, parsed.content, source, parsed.calls, parsed.malformed)
    results = _RESPONSE.findall(text)
    if results:
        return Message("tool", _RESPONSE.sub("", text).strip(), source, tool_results=results)
    return Message(role, text, source)
