"""Tool calls streamed as the model writes them.

A parser's ``streamer()`` reads the tool-call region (from its marker on) piece
by piece and emits a ``call`` delta (index, name) as soon as a call's name is
known, then ``args`` deltas with the call's arguments as they are generated.
The arguments are re-serialised on the fly into exactly the text that
``json.dumps(arguments, ensure_ascii=False)`` writes (``JsonCanon``), so the
deltas of a call concatenate to the arguments string of the finished turn,
streamed or not. The last character of a call's arguments (its closing brace)
is held back until the call is known to be whole (the next call starts, or the
turn ends and the whole output parses): a client never holds parseable
arguments the final parse then refuses.

The parser's whole-text ``parse`` stays the judge: when it finds the output
malformed there are no calls, the text is returned as text (after the deltas
already sent), exactly as without streaming.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from harnessrl import metrics
from harnessrl.logs import kv

if TYPE_CHECKING:
    from services.proxy.chat.toolparsers import ParsedCall, ParseResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    """A piece of the model's output as it streams out.

    ``reasoning`` / ``text``: ``text`` is the new text. ``call``: tool call
    ``index`` begins, ``text`` is its name, ``id`` its id (set by the turn).
    ``args``: ``text`` extends the arguments of call ``index``."""

    kind: Literal["reasoning", "text", "call", "args"]
    text: str
    index: int = 0
    id: str = ""


def canonical_args(arguments: dict[str, Any]) -> str:
    """The arguments string of a call: what a non-streamed response carries."""
    return json.dumps(arguments, ensure_ascii=False)


# In a string: stop at a quote, a backslash or a raw control character (invalid JSON).
_STR_STOP = re.compile(r'["\\\x00-\x1f]')
_SCALAR = re.compile(r"[-+.0-9A-Za-z]+")
_SIMPLE_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "/", "b": "\\b", "f": "\\f", "n": "\\n", "r": "\\r", "t": "\\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonError(ValueError):
    pass


class JsonCanon:
    """Incremental canonical re-serialisation of one JSON object.

    ``feed`` takes raw text as it arrives and returns the canonical text it
    could produce so far (separators ``", "`` and ``": "``, strings re-escaped
    as ``json.dumps(..., ensure_ascii=False)`` does, numbers and literals
    normalised through ``json``), the events of the object's own members
    (a container value opening or closing, at an offset of the canonical
    text), and what was left after the object ended (None while it has not).
    An incomplete escape, number or literal waits for more text. Scalar
    members of the object are kept decoded in ``scalars``."""

    def __init__(self) -> None:
        self.size = 0  # length of the canonical text produced so far
        self.scalars: dict[str, Any] = {}
        self._stack: list[str] = []
        self._pending = ""
        self._in_str = False
        self._key_next = False  # the next member string is a key
        self._key: str | None = None
        self._str_parts: list[str] | None = None  # canonical content of a member string being read

    def feed(self, text: str) -> tuple[str, list[tuple[str, str | None, int]], str | None]:
        buf, self._pending = self._pending + text, ""
        parts: list[str] = []
        events: list[tuple[str, str | None, int]] = []
        stack = self._stack
        pos, i, n = self.size, 0, len(buf)
        rest: str | None = None
        while i < n:
            if self._in_str:
                m = _STR_STOP.search(buf, i)
                j = n if m is None else m.start()
                if j > i:
                    piece = buf[i:j]
                    parts.append(piece)
                    pos += len(piece)
                    if self._str_parts is not None:
                        self._str_parts.append(piece)
                    i = j
                if j == n:
                    break
                c = buf[j]
                if c == '"':
                    parts.append('"')
                    pos += 1
                    i = j + 1
                    self._in_str = False
                    self._string_done()
                    continue
                if c != "\\":
                    raise JsonError("raw control character in a string")
                esc = _escape(buf, j)
                if esc is None:
                    self._pending = buf[j:]
                    break
                piece, used = esc
                parts.append(piece)
                pos += len(piece)
                if self._str_parts is not None:
                    self._str_parts.append(piece)
                i = j + used
                continue
            c = buf[i]
            if c in " \t\n\r":
                i += 1
            elif c == '"':
                if not stack:
                    raise JsonError("expected an object")
                self._in_str = True
                self._str_parts = [] if len(stack) == 1 else None
                parts.append('"')
                pos += 1
                i += 1
            elif c in "{[":
                if len(stack) == 1:
                    events.append(("open", self._key, pos))
                elif not stack and c != "{":
                    raise JsonError("expected an object")
                stack.append(c)
                parts.append(c)
                pos += 1
                i += 1
                if len(stack) == 1:
                    self._key_next = True
            elif c in "}]":
                if not stack or (stack[-1] == "{") != (c == "}"):
                    raise JsonError(f"unexpected {c!r}")
                stack.pop()
                parts.append(c)
                pos += 1
                i += 1
                if len(stack) == 1:
                    events.append(("close", self._key, pos))
                elif not stack:
                    rest = buf[i:]
                    break
            elif c == ":":
                parts.append(": ")
                pos += 2
                i += 1
            elif c == ",":
                parts.append(", ")
                pos += 2
                i += 1
                if len(stack) == 1:
                    self._key_next = True
            else:
                m = _SCALAR.match(buf, i)
                if m is None or not stack:
                    raise JsonError(f"unexpected {c!r}")
                if m.end() == n:  # the number or literal may go on
                    self._pending = buf[i:]
                    break
                try:
                    value = json.loads(m.group())
                except ValueError as e:
                    raise JsonError(f"bad scalar {m.group()!r}") from e
                piece = json.dumps(value)
                parts.append(piece)
                pos += len(piece)
                i = m.end()
                if len(stack) == 1 and self._key is not None:
                    self.scalars[self._key] = value
        self.size = pos
        return "".join(parts), events, rest

    def _string_done(self) -> None:
        if self._str_parts is None:
            return
        value = json.loads('"' + "".join(self._str_parts) + '"')
        self._str_parts = None
        if self._key_next:
            self._key, self._key_next = value, False
        elif self._key is not None:
            self.scalars[self._key] = value


def _escape(buf: str, j: int) -> tuple[str, int] | None:
    """The canonical text of the escape at ``buf[j]`` and the raw characters it
    used; None when it is not complete yet."""
    n = len(buf)
    if j + 1 >= n:
        return None
    e = buf[j + 1]
    if e != "u":
        piece = _SIMPLE_ESCAPES.get(e)
        if piece is None:
            raise JsonError(f"bad escape \\{e}")
        return piece, 2
    code = _hex4(buf, j + 2)
    if code is None:
        return None
    used = 6
    if 0xD800 <= code <= 0xDBFF:  # a high surrogate pairs with a following low one, as json does
        nxt = buf[j + 6 : j + 8]
        if len(nxt) < 2 and "\\u".startswith(nxt):
            return None
        if nxt == "\\u":
            low = _hex4(buf, j + 8)
            if low is None:
                return None
            if 0xDC00 <= low <= 0xDFFF:
                code = 0x10000 + (((code - 0xD800) << 10) | (low - 0xDC00))
                used = 12
    return json.dumps(chr(code), ensure_ascii=False)[1:-1], used


def _hex4(buf: str, at: int) -> int | None:
    digits = buf[at : at + 4]
    if not all(d in _HEX for d in digits):
        raise JsonError(f"bad unicode escape {digits!r}")
    return int(digits, 16) if len(digits) == 4 else None


@dataclass
class StreamedCall:
    """One call as it streamed: its name once known, its canonical arguments text."""

    name: str = ""
    started: bool = False
    args: list[str] = field(default_factory=list)  # canonical arguments text, in pieces
    unsent: list[str] = field(default_factory=list)  # arguments read before the name
    held: str = ""  # the closing brace, until the call is known whole
    args_start: int = -1  # offsets of the arguments value in the call object's canonical text
    args_end: int = -1
    obj: list[str] = field(default_factory=list)  # the call object's canonical text
    consistent: bool = True  # the streamed arguments are the parsed ones

    @property
    def text(self) -> str:
        return "".join(self.args)


class ToolStream:
    """Streams a parser's tool calls; the default streams nothing before the
    end, then each parsed call whole (for parsers without an incremental form)."""

    def __init__(self) -> None:
        self.calls: list[StreamedCall] = []

    def feed(self, text: str) -> list[Delta]:
        return []

    def finish(self, result: ParseResult) -> tuple[list[Delta], list[str]]:
        """Deltas still owed for the parsed calls, and each call's arguments text."""
        out: list[Delta] = []
        texts: list[str] = []
        if result.malformed:
            return out, texts
        for i, parsed in enumerate(result.calls):
            streamed = self.calls[i] if i < len(self.calls) else None
            if streamed is not None and streamed.started:
                if streamed.name == parsed.name and streamed.consistent and _same(streamed.text, parsed):
                    if streamed.held:
                        out.append(Delta("args", streamed.held, i))
                        streamed.held = ""
                    texts.append(streamed.text)
                    continue
                # A call object the incremental reading saw otherwise than the whole
                # parse (duplicate keys): the parse wins; what was sent cannot be taken back.
                metrics.FAILURES.labels("proxy", "tool_stream_mismatch").inc()
                log.warning("streamed tool call differs from the parsed one", extra=kv(call=parsed.name))
                texts.append(canonical_args(parsed.arguments))
                continue
            text = canonical_args(parsed.arguments)
            out += [Delta("call", parsed.name, i), Delta("args", text, i)]
            texts.append(text)
        return out, texts


def _same(text: str, parsed: ParsedCall) -> bool:
    try:
        return bool(json.loads(text) == parsed.arguments)
    except ValueError:
        return False


class HermesStream(ToolStream):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, read
    as they arrive. Anything off the format stops the streaming; the whole
    parse at the end decides what the output was."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._state: Literal["between", "open", "object", "close", "broken"] = "between"
        self._json = JsonCanon()

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        buf, self._buf = self._buf + text, ""
        while buf and self._state != "broken":
            if self._state == "object":
                try:
                    rest = self._object(buf, out)
                except JsonError:
                    self._state = "broken"
                    break
                if rest is None:
                    break
                buf, self._state = rest, "close"
                continue
            s = buf.lstrip()
            if not s:
                break
            if self._state == "open":
                if s[0] != "{":
                    self._state = "broken"
                    break
                self._json = JsonCanon()
                self.calls.append(StreamedCall())
                buf, self._state = s, "object"
                continue
            marker = self.OPEN if self._state == "between" else self.CLOSE
            if s.startswith(marker):
                buf = s[len(marker) :]
                self._state = "open" if self._state == "between" else "between"
            elif marker.startswith(s):
                self._buf = s  # may still become the marker
                break
            else:
                self._state = "broken"
        return out

    def _object(self, buf: str, out: list[Delta]) -> str | None:
        """Feeds the call object; returns what follows it once it has ended."""
        call, index = self.calls[-1], len(self.calls) - 1
        base = self._json.size
        canon, events, rest = self._json.feed(buf)
        call.obj.append(canon)
        if not events and rest is None and call.started and call.args_start >= 0 > call.args_end:
            if canon:  # the common case, inside the arguments: all of it is theirs
                call.args.append(canon)
                out.append(Delta("args", canon, index))
            return None
        for kind, key, offset in events:
            if key != "arguments":
                continue
            if kind == "open" and call.args_start < 0:
                call.args_start = offset
            elif kind == "close" and call.args_start >= 0 and call.args_end < 0:
                call.args_end = offset
        end = base + len(canon)
        if call.args_start >= 0:
            lo, hi = max(call.args_start, base), min(call.args_end if call.args_end >= 0 else end, end)
            if lo < hi:
                piece = canon[lo - base : hi - base]
                call.args.append(piece)
                if call.started:
                    self._send(call, index, piece, out)
                else:
                    call.unsent.append(piece)
        name = self._json.scalars.get("name")
        if not call.started and isinstance(name, str) and name:
            self._start(call, index, name, out)
        if rest is not None:
            self._ended(call, index, out)
        return rest

    def _start(self, call: StreamedCall, index: int, name: str, out: list[Delta]) -> None:
        if index and self.calls[index - 1].held:  # the previous call is whole: release its last brace
            prev = self.calls[index - 1]
            out.append(Delta("args", prev.held, index - 1))
            prev.held = ""
        call.name, call.started = name, True
        out.append(Delta("call", name, index))
        if call.unsent:
            self._send(call, index, "".join(call.unsent), out)
            call.unsent = []

    def _send(self, call: StreamedCall, index: int, piece: str, out: list[Delta]) -> None:
        if call.args_end >= 0 and not call.held:  # the arguments are complete: hold the closing brace
            piece, call.held = piece[:-1], piece[-1:]
        if piece:
            out.append(Delta("args", piece, index))

    def _ended(self, call: StreamedCall, index: int, out: list[Delta]) -> None:
        """The call object is complete: arguments it did not stream (a string,
        ``parameters``) are sent whole now; streamed ones are checked."""
        from services.proxy.chat.toolparsers import _call_from_obj

        try:
            parsed = _call_from_obj(json.loads("".join(call.obj)))
        except ValueError:
            parsed = None
        if parsed is None:
            self._state = "broken"
            return
        if call.args_start < 0:
            text = canonical_args(parsed.arguments)
            call.args = [text]
            if not call.started:
                self._start(call, index, parsed.name, out)
            call.args_end = len(text)
            self._send(call, index, text, out)
        else:
            call.consistent = _same(call.text, parsed)
