"""Prometheus metrics every service shares: requests, latencies, queue depth,
active trials and tokens (tokens/s is ``rate(harnessrl_tokens_total[1m])``).

gRPC servers count their RPCs through ``harnessrl.rpc`` (nothing to do in a
service); HTTP apps call ``instrument_app``; services add the few domain
gauges/counters below with their own ``service`` label. Exposition: ``/metrics``
on HTTP apps, or ``serve(port)`` for a gRPC service (``metrics_port`` setting).
Several services in one process share the default registry, told apart by label.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest, start_http_server

if TYPE_CHECKING:
    from harnessrl.tls import TlsSettings

REQUESTS = Counter(
    "harnessrl_requests", "Requests served, by service, method and outcome code.", ["service", "method", "code"]
)
LATENCY = Histogram(
    "harnessrl_request_seconds",
    "Request latency (for streams: until the stream ended).",
    ["service", "method"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
QUEUE_DEPTH = Gauge("harnessrl_queue_depth", "Items waiting in a queue.", ["service", "queue"])
ACTIVE_TRIALS = Gauge("harnessrl_active_trials", "Trials in progress.", ["service"])
TOKENS = Counter("harnessrl_tokens", "Tokens processed, by kind (prompt, sampled, captured...).", ["service", "kind"])
FAILURES = Counter(
    "harnessrl_failures",
    "Failures a service detected, by kind (proxy: engine_arrays_mismatch, refused, proxy_error, turn_aborted).",
    ["service", "kind"],
)
IGNORED_FIELDS = Counter(
    "harnessrl_ignored_fields",
    "Request fields accepted and ignored on purpose (proxy: the Gemini API's IGNORED), by protocol and field.",
    ["service", "protocol", "field"],
)
SAMPLING_OVERRIDES = Counter(
    "harnessrl_sampling_overrides",
    "Sampling parameters a harness asked for that the run pinned to its own value (proxy sampling = pin), by field.",
    ["service", "field"],
)

_served: set[int] = set()
_lock = threading.Lock()


def observe(service: str, method: str, code: str, started: float) -> None:
    REQUESTS.labels(service, method, code).inc()
    LATENCY.labels(service, method).observe(time.monotonic() - started)


def serve(port: int, host: str = "127.0.0.1", tls: TlsSettings | None = None) -> None:
    """Serves /metrics on ``host:port`` in a thread, once per port per process; over
    TLS (mTLS with a client CA) when ``tls`` serves it, like the service's own port."""
    with _lock:
        if port in _served:
            return
        if tls is not None and tls.serves_tls:
            start_http_server(
                port,
                addr=host,
                certfile=str(tls.cert_file),
                keyfile=str(tls.key_file),
                client_cafile=str(tls.client_ca_file) if tls.client_ca_file else None,
                client_auth_required=tls.client_ca_file is not None,
            )
        else:
            start_http_server(port, addr=host)
        _served.add(port)


def exposition() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST


def instrument_app(app: Any, service: str) -> None:
    """Counts every request of a FastAPI app by route template and status (a pure
    ASGI middleware: cheap, and a stream counts until it ends), and serves
    ``GET /metrics``. Unmatched paths share one label so scanners cannot blow up
    the label set."""
    from fastapi import Response

    app.add_middleware(_Metrics, service=service)

    @app.get("/metrics", include_in_schema=False)
    async def _metrics() -> Response:
        body, content_type = exposition()
        return Response(body, media_type=content_type)


class _Metrics:
    def __init__(self, app: Any, service: str) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        code = ["500"]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                code[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            observe(self.service, f"{scope['method']} {getattr(route, 'path', '<unmatched>')}", code[0], started)
