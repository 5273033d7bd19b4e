"""The shared gRPC plumbing against a real server: health, auth, error
mapping, graceful stop and one trace across client and server."""

from __future__ import annotations

from typing import ClassVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harnessrl import telemetry
from harnessrl.config import ServiceSettings
from harnessrl.errors import NotFound
from harnessrl.rpc import connect, start_server
from harnessrl.v1 import trainer_pb2, trainer_pb2_grpc


class ProbeTrainer(trainer_pb2_grpc.TrainerServicer):
    """A minimal servicer to exercise the plumbing, not the trainer."""

    seen_traces: ClassVar[list[int]] = []  # the trace id each Status call ran in (0: none)

    async def Status(self, request, context):
        self.seen_traces.append(trace.get_current_span().get_span_context().trace_id)
        return trainer_pb2.TrainerStatus(run_id="probe", step=3)

    async def Metrics(self, request, context):
        raise NotFound(f"no metrics after step {request.since_step}")


async def start(token: str | None = None):
    settings = ServiceSettings(auth_token=token, shutdown_grace_s=0.5)

    def register(server):
        trainer_pb2_grpc.add_TrainerServicer_to_server(ProbeTrainer(), server)
        return ["harnessrl.v1.Trainer"]

    return await start_server(settings, "probe", register)


async def test_error_mapping_and_trace_propagation() -> None:
    exporter = InMemorySpanExporter()
    telemetry.add_exporter(exporter)
    running = await start()
    try:
        async with connect(f"127.0.0.1:{running.port}") as channel:
            stub = trainer_pb2_grpc.TrainerStub(channel)
            with telemetry.tracer("test").start_as_current_span("trial") as parent:
                status = await stub.Status(trainer_pb2.StatusRequest())
            assert status.step == 3
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Metrics(trainer_pb2.MetricsRequest(since_step=9))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            assert info.value.details() == "no metrics after step 9"
    finally:
        await running.stop()
    trace_id = parent.get_span_context().trace_id
    assert trace_id in ProbeTrainer.seen_traces
    status_spans = [s for s in exporter.get_finished_spans() if s.name.endswith("Trainer/Status")]
    assert len(status_spans) == 2  # client span and server span
    assert {s.context.trace_id for s in status_spans} == {trace_id}


async def test_no_server_spans_while_nothing_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A span per call costs the hot path ~0.3 ms: a process that exports no traces
    installs no server interceptor, so a call carries no trace into the handler."""
    monkeypatch.setattr(telemetry, "_processors", [])
    ProbeTrainer.seen_traces.clear()
    running = await start()
    try:
        async with connect(f"127.0.0.1:{running.port}") as channel:
            with telemetry.tracer("test").start_as_current_span("trial") as parent:
                assert parent.get_span_context().is_valid  # a context to propagate, though nothing records it
                await trainer_pb2_grpc.TrainerStub(channel).Status(trainer_pb2.StatusRequest())
    finally:
        await running.stop()
    assert ProbeTrainer.seen_traces == [0]


async def test_auth_rejects_wrong_token_but_not_health() -> None:
    running = await start(token="right")
    target = f"127.0.0.1:{running.port}"
    try:
        for token in (None, "wrong"):
            async with connect(target, token) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await trainer_pb2_grpc.TrainerStub(channel).Status(trainer_pb2.StatusRequest())
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with connect(target, "right") as channel:
            assert (await trainer_pb2_grpc.TrainerStub(channel).Status(trainer_pb2.StatusRequest())).run_id == "probe"
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.stop()


async def test_stop_reports_not_serving_first() -> None:
    running = await start()
    await running.stop(grace=0.1)
    status = await running.health.Check(health_pb2.HealthCheckRequest(service=""), None)
    assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
