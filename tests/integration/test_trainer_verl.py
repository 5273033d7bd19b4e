"""The verl cluster path on CPU, against verl's own classes: the agent loop is in
verl's registry, its engine adapter serves verl's server manager behind a real
gateway, a trial runs through the sandbox contract and comes back from the real
capture store as verl's AgentLoopOutput. What needs GPUs is in stack/verl/README.md."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    _agent_loop_registry,
)

from harnessrl import arrays, paths
from harnessrl.errors import InvalidArgument
from harnessrl.rpc import connect
from harnessrl.v1 import (
    gateway_pb2,
    gateway_pb2_grpc,
)
from services.gateway.engines.scripted import read_generation_log
from stack.verl import agent_loop as val
from tests.trainer_support import TR, segment, trajectory
from tests.verl_support import AGENT_LOOPS, STACK_VERL, FakeServerManager, agent_loop, verl_batch, verl_worker


def test_agent_loop_is_registered_with_verl() -> None:
    assert _agent_loop_registry[val.AGENT_NAME] == {"_target_": "stack.verl.agent_loop.HarnessAgentLoop"}
    # The name verl's agent-loop YAML gave before the room existed still instantiates it.
    from hydra.utils import get_class

    assert get_class("stack.verl_agent_loop.HarnessAgentLoop") is val.HarnessAgentLoop


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
    assert out.extra_fields["harnessrl_dropped_segments"] == 1, "one trainable segment not trained, counted"
    batch = out.as_dict()  # verl's own conversion to training tensors
    assert batch["prompts"].tolist() == [5, 6, 7] and batch["responses"].tolist() == [8, 9, 10]
    assert torch.equal(batch["rollout_log_probs"], torch.tensor([-0.5, 0.0, -1.5]))
    assert batch["routed_experts"].shape == (6, 2, 2) and batch["routed_experts"][3:].tolist() == routes.tolist()
    assert batch["rm_scores"].tolist() == [0.0, 0.0, 1.0]


async def test_every_outcome_is_a_well_formed_sample_and_untrainable_ones_weigh_zero() -> None:
    from transformers import AutoTokenizer

    routes = np.arange(2 * 2 * 2, dtype=np.uint8).reshape(2, 2, 2)
    good = trajectory("ok", "g", 1.0, [segment([1, 2], [3, 4], [1, 1], [-1.0, -2.0], routes=routes)])
    infra = trajectory("infra", "g", 1.0, [segment([1], [2], [1], [-1.0])], TR.TERMINATION_REASON_VERIFIER_ERROR)
    setup = trajectory("setup", "g", 0.0, [], TR.TERMINATION_REASON_ENV_SETUP_FAILED)
    setup.has_reward = False
    long = trajectory("long", "g", 1.0, [segment([1], [2] * 9, [1] * 9, [-1.0] * 9)])
    wide = trajectory("wide", "g", 1.0, [segment([1] * 9, [2], [1], [-1.0])])
    untrainable = trajectory("sub", "g", 1.0, [segment([1], [2], [1], [-1.0], trainable=False)])
    outs = [val.trajectory_to_output(t, 8, prompt_length=8, pad_id=0, route_shape=(2, 2)) for t in (good, infra)]
    outs += [
        val.trajectory_to_output(t, 8, prompt_length=8, route_shape=(2, 2)) for t in (setup, long, wide, untrainable)
    ]
    masked = {o.extra_fields["harnessrl_trial_id"]: o.extra_fields["harnessrl_masked"] for o in outs}
    assert masked == {
        "ok": "",
        "infra": "infra:verifier_error",
        "setup": "infra:env_setup_failed",
        "long": "response_too_long",
        "wide": "prompt_too_long",
        "sub": "no_trainable_segment",
    }
    for out in outs[1:]:
        assert out.response_mask == [0] and out.reward_score == 0.0 and out.extra_fields["harnessrl_valid"] is False
    assert outs[1].extra_fields["harnessrl_reward"] == 1.0, "the verifier's reward is reported, not trained"
    # verl's own worker turns them into one batch: nothing raises, masked rows weigh 0.
    batch = await verl_batch(verl_worker(AutoTokenizer.from_pretrained(paths.default_model_dir()), 8, 8), outs)
    mask = batch.batch["response_mask"]
    assert mask.shape == (6, 8) and mask[0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0] and int(mask[1:].sum()) == 0
    assert batch.batch["routed_experts"].shape == (6, 16, 2, 2)
    assert batch.batch["rm_scores"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert list(batch.non_tensor_batch["harnessrl_valid"]) == [True] + [False] * 5


async def test_engine_adapter_serves_verl_server_manager_through_a_real_gateway() -> None:
    manager = FakeServerManager()
    engine = val.VerlServerEngine(manager, vocab_size=49152, context_window=4096)
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


VERL_PARAMS = {"temperature": 0.6, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}


async def test_verls_sampling_params_govern_the_trials_calls() -> None:
    """What verl's worker passes to run() is what its replicas sample with, for every
    call of that trial, whatever the proxy asked; max tokens capped at verl's
    response_length; other trials keep their own."""
    manager = FakeServerManager()
    engine = val.VerlServerEngine(manager, vocab_size=49152, context_window=4096)
    engine.govern("t1", VERL_PARAMS, response_length=3)
    server, port = await val.serve_engine(engine)

    async def call(trial: str) -> None:
        async with connect(f"127.0.0.1:{port}") as channel:
            req = gateway_pb2.GenerateRequest(
                request_id=f"r-{trial}-{len(manager.calls)}",
                trial_id=trial,
                thread="main",
                prompt_ids=arrays.pack_i32([10, 11, 12]),
                sampling=gateway_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=64),
            )
            [c async for c in gateway_pb2_grpc.RolloutGatewayStub(channel).Generate(req)]

    try:
        await call("t1")
        await call("t2")
        engine.release("t1")
        await call("t1")
    finally:
        await server.stop(0)
    governed, other, released = (params for _, _, params in manager.calls)
    assert governed == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
        "max_tokens": 3,
    }
    assert other["temperature"] == 1.0 and other["max_tokens"] == 64 and "repetition_penalty" not in other
    assert released["temperature"] == 1.0


def test_malformed_verl_sampling_params_are_refused() -> None:
    engine = val.VerlServerEngine(FakeServerManager(), vocab_size=10, context_window=64)
    for bad in ({}, {"temperature": "hot"}, {"temperature": 1.0, "top_p": "x"}):
        with pytest.raises(InvalidArgument, match="numeric temperature"):
            engine.govern("t", bad, response_length=8)
    with pytest.raises(InvalidArgument, match="response_length"):
        engine.govern("t", VERL_PARAMS, response_length=0)


# The harness: one chat call with tools (the trial's main thread) through its proxy.
CALL = """set -e
python3 - <<'PY'
import json, os, urllib.request

tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
body = json.dumps({"model": os.environ["HARNESSRL_MODEL"], "tools": tools,
                   "messages": [{"role": "user", "content": "go"}]}).encode()
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60).read()
PY
echo hello > hello.txt
"""


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_harness_agent_loop_runs_real_trials_on_verls_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real path: the real sandbox (gRPC + worker + bubblewrap), the real proxy
    whose own gateway is a scripted engine (A), the real capture store. The trial's
    spec names the worker's gateway, so its model calls reach verl's server manager
    and none reach A; a failed setup and an over-long response are masked rows of
    one batch that verl's own worker assembles."""
    from transformers import AutoTokenizer

    from services.sandbox.server import create_sandbox_server
    from tests.sandbox_support import make_task, model_stack

    tasks = tmp_path / "tasks"
    good, broken = make_task(tasks, "good"), make_task(tasks, "broken", dockerfile="FROM x\nRUN exit 7\n")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    manager = FakeServerManager(versions=(3, 3))  # verl's replicas report the weights' version
    async with model_stack(tmp_path / "stack", {"*": [{"content": "from A"}]}) as stack:
        sandbox = await create_sandbox_server(stack.sandbox_settings(tmp_path, heartbeat_s=0.2, concurrency=3))
        monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", f"127.0.0.1:{sandbox.port}")
        monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", f"127.0.0.1:{stack.capture.port}")
        monkeypatch.setenv("HARNESSRL_RUN_ID", "verl-run")
        monkeypatch.setenv("HARNESSRL_HARNESS", "shell")
        options = {"harness_options": {"script": CALL}}
        loop = agent_loop(manager, tokenizer, prompt_length=4096, response_length=32, **options)
        short = agent_loop(manager, tokenizer, prompt_length=4096, response_length=2, **options)
        assert isinstance(loop, val.HarnessAgentLoop)
        params: dict[str, Any] = dict(VERL_PARAMS)
        try:
            outs = await asyncio.gather(
                # rows as `verl prepare` writes them: no global_steps
                loop.run(params, task_path=str(good), task_id="good", uid="g-good"),
                loop.run(params, task_path=str(broken), task_id="broken", uid="g-broken"),
                short.run(params, task_path=str(good), task_id="good", uid="g-good"),
            )
        finally:
            await sandbox.stop(0)
            await val._GATEWAY.close()
        on_a = read_generation_log(stack.engine_log) if stack.engine_log.exists() else []
    assert on_a == [], "no model call of a routed trial reaches the proxy's own gateway"
    ok, failed, too_long = outs
    assert ok.extra_fields["harnessrl_masked"] == "" and ok.reward_score == 1.0
    sampled = [[(sum(prompt) + k) % 1000 + 3 for k in range(4)] for _, prompt, _ in manager.calls]
    assert ok.response_ids in sampled, "the tokens verl's replicas sampled, as captured"
    assert ok.response_logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert ok.extra_fields["harnessrl_policy_versions"] == [3] * 4 and set(ok.response_mask) == {1}
    assert (ok.extra_fields["min_global_steps"], ok.extra_fields["max_global_steps"]) == (3, 3)
    assert failed.extra_fields["harnessrl_masked"] == "infra:env_setup_failed" and failed.response_mask == [0]
    assert too_long.extra_fields["harnessrl_masked"] == "response_too_long" and too_long.response_mask == [0]
    assert len(manager.calls) == 2, "the two trials that ran called verl's replicas once each"
    sticky = [request_id for request_id, _, _ in manager.calls]
    assert all(r.endswith("/main") and r.startswith("verl-") for r in sticky), sticky
    # verl's sampling params, not the proxy's (temperature 1.0), sampled the trials; max tokens
    # capped at each loop's response_length.
    assert [(p["temperature"], p["top_p"]) for _, _, p in manager.calls] == [(0.6, 0.9)] * 2
    assert sorted(p["max_tokens"] for _, _, p in manager.calls) == [2, 32]
    worker = verl_worker(tokenizer, 4096, 32)
    batch = await verl_batch(worker, [o.model_copy(update={"routed_experts": None}) for o in outs[:2]])
    assert batch.batch["response_mask"].sum(-1).tolist() == [4, 0]


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_an_unreachable_sandbox_is_a_masked_row_not_a_failed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_VERL_GATEWAY_ADDRESS", "localhost")  # the name the proxy is given
    loop = agent_loop(FakeServerManager(), AutoTokenizer.from_pretrained(paths.default_model_dir()), 64, 8)
    try:
        out = await loop.run(VERL_PARAMS, task_path="/tasks/x", task_id="x", uid="g")
        assert val._GATEWAY.target is not None and val._GATEWAY.target.startswith("localhost:")
        async with connect(val._GATEWAY.target) as channel:
            health = await gateway_pb2_grpc.RolloutGatewayStub(channel).Health(gateway_pb2.GatewayHealthRequest())
        assert health.context_window > 0
    finally:
        await val._GATEWAY.close()
    assert out.extra_fields["harnessrl_masked"] == "sandbox_error" and out.response_mask == [0]
    assert out.extra_fields["harnessrl_valid"] is False and out.reward_score == 0.0


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
    assert cfg.async_training.partial_rollout and cfg.algorithm.adv_estimator == "harnessrl_grpo"
    # verl repeats each prompt actor_rollout_ref.rollout.n times (the group); its own default is 1.
    assert cfg.actor_rollout_ref.rollout.n == cfg.rollout.n == 8
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own schema check
    assert actor.policy_loss.loss_mode == "gspo" and actor.clip_ratio_high == pytest.approx(4e-4)
    from verl.utils.import_utils import resolve_config_path

    monkeypatch.chdir(STACK_VERL.parent.parent)  # launched from the repository root
    assert Path(resolve_config_path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)) == AGENT_LOOPS


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_segments_all_returns_a_list_and_a_bad_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """segments: all (verl's v1 worker takes a list per session): even a failed trial is a
    list of one masked row; an unknown mode is refused when verl builds the loop."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:1")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    loop = agent_loop(FakeServerManager(), tokenizer, 64, 8, segments="all")
    try:
        outs = await loop.run(VERL_PARAMS, task_path="/tasks/x", task_id="x", uid="g")
    finally:
        await val._GATEWAY.close()
    assert isinstance(outs, list) and [o.extra_fields["harnessrl_masked"] for o in outs] == ["sandbox_error"]
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match="segments must be one of"):  # verl builds it with Hydra
        agent_loop(FakeServerManager(), tokenizer, 64, 8, segments="some")
