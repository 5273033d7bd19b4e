"""The ``fenced`` tool parser with the ``fenced-chatml`` template, through the OpenAI
SDK: a ```bash block the engine writes comes back as a ``bash`` tool call, other
fences stay text, an unclosed one is a malformed call, and the conversation stays
ONE segment (each turn re-renders exactly what was sampled)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
MAIN = [
    {"raw": "Listing first.\n```bash\nls -la\n```"},
    {"raw": "```python\nprint('not a tool')\n```"},
    {"raw": "```bash\necho quartz > answer.txt\n```"},
    {"raw": "Now submit.\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("fenced")
    s = Stack(tmp, script(tmp, {"main": MAIN}, chunk_tokens=2), chat_template="fenced-chatml", tool_parser="fenced")
    yield s
    s.stop()


def test_fenced_blocks_are_tool_calls_and_the_conversation_is_one_segment(stack: Stack) -> None:
    base, token = stack.new_trial("fenced-1")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    bash: Any = {"type": "function", "function": {"name": "bash", "description": "Run", "parameters": PARAMS}}
    messages: list[Any] = [{"role": "system", "content": "Use bash."}, {"role": "user", "content": "Write quartz."}]
    got = []
    for turn in range(len(MAIN)):
        stream = turn == 2
        kw = {"model": MODEL, "messages": messages, "tools": [bash]}
        if stream:
            with c.chat.completions.stream(**kw) as s:
                r = s.get_final_completion()
        else:
            r = c.chat.completions.create(**kw)
        m = r.choices[0].message
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or ()]
        got.append((r.choices[0].finish_reason, m.content or None, calls))  # streamed: "" for none
        messages.append(m.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in m.tool_calls or ()]
        if not m.tool_calls:
            messages.append({"role": "user", "content": "Call the bash tool with one command."})
    assert got == [
        ("tool_calls", "Listing first.", [("bash", {"command": "ls -la"})]),
        ("stop", "```python\nprint('not a tool')\n```", []),
        ("tool_calls", None, [("bash", {"command": "echo quartz > answer.txt"})]),
        ("stop", "Now submit.\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", []),
    ]
    summary = stack.close_trial("fenced-1")
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (4, 1, 0), summary
    assert summary["malformed_tool_calls"] == 1, "the unclosed ```bash block"
    check_faithful(stack.export("fenced-1"), stack.engine_log(), "fenced-1")
