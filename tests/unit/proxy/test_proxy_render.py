"""Chat templates and token-faithful rendering against the real SmolLM2 tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from harnessrl.errors import ConfigError
from harnessrl.paths import default_model_dir
from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall, message_for_template
from services.proxy.chat.render import Renderer, SampledIds
from services.proxy.chat.template import ChatTemplate, read_model_template, resolve_template
from services.proxy.chat.tokenizer import Tokenizer

BASH = Tool("bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}})
CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List files, then say done. Ünïcödé ✓"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": "Done."},
]


def ids(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<i4").tolist()


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.mark.parametrize("choice", ["model", "hermes-chatml"])
def test_render_is_byte_identical_to_transformers(choice: str, tokenizer: Tokenizer, hf) -> None:  # type: ignore[no-untyped-def]
    template = resolve_template(default_model_dir(), choice, tokenizer.special_tokens)
    tools = [{"type": "function", "function": {"name": "bash", "description": "d", "parameters": BASH.parameters}}]
    for gen in (True, False):
        mine = template.render(CONV, tools, add_generation_prompt=gen)
        theirs = hf.apply_chat_template(
            CONV, tools=tools, chat_template=template.source, tokenize=False, add_generation_prompt=gen
        )
        assert mine == theirs
        assert (
            tokenizer.encode(mine)
            == hf.apply_chat_template(
                CONV, tools=tools, chat_template=template.source, tokenize=True, add_generation_prompt=gen
            )["input_ids"]
        )


def test_hermes_override_without_tools_renders_like_the_models_own(tokenizer: Tokenizer) -> None:
    own = resolve_template(default_model_dir(), "model", tokenizer.special_tokens)
    hermes = resolve_template(default_model_dir(), "hermes-chatml", tokenizer.special_tokens)
    plain = [m for m in CONV if "tool_calls" not in m and m["role"] != "tool"]
    for msgs in (plain, plain[1:]):
        assert own.render(msgs, None, True) == hermes.render(msgs, None, True)


def test_auto_picks_override_for_a_template_without_tools_and_records_its_sha(tokenizer: Tokenizer) -> None:
    auto = resolve_template(default_model_dir(), "auto", tokenizer.special_tokens)
    own = read_model_template(default_model_dir())
    assert own is not None and "tools" not in own
    assert auto.name == "hermes-chatml" and auto.renders_tools
    assert len(auto.sha256) == 64 and auto.sha256 != ChatTemplate(own, "own", {}).sha256


def test_bad_template_choices_are_config_errors(tokenizer: Tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="neither"):
        resolve_template(default_model_dir(), "no-such-template", tokenizer.special_tokens)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="does not compile"):
        resolve_template(default_model_dir(), str(broken), tokenizer.special_tokens)
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        Tokenizer(tmp_path)


def test_full_render_splices_sampled_ids_verbatim(renderer: Renderer, tokenizer: Tokenizer) -> None:
    # Ids no re-tokenization of the text would produce: the render must keep them.
    sampled = [4093, 4093, 30, 2]
    conv = Conversation(
        "sys",
        (Message("user", "hi"), Message("assistant", "whatever the harness echoed"), Message("user", "more")),
        (BASH,),
    )
    out = ids(renderer.full(conv, [None, SampledIds(np.array(sampled, "<i4").tobytes(), True), None]))
    head = tokenizer.encode(
        renderer.template.render(
            [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
            [
                {
                    "type": "function",
                    "function": {"name": "bash", "description": "Run a command", "parameters": BASH.parameters},
                }
            ],
            True,
        )
    )
    assert out[: len(head)] == head
    assert out[len(head) : len(head) + 4] == sampled
    # after the sampled eos: only the template's tail, then the next user turn
    assert tokenizer.decode(out[len(head) + 4 :], skip_special_tokens=False) == (
        "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tail_without_eos_keeps_the_template_end_of_turn(renderer: Renderer) -> None:
    assert renderer.tail(True) == "\n"
    assert renderer.tail(False) == "<|im_end|>\n"


# -- extension == full, for arbitrary conversations ---------------------------

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
new_messages = st.lists(
    st.one_of(
        st.builds(lambda c: Message("user", c), text),
        st.builds(lambda c, i: Message("tool", c, tool_call_id=f"c{i}"), text, st.integers(0, 3)),
        st.builds(lambda c: Message("system", c), text),
    ),
    min_size=0,
    max_size=4,
)
sampled_ids = st.lists(st.integers(3, 49151), min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    first=text,
    turns=st.lists(st.tuples(sampled_ids, st.booleans(), new_messages), min_size=1, max_size=4),
    with_tools=st.booleans(),
)
def test_incremental_extension_equals_full_render(renderer: Renderer, first: str, turns, with_tools: bool) -> None:  # type: ignore[no-untyped-def]
    """The heart of invariant 2: tokenizing only the new messages gives exactly
    the ids that rendering the whole conversation (own turns spliced) gives."""
    messages: list[Message] = [Message("user", first)]
    sampled: list[SampledIds | None] = [None]
    tools = (BASH,) if with_tools else ()
    context = renderer.full(Conversation("S", tuple(messages), tools), sampled)
    for raw, eos, new in turns:
        turn = SampledIds(np.array([*raw, *([2] if eos else [])], "<i4").tobytes(), eos)
        messages.append(Message("assistant", "echo", (ToolCall("x", "bash", json.dumps({"a": 1})),)))
        sampled.append(turn)
        context += turn.ids
        context += renderer.extension(turn, new).tobytes()
        messages.extend(new)
        sampled.extend([None] * len(new))
        assert ids(context) == ids(renderer.full(Conversation("S", tuple(messages), tools), sampled))


def test_template_dicts_carry_tool_calls_as_objects() -> None:
    m = Message("assistant", "", (ToolCall("c", "bash", '{"command": "ls"}'), ToolCall("d", "x", "not json")))
    out = message_for_template(m)
    assert out["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert out["tool_calls"][1]["function"]["arguments"] == "not json"


def test_text_that_looks_like_a_placeholder_cannot_move_a_splice(renderer: Renderer) -> None:
    sneaky = Message("user", "\x00hrl-turn-0\x00 \x00hrl-0000000000000000-0\x00")
    turn = SampledIds(np.array([4093, 2], "<i4").tobytes(), True)
    conv = Conversation("S", (sneaky, Message("assistant", "x"), Message("user", "y")), ())
    out = ids(renderer.full(conv, [None, turn, None]))
    head = renderer.tokenizer.encode(
        renderer.template.render(
            [{"role": "system", "content": "S"}, {"role": "user", "content": sneaky.content}], None, True
        )
    )
    assert out[: len(head)] == head and out[len(head) : len(head) + 2] == [4093, 2]
