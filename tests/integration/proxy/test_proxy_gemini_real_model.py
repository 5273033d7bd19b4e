"""The Gemini API with the real default model: google-genai streams a multi-turn
tool conversation through the proxy and the gateway's local fp32 CPU engine
(SmolLM2-135M); the capture is one main segment, rendered incrementally as a full
render would, and every captured logprob is the model's (a teacher-forced pass)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google import genai
from google.genai import types

from tests.integration.proxy.fidelity_support import forward_pass_agreement
from tests.integration.proxy.stack import MODEL, Stack

pytestmark = pytest.mark.slow
BASH = types.FunctionDeclaration(
    name="bash",
    description="Run a shell command",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"command": types.Schema(type=types.Type.STRING)}, required=["command"]
    ),
)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, None, engine="local", default_max_tokens=24)
    yield s
    s.stop()


def test_streamed_tool_conversation_with_the_default_model(stack: Stack) -> None:
    base, token = stack.new_trial("gemini-real")
    options = types.HttpOptions(base_url=base.removesuffix("/v1"), api_version="v1beta", timeout=600_000)
    c = genai.Client(api_key=token, http_options=options)
    config = types.GenerateContentConfig(
        system_instruction="You are a helpful coding assistant.",
        tools=[types.Tool(function_declarations=[BASH])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        temperature=1,
        top_p=0.95,
        top_k=64,
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What is in this directory?")])]
    for follow_up in ("Thanks. Say done.", "One more word."):
        chunks = list(c.models.generate_content_stream(model=MODEL, contents=contents, config=config))
        assert chunks[-1].candidates[0].finish_reason in (types.FinishReason.STOP, types.FinishReason.MAX_TOKENS)  # type: ignore[index]
        parts = [p for ch in chunks for p in ch.candidates[0].content.parts or ()]  # type: ignore[index,union-attr]
        contents.append(types.Content(role="model", parts=[p for p in parts if not p.thought]))
        replies = [
            types.Part(
                function_response=types.FunctionResponse(
                    id=p.function_call.id, name=p.function_call.name, response={"output": "a.txt"}
                )
            )
            for p in parts
            if p.function_call is not None
        ]
        contents.append(types.Content(role="user", parts=[*replies, types.Part(text=follow_up)]))
    summary = stack.close_trial("gemini-real")
    assert summary["num_turns"] == 2 and summary["render_mismatches"] == 0
    segments = stack.export("gemini-real")
    assert [(s["thread"], s["segment_index"]) for s in segments] == [("main", 0)]
    n, pearson, max_delta = forward_pass_agreement(segments)
    print(f"gemini fidelity: {n} tokens, pearson={pearson:.6f}, max|Δ|={max_delta:.2e}")
    assert n >= 10 and pearson >= 0.9999 and max_delta <= 1e-3
