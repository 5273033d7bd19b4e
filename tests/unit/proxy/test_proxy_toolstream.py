"""Incremental tool-call parsing: however the model's text is split, the
streamed argument deltas of each call concatenate to exactly the arguments
string of the finished turn (``json.dumps`` of the parsed arguments), the name
comes first, arguments stream before the call ends, a client never holds
parseable arguments before the call is known whole, and an unclosed call ends
as text, as without streaming."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.proxy.chat.conversation import Tool
from services.proxy.chat.stream import Delta, Final, OutputStream
from services.proxy.chat.toolparsers import HermesParser, JsonParser
from services.proxy.chat.toolstream import JsonCanon, JsonError

TOOLS = (Tool("bash", "", {"type": "object", "properties": {"command": {"type": "string"}}}),)


def run(text: str, pieces: list[str] | None = None, parser: Any = None) -> tuple[list[Delta], Final]:
    s = OutputStream(parser or HermesParser(), TOOLS)
    deltas = [d for p in (pieces if pieces is not None else [text]) for d in s.feed(p)]
    final = s.finish()
    return deltas + final.deltas, final


def args_of(deltas: list[Delta]) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in deltas:
        if d.kind == "args":
            out[d.index] = out.get(d.index, "") + d.text
    return out


def check_calls(deltas: list[Delta], final: Final) -> None:
    """What every split must give: the whole parse's calls, spelled out by the deltas."""
    assert not final.malformed
    starts = [d for d in deltas if d.kind == "call"]
    assert [(d.index, d.text) for d in starts] == [(i, c.name) for i, c in enumerate(final.calls)]
    canonical = [json.dumps(c.arguments, ensure_ascii=False) for c in final.calls]
    assert final.arguments == canonical
    assert [args_of(deltas).get(i, "") for i in range(len(final.calls))] == canonical
    for d in deltas:  # no call's arguments before its start
        if d.kind == "args":
            assert any(s.index == d.index for s in starts[: d.index + 1])


CALLS = [
    # plain, as the scripted engine and hermes templates write it
    'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
    # nested JSON, escaped quotes, braces and brackets inside strings, unicode escapes, surrogate pairs
    '<tool_call>{"name": "bash", "arguments": {"command": "echo \\"}{][\\" \\\\ \\/ \\u00e9\\ud83d\\ude00\\t",'
    ' "opts": {"deep": [1, -2.50, 3e2, {"x": [true, false, null]}], "empty": {}, "list": []}}}</tool_call>',
    # odd whitespace, no spaces, raw non-ASCII and control escapes
    '<tool_call>  {  "name" :"bash" ,"arguments":{ "command" : "naïve — ü\\n\\r\\b\\f\\u0001" ,'
    ' "n":0 }\n}  </tool_call>',
    # two calls; the first's closing brace is held until the second starts
    'Two.\n<tool_call>\n{"name": "bash", "arguments": {"command": "a"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "edit", "arguments": {"path": "x.py", "line": 12}}\n</tool_call>',
    # arguments before the name, arguments as a JSON string, "parameters": sent whole when the call ends
    '<tool_call>{"arguments": {"command": "b"}, "name": "bash"}</tool_call>'
    '<tool_call>{"name": "edit", "arguments": "{\\"line\\": 3}"}</tool_call>'
    '<tool_call>{"name": "bash", "parameters": {"command": "c"}}</tool_call>',
    # empty arguments, and none at all
    '<tool_call>{"name": "bash", "arguments": {}}</tool_call><tool_call>{"name": "bash"}</tool_call>',
]


@pytest.mark.parametrize("text", CALLS)
def test_every_split_into_two_gives_the_same_calls(text: str) -> None:
    whole_deltas, whole = run(text)
    check_calls(whole_deltas, whole)
    for cut in range(len(text) + 1):
        deltas, final = run(text, [text[:cut], text[cut:]])
        check_calls(deltas, final)
        assert final.content == whole.content and final.arguments == whole.arguments


@pytest.mark.parametrize("text", CALLS)
def test_character_by_character_streams_the_arguments_incrementally(text: str) -> None:
    s = OutputStream(HermesParser(), TOOLS)
    deltas: list[Delta] = []
    for ch in text:
        deltas += s.feed(ch)
        for index, so_far in args_of(deltas).items():
            # Never parseable before the call is known whole: a client cannot act on a half call.
            if index == len([d for d in deltas if d.kind == "call"]) - 1:
                with pytest.raises(ValueError):
                    json.loads(so_far)
    final = s.finish()
    deltas += final.deltas
    check_calls(deltas, final)
    first_call = text.index('"command": "ls -la"') if "ls -la" in text else None
    if first_call is not None:  # the first call's arguments stream in many pieces
        assert len([d for d in deltas if d.kind == "args" and d.index == 0]) > 5


def test_the_name_comes_before_the_arguments_end_and_text_before_the_call() -> None:
    text = CALLS[0]
    s = OutputStream(HermesParser(), TOOLS)
    seen: list[tuple[int, Delta]] = []
    for i, ch in enumerate(text):
        seen += [(i, d) for d in s.feed(ch)]
    start = next(i for i, d in seen if d.kind == "call")
    first_args = next(i for i, d in seen if d.kind == "args")
    assert start == text.index('"bash"') + len('"bash"') - 1, "the call starts when its name is complete"
    assert first_args < text.index("la"), "arguments stream before they are complete"
    assert "".join(d.text for _, d in seen if d.kind == "text") == "Let me look."
    assert max(i for i, d in seen if d.kind == "text") < text.index("<tool_call>") + len("<tool_call>")


def test_multiple_calls_release_the_previous_closing_brace_in_order() -> None:
    deltas, final = run(CALLS[3], list(CALLS[3]))
    order = [(d.kind, d.index, d.text) for d in deltas if d.kind in ("call", "args")]
    second = order.index(("call", 1, "edit"))
    assert order[second - 1] == ("args", 0, "}"), "call 0 becomes whole when call 1 starts"
    assert order[-1] == ("args", 1, "}"), "the last call's brace comes with the final parse"
    assert [c.name for c in final.calls] == ["bash", "edit"]


@pytest.mark.parametrize(
    "tail",
    [
        '{"name": "bash", "arguments": {"command": "ls -la',  # cut mid-string (max_tokens)
        '{"name": "bash", "arguments": {"command": "ls"}}',  # object done, never closed
        '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call> trailing words',
        '{"name": "bash", "arguments": {"command": \n</tool_call>',  # bad JSON
        '{"name": "bash", "arguments": [1]}</tool_call>',  # arguments not an object
    ],
)
def test_a_call_that_does_not_parse_ends_as_text_as_before(tail: str) -> None:
    text = "Sure. <tool_call>" + tail
    whole = HermesParser().parse(text, TOOLS)
    assert whole.malformed
    for pieces in ([text], list(text)):
        deltas, final = run(text, pieces)
        assert final.malformed and final.calls == [] and final.arguments == []
        assert final.content == text.strip() == "".join(d.text for d in deltas if d.kind == "text")
        for so_far in args_of(deltas).values():  # what streamed of the call never parses
            with pytest.raises(ValueError):
                json.loads(so_far)


def test_parsers_without_an_incremental_form_send_each_call_whole() -> None:
    deltas, final = run('{"name": "bash", "arguments": {"command": "ls"}}', None, JsonParser())
    assert [(d.kind, d.text) for d in deltas] == [("call", "bash"), ("args", '{"command": "ls"}')]
    assert final.arguments == ['{"command": "ls"}']


# -- the canonical re-serialiser ---------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=6), json_values, max_size=5),
    ascii_only=st.booleans(),
    spaced=st.booleans(),
    cuts=st.lists(st.integers(1, 7), max_size=60),
)
def test_canonical_text_is_json_dumps_however_written_and_split(
    value: dict[str, Any], ascii_only: bool, spaced: bool, cuts: list[int]
) -> None:
    raw = json.dumps(
        value, ensure_ascii=ascii_only, indent=2 if spaced else None, separators=None if spaced else (",", ":")
    )
    j = JsonCanon()
    out, rest, i = [], None, 0
    for n in [*cuts, len(raw) + 8]:
        canon, _, rest = j.feed(raw[i : i + n])
        out.append(canon)
        i += n
        if rest is not None:
            break
    assert rest == "" and "".join(out) == json.dumps(value, ensure_ascii=False)


def test_canonical_member_events_and_leftover() -> None:
    j = JsonCanon()
    canon, events, rest = j.feed('{"name": "x", "arguments": {"a": [1]}} </tool_call>')
    assert rest == " </tool_call>" and j.scalars == {"name": "x"}
    start = next(o for k, key, o in events if k == "open" and key == "arguments")
    end = next(o for k, key, o in events if k == "close" and key == "arguments")
    assert canon[start:end] == '{"a": [1]}'


@pytest.mark.parametrize("bad", ['{"a": 1]', '{"a": "x\ny"}', '{"a": \\q}', '{"a": "\\x"}', '{"a": tru e}', "[1]"])
def test_canonical_rejects_what_json_rejects(bad: str) -> None:
    with pytest.raises(JsonError):
        JsonCanon().feed(bad)


# -- qwen3_coder: XML-ish parameters, converted by the tool's schema -------------------

QWEN_TOOLS = (
    Tool("bash", "", {"type": "object", "properties": {"command": {"type": "string"}}}),
    Tool("edit", "", {"type": "object", "properties": {"line": {"type": "integer"}, "opts": {"type": "object"}}}),
)
QWEN_CALLS = [
    # a string value with quotes, backslashes, tags, braces and inner newlines; a converted integer and object
    'Editing.\n<tool_call>\n<function=bash>\n<parameter=command>\necho "a\\b" <x> {y}\nsecond line\n'
    "</parameter>\n</function>\n</tool_call>\n"
    '<tool_call>\n<function=edit>\n<parameter=line>\n12\n</parameter>\n<parameter=opts>\n{"a": [true, 1.50]}\n'
    "</parameter>\n<parameter=note>\n\n</parameter>\n</function>\n</tool_call>",
    # no newlines around values, an empty string, a value ending in a newline of its own
    "<tool_call><function=bash><parameter=command>ls</parameter></function></tool_call>"
    "<tool_call><function=bash><parameter=command>\n\n</parameter></function></tool_call>"
    "<tool_call><function=bash><parameter=command>\nx\n\n</parameter></function></tool_call>",
    # a parameter the schema does not know (a string), an integer that does not parse (kept as text)
    "<tool_call>\n<function=edit>\n<parameter=line>\ntwelve\n</parameter>\n<parameter=why>\n</param\n"
    "</parameter>\n</function>\n</tool_call>",
]


def qwen(text: str, pieces: list[str]) -> tuple[list[Delta], Final]:
    from services.proxy.chat.toolparsers import Qwen3CoderParser

    s = OutputStream(Qwen3CoderParser(), QWEN_TOOLS)
    deltas = [d for p in pieces for d in s.feed(p)]
    final = s.finish()
    return deltas + final.deltas, final


@pytest.mark.parametrize("text", QWEN_CALLS)
def test_qwen3_coder_every_split_gives_the_parsed_calls(text: str) -> None:
    from services.proxy.chat.toolparsers import Qwen3CoderParser

    parsed = Qwen3CoderParser().parse(text, QWEN_TOOLS)
    assert not parsed.malformed and parsed.calls
    canonical = [json.dumps(c.arguments, ensure_ascii=False) for c in parsed.calls]
    for pieces in [list(text), *([text[:cut], text[cut:]] for cut in range(len(text) + 1))]:
        deltas, final = qwen(text, pieces)
        assert not final.malformed and final.arguments == canonical
        assert [(d.index, d.text) for d in deltas if d.kind == "call"] == [
            (i, c.name) for i, c in enumerate(parsed.calls)
        ]
        assert [args_of(deltas)[i] for i in range(len(canonical))] == canonical
    if text == QWEN_CALLS[0]:
        deltas, _ = qwen(text, list(text))
        assert len([d for d in deltas if d.kind == "args" and d.index == 0]) > 10, "a string value streams as written"


def test_qwen3_coder_unclosed_call_ends_as_text() -> None:
    text = "Sure. <tool_call>\n<function=bash>\n<parameter=command>\nls -la"
    deltas, final = qwen(text, list(text))
    assert final.malformed and final.calls == [] and final.content == text
    assert [d.text for d in deltas if d.kind == "call"] == ["bash"]
    assert args_of(deltas)[0] == '{"command": "ls -la', "the value streamed, never closed"


def test_a_call_read_otherwise_than_the_whole_parse_keeps_the_parse() -> None:
    """Two "arguments" keys: json keeps the last, the stream had sent the first. The
    turn carries the parsed arguments; the streamed call is never completed."""
    text = '<tool_call>{"name": "bash", "arguments": {"a": 1}, "arguments": {"b": 2}}</tool_call>'
    for pieces in ([text], list(text)):
        deltas, final = run(text, pieces)
        assert final.arguments == ['{"b": 2}'] and [c.arguments for c in final.calls] == [{"b": 2}]
        assert args_of(deltas) == {0: '{"a": 1'}
