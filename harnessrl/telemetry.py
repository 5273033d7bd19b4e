"""OpenTelemetry: one tracer provider per service, OTLP export when configured.

Several services may share one process (the embedded default), so each
service gets its own provider (its own ``service.name`` in Jaeger) and every
provider feeds the same span processors: an OTLP endpoint configured by any
service exports the spans of all of them, once.

Trace context crosses gRPC in metadata (the grpc instrumentation's
interceptors, installed by ``harnessrl.rpc``), HTTP in ``traceparent`` headers
and queue messages as a ``traceparent`` field (``inject``/``extract`` below).
A trial's spans carry ``harnessrl.*`` attributes (``trial_attributes``).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult

DEFAULT_SERVICE = "harnessrl"
# Fields that identify a trial, wherever they appear (specs, requests, records).
TRIAL_FIELDS = ("run_id", "trial_id", "task_id", "group_id", "step", "policy_version")

_lock = threading.Lock()
_providers: dict[str, TracerProvider] = {}
_processors: list[SpanProcessor] = []
_endpoints: dict[str, _Detachable] = {}


def configure(service_name: str, otlp_endpoint: str | None = None) -> TracerProvider:
    """The provider of ``service_name`` (made once); with ``otlp_endpoint``, spans of
    every service in this process are exported there from now on."""
    with _lock:
        if not _providers:
            atexit.register(_shutdown)
        provider = _providers.get(service_name)
        if provider is None:
            provider = TracerProvider(
                resource=Resource.create({"service.name": service_name}),
                sampler=_WhenExporting(),
                shutdown_on_exit=False,
            )
            for processor in _processors:
                provider.add_span_processor(processor)
            if not _providers:
                # Code that asks the global API (instrumentations) gets the first one.
                trace.set_tracer_provider(provider)
            _providers[service_name] = provider
        if otlp_endpoint and otlp_endpoint not in _endpoints:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            processor = _Detachable(BatchSpanProcessor(_exporter(otlp_endpoint, OTLPSpanExporter)))
            _endpoints[otlp_endpoint] = processor
            _add_processor(processor)
        return provider


def _exporter(otlp_endpoint: str, cls: Any) -> Any:
    """An OTLP/gRPC exporter: plaintext for http://, TLS for https:// verified against
    the process's CA (``harnessrl.tls.client()``; the system's roots without one)."""
    from harnessrl import tls

    if not otlp_endpoint.startswith("https://"):
        return cls(endpoint=otlp_endpoint, insecure=True)
    return cls(endpoint=otlp_endpoint, insecure=False, credentials=tls.channel_credentials(tls.client()))


class _WhenExporting(Sampler):
    """Records spans only while something exports them: without an exporter a span is
    a non-recording one that still carries the trace context (instrumented servers,
    FastAPI's own spans included, then cost next to nothing on hot paths)."""

    _inner = ParentBased(ALWAYS_ON)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str, *args: Any, **kw: Any) -> Any:
        if not _processors:
            return SamplingResult(Decision.DROP)
        return self._inner.should_sample(parent_context, trace_id, name, *args, **kw)

    def get_description(self) -> str:
        return "harnessrl.WhenExporting(ParentBased(AlwaysOn))"


def close_endpoint(otlp_endpoint: str) -> None:
    """Flushes and stops exporting to ``otlp_endpoint`` (a collector going away, in tests)."""
    with _lock:
        processor = _endpoints.pop(otlp_endpoint, None)
    if processor is not None:
        processor.detach()


class _Detachable(SpanProcessor):
    """A processor that can be switched off: providers cannot drop a processor."""

    def __init__(self, inner: SpanProcessor) -> None:
        self._inner: SpanProcessor | None = inner

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        if self._inner is not None:
            self._inner.on_start(span, parent_context)

    def on_end(self, span: Any) -> None:
        if self._inner is not None:
            self._inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis) if self._inner is not None else True

    def shutdown(self) -> None:
        self.detach()

    def detach(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.force_flush()
            inner.shutdown()


def exporting() -> bool:
    """Whether spans of this process are exported anywhere (an endpoint or a test's exporter)."""
    return bool(_processors)


def _add_processor(processor: SpanProcessor) -> None:
    _processors.append(processor)
    for provider in _providers.values():
        provider.add_span_processor(processor)


def add_exporter(exporter: SpanExporter) -> None:
    """Adds a synchronous exporter for every service's spans (tests use an in-memory one)."""
    configure(DEFAULT_SERVICE)
    with _lock:
        _add_processor(SimpleSpanProcessor(exporter))


def flush(timeout_ms: int = 5000) -> None:
    """Exports what is buffered now (before a process hands off, and in tests)."""
    for processor in list(_processors):
        processor.force_flush(timeout_ms)


def _shutdown() -> None:
    for processor in list(_processors):
        processor.shutdown()


def provider(service_name: str = DEFAULT_SERVICE) -> TracerProvider:
    return configure(service_name)


def tracer(name: str, service_name: str = DEFAULT_SERVICE) -> trace.Tracer:
    return provider(service_name).get_tracer(name)


def inject(carrier: dict[str, Any] | None = None, context: Context | None = None) -> dict[str, Any]:
    """Writes the current (or given) trace context into ``carrier`` (a queue message or headers)."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier, context=context)
    return carrier


def extract(carrier: Mapping[str, Any]) -> Context:
    return propagate.extract(carrier)


def trial_attributes(source: Any) -> dict[str, Any]:
    """``harnessrl.<field>`` span attributes from whatever identifies a trial: a
    mapping, a pydantic model or a protobuf message (nested ``key``/``spec`` too)."""
    out: dict[str, Any] = {}
    for obj in (source, getattr(source, "key", None), getattr(source, "spec", None)):
        if obj is None:
            continue
        for name in TRIAL_FIELDS:
            value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
            if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
                out.setdefault(f"harnessrl.{name}", value)
    return out


def current_trace_id() -> str:
    """The current span's trace id as 32 hex digits ('' outside a trace)."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def trace_id_of(carrier: Mapping[str, Any]) -> str:
    """The trace id a carrier (queue message, headers) continues, '' if none."""
    ctx = trace.get_current_span(extract(carrier)).get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def trial_trace(name: str, service: str, attributes: Mapping[str, Any]) -> Any:
    """Starts a new trace for one trial (one trace per trial), linked to the current
    span: the trainer step enqueues each trial inside ``trial_trace("trainer.enqueue",
    "trainer", {...})`` so that the step -> queue -> sandbox -> proxy -> gateway ->
    capture chain of a trial is one trace, and the step's span links to all of them."""
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else []
    return tracer(__name__, service).start_as_current_span(
        name, context=Context(), links=links, attributes=dict(attributes)
    )
