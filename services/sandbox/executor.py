"""The remote executor: the project's trial runner behind a small HTTP/JSON API,
for a front that implements the Sandbox gRPC contract somewhere else (the second
implementation in ``services/sandbox_remote``, or a managed provider's control
plane). It is configured by the ``[sandbox]`` settings like a worker: backend,
limits, proxy and capture store; ``host``/``port`` bind its HTTP server,
``auth_token`` is the bearer token its callers present, ``tls`` its certificate, ``concurrency`` trials run
at once, and an execution its front stops polling for ``lease_s`` is cancelled
(the front is gone or has given it up).

API (every route but /healthz needs ``Authorization: Bearer <auth_token>`` when set):

  POST /v1/validate                 {"spec": TrialSpec JSON}            204, 400 {"detail"}
  PUT  /v1/executions/{id}          {"spec", "trace_context", "previous_id"}
                                    201 created, 200 the same spec again, 409 another spec
  GET  /v1/executions/{id}          the execution (and its lease renewed), 404 unknown
  POST /v1/executions/{id}/cancel   the execution, cancelled when not finished
  GET  /healthz

An execution is ``{"id", "state", "outcome", "error", "worker"}``; ``state`` is queued,
setup, agent, verify, teardown, done (``outcome`` is the runner's TrialOutcome) or lost
(the runner could not report it, e.g. the capture store refused: ``error`` says why;
the front retries or ends the trial as an infrastructure failure). The spec is the
``harnessrl.v1.TrialSpec`` message in proto JSON; its ``trial_id`` is the execution id,
so a retried attempt (``<trial>.attempt-<n>``) is its own trajectory.

``python -m services.sandbox.executor [--config FILE]`` serves it until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl import logs, telemetry, tls
from harnessrl.config import format_validation_error, load_section
from harnessrl.errors import AlreadyExists, HarnessError, InvalidArgument, NotFound, Unauthenticated, http_status
from harnessrl.v1 import sandbox_pb2
from services.sandbox.common.settings import Settings
from services.sandbox.factory import build_runner
from services.sandbox.harnesses import get_harness
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec, TrialState
from services.sandbox.trial.runner import TrialRunner
from services.sandbox.worker import default_worker_name

log = logging.getLogger(__name__)

LOST = "lost"


class StartBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="harnessrl.v1.TrialSpec in proto JSON.")
    trace_context: dict[str, str] = Field(default_factory=dict, description="The submitter's traceparent.")
    previous_id: str = Field(default="", description="The execution id of the attempt this one retries.")


class ValidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any]


@dataclass
class Execution:
    spec: TrialSpec
    state: str = TrialState.QUEUED.value
    outcome: TrialOutcome | None = None
    error: str = ""
    seen: float = field(default_factory=time.monotonic)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def view(self, worker: str) -> dict[str, Any]:
        outcome = self.outcome.model_dump(mode="json") if self.outcome is not None else None
        return {
            "id": self.spec.trial_id,
            "state": self.state,
            "outcome": outcome,
            "error": self.error,
            "worker": worker,
        }


def parse_spec(data: dict[str, Any]) -> TrialSpec:
    """A TrialSpec from proto JSON, validated as the sandbox service validates a submission."""
    try:
        msg = json_format.ParseDict(data, sandbox_pb2.TrialSpec())
    except json_format.ParseError as e:
        raise InvalidArgument(f"invalid trial spec: {e}") from e
    try:
        spec = TrialSpec.from_proto(msg)
    except ValidationError as e:
        raise InvalidArgument(f"invalid trial spec: {format_validation_error(e)}") from e
    get_harness(spec.harness)
    load_task(spec.task_path)
    return spec


class ExecutorService:
    """Executions by id, run ``concurrency`` at once through the trial runner."""

    def __init__(self, settings: Settings, runner: TrialRunner, name: str | None = None) -> None:
        self.settings = settings
        self.runner = runner
        self.name = name or default_worker_name()
        self.executions: dict[str, Execution] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)

    async def start(self, execution_id: str, body: StartBody) -> tuple[Execution, bool]:
        spec = parse_spec(body.spec)
        if spec.trial_id != execution_id:
            raise InvalidArgument(f"spec.trial_id {spec.trial_id!r} is not the execution id {execution_id!r}")
        existing = self.executions.get(execution_id)
        if existing is not None:
            if not existing.spec.same_as(spec):
                raise AlreadyExists(f"execution {execution_id} already exists with a different spec")
            existing.seen = time.monotonic()
            return existing, False
        spec = spec.model_copy(update={"trace_context": body.trace_context})
        execution = Execution(spec=spec)
        self.executions[execution_id] = execution
        execution.task = asyncio.ensure_future(self._run(execution, body.previous_id))
        return execution, True

    def get(self, execution_id: str) -> Execution:
        execution = self.executions.get(execution_id)
        if execution is None:
            raise NotFound(f"execution {execution_id} not found on executor {self.name}")
        execution.seen = time.monotonic()
        return execution

    def cancel(self, execution_id: str) -> Execution:
        execution = self.get(execution_id)
        execution.cancel.set()
        return execution

    async def reap_forever(self) -> None:
        """Cancels executions nobody has polled for ``lease_s``: their front is gone."""
        while True:
            await asyncio.sleep(max(0.2, self.settings.lease_s / 3))
            now = time.monotonic()
            for execution in list(self.executions.values()):
                if (
                    execution.state not in (TrialState.DONE.value, LOST)
                    and now - execution.seen > self.settings.lease_s
                ):
                    if not execution.cancel.is_set():
                        log.warning("front stopped polling; cancelling", extra={"kv": {"id": execution.spec.trial_id}})
                    execution.cancel.set()

    async def close(self) -> None:
        for execution in self.executions.values():
            execution.cancel.set()
        tasks = [e.task for e in self.executions.values() if e.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.backend.close()

    async def _run(self, execution: Execution, previous_id: str) -> None:
        spec = execution.spec
        async with self._slots:
            if execution.cancel.is_set():
                execution.outcome = TrialOutcome(termination_reason=TerminationReason.CANCELLED, error="cancelled")
                execution.state = TrialState.DONE.value
                return
            parent = telemetry.extract(spec.trace_context)
            attributes = telemetry.trial_attributes(spec)
            tracer = telemetry.tracer(__name__, "sandbox")
            with tracer.start_as_current_span("sandbox.trial", context=parent, attributes=attributes):
                await self._run_in_span(execution, previous_id)

    async def _run_in_span(self, execution: Execution, previous_id: str) -> None:
        spec = execution.spec

        async def on_state(state: TrialState) -> None:
            execution.state = state.value

        try:
            outcome = None
            if previous_id:
                # The previous attempt's executor may have died after FinalizeTrajectory.
                previous = spec.model_copy(update={"trial_id": previous_id})
                outcome = await self.runner.finalized_outcome(previous)
                if outcome is None:
                    await self.runner.abandon(previous)
            if outcome is None:
                outcome = await self.runner.run(spec, cancel=execution.cancel, on_state=on_state)
                await self.runner.finalize(spec, outcome)
            execution.outcome = outcome
            execution.state = TrialState.DONE.value
        except Exception as e:  # broad: any fault is reported to the front as LOST, which retries or ends it
            log.exception("execution failed", extra={"kv": {"id": spec.trial_id}})
            execution.error = f"executor {self.name}: {type(e).__name__}: {e}"
            execution.state = LOST


def create_app(service: ExecutorService, token: str | None) -> FastAPI:
    app = FastAPI(title="harnessrl sandbox executor", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Response:
        if token and request.url.path != "/healthz" and request.headers.get("authorization") != f"Bearer {token}":
            return _error(Unauthenticated("missing or wrong bearer token"))
        return await call_next(request)

    @app.exception_handler(HarnessError)
    async def harness_error(request: Request, exc: HarnessError) -> JSONResponse:
        return _error(exc)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "worker": service.name}

    @app.post("/v1/validate", status_code=204)
    async def validate(body: ValidateBody) -> Response:
        parse_spec(body.spec)
        return Response(status_code=204)

    @app.put("/v1/executions/{execution_id}")
    async def start(execution_id: str, body: StartBody) -> JSONResponse:
        execution, created = await service.start(execution_id, body)
        return JSONResponse(execution.view(service.name), status_code=201 if created else 200)

    @app.get("/v1/executions/{execution_id}")
    async def get(execution_id: str) -> dict[str, Any]:
        return service.get(execution_id).view(service.name)

    @app.post("/v1/executions/{execution_id}/cancel")
    async def cancel(execution_id: str) -> dict[str, Any]:
        return service.cancel(execution_id).view(service.name)

    return app


def _error(exc: HarnessError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=http_status(exc))


class _Server(uvicorn.Server):
    """Signals are handled by ``serve``, not by uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def serve(settings: Settings, announce: bool = True) -> None:
    """Serves until SIGTERM/SIGINT, then cancels the running executions and waits for their teardown."""
    telemetry.configure("sandbox", settings.otlp_endpoint)
    runner = build_runner(settings)
    orphans = await runner.backend.cleanup_orphans()
    if orphans:
        log.warning("removed sandboxes of dead executors", extra={"kv": {"count": orphans}})
    service = ExecutorService(settings, runner)
    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    tls.warn_if_plaintext("sandbox", settings.host, settings.tls)
    config = uvicorn.Config(
        create_app(service, token),
        log_level=settings.log_level.lower(),
        access_log=False,
        **tls.uvicorn_options(settings.tls),
    )
    server = _Server(config)
    reaper = asyncio.ensure_future(service.reap_forever())
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    while not server.started:
        if task.done():
            break
        await asyncio.sleep(0.02)
    if announce and server.started:
        port = sock.getsockname()[1]
        where = f"{tls.http_scheme(settings.tls)}://{settings.host}:{port}"
        print(f"sandbox executor {service.name} listening on {where}", file=sys.stderr, flush=True)
    try:
        await task
    finally:
        reaper.cancel()
        await service.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.sandbox.executor", description=__doc__.split("\n")[0])
    parser.add_argument("--config", "-c", type=Path, help="TOML file; its [sandbox] table (env: HARNESSRL_SANDBOX_*).")
    parser.add_argument("--host", help="Bind address (default 127.0.0.1).")
    parser.add_argument("--port", type=int, help="Port (0 picks a free one).")
    args = parser.parse_args(argv)
    try:
        settings = load_section(Settings, args.config, "sandbox", {"host": args.host, "port": args.port})
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    logs.configure(settings.log_level)
    tls.use(settings.tls)  # its clients (the proxy's admin API, the capture store) dial as [sandbox.tls] says
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
