"""Engine failures reach the harness as the status its SDK retries on (or
does not): retryable trouble is 503 / Anthropic 529 with x-should-retry: true,
a permanent failure 500 with x-should-retry: false; a failure mid-stream is an
error event; none of them records a turn."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest

from tests.integration.proxy.stack import MODEL, Stack, script

MSG = [{"role": "user", "content": "hi"}]


def test_engine_down_is_retryable_for_both_sdks(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "x"}]}))
    try:
        base, token = stack.new_trial("down")
        stack.run(stack.gateway.stop(0))
        with pytest.raises(openai.InternalServerError) as oe:
            openai.OpenAI(base_url=base, api_key=token, max_retries=1).chat.completions.create(
                model=MODEL, messages=MSG
            )  # type: ignore[arg-type]
        assert oe.value.status_code == 503 and oe.value.response.headers["x-should-retry"] == "true"
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as ae:
            client.messages.create(model=MODEL, max_tokens=5, messages=MSG)  # type: ignore[arg-type]
        assert ae.value.status_code == 529 and ae.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        summary = stack.close_trial("down")
        assert summary["engine_error"] and summary["engine_errors"] == 3, "the openai SDK retried once"
        assert summary["num_turns"] == 0 and stack.export("down") == []
    finally:
        stack.stop()


def test_permanent_engine_failure_is_not_retried(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "once"}]}, on_exhausted="error"))
    try:
        base, token = stack.new_trial("permanent")
        c = openai.OpenAI(base_url=base, api_key=token, max_retries=3)
        assert c.chat.completions.create(model=MODEL, messages=MSG).choices[0].message.content == "once"  # type: ignore[arg-type]
        with pytest.raises(openai.InternalServerError) as oe:
            c.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
        assert oe.value.status_code == 500 and oe.value.response.headers["x-should-retry"] == "false"
        assert "engine error" in str(oe.value)
        summary = stack.close_trial("permanent")
        assert summary["engine_errors"] == 1, "x-should-retry: false stops the SDK's retries"
        assert summary["num_turns"] == 1
    finally:
        stack.stop()


def test_engine_dying_mid_stream_is_an_error_event_and_no_turn(tmp_path: Path) -> None:
    slow = {"*": [{"content": "word " * 200}]}
    stack = Stack(tmp_path, script(tmp_path, slow, chunk_tokens=1, chunk_delay_s=0.02))
    try:
        base, token = stack.new_trial("midstream")
        c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        stream = c.chat.completions.create(model=MODEL, messages=MSG, stream=True)  # type: ignore[arg-type]
        got = []
        with pytest.raises(openai.APIError):
            for chunk in stream:
                got.append(chunk)
                if len(got) == 5:
                    stack.run(stack.gateway.stop(0))
        summary = stack.close_trial("midstream")
        assert summary["num_turns"] == 0 and summary["aborted_turns"] == 1 and summary["engine_error"]
        assert stack.export("midstream") == []
    finally:
        stack.stop()
