"""OpenTelemetry: one tracer provider per process, OTLP export when configured.

Trace context crosses gRPC in metadata (the grpc instrumentation's
interceptors, installed by ``harnessrl.rpc``), HTTP in ``traceparent`` headers
and queue messages as a ``traceparent`` field (``inject``/``extract`` below).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

_lock = threading.Lock()
_provider: TracerProvider | None = None


def configure(service_name: str, otlp_endpoint: str | None = None) -> TracerProvider:
    """Installs the process's tracer provider once; later calls return it unchanged
    (several services may share one process in the embedded default)."""
    global _provider
    with _lock:
        if _provider is None:
            _provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
            trace.set_tracer_provider(_provider)
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True)))
        return _provider


def add_exporter(exporter: SpanExporter) -> None:
    """Adds a synchronous exporter (tests use an in-memory one)."""
    configure("harnessrl").add_span_processor(SimpleSpanProcessor(exporter))


def provider() -> TracerProvider:
    return configure("harnessrl")


def tracer(name: str) -> trace.Tracer:
    return provider().get_tracer(name)


def inject(carrier: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes the current trace context into ``carrier`` (a queue message or headers)."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier)
    return carrier


def extract(carrier: dict[str, Any]) -> Context:
    return propagate.extract(carrier)
