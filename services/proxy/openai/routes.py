"""``POST /trials/<id>/v1/chat/completions``: thin route, streaming and not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from services.proxy.chat.toolchoice import forcing
from services.proxy.errors import error_body
from services.proxy.openai.logprobs import TokenLogprobs, chat_request
from services.proxy.openai.models import ChatRequest, to_conversation, tool_choice
from services.proxy.protocol import SSE_KEEPALIVE, FastJSON, authenticate, core_of, grace, guarded, parse_request, sse
from services.proxy.turn import CallParams, Done, KeepAlive, ModelCall

router = APIRouter()


@router.post("/trials/{trial_id}/v1/chat/completions")
async def chat_completions(trial_id: str, request: Request) -> Response:
    trial = authenticate(request, trial_id)
    body = await parse_request(request, ChatRequest, "openai")
    core = core_of(request)
    core.check_model(trial, body.model)
    top = chat_request(body.logprobs, body.top_logprobs)
    conv = to_conversation(body)
    params = CallParams(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=None if body.top_k is None else max(body.top_k, 0),
        stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        call_id_prefix="call_",
        top_logprobs=top or 0,
        forcing=forcing(tool_choice(body), core.model, conv.tools),
        whole=not body.stream,
    )
    call = ModelCall(core, trial, conv, params)
    await call.start(grace(request, body.stream))
    lp = TokenLogprobs(call, top) if top is not None else None
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(guarded(call, _stream(call, body.model, usage, lp)), media_type="text/event-stream")
    done = await _collect(call)
    return FastJSON(completion(done, body.model, lp.take() if lp else None))


async def _collect(call: ModelCall) -> Done:
    async for event in call.events():
        if isinstance(event, Done):
            return event
    raise RuntimeError("generation ended without a result")


def _usage(done: Done) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def _tool_calls(done: Done) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in done.calls
    ]


def _logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return None if entries is None else {"content": entries, "refusal": None}


def completion(done: Done, model: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": done.content or None}
    if done.calls:
        message["tool_calls"] = _tool_calls(done)
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    return {
        "id": f"chatcmpl-{done.turn_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": done.finish_reason, "logprobs": _logprobs(logprobs)}
        ],
        "usage": _usage(done),
    }


async def _stream(call: ModelCall, model: str, include_usage: bool, lp: TokenLogprobs | None) -> AsyncIterator[bytes]:
    base = {
        "id": f"chatcmpl-{call.turn_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        # Each chunk carries the logprobs of the tokens received since the last one.
        logprobs = _logprobs(lp.take()) if lp is not None else None
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return sse({**base, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for event in call.events():
            if isinstance(event, KeepAlive):  # the first token is still coming
                yield SSE_KEEPALIVE
            elif isinstance(event, Done):  # every tool call has streamed by now
                yield chunk({}, event.finish_reason)
                if include_usage:
                    yield sse({**base, "choices": [], "usage": _usage(event)})
            elif event.kind == "text":
                yield chunk({"content": event.text})
            elif event.kind == "call":
                fn = {"name": event.text, "arguments": ""}
                start = {"index": event.index, "id": event.id, "type": "function", "function": fn}
                yield chunk({"tool_calls": [start]})
            elif event.kind == "args":
                yield chunk({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})
            else:
                yield chunk({"reasoning_content": event.text})
    except Exception as e:  # noqa: BLE001 - the status line is gone; the SDK reads an error event
        yield sse(error_body(e, "openai"))
    yield b"data: [DONE]\n\n"
