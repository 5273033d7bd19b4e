"""The standalone ``harnessrl sandbox worker`` exports its spans, and they continue
the submitter's trace: a real sandbox front over a real Redis queue, a worker
process, and an OTLP receiver (tests/compose/otlp_receiver.py) they both export to."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from harnessrl import telemetry
from harnessrl.localservers import RedisServer, free_port
from harnessrl.rpc import connect
from harnessrl.v1 import records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.server import create_sandbox_server
from tests.compose.otlp_receiver import Receiver
from tests.sandbox_support import make_task, settings_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    out = tmp_path / "spans.jsonl"
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield endpoint, out
    finally:
        # The collector answers on this loop: flush and detach off it.
        await asyncio.to_thread(telemetry.close_endpoint, endpoint)
        await server.stop(0)


def spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _worker(tmp: Path, redis_url: str, endpoint: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the task's verifier needs no network
        "HARNESSRL_SANDBOX_OTLP_ENDPOINT": endpoint,
    }
    cmd = [sys.executable, "-m", "stack.cli", "sandbox", "worker", "--queue-url", redis_url, "--name", "w1"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def test_the_standalone_worker_continues_the_submitters_trace(
    tmp_path: Path, redis_server: RedisServer, receiver: tuple[str, Path]
) -> None:
    endpoint, out = receiver
    task = make_task(tmp_path / "tasks")
    front = await create_sandbox_server(settings_for(tmp_path, queue_url=redis_server.url, otlp_endpoint=endpoint))
    worker = _worker(tmp_path, redis_server.url, endpoint)
    try:
        async with connect(f"127.0.0.1:{front.port}") as channel:
            stub = sandbox_pb2_grpc.SandboxStub(channel)
            spec = sandbox_pb2.TrialSpec(
                trial_id="traced-1",
                task_path=str(task),
                harness="shell",
                harness_options={"script": "echo hello > hello.txt"},
            )
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec))
            request = sandbox_pb2.WatchTrialsRequest(trial_ids=["traced-1"])
            async for status in stub.WatchTrials(request, timeout=120):
                if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                    break
            assert status.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED, status.error
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(worker.communicate, timeout=60)  # it flushes its spans on the way out
        await front.stop(0)
    await asyncio.to_thread(telemetry.flush)  # the receiver answers on this loop
    got = spans(out)
    submit = [s for s in got if s["name"] == "/harnessrl.v1.Sandbox/SubmitTrial" and s["kind"] == 2]
    trial = [s for s in got if s["name"] == "sandbox.trial"]
    assert submit and trial, f"spans: {sorted({(s['service'], s['name']) for s in got})}; worker: {stderr[-2000:]!r}"
    assert trial[0]["trace_id"] == submit[0]["trace_id"], "the worker's trial span is in the submitter's trace"
    assert trial[0]["attributes"]["harnessrl.trial_id"] == "traced-1"
    phases = {s["name"] for s in got if s["trace_id"] == submit[0]["trace_id"] and s["service"] == "sandbox"}
    assert {"sandbox.setup", "sandbox.agent", "sandbox.verify"} <= phases, phases
