"""The verl cluster path on CPU, against verl's own classes: the agent loop is in
verl's registry, its engine adapter serves verl's server manager behind a real
gateway, a trial runs through the sandbox contract and comes back from the real
capture store as verl's AgentLoopOutput. What needs GPUs is in stack/verl/README.md."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.workers.rollout.replica import TokenOutput

from harnessrl import arrays, paths
from harnessrl.errors import InvalidArgument
from harnessrl.rpc import connect
from harnessrl.v1 import (
    capture_pb2,
    capture_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    records_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
)
from services.capture_store.server import create_server as create_capture
from services.capture_store.settings import Settings as CaptureSettings
from stack import verl_agent_loop as val
from tests.trainer_support import TR, segment, trajectory

STACK_VERL = Path(val.__file__).parent / "verl"
AGENT_LOOPS = STACK_VERL / "agent_loops.yaml"


class FakeServerManager:
    """verl's server manager interface (generate -> TokenOutput), deterministic."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], dict[str, Any]]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        self.calls.append((request_id, prompt_ids, sampling_params))
        n = 4
        ids = [(sum(prompt_ids) + i) % 1000 + 3 for i in range(n)]
        routes = np.arange((len(prompt_ids) + n) * 2 * 2).reshape(-1, 2, 2) % 8
        return TokenOutput(token_ids=ids, log_probs=[-0.5 - 0.1 * i for i in range(n)], routed_experts=routes.tolist())


def test_agent_loop_is_registered_with_verl() -> None:
    assert _agent_loop_registry[val.AGENT_NAME] == {"_target_": "stack.verl_agent_loop.HarnessAgentLoop"}


def test_trajectory_becomes_verl_output_token_for_token() -> None:
    routes = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2)
    first = segment([1, 2], [3, 4], [1, 1], [-1.0, -2.0], [0, 0], index=0)
    last = segment([5, 6, 7], [8, 9, 10], [1, 0, 1], [-0.5, 0.0, -1.5], [1, -1, 2], index=1, routes=routes)
    out = val.trajectory_to_output(trajectory("t", "g", 1.0, [first, last]), response_length=16)
    assert isinstance(out, AgentLoopOutput)
    assert (out.prompt_ids, out.response_ids, out.response_mask) == ([5, 6, 7], [8, 9, 10], [1, 0, 1])
    assert out.response_logprobs == [-0.5, 0.0, -1.5] and out.reward_score == 1.0
    assert out.extra_fields["harnessrl_valid"] and out.extra_fields["harnessrl_policy_versions"] == [1, -1, 2]
    assert [s["index"] for s in out.extra_fields["harnessrl_segments"]] == [0]
    batch = out.as_dict()  # verl's own conversion to training tensors
    assert batch["prompts"].tolist() == [5, 6, 7] and batch["responses"].tolist() == [8, 9, 10]
    assert torch.equal(batch["rollout_log_probs"], torch.tensor([-0.5, 0.0, -1.5]))
    assert batch["routed_experts"].shape == (6, 2, 2) and batch["routed_experts"][3:].tolist() == routes.tolist()
    assert batch["rm_scores"].tolist() == [0.0, 0.0, 1.0]


def test_infra_failures_and_oversized_captures() -> None:
    seg = segment([1], [2], [1], [-1.0])
    bad = val.trajectory_to_output(trajectory("t", "g", 1.0, [seg], TR.TERMINATION_REASON_VERIFIER_ERROR), 8)
    assert bad.reward_score == 0.0 and bad.extra_fields["harnessrl_valid"] is False
    with pytest.raises(InvalidArgument, match="response_length"):
        val.trajectory_to_output(trajectory("t", "g", 1.0, [segment([1], [2] * 9, [1] * 9, [-1.0] * 9)]), 8)
    with pytest.raises(InvalidArgument, match="no trainable main-thread segment"):
        val.trajectory_to_output(trajectory("t", "g", 1.0, [segment([1], [2], [1], [-1.0], trainable=False)]), 8)


async def test_engine_adapter_serves_verl_server_manager_through_a_real_gateway() -> None:
    manager = FakeServerManager()
    engine = val.VerlServerEngine(manager, vocab_size=49152)
    engine.policy_version = 7
    server, port = await val.serve_engine(engine)
    try:
        async with connect(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
            req = gateway_pb2.GenerateRequest(
                request_id="r1",
                trial_id="t1",
                thread="main",
                prompt_ids=arrays.pack_i32([10, 11, 12]),
                sampling=gateway_pb2.SamplingParams(temperature=0.7, max_tokens=4, return_routed_experts=True),
            )
            chunks = [c async for c in stub.Generate(req)]
    finally:
        await server.stop(0)
    ids = [i for c in chunks for i in arrays.unpack_i32(c.tokens.ids).tolist()]
    assert ids == [36, 37, 38, 39]
    lps = [x for c in chunks for x in arrays.unpack_f32(c.tokens.logprobs).tolist()]
    assert lps == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert {v for c in chunks for v in arrays.unpack_i32(c.tokens.policy_versions).tolist()} == {7}
    request_id, prompt, params = manager.calls[0]
    assert prompt == [10, 11, 12] and params["max_tokens"] == 4 and params["temperature"] == pytest.approx(0.7)
    assert request_id  # the gateway's own request id, passed through


class ScriptedSandbox(sandbox_pb2_grpc.SandboxServicer):
    """Stands in for the sandbox service + harness + proxy: one model call through the
    gateway named in the trial's harness options, captured in the real capture store."""

    def __init__(self, capture: str) -> None:
        self.capture = capture
        self.done: dict[str, float] = {}
        self.specs: list[sandbox_pb2.TrialSpec] = []
        self.tasks: list[asyncio.Future[None]] = []

    async def SubmitTrial(self, request, context):  # type: ignore[no-untyped-def]
        self.specs.append(request.spec)
        self.tasks.append(asyncio.ensure_future(self._run(request.spec)))
        return sandbox_pb2.SubmitTrialResponse(trial_id=request.spec.trial_id, created=True)

    async def _run(self, spec: sandbox_pb2.TrialSpec) -> None:
        prompt = [1, 2, 3]
        async with connect(spec.harness_options[val.GATEWAY_OPTION]) as channel:
            req = gateway_pb2.GenerateRequest(
                request_id=f"{spec.trial_id}-0",
                trial_id=spec.trial_id,
                thread="main",
                prompt_ids=arrays.pack_i32(prompt),
            )
            tokens = [c.tokens async for c in gateway_pb2_grpc.RolloutGatewayStub(channel).Generate(req)]
        ids = [i for t in tokens for i in arrays.unpack_i32(t.ids).tolist()]
        lps = [x for t in tokens for x in arrays.unpack_f32(t.logprobs).tolist()]
        vs = [v for t in tokens for v in arrays.unpack_i32(t.policy_versions).tolist()]
        async with connect(self.capture) as channel:
            stub = capture_pb2_grpc.CaptureStoreStub(channel)
            key = records_pb2.SegmentKey(run_id=spec.run_id, trial_id=spec.trial_id, thread="main")
            await stub.AppendSegment(
                capture_pb2.AppendSegmentRequest(
                    key=key,
                    thread_kind="main",
                    trainable=True,
                    prompt_ids=arrays.pack_i32(prompt),
                    tokens=arrays.make_tokens(ids, [1] * len(ids), lps, vs),
                    close=True,
                    task_id=spec.task_id,
                    group_id=spec.group_id,
                )
            )
            await stub.FinalizeTrajectory(
                capture_pb2.FinalizeTrajectoryRequest(
                    run_id=spec.run_id,
                    trial_id=spec.trial_id,
                    task_id=spec.task_id,
                    group_id=spec.group_id,
                    group_size=spec.group_size,
                    reward=1.0,
                    has_reward=True,
                    termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
                )
            )
        self.done[spec.trial_id] = 1.0

    async def GetTrial(self, request, context):  # type: ignore[no-untyped-def]
        state = sandbox_pb2.TRIAL_STATE_DONE if request.trial_id in self.done else sandbox_pb2.TRIAL_STATE_AGENT
        return sandbox_pb2.TrialStatus(
            trial_id=request.trial_id, state=state, reward=self.done.get(request.trial_id, 0)
        )


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[str]:
    server = await create_capture(CaptureSettings(store_dir=tmp_path / "store", fsync=False, shutdown_grace_s=0.2))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0.2)


@pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")
async def test_harness_agent_loop_runs_a_trial_and_returns_the_capture(
    capture: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import grpc
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    sandbox = ScriptedSandbox(capture)
    server = grpc.aio.server()
    sandbox_pb2_grpc.add_SandboxServicer_to_server(sandbox, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 64,
                    "response_length": 32,
                    "n": 2,
                }
            }
        }
    )
    manager = FakeServerManager()
    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", f"127.0.0.1:{port}")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", capture)
    monkeypatch.setenv("HARNESSRL_RUN_ID", "verl-run")
    (entry,) = OmegaConf.load(AGENT_LOOPS)
    # Exactly how verl's AgentLoopWorker builds an agent loop from agent_loop_config_path.
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=manager,
        tokenizer=AutoTokenizer.from_pretrained(paths.default_model_dir()),
        processor=None,
        hf_model_type="llama",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        tools=ToolListWrap([]),
    )
    assert isinstance(loop, val.HarnessAgentLoop)
    try:
        out = await loop.run(
            {"temperature": 1.0}, task_path="/tasks/hello", task_id="hello", uid="group-1", global_steps=3
        )
    finally:
        await server.stop(0)
        await val._GATEWAY.close()
    (spec,) = sandbox.specs
    assert (spec.task_path, spec.group_id, spec.group_size, spec.policy_version) == ("/tasks/hello", "group-1", 2, 3)
    assert out.prompt_ids == [1, 2, 3] and out.response_ids == [9, 10, 11, 12]
    assert out.response_logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert out.reward_score == 1.0 and out.extra_fields["harnessrl_policy_versions"] == [3] * 4
    assert len(manager.calls) == 1


def test_hydra_config_composes_with_verls_fully_async_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import verl.experimental.fully_async_policy as fully_async
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:2")
    overrides = [f"hydra.searchpath=[pkg://verl.trainer.config,file://{STACK_VERL}]", "+harnessrl@_global_=fully_async"]
    with initialize_config_dir(config_dir=str(Path(fully_async.__file__).parent / "config"), version_base=None):
        cfg = compose(config_name="fully_async_ppo_trainer", overrides=overrides)
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == val.AGENT_NAME
    assert cfg.async_training.partial_rollout and cfg.algorithm.adv_estimator == "grpo"
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own schema check
    assert actor.policy_loss.loss_mode == "gspo" and actor.clip_ratio_high == pytest.approx(4e-4)
    from verl.utils.import_utils import resolve_config_path

    monkeypatch.chdir(STACK_VERL.parent.parent)  # launched from the repository root
    assert Path(resolve_config_path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)) == AGENT_LOOPS
