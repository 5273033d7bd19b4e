"""Qwen3-Coder tool calls streamed as they are written::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A call starts when its ``<function=NAME>`` tag closes. Its arguments are the
canonical JSON object of its parameters, exactly what ``json.dumps`` writes of
the whole parse's arguments: a string parameter (by the tool's schema) streams
as it is written, escaped, holding back what may be the newline before its
closing tag; any other is converted by the schema once its closing tag
arrives. As for hermes, the closing brace waits until the call is whole and
the whole parse decides what the output was.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from services.proxy.chat.conversation import Tool
from services.proxy.chat.toolstream import Delta, StreamedCall, ToolStream

_State = Literal["between", "open", "name", "params", "key", "value", "close", "broken"]
# Outside a call's parameters: the marker each state expects, and the state after it.
_NEXT: dict[str, tuple[str, _State]] = {
    "between": ("<tool_call>", "open"),
    "open": ("<function=", "name"),
    "close": ("</tool_call>", "between"),
}


class Qwen3CoderStream(ToolStream):
    FUNC_END = "</function>"
    PARAM, PARAM_END = "<parameter=", "</parameter>"

    def __init__(self, tools: tuple[Tool, ...]) -> None:
        super().__init__()
        self._schemas = {t.name: t.parameters.get("properties", {}) for t in tools}
        self._buf = ""
        self._state: _State = "between"
        self._props: dict[str, Any] = {}
        self._keys: set[str] = set()
        self._schema: Any = {}
        self._string = False  # the current value streams as a JSON string
        self._value_start = True  # one newline right after the tag is not part of the value
        self._tail = ""  # value text held back: it may be the newline before the closing tag
        self._raw: list[str] = []  # a non-string value, until its closing tag

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        buf: str | None = self._buf + text
        self._buf = ""
        while buf and self._state != "broken":
            buf = self._step(buf, out)
        return out

    def _step(self, buf: str, out: list[Delta]) -> str | None:
        """Consumes what it can of ``buf``; returns the rest, or None to wait for more text."""
        state = self._state
        if state in ("name", "key"):
            return self._tag_name(buf, out)
        if state == "value":
            return self._value(buf, out)
        s = buf.lstrip()
        if not s:
            return None
        if state == "params":
            if s.startswith(self.PARAM):
                self._state = "key"
                return s[len(self.PARAM) :]
            if s.startswith(self.FUNC_END):
                call = self.calls[-1]
                call.args.append("}")
                call.held = "}"  # sent once the call is known whole
                self._state = "close"
                return s[len(self.FUNC_END) :]
            self._partial(s, (self.PARAM, self.FUNC_END))
            return None
        marker, after = _NEXT[state]
        if s.startswith(marker):
            self._state = after
            return s[len(marker) :]
        self._partial(s, (marker,))
        return None

    def _partial(self, s: str, markers: tuple[str, ...]) -> None:
        if any(m.startswith(s) for m in markers):
            self._buf = s  # may still become the marker
        else:
            self._state = "broken"

    def _tag_name(self, buf: str, out: list[Delta]) -> str | None:
        """``NAME>`` of a function or parameter tag (no newline in it)."""
        at = buf.find(">")
        newline = buf.find("\n", 0, at if at >= 0 else len(buf))
        if newline >= 0 or (at >= 0 and not buf[:at].strip()):
            self._state = "broken"
            return None
        if at < 0:
            self._buf = buf
            return None
        name, rest = buf[:at].strip(), buf[at + 1 :]
        if self._state == "name":
            self._start(name, out)
        else:
            self._param(name, out)
        return rest

    def _start(self, name: str, out: list[Delta]) -> None:
        index = len(self.calls)
        if index and self.calls[-1].held:  # the previous call is whole: release its last brace
            prev = self.calls[-1]
            out.append(Delta("args", prev.held, index - 1))
            prev.held = ""
        self.calls.append(StreamedCall(name=name, started=True, args=["{"]))
        out += [Delta("call", name, index), Delta("args", "{", index)]
        self._props, self._keys, self._state = self._schemas.get(name, {}), set(), "params"

    def _param(self, key: str, out: list[Delta]) -> None:
        if key in self._keys:  # a repeated parameter: the whole parse keeps the last value
            self._state = "broken"
            self.calls[-1].consistent = False
            return
        schema = self._props.get(key, {})
        kind = schema.get("type") if isinstance(schema, dict) else None
        self._schema, self._string = schema, kind in (None, "string") or isinstance(kind, list)
        piece = (
            (", " if self._keys else "") + json.dumps(key, ensure_ascii=False) + ": " + ('"' if self._string else "")
        )
        self._keys.add(key)
        self._send(piece, out)
        self._state, self._value_start, self._tail, self._raw = "value", True, "", []

    def _value(self, buf: str, out: list[Delta]) -> str | None:
        if self._value_start:
            self._value_start = False
            if buf.startswith("\n"):
                buf = buf[1:]
        text = self._tail + buf
        at = text.find(self.PARAM_END)
        if at < 0:
            keep = max(_held_suffix(text, "\n" + self.PARAM_END), _held_suffix(text, self.PARAM_END))
            self._tail = text[len(text) - keep :]
            self._value_text(text[: len(text) - keep], out)
            return None
        value, rest = text[:at], text[at + len(self.PARAM_END) :]
        self._value_text(value[:-1] if value.endswith("\n") else value, out)
        if self._string:
            self._send('"', out)
        else:
            from services.proxy.chat.toolparsers import _convert

            self._send(json.dumps(_convert("".join(self._raw), self._schema), ensure_ascii=False), out)
        self._state, self._tail = "params", ""
        return rest

    def _value_text(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._string:
            self._send(json.dumps(text, ensure_ascii=False)[1:-1], out)
        else:
            self._raw.append(text)

    def _send(self, piece: str, out: list[Delta]) -> None:
        self.calls[-1].args.append(piece)
        out.append(Delta("args", piece, len(self.calls) - 1))


def _held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
