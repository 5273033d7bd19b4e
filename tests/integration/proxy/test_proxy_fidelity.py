"""Fidelity with the real model: a trial through the proxy and the gateway's
local fp32 CPU engine, then a teacher-forced forward pass over every exported
segment; the captured logprob of every mask-1 token must be the model's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.proxy.fidelity_support import forward_pass_agreement
from tests.integration.proxy.stack import MODEL, Stack

pytestmark = pytest.mark.slow
BASH = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, None, engine="local", default_max_tokens=24)
    yield s
    s.stop()


def test_captured_logprobs_match_a_forward_pass(stack: Stack) -> None:
    base, token = stack.new_trial("fidelity")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=600)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "What is in this directory?"},
    ]
    for follow_up in ("Thanks. Say done.", "One more word."):
        r = c.chat.completions.create(model=MODEL, messages=messages, tools=[BASH])  # type: ignore[arg-type]
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        for call in r.choices[0].message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.txt"})
        messages.append({"role": "user", "content": follow_up})
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A title for this chat:"}])
    summary = stack.close_trial("fidelity")
    assert summary["num_turns"] == 3 and summary["render_mismatches"] == 0
    segments = stack.export("fidelity")
    assert {s["thread"] for s in segments} == {"main", "side-1"}

    n, pearson, max_delta = forward_pass_agreement(segments)
    assert n >= 10
    print(f"fidelity: {n} tokens, pearson={pearson:.6f}, max|Δ|={max_delta:.2e}")
    assert pearson >= 0.9999 and max_delta <= 1e-3
