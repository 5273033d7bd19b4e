"""Wire protocols -> the canonical conversation (what the capture sees)."""

from __future__ import annotations

import pytest

from services.proxy.anthropic.models import SIGNATURE_PREFIX, MessagesRequest
from services.proxy.anthropic.models import to_conversation as anthropic_conv
from services.proxy.chat.conversation import Message, ToolCall
from services.proxy.errors import BadRequest
from services.proxy.openai.models import ChatRequest
from services.proxy.openai.models import to_conversation as openai_conv
from services.proxy.protocol import parse
from services.proxy.responses.models import Item, ResponsesRequest
from services.proxy.responses.models import to_conversation as responses_conv


def test_openai_leading_system_and_developer_form_the_system_prompt() -> None:
    req = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "A"},
                {"role": "developer", "content": [{"type": "text", "text": "B"}]},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "image_url", "image_url": {}}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "r"},
                {"role": "system", "content": "mid"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "logit_bias": {},
        }
    )
    conv = openai_conv(req)
    assert conv.system == "A\n\nB"
    assert conv.messages == (
        Message("user", "hi [image_url omitted]"),
        Message("assistant", "", (ToolCall("c", "f", '{"x": 1}'),)),
        Message("tool", "r", tool_call_id="c"),
        Message("system", "mid"),
    )
    assert req.model_extra == {"logit_bias": {}}


def test_anthropic_blocks_keep_their_order_and_echoed_signature() -> None:
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 10,
            "system": [
                {"type": "text", "text": "S1", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "S2"},
            ],
            "messages": [
                {"role": "user", "content": "task"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE_PREFIX + "turn1"},
                        {"type": "text", "text": "Running."},
                        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a"}]},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                        {"type": "text", "text": "<system-reminder>r</system-reminder>"},
                    ],
                },
                {"role": "system", "content": "mid-conversation"},
            ],
            "tools": [
                {"name": "Bash", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"},
            ],
        }
    )
    conv = anthropic_conv(req)
    assert conv.system == "S1\n\nS2"
    assert [t.name for t in conv.tools] == ["Bash"]
    assert conv.messages == (
        Message("user", "task"),
        Message(
            "assistant",
            "Running.",
            (ToolCall("toolu_1", "Bash", '{"command": "ls"}'),),
            reasoning="hmm",
            turn_ref="turn1",
        ),
        Message("tool", "a", tool_call_id="toolu_1"),
        Message("tool", "Error: boom", tool_call_id="toolu_2"),
        Message("user", "<system-reminder>r</system-reminder>"),
        Message("system", "mid-conversation"),
    )


def test_responses_items_form_assistant_turns() -> None:
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "instructions": "I",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "D"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "reasoning", "id": "rs_t1", "summary": [{"type": "summary_text", "text": "think"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_t1",
                    "content": [{"type": "output_text", "text": "ok"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": '{"cmd": "ls"}'},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            ],
            "tools": [
                {"type": "function", "name": "exec", "parameters": {"type": "object"}},
                {"type": "custom", "name": "apply_patch", "description": "patch"},
                {"type": "web_search"},
            ],
        }
    )
    conv, custom = responses_conv(req)
    assert conv.system == "I\n\nD" and custom.custom == {"apply_patch"}
    assert [t.name for t in conv.tools] == ["exec", "apply_patch"]
    assert conv.messages == (
        Message("user", "go"),
        Message(
            "assistant",
            "ok",
            (ToolCall("c1", "exec", '{"cmd": "ls"}'), ToolCall("c2", "apply_patch", '{"input": "*** Begin"}')),
            reasoning="think",
            turn_ref="t1",
        ),
        Message("tool", "a.txt", tool_call_id="c1"),
        Message("tool", "done", tool_call_id="c2"),
    )
    # previous_response_id: the stored chain's items come first, then the request's own input
    chained = ResponsesRequest.model_validate({"model": "m", "input": "next", "previous_response_id": "r"})
    earlier = [Item(type="message", role="developer", content="D"), Item(type="message", role="user", content="go")]
    assert responses_conv(chained, earlier)[0].messages == (Message("user", "go"), Message("user", "next"))
    assert responses_conv(chained, earlier)[0].system == "D"


@pytest.mark.parametrize("raw", [b"[]", b"null", b"{", b"\xff", b"   "])
def test_parse_refuses_what_is_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(BadRequest, match=r"invalid request|empty"):
        parse(ChatRequest, raw)


def test_unknown_fields_are_accepted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from services.proxy.protocol import log_unknown

    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1, "metadata": {}}'
    caplog.set_level("INFO", logger="services.proxy.protocol")
    for _ in range(3):
        log_unknown("openai-test", parse(ChatRequest, body))
    logged = [r.kv["field"] for r in caplog.records if r.getMessage() == "ignored request field"]  # type: ignore[attr-defined]
    assert sorted(logged) == ["frobnicate", "metadata"]
