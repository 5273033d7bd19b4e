"""Per-trial engine routing through the real services: a trial's spec names the
gateway its model calls go to (``TrialSpec.gateway_target``); the sandbox passes
it to the proxy at registration and the proxy's engine client for that trial
dials it. Two real gateways (scripted engines) behind one real proxy: trials
routed to B reach B and never A; trials that name none use the proxy's own (A);
a trial whose gateway is down ends engine_error, not with a reward.
A malformed target is refused at submit (gRPC) and at registration (HTTP)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import grpc
import httpx
import pytest

from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.gateway.engines.scripted import read_generation_log
from services.gateway.server import create_server as create_gateway
from services.gateway.settings import Settings as GatewaySettings
from services.sandbox.server import create_sandbox_server
from tests.sandbox_support import make_task, model_stack, write_script

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]
MODEL = default_model_dir().name
# One model call per trial; the reply names the gateway that sampled it.
CALL = """set -e
python3 - <<'PY'
import json, os, urllib.request

base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
body = json.dumps({"model": os.environ["HARNESSRL_MODEL"], "tools": tools,
                   "messages": [{"role": "user", "content": "go"}]}).encode()
headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
request = urllib.request.Request(f"{base}/chat/completions", data=body, headers=headers)
json.dump(json.load(urllib.request.urlopen(request, timeout=60)), open("/logs/agent/reply.json", "w"))
PY
echo hello > hello.txt
"""


def reply(name: str) -> dict[str, list[dict[str, str]]]:
    return {"main": [{"content": f"from {name}"}], "*": [{"content": f"from {name}"}]}


def trial(task: Path, trial_id: str, gateway_target: str = "") -> sandbox_pb2.TrialSpec:
    return sandbox_pb2.TrialSpec(
        trial_id=trial_id,
        run_id="route",
        group_id=trial_id,
        group_size=1,
        task_path=str(task),
        harness="shell",
        harness_options={"script": CALL},
        model=MODEL,
        gateway_target=gateway_target,
    )


async def wait_done(stub: sandbox_pb2_grpc.SandboxStub, trial_ids: list[str]) -> dict[str, sandbox_pb2.TrialStatus]:
    done: dict[str, sandbox_pb2.TrialStatus] = {}
    async for status in stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(trial_ids=trial_ids), timeout=180):
        if status.state == sandbox_pb2.TRIAL_STATE_DONE:
            done[status.trial_id] = status
            if len(done) == len(trial_ids):
                return done
    raise AssertionError(f"watch ended with {sorted(done)} of {trial_ids} done")


async def test_trials_reach_the_gateway_their_spec_names(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    b_log = tmp_path / "b" / "engine.jsonl"
    b_script = write_script(tmp_path / "b", {"context_window": 200_000, "threads": reply("B")})
    async with model_stack(tmp_path / "a", reply("A")) as stack:
        b = await create_gateway(
            GatewaySettings.model_validate({"engine": f"scripted:{b_script}", "scripted_log_path": b_log})
        )
        sandbox = await create_sandbox_server(stack.sandbox_settings(tmp_path, heartbeat_s=0.2, concurrency=3))
        try:
            async with connect(f"127.0.0.1:{sandbox.port}") as channel:
                stub = sandbox_pb2_grpc.SandboxStub(channel)
                target_b = f"127.0.0.1:{b.port}"
                specs = [trial(task, "to-b-1", target_b), trial(task, "to-b-2", target_b), trial(task, "default")]
                specs.append(trial(task, "to-nowhere", "127.0.0.1:1"))  # well-formed, nothing listens
                for spec in specs:
                    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec))
                statuses = await wait_done(stub, [s.trial_id for s in specs])
                # What the queue kept is the spec as submitted, target included.
                record = await sandbox.queue.get("to-b-1")
                assert record.spec.gateway_target == target_b
        finally:
            await sandbox.stop(0)
            await b.stop(0)
        nowhere = statuses.pop("to-nowhere")
        assert nowhere.termination_reason == records_pb2.TERMINATION_REASON_ENGINE_ERROR, nowhere
        for trial_id, status in statuses.items():
            assert status.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED, (trial_id, status)
            assert status.reward == 1.0, (trial_id, status)
        on_a = {r["trial_id"] for r in read_generation_log(stack.engine_log)}
        on_b = {r["trial_id"] for r in read_generation_log(b_log)}
        assert on_b == {"to-b-1", "to-b-2"} and on_a == {"default"}
        for trial_id, name in [("to-b-1", "B"), ("to-b-2", "B"), ("default", "A")]:
            answer = json.loads((tmp_path / "artifacts" / "route" / trial_id / "agent" / "reply.json").read_text())
            assert answer["choices"][0]["message"]["content"] == f"from {name}"


async def test_a_malformed_gateway_target_is_refused_at_submit_and_at_registration(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    async with model_stack(tmp_path / "a", reply("A")) as stack:
        sandbox = await create_sandbox_server(stack.sandbox_settings(tmp_path))
        try:
            async with connect(f"127.0.0.1:{sandbox.port}") as channel:
                stub = sandbox_pb2_grpc.SandboxStub(channel)
                for bad in ["gateway-b", "http://gw:50051", "gw:0", "unix:relative.sock"]:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=trial(task, "bad", bad)))
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "gateway_target" in (err.value.details() or "") and bad in (err.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.GetTrial(sandbox_pb2.GetTrialRequest(trial_id="bad"))
        finally:
            await sandbox.stop(0)
        async with httpx.AsyncClient(base_url=stack.proxy.url) as client:
            headers = {"Authorization": f"Bearer {stack.admin_token}"}
            body = {"trial_id": "bad", "run_id": "r", "gateway_target": "gw:99999"}
            resp = await client.post("/admin/trials", json=body, headers=headers)
            assert resp.status_code == 400 and "gateway_target" in resp.text and "1-65535" in resp.text
            ok = await client.post("/admin/trials", json=body | {"gateway_target": "[::1]:50051"}, headers=headers)
            assert ok.status_code == 201


async def test_the_pool_closes_a_named_gateways_channel_when_idle(tmp_path: Path) -> None:
    from services.proxy.gateway_client import EnginePool

    pool = EnginePool("127.0.0.1:1", None, 5.0, tracing=False, idle_s=0.05)
    try:
        default = pool.acquire("")
        first, second = pool.acquire("127.0.0.1:2"), pool.acquire("127.0.0.1:2")
        assert first is second and first is not default and default is pool.default
        pool.release("127.0.0.1:2")
        await asyncio.sleep(0.1)
        assert "127.0.0.1:2" in pool.targets, "still held by one trial"
        pool.release("127.0.0.1:2")
        assert pool.acquire("127.0.0.1:2") is first, "re-acquired before the idle timer fired: same channel"
        pool.release("127.0.0.1:2")
        await asyncio.sleep(0.1)
        assert pool.targets == ["127.0.0.1:1"], "closed when idle; the default stays"
        pool.release("")
        await asyncio.sleep(0.1)
        assert pool.targets == ["127.0.0.1:1"]
    finally:
        await pool.close()
    assert pool.targets == []
