"""Splits the model's streamed text into reasoning, visible text and tool calls
as it arrives, so harnesses see text token by token and tool calls as they are
written (the parser's ``streamer``, see ``toolstream``); the whole parse at the
end decides what the output was."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

from services.proxy.chat.conversation import Tool
from services.proxy.chat.toolparsers import ParsedCall, ToolParser
from services.proxy.chat.toolstream import Delta, ToolStream

__all__ = ["Delta", "Final", "OutputStream", "StopStrings"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass
class Final:
    reasoning: str
    content: str
    calls: list[ParsedCall] = field(default_factory=list)
    malformed: bool = False
    deltas: list[Delta] = field(default_factory=list)  # what was still held back
    arguments: list[str] = field(default_factory=list)  # each call's arguments text, as streamed


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    # Run per streamed token: most texts end in a character no marker's proper
    # prefix holds, which rules out every suffix at once.
    if not text or text[-1] not in _prefix_chars(markers):
        return 0
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


@functools.lru_cache(maxsize=64)
def _prefix_chars(markers: tuple[str, ...]) -> frozenset[str]:
    """The characters that can end a proper prefix of one of ``markers``."""
    return frozenset(c for m in markers for c in m[:-1])


class OutputStream:
    def __init__(self, parser: ToolParser, tools: tuple[Tool, ...], reasoning: bool = True) -> None:
        self._parser = parser
        self._tools = tools
        self._phase: Literal["start", "reasoning", "content", "held"] = "start" if reasoning else "content"
        self._buf = ""  # text not yet classified or emitted
        self.reasoning = ""  # reasoning text already sent
        self._reasoning_raw = ""
        self._content = ""  # all content text (after reasoning)
        self._emitted = ""  # content text already sent as deltas
        self._calls: ToolStream | None = None  # reads the tool-call region once it has begun

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        progressed = True
        while progressed and self._buf:
            progressed = self._step(out)
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._phase == "start":
            head = self._buf.lstrip()
            if head.startswith(THINK_OPEN):
                self._buf = head[len(THINK_OPEN) :]
                self._phase = "reasoning"
                return True
            if THINK_OPEN.startswith(head):
                return False  # may still become <think>
            self._phase = "content"
            return True
        if self._phase == "reasoning":
            at = self._buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit_reasoning(self._buf[:at], out)
                self._buf = self._buf[at + len(THINK_CLOSE) :]
                self._phase = "content"
                return True
            keep = _partial_suffix(self._buf, (THINK_CLOSE,))
            self._emit_reasoning(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        if self._phase == "content":
            self._content += self._buf
            self._buf = ""
            self._advance_content(out)
            return False
        self._content += self._buf  # held: tool calls stream, the parse waits for finish()
        if self._calls is not None:
            out += self._calls.feed(self._buf)
        self._buf = ""
        return False

    def _emit_reasoning(self, text: str, out: list[Delta]) -> None:
        """Reasoning is sent stripped: trailing whitespace waits for more text."""
        self._reasoning_raw += text
        target = self._reasoning_raw.strip()
        if len(target) > len(self.reasoning) and target.startswith(self.reasoning):
            out.append(Delta("reasoning", target[len(self.reasoning) :]))
            self.reasoning = target

    def _advance_content(self, out: list[Delta]) -> None:
        if self._parser.holds_everything(self._content):
            self._phase = "held"
            return
        visible = self._content
        cut = min((i for i in (visible.find(m) for m in self._parser.markers) if i >= 0), default=-1)
        if cut >= 0:
            visible = visible[:cut]
            self._phase = "held"
        else:
            visible = visible[: len(visible) - _partial_suffix(visible, self._parser.markers)]
        self._emit_content(visible.strip(), out)
        if cut >= 0:
            self._calls = self._parser.streamer(self._tools)
            out += self._calls.feed(self._content[cut:])

    def _emit_content(self, target: str, out: list[Delta]) -> None:
        """Sends ``target[len(emitted):]`` when ``target`` extends what was sent."""
        if len(target) > len(self._emitted) and target.startswith(self._emitted):
            out.append(Delta("text", target[len(self._emitted) :]))
            self._emitted = target

    def finish(self) -> Final:
        """Parses what was held back; text that does not parse is returned as text."""
        out: list[Delta] = []
        if self._phase == "start":
            self._content = self._buf
        elif self._phase == "reasoning":
            self._emit_reasoning(self._buf, out)
        self._buf = ""
        result = self._parser.parse(self._content, self._tools)
        final = result.content if result.calls and not result.malformed else self._content.strip()
        self._emit_content(final, out)
        content = self._emitted if final.startswith(self._emitted) else final
        calls = [] if result.malformed else result.calls
        owed, arguments = (self._calls or self._parser.streamer(self._tools)).finish(result) if calls else ([], [])
        return Final(self.reasoning, content, calls, result.malformed, out + owed, arguments)


class StopStrings:
    """Cuts the model's text at the first stop string (OpenAI ``stop``, Anthropic
    ``stop_sequences``), which is not returned; text that may be the start of
    one is held back until it is known not to be."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._buf = ""
        self._passed = 0  # characters fed and passed on (the buffer starts there)
        self._blank = 0  # how many of them end it as whitespace
        self.hit: str | None = None
        # With a hit: how much of all the text fed a harness is given, the text before
        # the hit less its trailing whitespace (content and reasoning go out stripped).
        self.seen_chars = -1

    def feed(self, text: str) -> str:
        if not self._stops or self.hit is not None:
            return text if not self._stops else ""
        self._buf += text
        found = [(i, s) for s in self._stops if (i := self._buf.find(s)) >= 0]
        if found:
            cut, self.hit = min(found)
            out, self._buf = self._buf[:cut], ""
            self._pass(out)
            self.seen_chars = self._passed - self._blank
            return out
        keep = _partial_suffix(self._buf, self._stops)
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        self._pass(out)
        return out

    def _pass(self, out: str) -> None:
        self._passed += len(out)
        solid = len(out.rstrip())
        self._blank = len(out) - solid if solid else self._blank + len(out)

    def flush(self) -> str:
        out, self._buf = self._buf, ""
        return out
