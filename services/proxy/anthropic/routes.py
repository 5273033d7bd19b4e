"""``POST /trials/<id>/v1/messages`` (``?beta=true`` too) and ``count_tokens``:
thin routes; the event stream carries thinking, text and tool_use blocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from services.proxy.anthropic.models import (
    SIGNATURE_PREFIX,
    CountTokensRequest,
    MessagesRequest,
    to_conversation,
    tool_choice,
)
from services.proxy.chat.toolchoice import forcing
from services.proxy.errors import error_body
from services.proxy.protocol import FastJSON, authenticate, core_of, grace, guarded, parse_request, sse
from services.proxy.turn import CallParams, Done, KeepAlive, ModelCall

router = APIRouter()
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


@router.post("/trials/{trial_id}/v1/messages")
async def messages(trial_id: str, request: Request) -> Response:
    trial = authenticate(request, trial_id)
    body = await parse_request(request, MessagesRequest, "anthropic")
    core = core_of(request)
    core.check_model(trial, body.model)
    conv = to_conversation(body)
    params = CallParams(
        body.max_tokens,
        body.temperature,
        body.top_p,
        body.top_k,
        list(body.stop_sequences or []),
        "toolu_",
        forcing=forcing(tool_choice(body), core.model, conv.tools),
        whole=not body.stream,
    )
    call = ModelCall(core, trial, conv, params)
    await call.start(grace(request, bool(body.stream)))
    if body.stream:
        return StreamingResponse(guarded(call, _stream(call, body.model)), media_type="text/event-stream")
    async for event in call.events():
        if isinstance(event, Done):
            return FastJSON(message(event, body.model))
    raise RuntimeError("generation ended without a result")


@router.post("/trials/{trial_id}/v1/messages/count_tokens")
async def count_tokens(trial_id: str, request: Request) -> dict[str, int]:
    authenticate(request, trial_id)
    body = await parse_request(request, CountTokensRequest, "anthropic")
    conv = to_conversation(body)
    prompt = core_of(request).model.renderer.full(conv, [None] * len(conv.messages))
    return {"input_tokens": len(prompt) // 4}


def _usage(done: Done) -> dict[str, int]:
    return {
        "input_tokens": done.prompt_tokens - done.cached_tokens,
        "output_tokens": done.completion_tokens,
        "cache_read_input_tokens": done.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def message(done: Done, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": SIGNATURE_PREFIX + done.turn_id})
    if done.content:
        content.append({"type": "text", "text": done.content})
    for c in done.calls:
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)})
    return {
        "id": f"msg_{done.turn_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "stop_sequence" if done.stop_sequence else _STOP[done.finish_reason],
        "stop_sequence": done.stop_sequence,
        "usage": _usage(done),
    }


class _Blocks:
    """Opens and closes content blocks as the kind of output changes."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        out.append(
            sse({"type": "content_block_start", "index": self.index, "content_block": block}, "content_block_start")
        )
        return out

    def delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta")

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")]


async def _stream(call: ModelCall, model: str) -> AsyncIterator[bytes]:
    start: dict[str, Any] = {
        "id": f"msg_{call.turn_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": call.prompt_tokens, "output_tokens": 0},
    }
    yield sse({"type": "message_start", "message": start}, "message_start")
    blocks = _Blocks()
    try:
        async for event in call.events():
            if isinstance(event, KeepAlive):  # the first token is still coming: Anthropic's own ping
                yield sse({"type": "ping"}, "ping")
            elif isinstance(event, Done):
                if blocks.kind == "thinking":
                    yield blocks.delta({"type": "signature_delta", "signature": SIGNATURE_PREFIX + event.turn_id})
                for b in blocks.close():  # every tool_use block has streamed by now
                    yield b
                reason = "stop_sequence" if event.stop_sequence else _STOP[event.finish_reason]
                delta = {"stop_reason": reason, "stop_sequence": event.stop_sequence}
                yield sse({"type": "message_delta", "delta": delta, "usage": _usage(event)}, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
            elif event.kind == "call":
                if blocks.kind == "thinking":
                    yield blocks.delta({"type": "signature_delta", "signature": SIGNATURE_PREFIX + call.turn_id})
                for b in blocks.open("tool_use", {"type": "tool_use", "id": event.id, "name": event.text, "input": {}}):
                    yield b
            elif event.kind == "args":
                yield blocks.delta({"type": "input_json_delta", "partial_json": event.text})
            elif event.kind == "reasoning":
                if blocks.kind != "thinking":
                    for b in blocks.open("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                        yield b
                yield blocks.delta({"type": "thinking_delta", "thinking": event.text})
            else:
                if blocks.kind != "text":
                    if blocks.kind == "thinking":
                        yield blocks.delta({"type": "signature_delta", "signature": SIGNATURE_PREFIX + call.turn_id})
                    for b in blocks.open("text", {"type": "text", "text": ""}):
                        yield b
                yield blocks.delta({"type": "text_delta", "text": event.text})
    except Exception as e:  # noqa: BLE001 - the status line is gone; the SDK reads an error event
        yield sse(error_body(e, "anthropic"), "error")
