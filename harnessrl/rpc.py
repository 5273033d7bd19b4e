"""gRPC plumbing every service shares: asyncio servers with the standard
health service, trace propagation, bearer-token auth, HarnessError mapping and
graceful stop on SIGTERM; and client channels that carry the same."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor

from harnessrl import metrics, telemetry, tls
from harnessrl.config import ServiceSettings
from harnessrl.errors import HarnessError

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# Every channel and server (bench vllm-path, short streamed turns at 1 in flight; see the
# docs/choices.md): no HTTP/2 BDP probing, which pings the peer on reads to size the
# flow-control window, and every ping and its ack wake both processes (the proxy's gRPC
# wakes per turn 99 -> 35 with both settings); instead a fixed window wide enough for
# a large trajectory read. No retry machinery: no service config asks gRPC to retry, and
# the callers retry UNAVAILABLE themselves (capture writer, trainer, harness on a 503).
OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 8 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]


# When set, every server appends each RPC method it serves to this file; the
# test suite's contract check (tests/conftest.py) reads it to prove that every
# RPC in the protos is exercised by some test.
RECORD_ENV = "HARNESSRL_RPC_RECORD"


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns a HarnessError raised by a servicer into its gRPC status with the
    error's message; logs anything else and answers INTERNAL."""

    def __init__(self, service_name: str) -> None:
        self._service_name = service_name
        self._record = os.environ.get(RECORD_ENV)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if self._record:
            with open(self._record, "a") as f:  # noqa: ASYNC230 - test-only, a few bytes
                f.write(f"{self._service_name} {method}\n")
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, method, self._service_name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, method, self._service_name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_stream(handler.stream_stream, method, self._service_name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, HarnessError):
        log.info("rpc error", extra={"kv": {"method": method, "code": exc.grpc_code.name, "error": str(exc)}})
        await context.abort(exc.grpc_code, str(exc))
    log.exception("rpc failed", extra={"kv": {"method": method}})
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _tag(request: Any) -> None:
    """Puts the trial's identity (run, trial, task, group, step, policy version) on the RPC's span."""
    attributes = telemetry.trial_attributes(request)
    if attributes:
        trace.get_current_span().set_attributes(attributes)


def _code(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "OK"


def _wrap_unary(fn: Callable[..., Awaitable[Any]], method: str, service: str) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started, code = time.monotonic(), "INTERNAL"
        try:
            _tag(request)
            result = await fn(request, context)
            code = _code(context)
            return result
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except grpc.aio.AbortError:
            code = _code(context)
            raise
        except Exception as e:  # noqa: BLE001 - mapped to a status, never swallowed
            code = e.grpc_code.name if isinstance(e, HarnessError) else "INTERNAL"
            await _abort(context, e, method)
        finally:
            metrics.observe(service, method, code, started)

    return wrapped


def _wrap_stream(fn: Callable[..., AsyncIterator[Any]], method: str, service: str) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        started, code = time.monotonic(), "INTERNAL"
        try:
            _tag(request)
            async for item in fn(request, context):
                yield item
            code = _code(context)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except grpc.aio.AbortError:
            code = _code(context)
            raise
        except Exception as e:  # noqa: BLE001 - mapped to a status, never swallowed
            code = e.grpc_code.name if isinstance(e, HarnessError) else "INTERNAL"
            await _abort(context, e, method)
        finally:
            metrics.observe(service, method, code, started)

    return wrapped


class _WhileExporting(grpc.aio.ServerInterceptor):
    """The server span interceptor, asked per call whether anything exports spans: a span
    per call costs ~0.3 ms, and one that nothing records buys nothing; an exporter added
    after the server started (a test's, a late ``configure``) still sees every call."""

    def __init__(self, inner: grpc.aio.ServerInterceptor) -> None:
        self.inner = inner

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if telemetry.exporting():
            return await self.inner.intercept_service(continuation, handler_call_details)
        return await continuation(handler_call_details)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on every RPC but health checks."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(f"/{HEALTH_SERVICE}/"):
            return await continuation(details)
        metadata = dict(details.invocation_metadata or ())
        if metadata.get("authorization") == self._expected:
            return await continuation(details)
        return _deny_handler(await continuation(details))


def _deny_handler(handler: Any) -> Any:
    async def deny_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        yield  # pragma: no cover - makes this an async generator

    if handler is None:
        return None
    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny_unary, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny_unary, **kw)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, from now on. A service installs it before
    it starts serving: once its health check answers, a supervisor may stop it at
    once, and a signal that arrives before the handler takes the default action."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class RunningServer:
    """A started gRPC server with its bound port and health servicer."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        health_servicer: health.aio.HealthServicer,
        services: list[str],
        grace: float,
    ) -> None:
        self.server = server
        self.port = port
        self.health = health_servicer
        self.services = services
        self.grace = grace

    async def stop(self, grace: float | None = None) -> None:
        """Marks every service NOT_SERVING, then stops, letting in-flight RPCs finish."""
        for name in ["", *self.services]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(self.grace if grace is None else grace)

    async def wait_for_signal(self, stop: asyncio.Event | None = None) -> None:
        """Serves until SIGTERM or SIGINT, then stops gracefully. Pass the event of
        ``stop_on_signals`` when the handlers had to be in place before the server
        started (a signal in between otherwise kills the process: exit -15)."""
        stop = stop or stop_on_signals()
        waiter = asyncio.ensure_future(self.server.wait_for_termination())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            log.warning("stopping", extra={"kv": {"grace_s": self.grace}})
            await self.stop()
        waiter.cancel()
        stopper.cancel()


async def start_server(
    settings: ServiceSettings,
    service_name: str,
    register: Callable[[grpc.aio.Server], Iterable[str]],
) -> RunningServer:
    """Builds, binds and starts an asyncio gRPC server.

    ``register`` adds the servicers and returns their full service names, which
    the health service then reports SERVING.
    """
    provider = telemetry.configure(service_name, settings.otlp_endpoint)
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port, settings.host, settings.tls)
    interceptors: list[grpc.aio.ServerInterceptor] = []
    interceptors.append(_WhileExporting(aio_server_interceptor(tracer_provider=provider)))
    if settings.auth_token is not None:
        interceptors.append(AuthInterceptor(settings.auth_token.get_secret_value()))
    interceptors.append(ErrorMappingInterceptor(service_name))
    server = grpc.aio.server(
        interceptors=interceptors,
        # A port in use is a bind error, never silently shared with another server.
        options=[*OPTIONS, ("grpc.so_reuseport", 0)],
    )
    services = list(register(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{settings.host}:{settings.port}"
    credentials = tls.server_credentials(settings.tls)
    tls.warn_if_plaintext(service_name, settings.host, settings.tls)
    port = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"could not bind {address}")
    await server.start()
    for name in ["", *services]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    where = {"service": service_name, "address": f"{settings.host}:{port}", "tls": _tls_mode(settings.tls)}
    log.info("serving", extra={"kv": where})
    return RunningServer(server, port, health_servicer, services, settings.shutdown_grace_s)


def _tls_mode(settings: tls.TlsSettings) -> str:
    return "mtls" if settings.client_ca_file else "tls" if settings.serves_tls else "plaintext"


class _Bearer:
    # grpc.aio files a channel interceptor under the first interceptor kind it
    # is an instance of, so each call kind needs its own class (one class
    # implementing all kinds would authenticate unary-unary calls only).
    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._md)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _BearerUnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerUnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerStreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _BearerStreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


_BEARERS = (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)


_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def check_target(target: str) -> str:
    """``target`` if it is a gRPC address a channel can dial: ``host:port``, ``[v6]:port``
    or ``unix:/absolute/path``; a ValueError that names the accepted forms otherwise
    (pydantic validators turn it into a field error)."""
    forms = "expected host:port, [ipv6]:port or unix:/absolute/path"
    if target != target.strip() or not target or len(target) > 500:
        raise ValueError(f"gRPC target {target!r}: {forms}")
    if target.startswith("unix:"):
        path = target[len("unix://") :] if target.startswith("unix://") else target[len("unix:") :]
        if not path.startswith("/") or "\x00" in path:
            raise ValueError(f"gRPC target {target!r}: a unix socket path must be absolute ({forms})")
        return target
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"gRPC target {target!r}: no port in 1-65535 ({forms})")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError as e:
            raise ValueError(f"gRPC target {target!r}: {host} is not an IPv6 address ({forms})") from e
    elif not _HOST.match(host):
        raise ValueError(f"gRPC target {target!r}: {host!r} is not a host name or IPv4 address ({forms})")
    return target


def connect(
    target: str,
    token: str | None = None,
    *,
    tracing: bool = True,
    service: str = telemetry.DEFAULT_SERVICE,
    tls_settings: tls.TlsSettings | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel that propagates the trace and, if given, the bearer token.

    It verifies the server against the CA of ``tls_settings`` (default: the
    process's, ``tls.client()``) and presents its client certificate when set; a
    table without ``ca_file`` dials in plaintext.
    ``tracing=False`` leaves out the OpenTelemetry interceptors, for hot paths of a
    process that exports no traces (they cost a span per call, ~0.2 ms in Python).
    ``service`` names the calling service in its client spans."""
    interceptors: list[Any] = []
    if tracing:  # no provider otherwise: a process that does not trace gets no-op spans everywhere
        interceptors += aio_client_interceptors(tracer_provider=telemetry.provider(service))
    if token:
        interceptors += [cls(token) for cls in _BEARERS]
    return _channel(target, tls_settings, interceptors)


def _channel(target: str, tls_settings: tls.TlsSettings | None, interceptors: list[Any] | None = None) -> Any:
    settings = tls.client() if tls_settings is None else tls_settings
    options = OPTIONS
    credentials = tls.channel_credentials(settings)
    if credentials is None:
        return grpc.aio.insecure_channel(target, interceptors=interceptors, options=options)
    interceptors = [_ExplainTls(target, settings), *(interceptors or [])]
    return grpc.aio.secure_channel(target, credentials, interceptors=interceptors, options=options)


class _ExplainTls(grpc.aio.UnaryUnaryClientInterceptor):
    """On a TLS channel, a unary call that fails UNAVAILABLE says why the handshake
    failed (a CA that does not verify the server, an expired certificate, a client
    certificate the server wants) and with whom: for a missing client certificate
    gRPC itself says only "Socket closed"."""

    def __init__(self, target: str, settings: tls.TlsSettings) -> None:
        self._target, self._settings = target, settings

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        try:
            await call
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            why = await asyncio.to_thread(tls.explain, self._target, self._settings)
            if not why:
                raise
            raise grpc.aio.AioRpcError(
                e.code(),
                e.initial_metadata(),
                e.trailing_metadata(),
                details=f"TLS to {self._target}: {why} ({e.details()})",
                debug_error_string=e.debug_error_string(),
            ) from e
        return call


async def check_health(
    target: str, service: str = "", wait_s: float = 5.0, tls_settings: tls.TlsSettings | None = None
) -> str:
    """Returns the health status name (``SERVING``...) of ``service`` at ``target``
    (dialled as ``connect`` dials: the process's TLS unless ``tls_settings``)."""
    deadline = time.monotonic() + wait_s
    async with _channel(target, tls_settings) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
