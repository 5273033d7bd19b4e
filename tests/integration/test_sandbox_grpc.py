"""The Sandbox gRPC contract over real gRPC: SubmitTrial, GetTrial, WatchTrials,
CancelTrial, malformed input; and the distributed mode (Redis queue, separate
worker processes) surviving a worker killed mid-trial."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from harnessrl.localservers import RedisServer
from harnessrl.rpc import connect
from harnessrl.v1 import records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.server import SandboxServer, create_sandbox_server
from tests.sandbox_support import make_task, settings_for

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[SandboxServer]:
    running = await create_sandbox_server(settings_for(tmp_path, heartbeat_s=0.2))
    yield running
    await running.stop(0)


@pytest.fixture
async def stub(server: SandboxServer) -> AsyncIterator[sandbox_pb2_grpc.SandboxStub]:
    async with connect(f"127.0.0.1:{server.port}") as channel:
        yield sandbox_pb2_grpc.SandboxStub(channel)


@pytest.fixture
async def front(tmp_path: Path, redis_server: RedisServer) -> AsyncIterator[sandbox_pb2_grpc.SandboxStub]:
    """The gRPC front over a Redis queue, with no worker (runs no trial, needs no bwrap)."""
    running = await create_sandbox_server(settings_for(tmp_path, queue_url=redis_server.url))
    try:
        async with connect(f"127.0.0.1:{running.port}") as channel:
            yield sandbox_pb2_grpc.SandboxStub(channel)
    finally:
        await running.stop(0)


def spec(
    task: Path, trial_id: str, script: str = "echo hello > hello.txt", run_id: str = "run-1"
) -> sandbox_pb2.TrialSpec:
    return sandbox_pb2.TrialSpec(
        trial_id=trial_id, run_id=run_id, task_path=str(task), harness="shell", harness_options={"script": script}
    )


async def wait_done(stub: sandbox_pb2_grpc.SandboxStub, trial_id: str) -> sandbox_pb2.TrialStatus:
    async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=[trial_id]), timeout=120):
        if status.state == sandbox_pb2.TRIAL_STATE_DONE:
            return status
    raise AssertionError("watch ended before the trial finished")


@needs_bwrap
async def test_submit_watch_get_over_grpc(stub: sandbox_pb2_grpc.SandboxStub, tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    first = await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "g1")))
    assert first.created and first.trial_id == "g1"
    again = await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "g1")))
    assert not again.created
    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "g2", script="true")))
    states: dict[str, list[int]] = {"g1": [], "g2": []}
    async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(run_id="run-1"), timeout=120):
        states[status.trial_id].append(status.state)
        if all(s and s[-1] == sandbox_pb2.TRIAL_STATE_DONE for s in states.values()):
            break
    g1 = await stub.GetTrial(sandbox_pb2.GetTrialRequest(trial_id="g1"))
    assert g1.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED
    assert g1.has_reward and g1.reward == 1.0 and g1.attempt == 1 and g1.worker
    assert g1.timings.setup_s > 0 and g1.timings.agent_s > 0 and g1.timings.verify_s > 0
    g2 = await stub.GetTrial(sandbox_pb2.GetTrialRequest(trial_id="g2"))
    assert g2.has_reward and g2.reward == 0.0


@needs_bwrap
async def test_cancel_over_grpc(stub: sandbox_pb2_grpc.SandboxStub, tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "c1", script="sleep 60")))
    async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=["c1"]), timeout=60):
        if status.state == sandbox_pb2.TRIAL_STATE_AGENT:
            break
    assert (await stub.CancelTrial(sandbox_pb2.CancelTrialRequest(trial_id="c1"))).cancelled
    done = await wait_done(stub, "c1")
    assert done.termination_reason == records_pb2.TERMINATION_REASON_CANCELLED and not done.has_reward
    assert not (await stub.CancelTrial(sandbox_pb2.CancelTrialRequest(trial_id="c1"))).cancelled


@pytest.mark.parametrize(
    ("mutate", "code", "fragment"),
    [
        (lambda s: s.ClearField("trial_id"), grpc.StatusCode.INVALID_ARGUMENT, "trial_id"),
        (lambda s: setattr(s, "trial_id", "../../etc"), grpc.StatusCode.INVALID_ARGUMENT, "trial_id"),
        (lambda s: setattr(s, "harness", "gpt-agent"), grpc.StatusCode.INVALID_ARGUMENT, "valid harnesses"),
        (lambda s: setattr(s, "task_path", "/no/such/task"), grpc.StatusCode.INVALID_ARGUMENT, "not a directory"),
        (lambda s: s.harness_options.update({"x": "y"}), grpc.StatusCode.ALREADY_EXISTS, "different spec"),
    ],
)
async def test_malformed_submissions_are_refused(
    front: sandbox_pb2_grpc.SandboxStub, tmp_path: Path, mutate, code: grpc.StatusCode, fragment: str
) -> None:
    task = make_task(tmp_path / "tasks")
    await front.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "dup")))
    bad = spec(task, "dup")
    mutate(bad)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await front.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=bad))
    assert info.value.code() == code and fragment in (info.value.details() or "")


async def test_unknown_and_empty_ids(front: sandbox_pb2_grpc.SandboxStub) -> None:
    stub = front
    for call, request, code in [
        (stub.GetTrial, sandbox_pb2.GetTrialRequest(trial_id="nope"), grpc.StatusCode.NOT_FOUND),
        (stub.GetTrial, sandbox_pb2.GetTrialRequest(), grpc.StatusCode.INVALID_ARGUMENT),
        (stub.CancelTrial, sandbox_pb2.CancelTrialRequest(trial_id="nope"), grpc.StatusCode.NOT_FOUND),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request)
        assert info.value.code() == code
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest()):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _worker(tmp: Path, redis_url: str, name: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "HARNESSRL_SANDBOX_LEASE_S": "2",
        "HARNESSRL_SANDBOX_HEARTBEAT_S": "0.3",
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the tasks' verifiers need no network
    }
    cmd = [sys.executable, "-m", "stack.cli", "sandbox", "worker", "--queue-url", redis_url, "--name", name]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@needs_bwrap
async def test_a_worker_killed_mid_trial_loses_its_lease_and_the_trial_is_retried(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    task = make_task(tmp_path / "tasks")
    settings = settings_for(tmp_path, queue_url=redis_server.url)
    front = await create_sandbox_server(settings)  # no in-process worker with a Redis queue
    first = _worker(tmp_path, redis_server.url, "doomed")
    second = None
    try:
        async with connect(f"127.0.0.1:{front.port}") as channel:
            stub = sandbox_pb2_grpc.SandboxStub(channel)
            script = "sleep 4; echo hello > hello.txt"
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(task, "k1", script=script)))
            async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=["k1"]), timeout=120):
                if status.state == sandbox_pb2.TRIAL_STATE_AGENT:
                    assert status.worker == "doomed"
                    break
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            second = _worker(tmp_path, redis_server.url, "survivor")
            done = await wait_done(stub, "k1")
            assert done.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED, done.error
            assert done.reward == 1.0 and done.attempt == 2 and done.worker == "survivor"
            assert not any((tmp_path / "trials").iterdir()), "the survivor removed the dead worker's sandbox"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        await front.stop(0)
    await asyncio.sleep(0)
