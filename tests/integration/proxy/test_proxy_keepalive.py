"""A streamed answer whose first token comes after ``stream_headers_after_s`` (a long
prefill): the proxy sends 200 and headers, then its protocol's keep-alive until the
first token, and an error after the headers goes in the stream in the protocol's own
shape. Each official SDK (openai, anthropic, google-genai) against the real proxy, the
scripted engine (``first_delay_s``: every reply's first chunk comes late) and a capture
store over gRPC; a client that leaves while waiting aborts the turn, captured nowhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors, types

from harnessrl import paths
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

ANSWER = "Hello after a long prefill."
DELAY_S = 1.5  # the scripted engine's wait before each reply (or its exhausted-script error)
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("keepalive")
    # One reply per thread and trial: a trial's second call fails in the engine (the
    # script is exhausted), after the delay, so after the headers.
    path = script(tmp, {"main": [{"content": ANSWER}], "*": [{"content": ANSWER}]}, on_exhausted="error")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "first_delay_s": DELAY_S}))
    s = Stack(tmp, path, stream_headers_after_s=0.2, stream_keepalive_s=0.2)
    yield s
    s.stop()


def raw(
    stack: Stack, trial: str, path: str, body: dict[str, object], headers: Callable[[str], dict[str, str]]
) -> bytes:
    """The whole body of one streamed request (keep-alives in it show that the headers
    and they came before the first token)."""
    base, token = stack.new_trial(trial)
    with httpx.stream("POST", f"{base.removesuffix('/v1')}{path}", json=body, headers=headers(token), timeout=60) as r:
        assert r.status_code == 200, r.read()
        return r.read()


def test_openai_chat_keepalives_then_the_answer_then_an_in_stream_error(stack: Stack) -> None:
    body = {"model": MODEL, "stream": True, "messages": ASK}
    data = raw(stack, "ka-oa-raw", "/v1/chat/completions", body, lambda t: {"Authorization": f"Bearer {t}"})
    lines = data.decode().split("\n\n")
    first_token = next(i for i, e in enumerate(lines) if '"content":"Hello' in e)
    assert lines[1:first_token].count(": keep-alive") >= 2, lines[:first_token]

    base, token = stack.new_trial("ka-oa")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    stream = c.chat.completions.create(model=MODEL, messages=ASK, stream=True)  # type: ignore[arg-type]
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == ANSWER
    with pytest.raises(openai.APIError) as e:  # the engine fails after the headers: the SDK raises, no empty answer
        for _ in c.chat.completions.create(model=MODEL, messages=ASK, stream=True):  # type: ignore[arg-type]
            pass
    assert e.value.code == "engine_error" or "engine" in str(e.value).lower(), e.value
    summary = stack.close_trial("ka-oa")
    assert summary["num_turns"] == 1 and summary["engine_errors"] == 1 and summary["aborted_turns"] == 0
    check_faithful(stack.export("ka-oa"), stack.engine_log(), "ka-oa")


def test_anthropic_pings_then_the_answer_then_an_error_event(stack: Stack) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": 64, "messages": ASK}
    data = raw(stack, "ka-an-raw", "/v1/messages", body, lambda t: {"x-api-key": t})
    events = [e.split("\n", 1)[0] for e in data.decode().split("\n\n") if e]
    assert events[0] == "event: message_start" and events[1:3] == ["event: ping"] * 2, events

    base, token = stack.new_trial("ka-an")
    c = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
    with c.messages.stream(model=MODEL, max_tokens=64, messages=ASK) as s:  # type: ignore[arg-type]
        assert s.get_final_text() == ANSWER
    with pytest.raises(anthropic.APIStatusError) as e:
        with c.messages.stream(model=MODEL, max_tokens=64, messages=ASK) as s:  # type: ignore[arg-type]
            s.get_final_text()
    assert isinstance(e.value.body, dict) and e.value.body["error"]["type"] == "api_error", e.value.body
    summary = stack.close_trial("ka-an")
    assert summary["num_turns"] == 1 and summary["engine_errors"] == 1
    check_faithful(stack.export("ka-an"), stack.engine_log(), "ka-an")


def test_responses_keepalives_then_the_answer_then_response_failed(stack: Stack) -> None:
    body = {"model": MODEL, "stream": True, "input": "hi"}
    data = raw(stack, "ka-rs-raw", "/v1/responses", body, lambda t: {"Authorization": f"Bearer {t}"})
    events = [e.split("\n", 1)[0] for e in data.decode().split("\n\n") if e]
    assert events[2:4] == [": keep-alive"] * 2, events

    base, token = stack.new_trial("ka-rs")
    c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    kinds = [ev.type for ev in c.responses.create(model=MODEL, input="hi", stream=True)]
    assert kinds[-1] == "response.completed"
    last = list(c.responses.create(model=MODEL, input="hi", stream=True))[-1]
    assert last.type == "response.failed" and last.response.error is not None, last  # type: ignore[union-attr]
    assert stack.close_trial("ka-rs")["num_turns"] == 1


def test_gemini_blank_lines_then_the_answer_then_a_google_error(stack: Stack) -> None:
    path = f"/v1beta/models/{MODEL}:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    data = raw(stack, "ka-gm-arr", path, body, lambda t: {"x-goog-api-key": t})
    assert data.startswith(b"[\n\n"), data[:20]  # whitespace after '[': legal JSON
    assert "".join(p["text"] for c in json.loads(data) for p in c["candidates"][0]["content"]["parts"]) == ANSWER
    data = raw(stack, "ka-gm-sse", path + "?alt=sse", body, lambda t: {"x-goog-api-key": t})
    assert data.startswith(b"\n\n") and b":" not in data.split(b"data:")[0], data[:20]

    base, token = stack.new_trial("ka-gm")
    options = types.HttpOptions(base_url=base.removesuffix("/v1"), api_version="v1beta")
    c = genai.Client(api_key=token, http_options=options)
    text = "".join(ch.text or "" for ch in c.models.generate_content_stream(model=MODEL, contents="hi"))
    assert text == ANSWER
    with pytest.raises(errors.APIError) as e:
        for _ in c.models.generate_content_stream(model=MODEL, contents="hi"):
            pass
    assert e.value.code >= 500, e.value
    summary = stack.close_trial("ka-gm")
    assert summary["num_turns"] == 1 and summary["engine_errors"] == 1
    check_faithful(stack.export("ka-gm"), stack.engine_log(), "ka-gm")


def test_a_client_that_leaves_while_waiting_aborts_the_turn_and_nothing_is_captured(stack: Stack) -> None:
    base, token = stack.new_trial("ka-gone")
    body = {"model": MODEL, "stream": True, "messages": ASK}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the headers and the first bytes came; the client leaves before the first token
    summary = stack.admin("GET", "/trials/ka-gone").json()
    for _ in range(200):
        if summary["aborted_turns"]:
            break
        httpx.get(f"{stack.url}/healthz")
        summary = stack.admin("GET", "/trials/ka-gone").json()
    assert summary["aborted_turns"] == 1 and summary["num_turns"] == 0 and summary["engine_errors"] == 0
    assert summary["abandoned_turns"] == 0  # nothing was sampled: nothing to keep
    assert stack.close_trial("ka-gone")["num_segments"] == 0
    assert stack.export("ka-gone") == []


NODE_CLIENT = r"""
// Gemini CLI's SDK (@google/genai) over undici's fetch with a short header wait: Node's
// fetch gives up on a request whose headers take longer (300 s by default).
const [undiciPath, genaiPath, base, token, model] = process.argv.slice(2);
const undici = require(undiciPath);
undici.setGlobalDispatcher(new undici.Agent({ headersTimeout: 3000, bodyTimeout: 3000 }));
globalThis.fetch = undici.fetch;
const { GoogleGenAI } = require(genaiPath);
(async () => {
  const ai = new GoogleGenAI({ apiKey: token, httpOptions: { baseUrl: base } });
  const out = { text: "", error: null };
  const stream = await ai.models.generateContentStream({ model, contents: "hi" });
  for await (const chunk of stream) out.text += chunk.text || "";
  try {
    for await (const _ of await ai.models.generateContentStream({ model, contents: "hi" })) {}
  } catch (e) {
    out.error = { name: e.name, status: e.status ?? null, message: String(e.message).slice(0, 300) };
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(String(e), e.cause ? String(e.cause) : ""); process.exit(1); });
"""


def node_modules_with(node: str, *packages: str) -> Path | None:
    """A harness's node_modules (installed by setup) that holds every package named, each
    one this ``node`` runs (its ``engines.node`` lower bound at most node's version)."""
    have = _version(subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout)
    for d in sorted((paths.tools_dir() / "declared").glob("*/node_modules")):
        metas = [d / p / "package.json" for p in packages]
        if all(m.is_file() for m in metas) and all(
            _version(json.loads(m.read_text()).get("engines", {}).get("node", "0")) <= have for m in metas
        ):
            return d
    return None


def _version(text: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version or of a range's first bound: 'v20.20.2', '>=20.18.1'."""
    digits = re.findall(r"\d+", text)[:3]
    return tuple(int(x) for x in digits) or (0,)


def test_node_fetch_with_a_short_header_timeout_gets_the_late_answer_and_the_error(tmp_path: Path) -> None:
    """The first token comes after 6 s, the client drops a request with no headers in 3 s:
    it gets headers after the grace, blank-line keep-alives, the answer, then the late
    engine failure as an ApiError (never an empty answer)."""
    node = shutil.which("node")
    modules = node_modules_with(node, "undici", "@google/genai") if node else None
    if node is None or modules is None:
        pytest.skip(
            "needs node and a harness's node_modules with undici and @google/genai (harnessrl harness install pi)"
        )
    path = script(tmp_path, {"main": [{"content": ANSWER}], "*": [{"content": ANSWER}]}, on_exhausted="error")
    path.write_text(json.dumps({**json.loads(path.read_text()), "first_delay_s": 6.0}))
    stack = Stack(tmp_path, path, stream_headers_after_s=0.2, stream_keepalive_s=0.5)
    try:
        base, token = stack.new_trial("ka-node")
        client = tmp_path / "client.cjs"
        client.write_text(NODE_CLIENT)
        args = [str(modules / "undici"), str(modules / "@google/genai"), base.removesuffix("/v1"), token, MODEL]
        done = subprocess.run([node, str(client), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["text"] == ANSWER, out
        assert out["error"] is not None and out["error"]["name"] == "ApiError" and out["error"]["status"] >= 500, out
        summary = stack.close_trial("ka-node")
        assert summary["num_turns"] == 1 and summary["engine_errors"] == 1
    finally:
        stack.stop()
