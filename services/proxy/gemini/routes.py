"""``POST /trials/<id>/v1beta/models/<model>:generateContent``, ``:streamGenerateContent``
(SSE with ``?alt=sse``, else a JSON array streamed element by element) and
``:countTokens``; ``v1`` and ``v1alpha`` too (the Python SDK's default is ``v1``).

A Gemini client's base URL is ``http://HOST:PORT/trials/<id>`` (Gemini CLI's
``GOOGLE_GEMINI_BASE_URL``, the SDK's ``http_options.base_url``); the key, the
trial's token, comes in ``x-goog-api-key`` or ``?key=``. Thin routes: the
conversation, the call and the capture are the shared ones."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from harnessrl import metrics
from harnessrl.logs import kv
from services.proxy.chat.toolchoice import ToolForcing, forcing
from services.proxy.errors import ModelNotFound, error_body
from services.proxy.gemini.honour import IGNORED, ignored, include_thoughts, refusals, tool_choice
from services.proxy.gemini.models import CountTokensRequest, GenerateContentRequest, GenerationConfig
from services.proxy.gemini.translate import signature, to_conversation
from services.proxy.protocol import FastJSON, bearer, core_of, grace, guarded, parse_request, sse
from services.proxy.trials import Trial
from services.proxy.turn import CallParams, Done, KeepAlive, ModelCall, ToolCallOut

log = logging.getLogger(__name__)
router = APIRouter()
VERSIONS = ("v1beta", "v1", "v1alpha")
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
_logged_ignored: set[str] = set()


def authenticate(request: Request, trial_id: str) -> Trial:
    """Google's SDKs send ``x-goog-api-key``; ``?key=`` and a bearer token work too."""
    key = request.headers.get("x-goog-api-key") or request.query_params.get("key") or bearer(request)
    trial = core_of(request).authenticate(trial_id, key)
    request.state.trial = trial
    return trial


@router.post("/trials/{trial_id}/{version}/models/{target:path}")
async def model_method(trial_id: str, version: str, target: str, request: Request) -> Response:
    model, _, method = target.rpartition(":")
    if version not in VERSIONS or not model:
        raise ModelNotFound(f"no such method: POST /{version}/models/{target}")
    trial = authenticate(request, trial_id)
    if method == "countTokens":
        return await _count_tokens(request, model, trial)
    if method not in ("generateContent", "streamGenerateContent"):
        raise ModelNotFound(
            f"models/{model}: no method {method!r}; served: generateContent, streamGenerateContent, countTokens"
        )
    body = await parse_request(request, GenerateContentRequest, "gemini")
    refusals(body)
    note_ignored(body)
    core = core_of(request)
    core.check_model(trial, model)
    conv = to_conversation(body)
    stream = method == "streamGenerateContent"
    params = call_params(body, forcing(tool_choice(body, conv.tools), core.model, conv.tools), stream)
    call = ModelCall(core, trial, conv, params)
    await call.start(grace(request, stream))
    thoughts = include_thoughts(body)
    if not stream:
        async for event in call.events():
            if isinstance(event, Done):
                return FastJSON(response(event, model, thoughts))
        raise RuntimeError("generation ended without a result")
    chunks = _chunks(call, model, thoughts)
    if request.query_params.get("alt") == "sse":
        return StreamingResponse(guarded(call, _sse(chunks)), media_type="text/event-stream")
    return StreamingResponse(guarded(call, _json_array(chunks)), media_type="application/json")


def call_params(body: GenerateContentRequest, tool_forcing: ToolForcing, stream: bool) -> CallParams:
    g = body.generation_config or GenerationConfig.model_validate({})
    return CallParams(
        g.max_output_tokens,
        g.temperature,
        g.top_p,
        g.top_k,
        list(g.stop_sequences or []),
        "call_",
        forcing=tool_forcing,
        whole=not stream,
    )


async def _count_tokens(request: Request, model: str, trial: Trial) -> Response:
    body = (await parse_request(request, CountTokensRequest, "gemini")).as_generate()
    core = core_of(request)
    core.check_model(trial, model)
    conv = to_conversation(body)
    prompt = core.model.renderer.full(conv, [None] * len(conv.messages))
    return FastJSON({"totalTokens": len(prompt) // 4})


def note_ignored(body: GenerateContentRequest) -> None:
    for name in ignored(body):
        metrics.IGNORED_FIELDS.labels("proxy", "gemini", name).inc()
        if name not in _logged_ignored:
            _logged_ignored.add(name)
            log.info("ignored request field", extra=kv(protocol="gemini", field=name, why=IGNORED[name]))


def _usage(done: Done) -> dict[str, int]:
    usage = {
        "promptTokenCount": done.prompt_tokens,
        "candidatesTokenCount": done.completion_tokens,
        "totalTokenCount": done.prompt_tokens + done.completion_tokens,
    }
    if done.cached_tokens:
        usage["cachedContentTokenCount"] = done.cached_tokens
    return usage


def _call_part(c: ToolCallOut, sig: str) -> dict[str, Any]:
    args = json.loads(c.arguments) if c.arguments else {}
    return {"functionCall": {"id": c.id, "name": c.name, "args": args}, "thoughtSignature": sig}


def _chunk(turn_id: str, model: str, parts: list[dict[str, Any]], done: Done | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": turn_id}
    if done is not None:
        candidate["finishReason"] = _FINISH[done.finish_reason]
        out["usageMetadata"] = _usage(done)
    return out


def response(done: Done, model: str, thoughts: bool) -> dict[str, Any]:
    """A whole ``GenerateContentResponse``; every part carries the turn's thought signature."""
    sig = signature(done.turn_id)
    parts: list[dict[str, Any]] = []
    if done.reasoning and thoughts:
        parts.append({"text": done.reasoning, "thought": True, "thoughtSignature": sig})
    if done.content:
        parts.append({"text": done.content, "thoughtSignature": sig})
    parts += [_call_part(c, sig) for c in done.calls]
    return _chunk(done.turn_id, model, parts or [{"text": "", "thoughtSignature": sig}], done)


async def _chunks(call: ModelCall, model: str, thoughts: bool) -> AsyncIterator[dict[str, Any] | None]:
    """Response chunks as the reply is sampled: text and thoughts token by token, each
    function call whole once the next one starts (else at the end), and a last chunk
    with the finish reason, the usage and the signature on an empty text part; None
    for a keep-alive while the first token is coming."""
    sig = signature(call.turn_id)
    sent_calls = 0
    pending: list[str] = []  # the open call's id, name and arguments, as streamed
    try:
        async for event in call.events():
            if isinstance(event, KeepAlive):
                yield None
            elif isinstance(event, Done):
                for c in event.calls[sent_calls:]:
                    yield _chunk(call.turn_id, model, [_call_part(c, sig)])
                yield _chunk(call.turn_id, model, [{"text": "", "thoughtSignature": sig}], event)
            elif event.kind == "text":
                yield _chunk(call.turn_id, model, [{"text": event.text, "thoughtSignature": sig}])
            elif event.kind == "reasoning":
                if thoughts:
                    yield _chunk(call.turn_id, model, [{"text": event.text, "thought": True, "thoughtSignature": sig}])
            elif event.kind == "call":
                # The previous call is whole; one that is not valid JSON (or follows
                # one held back) waits for the final parse, so calls keep their order.
                if pending and event.index == sent_calls + 1 and _is_json(pending[2]):
                    yield _chunk(
                        call.turn_id, model, [_call_part(ToolCallOut(pending[0], pending[1], pending[2]), sig)]
                    )
                    sent_calls += 1
                pending = [event.id or "", event.text, ""]
            elif event.kind == "args" and pending:
                pending[2] += event.text
    except Exception as e:  # noqa: BLE001 - the status line is gone; the client reads an error element
        yield error_body(e, "gemini")


def _is_json(text: str) -> bool:
    try:
        json.loads(text or "{}")
    except ValueError:
        return False
    return True


async def _sse(chunks: AsyncIterator[dict[str, Any] | None]) -> AsyncIterator[bytes]:
    """``alt=sse``. A keep-alive is a blank line, not an SSE comment: Google's SDKs skip
    blank lines, but the JS SDK's (Gemini CLI's) parser stalls on a comment line and the
    Python SDK's reads one as a chunk. An error is Google's raw JSON error object on its
    own line, not a ``data:`` event: what both SDKs raise from (``ApiError``/``APIError``)."""
    async for c in chunks:
        if c is None:
            yield b"\n"
        elif "error" in c:
            yield orjson.dumps(c) + b"\n"
        else:
            yield sse(c)


async def _json_array(chunks: AsyncIterator[dict[str, Any] | None]) -> AsyncIterator[bytes]:
    """Google's stream without ``alt=sse``: one JSON array, sent element by element;
    a keep-alive is whitespace after its ``[`` (legal JSON)."""
    head = b"["
    async for c in chunks:
        if c is None:
            yield b"[\n" if head == b"[" else b"\n"
            head = b"" if head == b"[" else head
            continue
        yield head + orjson.dumps(c)
        head = b",\r\n"
    yield b"]" if head != b"[" else b"[]"
