"""What the three wire protocols share: request models that accept and log
unknown fields, bounded body reading, strict parsing with clear 400s, trial
authentication, and SSE framing."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from harnessrl.logs import kv
from services.proxy.errors import BadRequest, BodyTooLarge
from services.proxy.trials import ProxyCore, Trial

if TYPE_CHECKING:
    from services.proxy.turn import ModelCall

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
_logged: set[tuple[str, str]] = set()


class Loose(BaseModel):
    """Accepts fields the proxy does not know (harnesses send many); ``log_unknown``
    reports them once per process and name."""

    model_config = ConfigDict(extra="allow")


def log_unknown(protocol: str, model: BaseModel) -> None:
    for name in model.model_extra or {}:
        if (protocol, name) not in _logged:
            _logged.add((protocol, name))
            log.info("ignored request field", extra=kv(protocol=protocol, field=name))


def core_of(request: Request) -> ProxyCore:
    core: ProxyCore = request.app.state.core
    return core


def bearer(request: Request) -> str | None:
    """OpenAI SDKs send ``Authorization: Bearer``; Anthropic SDKs send ``x-api-key``."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def authenticate(request: Request, trial_id: str) -> Trial:
    """The trial of a request; kept on the request so that a failure of it counts against the trial."""
    trial = core_of(request).authenticate(trial_id, bearer(request))
    request.state.trial = trial
    return trial


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse(model: type[M], raw: bytes) -> M:
    """Validates JSON bytes into ``model``; every problem becomes one clear 400."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)  # several times faster than pydantic's own JSON path on big bodies
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"invalid request: body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise BadRequest(f"invalid request: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:8]:
            where = ".".join(str(p) for p in err["loc"]) or "body"
            problems.append(f"{where}: {err['msg']}")
        raise BadRequest("invalid request: " + "; ".join(problems)) from e


async def parse_request(request: Request, model: type[M], protocol: str) -> M:
    body = parse(model, await read_body(request, core_of(request).settings.max_body_bytes))
    log_unknown(protocol, body)
    return body


class FastJSON(Response):
    """A JSON response rendered by orjson (the responses here are on every turn's path)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


SSE_KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: every SSE client skips it


def grace(request: Request, stream: bool) -> float | None:
    """How long ``ModelCall.start`` waits for the first chunk before a streamed
    answer's headers go out (None: a whole answer waits for it, errors stay statuses)."""
    return core_of(request).settings.stream_headers_after_s if stream else None


async def guarded(call: ModelCall, body: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """A streamed body that stops the call's generation however it ends: a client that
    left before the body's first byte was read never runs ``body`` at all."""
    try:
        async for b in body:
            yield b
    finally:
        with contextlib.suppress(Exception):
            await body.aclose()  # type: ignore[attr-defined]
        await call.abandon()


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def text_of(content: Any) -> str:
    """Text of a content field: a string, or a list of blocks whose text parts are
    joined (images and other media are not representable for a text model)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for block in content:
        kind = getattr(block, "type", None) if not isinstance(block, dict) else block.get("type")
        text = getattr(block, "text", None) if not isinstance(block, dict) else block.get("text")
        if isinstance(text, str):
            out.append(text)
        elif kind and ("image" in kind or "file" in kind or "document" in kind):
            out.append(f"[{kind} omitted]")
    return "".join(out)
