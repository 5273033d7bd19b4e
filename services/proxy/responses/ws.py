"""``WebSocket /trials/<id>/v1/responses``: OpenAI's Responses WebSocket transport,
the one Codex uses with ``supports_websockets = true`` (and the only one on which
it sends ``previous_response_id`` with just the new input).

The upgrade is authenticated like HTTP (the trial token as a bearer or
``x-api-key``); a bad one is refused with the HTTP status and body the HTTP route
would answer. Each client message is one JSON object:

- ``{"type": "response.create", ...a Responses request...}`` runs one turn with
  the same code as ``POST /v1/responses`` with ``stream: true`` and sends the same
  events, one JSON object per text message (no SSE framing). ``generate: false``
  (Codex's warm-up) answers ``response.created`` and ``response.completed`` with no
  output, generates nothing and keeps the request's input for the next call to
  continue.
- ``{"type": "response.processed", "response_id": ...}`` is an acknowledgement; nothing to do.

``previous_response_id`` resolves from the connection's own cache first (where
responses made with ``store: false`` are kept, as OpenAI's WebSocket does: per
connection, bounded like the trial's store, dropped at close) and then from the
trial's store (``store: true`` ones), so a chain of new-input-only calls gives
the whole conversation and the capture stays one segment. Every lookup goes
through the trial the connection authenticated.

A message that cannot be served (not JSON, no known ``type``, an invalid
request, an unknown ``previous_response_id``, a refused model) is answered with
an ``error`` event in the shape Codex reads (``{"type": "error", "status": 400,
"error": {"type", "code", "message", "param"}}``) and counts against the trial
like the HTTP 4xx; the connection stays usable. Once the trial is closed, the
next message gets the error and the connection is closed (1008). A message over
``max_body_bytes`` closes the connection with 1009 (the server's frame limit)."""

from __future__ import annotations

import logging
import secrets
from contextlib import aclosing
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from harnessrl.errors import HarnessError
from harnessrl.logs import kv
from services.proxy.errors import BadRequest, error_body, status_of
from services.proxy.protocol import FastJSON, log_unknown
from services.proxy.responses.models import ResponsesRequest, input_items
from services.proxy.responses.routes import EventStream, begin, echo, keep, response_object
from services.proxy.responses.store import ResponseStore
from services.proxy.responses.thread_hint import thread_hint
from services.proxy.trials import ProxyCore, Trial
from services.proxy.turn import Done

log = logging.getLogger(__name__)
router = APIRouter()
PATH = "/trials/{trial_id}/v1/responses"
# Fields of response.create that are the transport's, not the request's.
TRANSPORT_FIELDS = ("type", "generate", "client_metadata", "stream")


class TrialClosed(BadRequest):
    """The connection's trial ended: its responses are gone, the connection closes."""

    http_status = 401


def _encode(data: dict[str, Any], kind: str) -> bytes:
    return orjson.dumps(data)


def _token(ws: WebSocket) -> str | None:
    auth = ws.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return ws.headers.get("x-api-key") or None


def error_event(exc: BaseException) -> dict[str, Any]:
    """An error as Codex's WebSocket client reads it: the HTTP status it would have
    had and OpenAI's error object (Codex maps it to that HTTP error)."""
    status = status_of(exc, "openai") if isinstance(exc, HarnessError) else 500
    return {"type": "error", "status": status, "error": error_body(exc, "openai")["error"]}


@router.websocket(PATH)
async def responses_ws(websocket: WebSocket, trial_id: str) -> None:
    core: ProxyCore = websocket.app.state.core
    try:
        trial = core.authenticate(trial_id, _token(websocket))
    except HarnessError as e:
        log.info("websocket refused", extra=kv(trial=trial_id, error=str(e)))
        try:
            await websocket.send_denial_response(FastJSON(error_body(e, "openai"), status_of(e, "openai")))
        except RuntimeError:  # a server without the denial-response extension: refuse by a close code
            await websocket.close(1008, str(e)[:120])
        return
    await websocket.accept()
    trial.responses.ws_connections += 1
    connection = Connection(core, trial, websocket)
    try:
        await connection.serve()
    except WebSocketDisconnect:
        pass
    finally:
        connection.cache.clear()  # the connection's store=false responses die with it


class Connection:
    """One client connection: its messages in order, and its cache of ``store: false`` responses."""

    def __init__(self, core: ProxyCore, trial: Trial, websocket: WebSocket) -> None:
        self.core, self.trial, self.ws = core, trial, websocket
        s = core.settings
        bounds = (s.responses_store_max_count, s.responses_store_max_bytes)
        self.cache = ResponseStore(*bounds, scope="this WebSocket connection")

    async def serve(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            raw = raw if raw is not None else message.get("bytes") or b""
            try:
                await self.handle(raw)
            except WebSocketDisconnect:
                raise
            except Exception as e:  # every failure is an error event, never a dead server
                if not isinstance(e, HarnessError):
                    log.exception("websocket message failed", extra=kv(trial=self.trial.spec.trial_id))
                self.trial.note_failure(e, "responses (websocket)")
                await self.send(error_event(e))
                if isinstance(e, TrialClosed):
                    await self.ws.close(1008, "the trial is closed")
                    return

    async def send(self, data: dict[str, Any] | bytes) -> None:
        if self.ws.client_state != WebSocketState.CONNECTED:
            raise WebSocketDisconnect(1006)
        await self.ws.send_text((data if isinstance(data, bytes) else orjson.dumps(data)).decode())

    async def handle(self, raw: str | bytes) -> None:
        if self.trial.closed:
            self.cache.clear()
            raise TrialClosed("the trial is closed: its responses were dropped (open a new trial)")
        data = _message(raw)
        kind = data.get("type")
        if kind == "response.processed":
            return
        if kind != "response.create":
            raise BadRequest(
                f"unknown message type {kind!r}: expected 'response.create' (or 'response.processed')", param="type"
            )
        generate = data.get("generate", True)
        if not isinstance(generate, bool):
            raise BadRequest(f"'generate' must be a boolean, got {generate!r}", param="generate")
        body = _request({k: v for k, v in data.items() if k not in TRANSPORT_FIELDS})
        log_unknown("responses", body)
        earlier = self.cache.chain(body.previous_response_id, self.trial.responses) if body.previous_response_id else []
        if not generate:
            await self.warm_up(body)
            return
        call, names, lp = await begin(
            self.core, self.trial, body, earlier, hint=thread_hint(data.get("client_metadata"))
        )

        def store(done: Done) -> None:
            keep(self.trial.responses if body.store else self.cache, body, done, names)

        stream = EventStream(call, body.model, names, lp, store, echo(body), encode=_encode)
        async with aclosing(stream.events()) as events:  # a client that leaves aborts the turn
            async for event in events:
                await self.send(event)

    async def warm_up(self, body: ResponsesRequest) -> None:
        """``generate: false``: a response with no output whose input a later call continues."""
        self.core.check_model(self.trial, body.model)
        turn = f"warmup_{secrets.token_hex(12)}"
        obj = {**response_object(turn, body.model, "completed", [], None), **echo(body)}
        (self.trial.responses if body.store else self.cache).put(
            obj["id"], body.previous_response_id or None, input_items(body), [], obj
        )
        created = {**obj, "status": "in_progress"}
        await self.send({"type": "response.created", "sequence_number": 1, "response": created})
        await self.send({"type": "response.completed", "sequence_number": 2, "response": obj})


def _message(raw: str | bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"invalid message: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise BadRequest(f"invalid message: expected a JSON object, got {type(data).__name__}")
    return data


def _request(data: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as e:
        problems = [f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:8]]
        raise BadRequest("invalid response.create: " + "; ".join(problems)) from e
