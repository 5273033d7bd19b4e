"""HTTP application factory of the proxy: the four protocol routers, the
admin API, probes, and error handlers that answer every failure in the shape
the caller's SDK understands (the proxy never crashes on input)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl import metrics
from harnessrl.errors import HarnessError
from services.proxy import admin
from services.proxy.anthropic import routes as anthropic_routes
from services.proxy.chat.model import ChatModel
from services.proxy.errors import BadRequest, error_body, retry_headers, status_of
from services.proxy.gemini import routes as gemini_routes
from services.proxy.openai import routes as openai_routes
from services.proxy.protocol import authenticate, core_of
from services.proxy.responses import routes as responses_routes
from services.proxy.responses import ws as responses_ws
from services.proxy.settings import Settings
from services.proxy.trials import ProxyCore

log = logging.getLogger(__name__)


def load_model(settings: Settings) -> ChatModel:
    return ChatModel.load(
        settings.model_dir,
        settings.served_model_names,
        settings.chat_template,
        settings.template_overrides,
        settings.tool_parser,
        settings.reasoning_parser,
    )


# A Gemini API method: POST .../models/<model>:<method> (an OpenAI model name may hold a colon, on GET).
_GEMINI_METHOD = re.compile(r"/models/.+:[A-Za-z]+$")


def _protocol(request: Request) -> str:
    path = request.url.path
    if "/v1/messages" in path:
        return "anthropic"
    if request.method == "POST" and _GEMINI_METHOD.search(path):
        return "gemini"
    return "openai"


def create_app(settings: Settings, model: ChatModel | None = None) -> FastAPI:
    """Builds the app; the model (tokenizer, template, parser) loads and passes
    preflight here, before anything listens."""
    core = ProxyCore(settings, model or load_model(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await core.aclose()

    app = FastAPI(title="harnessrl proxy", lifespan=lifespan)
    app.state.core = core
    metrics.instrument_app(app, "proxy")
    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(gemini_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(responses_ws.router)  # the same path, over a WebSocket (Codex)
    app.include_router(admin.router)

    @app.exception_handler(HarnessError)
    async def harness_error(request: Request, exc: HarnessError) -> JSONResponse:
        protocol = _protocol(request)
        _note_failure(request, exc)
        log.info("request failed", extra={"kv": {"path": request.url.path, "error": str(exc)}})
        return JSONResponse(error_body(exc, protocol), status_of(exc, protocol), headers=retry_headers(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await harness_error(request, BadRequest(f"invalid request: {exc.errors()[:3]}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = HarnessError(str(exc.detail))
        err.http_status = exc.status_code
        return JSONResponse(error_body(err, _protocol(request)), exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"kv": {"path": request.url.path}})
        _note_failure(request, exc)
        return JSONResponse(error_body(exc, _protocol(request)), 500)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # Claude Code probes the base URL with HEAD before its first request.
    @app.api_route("/", methods=["GET", "HEAD"])
    @app.api_route("/trials/{trial_id}", methods=["GET", "HEAD"])
    @app.api_route("/trials/{trial_id}/", methods=["GET", "HEAD"])
    async def probe() -> Response:
        return Response(status_code=200)

    @app.get("/trials/{trial_id}/v1/models")
    async def list_models(trial_id: str, request: Request) -> dict[str, Any]:
        trial = authenticate(request, trial_id)
        names = dict.fromkeys([*([trial.spec.model] if trial.spec.model else []), *core_of(request).model.names])
        return {"object": "list", "data": [_model_card(n) for n in names]}

    @app.get("/trials/{trial_id}/v1/models/{model:path}")
    async def get_model(trial_id: str, model: str, request: Request) -> dict[str, Any]:
        trial = authenticate(request, trial_id)
        core_of(request).check_model(trial, model)
        return _model_card(model)

    return app


def _note_failure(request: Request, exc: Exception) -> None:
    trial = getattr(request.state, "trial", None)
    if trial is not None:
        trial.note_failure(exc, request.url.path.rsplit("/v1/", 1)[-1])


def _model_card(name: str) -> dict[str, Any]:
    # Both SDKs' shapes: OpenAI reads id/object/owned_by, Anthropic id/type/display_name.
    return {
        "id": name,
        "object": "model",
        "type": "model",
        "display_name": name,
        "created": int(time.time()),
        "created_at": "2026-01-01T00:00:00Z",
        "owned_by": "harnessrl",
    }
