"""One OpenTelemetry trace per trial across every service, received by a real
OTLP/gRPC collector servicer (opentelemetry-proto) running in this test.

Real services on 127.0.0.1, each exporting over OTLP: the sandbox (gRPC server
with its in-process queue and worker), the proxy, the gateway (scripted engine)
and the capture store. The test plays the trainer: it opens the step's span and
submits the trial over the Sandbox gRPC API, as the trainer does. Then every span
of the trial (trainer step -> SubmitTrial -> queue -> sandbox phases -> each proxy
request -> gateway Generate -> capture store writes -> FinalizeTrajectory) must
share the step's trace id, with the right parents and trial attributes; the
dashboard links the trajectory to that trace; and the Prometheus counters moved.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from harnessrl import metrics, telemetry
from harnessrl.localservers import free_port
from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from tests.integration.test_dashboard.recorder import AGENT, BEHAVIOURS, TITLE
from tests.sandbox_support import make_task, settings_for

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attributes: dict[str, Any]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """The receiving end of OTLP/gRPC: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    async def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(
                        Span(
                            resource.get("service.name", ""),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            attrs,
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


async def collector() -> tuple[grpc.aio.Server, Collector, str]:
    servicer = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"http://127.0.0.1:{port}"


@dataclass
class Stack:
    capture: Any
    gateway: Any
    proxy: Any
    sandbox: Any


async def _stack(tmp: Path, otlp: str, metrics_port: int) -> Stack:
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings
    from services.sandbox.server import create_sandbox_server

    common = {"otlp_endpoint": otlp}
    capture = await create_capture(
        CaptureSettings.model_validate(
            {"store_dir": tmp / "capture", "fsync": False, "metrics_port": metrics_port, **common}
        )
    )
    script = tmp / "script.json"
    turns = BEHAVIOURS["solve_hello"]
    script.write_text(json.dumps({"context_window": 8192, "threads": {"main": turns, "*": TITLE}}))
    gateway = await create_gateway(GatewaySettings.model_validate({"engine": f"scripted:{script}", **common}))
    proxy = await start_proxy(
        ProxySettings.model_validate(
            {
                "gateway_target": f"127.0.0.1:{gateway.port}",
                "capture_target": f"127.0.0.1:{capture.port}",
                "admin_token": "admin-secret",
                "uds_path": tmp / "proxy.sock",
                "context_window": 8192,
                **common,
            }
        )
    )
    sandbox_settings = settings_for(
        tmp / "sandbox",
        proxy_url=proxy.url,
        proxy_admin_token="admin-secret",
        proxy_uds_path=tmp / "proxy.sock",
        capture_target=f"127.0.0.1:{capture.port}",
        queue_url="memory://",
        **common,
    )
    sandbox = await create_sandbox_server(sandbox_settings)
    return Stack(capture, gateway, proxy, sandbox)


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[Stack, Collector, int]]:
    server, received, endpoint = await collector()
    port = free_port()
    stack = await _stack(tmp_path, endpoint, port)
    try:
        yield stack, received, port
    finally:
        await stack.sandbox.stop(0)
        await stack.proxy.stop()
        await stack.gateway.stop(0)
        await stack.capture.stop(0)
        await asyncio.to_thread(telemetry.close_endpoint, endpoint)  # the collector answers on this loop
        await server.stop(0)


async def _run_trial(stack: Stack, task: Path) -> tuple[str, str]:
    """As the trainer: a step span, and SubmitTrial inside it; waits for the trial to end."""
    spec = sandbox_pb2.TrialSpec(
        trial_id="tr-1",
        run_id="run-t",
        task_path=str(task),
        task_id="hello",
        group_id="g-1",
        group_size=1,
        step=7,
        policy_version=3,
        harness="shell",
        harness_options={"script": AGENT},
        model=default_model_dir().name,
    )
    tracer = telemetry.tracer("tests.trainer", "trainer")
    attributes = {"harnessrl.run_id": "run-t", "harnessrl.step": 7, "harnessrl.policy_version": 3}
    async with connect(f"127.0.0.1:{stack.sandbox.port}", service="trainer") as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        with tracer.start_as_current_span("trainer.step", attributes=attributes) as step:
            with telemetry.trial_trace("trainer.enqueue", "trainer", telemetry.trial_attributes(spec)) as enqueue:
                await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec))
        async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=["tr-1"]), timeout=120):
            if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                break
    ctx = enqueue.get_span_context()
    assert ctx.trace_id != step.get_span_context().trace_id  # one trace per trial, not per step
    assert [link.context.span_id for link in enqueue.links] == [step.get_span_context().span_id]
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


async def _wait_for(received: Collector, trace_id: str, names: set[str], wait_s: float = 30) -> list[Span]:
    """The trace's spans once every name arrived and nothing new came for a second."""
    deadline = asyncio.get_running_loop().time() + wait_s
    seen, stable = -1, 0
    while True:
        # In a thread: the collector answers on this event loop.
        await asyncio.to_thread(telemetry.flush)
        spans = [s for s in received.spans if s.trace_id == trace_id]
        stable = stable + 1 if len(spans) == seen else 0
        seen = len(spans)
        done = names <= {s.name for s in spans} and stable >= 5
        if done or asyncio.get_running_loop().time() > deadline:
            return spans
        await asyncio.sleep(0.2)


FINALIZE = "/harnessrl.v1.CaptureStore/FinalizeTrajectory"
APPEND = "/harnessrl.v1.CaptureStore/AppendSegment"
GENERATE = "/harnessrl.v1.RolloutGateway/Generate"
SUBMIT = "/harnessrl.v1.Sandbox/SubmitTrial"


async def test_one_trial_is_one_trace_across_every_service(
    traced: tuple[Stack, Collector, int], tmp_path: Path
) -> None:
    stack, received, metrics_port = traced
    task = make_task(tmp_path / "tasks", "hello")
    trace_id, enqueue_span = await _run_trial(stack, task)
    names = {"trainer.enqueue", SUBMIT, "sandbox.trial", "sandbox.agent", "proxy.request", GENERATE, APPEND, FINALIZE}
    spans = await _wait_for(received, trace_id, names)
    by_name: dict[str, list[Span]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    assert names <= set(by_name), sorted(by_name)
    by_id = {s.span_id: s for s in spans}

    def parent(s: Span) -> Span:
        assert s.parent in by_id, f"{s.name} ({s.service}) has a parent outside the trace"
        return by_id[s.parent]

    def ancestors(s: Span) -> list[Span]:
        out = []
        while s.parent in by_id:
            s = by_id[s.parent]
            out.append(s)
        return out

    def one(name: str, kind: int | None = None, service: str | None = None) -> Span:
        found = [
            s for s in by_name[name] if (kind is None or s.kind == kind) and (service is None or s.service == service)
        ]
        assert len(found) == 1, (name, found)
        return found[0]

    server, client = 2, 3  # OTLP SpanKind
    assert all(s.attributes.get("harnessrl.trial_id", "tr-1") == "tr-1" for s in spans)  # this trial only
    # trainer (the trial's enqueue, linked to its step) -> SubmitTrial -> the queued trial
    enqueue = one("trainer.enqueue")
    assert enqueue.parent == "" and enqueue.span_id == enqueue_span and enqueue.service == "trainer"
    assert enqueue.attributes["harnessrl.trial_id"] == "tr-1" and enqueue.attributes["harnessrl.step"] == 7
    submit_client = one(SUBMIT, client, "trainer")
    assert submit_client.parent == enqueue_span
    submit_server = one(SUBMIT, server, "sandbox")
    assert parent(submit_server) is submit_client
    trial = one("sandbox.trial")
    assert parent(trial) is submit_server and trial.service == "sandbox"
    for key, value in {
        "trial_id": "tr-1",
        "task_id": "hello",
        "group_id": "g-1",
        "step": 7,
        "policy_version": 3,
    }.items():
        assert trial.attributes[f"harnessrl.{key}"] == value, key
    # sandbox phases
    phases = {s.name: s for s in spans if s.name.startswith("sandbox.") and s.name != "sandbox.trial"}
    assert set(phases) == {"sandbox.setup", "sandbox.agent", "sandbox.verify", "sandbox.teardown"}
    assert all(parent(p) is trial for p in phases.values())
    # each model call: proxy.request under the trial, Generate and AppendSegment under it
    requests = by_name["proxy.request"]
    assert len(requests) == len(BEHAVIOURS["solve_hello"]) + 1 == 3  # + the side (title) call
    for r in requests:
        assert parent(r) is trial and r.service == "proxy"
        assert r.attributes["harnessrl.trial_id"] == "tr-1" and r.attributes["harnessrl.task_id"] == "hello"
        assert r.attributes["harnessrl.sampled_tokens"] > 0
    gen_clients = [s for s in by_name[GENERATE] if s.kind == client]
    gen_servers = [s for s in by_name[GENERATE] if s.kind == server]
    assert len(gen_clients) == len(gen_servers) == 3
    assert {parent(c).span_id for c in gen_clients} == {r.span_id for r in requests}
    assert {parent(s).span_id for s in gen_servers} == {c.span_id for c in gen_clients}
    assert all(s.service == "gateway" and s.attributes["harnessrl.trial_id"] == "tr-1" for s in gen_servers)
    append_servers = [s for s in by_name[APPEND] if s.kind == server]
    assert append_servers and all(s.service == "capture_store" for s in append_servers)
    for s in append_servers:
        c = parent(s)
        assert c.kind == client and c.name == APPEND and c.service == "proxy"
        assert trial in ancestors(c)  # model calls' parts, and the closing part written at close (teardown)
    assert sum(parent(parent(s)).name == "proxy.request" for s in append_servers) >= len(requests)
    finalize = one(FINALIZE, server, "capture_store")
    assert parent(parent(finalize)) is trial
    assert finalize.attributes["harnessrl.step"] == 7 and finalize.attributes["harnessrl.group_id"] == "g-1"
    # the capture store records the trace id; the dashboard links the trajectory to it
    async with connect(f"127.0.0.1:{stack.capture.port}") as channel:
        traj = await capture_pb2_grpc.CaptureStoreStub(channel).GetTrajectory(
            capture_pb2.GetTrajectoryRequest(run_id="run-t", trial_id="tr-1")
        )
    assert traj.metadata["trace_id"] == trace_id
    from services.dashboard.service import DashboardService
    from services.dashboard.settings import Settings
    from services.dashboard.trajectories import row

    jaeger = Settings(runs_dir=tmp_path, trace_url="http://127.0.0.1:16686/trace/{trace_id}")
    link = DashboardService(jaeger).trace_link(row(traj))
    assert link == f"http://127.0.0.1:16686/trace/{trace_id}"
    # Prometheus: the services' counters moved, and a gRPC service serves /metrics
    text = metrics.exposition()[0].decode()
    assert 'method="/harnessrl.v1.RolloutGateway/Generate",service="gateway"' in text
    assert 'harnessrl_tokens_total{kind="sampled",service="proxy"}' in text
    assert 'harnessrl_tokens_total{kind="captured",service="capture_store"}' in text
    async with httpx.AsyncClient() as client:
        scraped = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    assert 'harnessrl_requests_total{code="OK",method="/harnessrl.v1.CaptureStore/AppendSegment"' in scraped
    async with httpx.AsyncClient() as client:  # the proxy serves on this event loop
        proxy_metrics = (await client.get(f"{stack.proxy.url}/metrics")).text
    assert 'method="POST /trials/{trial_id}/v1/chat/completions"' in proxy_metrics
