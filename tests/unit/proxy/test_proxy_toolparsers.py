"""Tool-call parsers and the streaming splitter: well-formed calls parse,
anything else comes back as text (counted as malformed when it tried to be a
call), and streaming emits exactly the text a non-streaming parse returns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.errors import ConfigError
from services.proxy.chat.conversation import Tool
from services.proxy.chat.model import ChatModel
from services.proxy.chat.stream import Delta, OutputStream, StopStrings
from services.proxy.chat.toolparsers import (
    PARSERS,
    FencedParser,
    HermesParser,
    JsonParser,
    Qwen3CoderParser,
    get_parser,
)

TOOLS = (
    Tool("bash", "", {"type": "object", "properties": {"command": {"type": "string"}}}),
    Tool("edit", "", {"type": "object", "properties": {"line": {"type": "integer"}, "opts": {"type": "object"}}}),
)


def test_hermes_parses_calls_and_keeps_content() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>{"name": "edit", "arguments": "{\\"line\\": 3}"}</tool_call>'
    )
    r = HermesParser().parse(text, TOOLS)
    assert r.content == "Let me look." and not r.malformed
    assert [(c.name, c.arguments) for c in r.calls] == [("bash", {"command": "ls"}), ("edit", {"line": 3})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "bash", "arguments": {}}',  # unclosed
        '<tool_call>{"name": "bash", "arguments": {}}</tool_call> trailing words',
    ],
)
def test_hermes_malformed_is_text(text: str) -> None:
    r = HermesParser().parse("Sure. " + text, TOOLS)
    assert r.malformed and r.calls == [] and r.content == ("Sure. " + text).strip()


def test_qwen3_coder_converts_by_schema() -> None:
    text = (
        "Editing.\n<tool_call>\n<function=edit>\n<parameter=line>\n12\n</parameter>\n"
        '<parameter=opts>\n{"a": true}\n</parameter>\n</function>\n</tool_call>\n'
        "<tool_call>\n<function=bash>\n<parameter=command>\necho 12\n</parameter>\n</function>\n</tool_call>"
    )
    r = Qwen3CoderParser().parse(text, TOOLS)
    assert r.content == "Editing." and not r.malformed
    assert [(c.name, c.arguments) for c in r.calls] == [
        ("edit", {"line": 12, "opts": {"a": True}}),
        ("bash", {"command": "echo 12"}),
    ]
    bad = Qwen3CoderParser().parse(
        "<tool_call>\n<function=bash>\n<parameter=command>\nx\n</function>\n</tool_call>", TOOLS
    )
    assert bad.malformed and bad.calls == []


def test_json_parser() -> None:
    p = JsonParser()
    assert [
        (c.name, c.arguments) for c in p.parse('{"name": "bash", "arguments": {"command": "ls"}}', TOOLS).calls
    ] == [("bash", {"command": "ls"})]
    fenced = p.parse(
        '```json\n[{"name": "bash", "parameters": {"command": "a"}}, {"name": "edit", "arguments": {}}]\n```', TOOLS
    )
    assert [c.name for c in fenced.calls] == ["bash", "edit"] and fenced.content == ""
    assert p.parse("just words", TOOLS).calls == []
    assert p.parse('{"name": "bash", "arguments": ', TOOLS).malformed
    plain_json = p.parse('{"answer": 42}', TOOLS)
    assert plain_json.calls == [] and not plain_json.malformed and plain_json.content == '{"answer": 42}'


def test_registry_by_name_and_import_path() -> None:
    assert set(PARSERS) == {"hermes", "qwen3_coder", "json", "fenced"}
    assert isinstance(get_parser("services.proxy.chat.toolparsers:JsonParser"), JsonParser)
    with pytest.raises(ConfigError, match="valid names"):
        get_parser("mystery")
    with pytest.raises(ConfigError, match="cannot be imported"):
        get_parser("no.such.module:Parser")
    with pytest.raises(ConfigError, match="not a ToolParser"):
        get_parser("services.proxy.chat.toolparsers:ParsedCall")


def test_preflight_catches_a_parser_that_cannot_read_the_template(tmp_path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    from harnessrl.paths import default_model_dir

    ChatModel.load(default_model_dir(), [], "auto", {}, "hermes", True)  # matches
    with pytest.raises(ConfigError, match="does not read the tool calls"):
        ChatModel.load(default_model_dir(), [], "auto", {}, "qwen3_coder", True)
    with pytest.raises(ConfigError, match="does not render tools"):
        ChatModel.load(default_model_dir(), [], "model", {}, "hermes", True)


# -- streaming splitter ---------------------------------------------------------

OUTPUTS = [
    "Plain answer.",
    "  leading and trailing spaces  \n",
    "<think>\nPlan it.\n</think>\n\nI will run it.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
    'Sure. <tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>',
    "<think>unterminated reasoning",
    "A <tool_ca not a tag",
    "<thin",
]


@settings(max_examples=200, deadline=None)
@given(out=st.sampled_from(OUTPUTS), cuts=st.lists(st.integers(1, 8), max_size=40))
def test_streaming_emits_what_a_whole_parse_returns(out: str, cuts: list[int]) -> None:
    whole = OutputStream(HermesParser(), TOOLS)
    whole.feed(out)
    expected = whole.finish()
    stream = OutputStream(HermesParser(), TOOLS)
    pieces, i = [], 0
    for n in [*cuts, len(out)]:
        pieces.append(out[i : i + n])
        i += n
    deltas = [d for p in pieces if p for d in stream.feed(p)]
    final = stream.finish()
    deltas += final.deltas
    assert "".join(d.text for d in deltas if d.kind == "text") == expected.content == final.content
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == expected.reasoning == final.reasoning
    assert [(c.name, c.arguments) for c in final.calls] == [(c.name, c.arguments) for c in expected.calls]
    assert final.malformed == expected.malformed
    assert "<tool_call>" not in "".join(d.text for d in deltas) or final.malformed


def test_streaming_holds_back_partial_markers() -> None:
    s = OutputStream(HermesParser(), TOOLS)
    assert [d.text for d in s.feed("Hello <tool")] == ["Hello"]
    assert s.feed('_call>{"name": "bash"') == [Delta("call", "bash", 0)]  # the call streams from its name on
    final = s.finish()
    assert final.malformed and final.content.startswith("Hello <tool_call>")


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abXY", max_size=30), cuts=st.lists(st.integers(1, 5), max_size=20))
def test_stop_strings_cut_at_the_first_stop_however_the_text_arrives(text: str, cuts: list[int]) -> None:
    stops = ["XY", "bbb"]
    found = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    expected = text[: min(found)[0]] if found else text
    s, out, i = StopStrings(stops), "", 0
    for n in [*cuts, len(text)]:
        out += s.feed(text[i : i + n])
        i += n
    if s.hit is None:
        out += s.flush()
    assert out == expected and (s.hit is not None) == bool(found)


def test_fenced_blocks_naming_a_one_parameter_tool_are_its_calls() -> None:
    text = "I will list them.\n```bash\nls -la\n```\n```python\nprint(1)\n```\n```bash \ncat a.txt\n```\nDone?"
    r = FencedParser().parse(text, TOOLS)
    assert r.content == "I will list them." and not r.malformed
    assert [(c.name, c.arguments) for c in r.calls] == [
        ("bash", {"command": "ls -la"}),
        ("bash", {"command": "cat a.txt"}),
    ]
    # "edit" has two parameters: no fenced form; other languages and plain text stay text
    for plain in ("```edit\n3\n```", "```python\nprint(1)\n```", "no code", "```\nls\n```"):
        got = FencedParser().parse(plain, TOOLS)
        assert got.calls == [] and got.content == plain and not got.malformed, plain
    cut = FencedParser().parse("Sure.\n```bash\necho partial", TOOLS)  # opened, never closed
    assert cut.calls == [] and cut.malformed and cut.content == "Sure.\n```bash\necho partial"
    required = Tool("run", "", {"type": "object", "properties": {"cmd": {}, "cwd": {}}, "required": ["cmd"]})
    assert FencedParser().parse("```run\nmake\n```", (required,)).calls[0].arguments == {"cmd": "make"}


def test_fenced_template_and_parser_read_back_each_other_on_the_real_tokenizer() -> None:
    """What the model writes is what the template renders back (so a turn extends the
    segment), and the proxy's startup check passes for the pair."""
    from harnessrl.paths import default_model_dir

    model = ChatModel.load(default_model_dir(), [], "fenced-chatml", {}, "fenced", True)
    bash = {
        "type": "function",
        "function": {"name": "bash", "description": "Run a command", "parameters": TOOLS[0].parameters},
    }
    reply = "Listing.\n```bash\nls -la\n```"
    parsed = model.parser.parse(reply, TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}
    messages = [{"role": "user", "content": "go"}]
    prompt = model.template.render(messages, [bash], add_generation_prompt=True)
    assert "reply with a code block whose language is the tool's name" in prompt and "- bash: Run a command" in prompt
    answered = [*messages, {"role": "assistant", "content": parsed.content, "tool_calls": [call]}]
    full = model.template.render(answered, [bash], add_generation_prompt=False)
    assert full == prompt + reply + "<|im_end|>\n"
    assert model.template.render(messages, [], add_generation_prompt=True) == ChatModel.load(
        default_model_dir(), [], "hermes-chatml", {}, "hermes", True
    ).template.render(messages, [], add_generation_prompt=True)


def test_preflight_refuses_a_template_that_does_not_render_incrementally(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from harnessrl.paths import default_model_dir
    from services.proxy.chat.template import BUILTIN_TEMPLATES

    # The hermes override, except that the last message is marked: a turn's
    # rendering then depends on whether another follows it.
    plain = "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    source = BUILTIN_TEMPLATES["hermes-chatml"].read_text()
    assert plain in source
    marked = tmp_path / "marked.jinja"
    marked.write_text(source.replace(plain, plain + "{%- if loop.last %}(last){% endif -%}"))
    with pytest.raises(ConfigError, match="does not render conversations incrementally"):
        ChatModel.load(default_model_dir(), [], str(marked), {}, "hermes", True)
