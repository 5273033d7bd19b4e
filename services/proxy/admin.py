"""The admin API the sandbox drives (services/proxy/README.md): create a trial, read its
summary, close it (every segment durable before the answer)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from harnessrl import telemetry
from services.proxy.errors import BadToken
from services.proxy.protocol import bearer, core_of, parse, read_body
from services.proxy.trials import TrialSpec

router = APIRouter(prefix="/admin")


def _admin(request: Request) -> None:
    expected = core_of(request).settings.admin_token
    token = bearer(request)
    if expected is None or token is None or not hmac.compare_digest(token, expected.get_secret_value()):
        raise BadToken("missing or invalid admin token")


@router.post("/trials", status_code=201)
async def create_trial(request: Request) -> JSONResponse:
    _admin(request)
    spec = parse(TrialSpec, await read_body(request, 1 << 20))
    trial = core_of(request).create(spec)
    if trial.trace_context is None and "traceparent" in request.headers:
        trial.trace_context = telemetry.extract(request.headers)
    body = {"trial_id": spec.trial_id, "token": trial.token, "base_path": f"/trials/{spec.trial_id}/v1"}
    return JSONResponse(body, status_code=201)


@router.get("/trials/{trial_id}")
async def trial_summary(trial_id: str, request: Request) -> dict[str, Any]:
    _admin(request)
    return core_of(request).get(trial_id).summary()


@router.post("/trials/{trial_id}/close")
async def close_trial(trial_id: str, request: Request) -> dict[str, Any]:
    _admin(request)
    return await core_of(request).close(trial_id)
