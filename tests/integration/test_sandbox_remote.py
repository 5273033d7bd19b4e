"""The second Sandbox implementation's own behaviour beyond the conformance checks:
leases across a real executor process (killed mid-trial: retried as a new attempt,
or ended as an infrastructure failure when no attempt is left), the executor's
lease on its front, an unreachable executor at submit, and malformed input to the
executor's HTTP API, its command line and the front's settings."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from harnessrl.config import validate
from harnessrl.errors import ConfigError
from harnessrl.localservers import free_port, restartable_port
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.conformance import write_tasks
from services.sandbox_remote.settings import Settings as RemoteSettings
from tests.sandbox_remote_support import ROOT, Executor, executor, executor_env, remote_front

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def spec(tasks: Path, trial_id: str, script: str) -> sandbox_pb2.TrialSpec:
    return sandbox_pb2.TrialSpec(
        trial_id=trial_id,
        run_id="r",
        group_id=f"{trial_id}-g",
        group_size=1,
        task_path=str(tasks / "hello"),
        harness="shell",
        harness_options={"script": script},
    )


async def follow(stub: sandbox_pb2_grpc.SandboxStub, trial_id: str, until: int) -> sandbox_pb2.TrialStatus:
    async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=[trial_id]), timeout=120):
        if status.state in (until, sandbox_pb2.TRIAL_STATE_DONE):
            return status
    raise AssertionError("watch ended")


@needs_bwrap
@pytest.mark.parametrize("max_attempts", [2, 1])
async def test_an_executor_killed_mid_trial(tmp_path: Path, max_attempts: int) -> None:
    """Its lease runs out: a restarted executor runs attempt 2 (``<id>.attempt-2``) to
    completion, or, with no attempt left, the front ends the trial env_setup_failed naming
    the executor; either way the trial's last attempt is finalized in the capture store."""
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings

    tasks = write_tasks(tmp_path / "tasks")
    capture = await create_capture(CaptureSettings.model_validate({"store_dir": tmp_path / "c", "fsync": False}))
    capture_target = f"127.0.0.1:{capture.port}"
    port = restartable_port()
    env = executor_env(tmp_path / "ex", lease_s=2, capture_target=capture_target)
    (tmp_path / "ex").mkdir()
    doomed = Executor(tmp_path / "ex", env, port).start()
    survivor = None
    try:
        front_settings = {"lease_s": 1.5, "max_attempts": max_attempts, "capture_target": capture_target}
        async with remote_front(doomed.url, **front_settings) as front:
            async with connect(f"127.0.0.1:{front.port}") as channel:
                stub = sandbox_pb2_grpc.SandboxStub(channel)
                script = "sleep 3; echo hello > hello.txt"
                await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(tasks, "k1", script)))
                running = await follow(stub, "k1", sandbox_pb2.TRIAL_STATE_AGENT)
                assert running.attempt == 1 and running.worker == doomed.name
                doomed.kill()
                survivor = Executor(tmp_path / "ex", env, port).start()
                done = await follow(stub, "k1", sandbox_pb2.TRIAL_STATE_DONE)
            last = "k1.attempt-2" if max_attempts == 2 else "k1"
            async with connect(capture_target) as channel:
                request = capture_pb2.GetTrajectoryRequest(run_id="r", trial_id=last)
                trajectory = await capture_pb2_grpc.CaptureStoreStub(channel).GetTrajectory(request, timeout=10)
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                proc.stop()
        await capture.stop(0)
    assert trajectory.finalized and trajectory.termination_reason == done.termination_reason
    if max_attempts == 2:
        assert done.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED, done.error
        assert done.reward == 1.0 and done.attempt == 2 and survivor is not None and done.worker == survivor.name
        assert (tmp_path / "ex" / "artifacts" / "r" / "k1.attempt-2" / "result.json").is_file()
    else:
        assert done.termination_reason == records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED
        assert not done.has_reward and "no attempts left" in done.error and doomed.url in done.error
        assert not trajectory.has_reward


@needs_bwrap
async def test_the_fronts_status_carries_tamper_and_suspicious_events(tmp_path: Path) -> None:
    """What the executor's outcome counted reaches the front's TrialStatus: a planted
    conftest.py reverted (a tamper event) and a module reaching for gc (a suspicious one)."""
    tasks = write_tasks(tmp_path / "tasks")
    script = "echo hello > hello.txt; printf 'import gc\\ngc.get_objects()\\n' > hack.py; echo 'x = 1' > conftest.py"
    with executor(tmp_path / "ex") as proc:
        async with remote_front(proc.url) as front, connect(f"127.0.0.1:{front.port}") as channel:
            stub = sandbox_pb2_grpc.SandboxStub(channel)
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(tasks, "ev1", script)))
            done = await follow(stub, "ev1", sandbox_pb2.TRIAL_STATE_DONE)
            fetched = await stub.GetTrial(sandbox_pb2.GetTrialRequest(trial_id="ev1"), timeout=10)
    assert done.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED, done.error
    assert list(done.suspicious_events) == ["suspicious: gc-objects in hack.py"], done
    assert any("conftest.py" in e for e in done.tamper_events), done.tamper_events
    assert list(fetched.suspicious_events) == list(done.suspicious_events)
    assert list(fetched.tamper_events) == list(done.tamper_events)


async def test_an_unreachable_executor_is_unavailable_at_submit(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with remote_front(url) as front, connect(f"127.0.0.1:{front.port}") as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(tmp_path, "u1", "true")))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and url in (info.value.details() or "")


@needs_bwrap
async def test_the_executor_cancels_what_its_front_stopped_polling(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks")
    with executor(tmp_path / "ex", lease_s=1) as proc:
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as http:
            body = {"spec": {"trial_id": "orphan", "task_path": str(tasks / "hello"), "harness": "shell",
                             "harness_options": {"script": "sleep 300"}}}  # fmt: skip
            assert (await http.put("/v1/executions/orphan", json=body)).status_code == 201
            await asyncio.sleep(3)  # nobody polls: the lease (1 s) runs out
            started = time.monotonic()
            while time.monotonic() - started < 30:
                view = (await http.get("/v1/executions/orphan")).json()
                if view["state"] == "done":
                    break
                await asyncio.sleep(0.2)
    assert view["outcome"]["termination_reason"] == "cancelled", view


async def test_the_executor_api_refuses_malformed_input(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks")
    with executor(tmp_path / "ex", auth_token="tok") as proc:
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as http:
            assert (await http.get("/healthz")).status_code == 200  # health needs no token
            denied = await http.put("/v1/executions/x", json={"spec": {}})
            assert denied.status_code == 401 and "bearer token" in denied.json()["detail"]
            http.headers["authorization"] = "Bearer tok"
            cases = [
                ({"spec": {"trial_id": "x", "harness": "nop"}}, 400, "task_path"),
                ({"spec": {"trial_id": "x", "task_path": str(tasks / "hello"), "harness": "gpt"}}, 400, "harness"),
                ({"spec": {"trial_id": "x", "no_such_field": 1}}, 400, "no_such_field"),
                ({"spec": {"trial_id": "y", "task_path": str(tasks / "hello"), "harness": "nop"}}, 400, "execution id"),
                ({"nope": 1}, 422, "spec"),
            ]
            for body, status, fragment in cases:
                resp = await http.put("/v1/executions/x", json=body)
                assert resp.status_code == status and fragment in resp.text, (body, resp.text)
            assert (await http.get("/v1/executions/never")).status_code == 404


def test_malformed_settings_are_refused(tmp_path: Path) -> None:
    env = executor_env(tmp_path, concurrency=0)
    bad = subprocess.run([sys.executable, "-m", "services.sandbox.executor"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "concurrency" in bad.stderr, bad.stderr
    with pytest.raises(ConfigError, match=r"executor_url must be http"):
        validate(RemoteSettings, {"executor_url": "ftp://somewhere"}, "sandbox_remote")
    front = subprocess.run([sys.executable, "-m", "services.sandbox_remote", "--executor-url", "nope"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert front.returncode == 2 and "executor_url" in front.stderr, front.stderr


@needs_bwrap
async def test_front_and_executor_over_mtls(tmp_path: Path) -> None:
    """The executor serves HTTPS with client certificates required; the front verifies it with its
    CA and serves gRPC over mTLS itself; a front that trusts another CA gets a clear UNAVAILABLE."""
    from harnessrl import tls
    from services.sandbox.conformance import run_conformance
    from tests.tls_support import make_pki

    pki = make_pki(tmp_path / "pki")
    certs = {"cert_file": pki.server_cert, "key_file": pki.server_key, "client_ca_file": pki.ca, "ca_file": pki.ca}
    with executor(tmp_path / "ex", **{f"tls__{k}": v for k, v in certs.items()}) as proc:
        url = f"https://127.0.0.1:{proc.port}"
        async with remote_front(url, tls=pki.service()) as front:
            tls.use(pki.client())
            try:
                results = await run_conformance(f"127.0.0.1:{front.port}", only=["completes_with_reward"])
            finally:
                tls.reset()
        assert all(r.ok for r in results), [(r.name, r.detail) for r in results]
        async with remote_front(url, tls=pki.client(cert=False, ca=pki.other_ca)) as wrong:
            async with connect(f"127.0.0.1:{wrong.port}") as channel:
                stub = sandbox_pb2_grpc.SandboxStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec(tmp_path, "t1", "true")))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert url in (info.value.details() or "") and "CERTIFICATE_VERIFY_FAILED" in (info.value.details() or "")
