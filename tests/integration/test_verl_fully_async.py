"""Rows of real trials (real sandbox, proxy and capture store; verl's server manager a
scripted stand-in that reports weight versions as verl's does) through the code of
verl's fully-async trainer that runs before a GPU is needed: its batch assembly
(``detach_utils.assemble_batch_from_rollout_samples``, what ``FullyAsyncTrainer``
calls on every batch), reward extraction, bypass-mode old log-probs, the advantage
(``ray_trainer.compute_advantage`` with ``harnessrl_grpo``) and the policy loss
(``core_algos``, GSPO) with its gradient. The actor's own forward pass (log-probs of
the current weights, FSDP/Megatron) is where a GPU is needed; the rollout log-probs
stand in for it here. Also: the engine's context window is verl's, a trial cut by it
ends ``context_overflow``, and an estimator that counts masked rows is refused."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from harnessrl import arrays, paths
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from stack.verl import agent_loop as val
from stack.verl import hooks as verl_hooks
from tests.integration.test_trainer_verl import CALL  # one chat call with tools: the main thread
from tests.verl_support import FakeServerManager, agent_loop, verl_worker

pytestmark = pytest.mark.skipif(
    not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"
)
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def shipped_config() -> Any:
    """verl's fully_async_ppo_trainer config with stack/verl/harnessrl/fully_async.yaml."""
    import verl.experimental.fully_async_policy as fully_async
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.verl_support import STACK_VERL

    search = f"hydra.searchpath=[pkg://verl.trainer.config,file://{STACK_VERL}]"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(fully_async.__file__).parent / "config"), version_base=None):
            return compose(config_name="fully_async_ppo_trainer", overrides=[search, "+harnessrl@_global_=fully_async"])
    finally:
        GlobalHydra.instance().clear()


async def fully_async_batch(tokenizer: Any, groups: list[list[Any]]) -> Any:
    """What the fully-async rollouter hands the trainer (one RolloutSample per task: its
    group's rows, as verl's worker post-processes them) and the trainer's own assembly."""
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample, assemble_batch_from_rollout_samples

    worker = verl_worker(tokenizer, 4096, 32)
    samples = []
    for i, group in enumerate(groups):
        rows = [
            await worker._agent_loop_postprocess(o.model_copy(update={"routed_experts": None}), False, raw_prompt=[])
            for o in group
        ]
        full = worker._postprocess(rows)
        full.non_tensor_batch["uid"] = np.array([f"uid_{i}"] * len(group), dtype=object)  # as the rollouter sets it
        samples.append(RolloutSample(full_batch=full, sample_id=f"s{i}", epoch=0, rollout_status={}))
    return assemble_batch_from_rollout_samples(samples, tokenizer, OmegaConf.create({}), None)


def train_step_until_the_gpu(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The fully-async trainer's CPU steps (separation/ray_trainer.py: _fit_compute_reward,
    _fit_compute_log_prob as its bypass mode does it, _fit_compute_advantage) and the actor's loss
    (core_algos) over log-probs that stand in for the actor's forward pass.
    Returns (loss, d loss / d log_prob)."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.reward import extract_reward
    from verl.utils.config import omega_conf_to_dataclass

    cfg = shipped_config()
    reward, _ = extract_reward(batch)
    batch.batch["token_level_scores"] = batch.batch["token_level_rewards"] = reward
    # _fit_compute_log_prob recomputes old_log_probs with the actor (a GPU); its bypass mode
    # substitutes the replicas' sampled logprobs, as here.
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    algo = omega_conf_to_dataclass(cfg.algorithm, dataclass_type=AlgoConfig)
    assert algo.adv_estimator == verl_hooks.ESTIMATOR, "the shipped config's estimator"
    batch = compute_advantage(batch, adv_estimator=algo.adv_estimator, num_repeat=2, config=algo)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # The GPU's part: the actor's log-probs of these tokens under the current weights.
    log_prob = batch.batch["old_log_probs"].clone().requires_grad_(True)
    loss_fn = core_algos.get_policy_loss_fn("gspo")
    loss, _ = loss_fn(
        old_log_prob=batch.batch["old_log_probs"],
        log_prob=log_prob,
        advantages=batch.batch["advantages"],
        response_mask=batch.batch["response_mask"],
        loss_agg_mode=actor.loss_agg_mode,
        config=actor,
    )
    loss.backward()
    assert log_prob.grad is not None
    return loss.detach(), log_prob.grad


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_real_rows_through_the_fully_async_trainers_batch_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    from services.sandbox.server import create_sandbox_server
    from tests.sandbox_support import make_task, model_stack

    tasks = tmp_path / "tasks"
    good = make_task(tasks, "good")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    # Every reply spans versions 2..3: verl resumed it across a weight sync (partial rollout).
    manager = FakeServerManager(versions=(2, 3))
    async with model_stack(tmp_path / "stack", {"*": [{"content": "from A"}]}) as stack:
        sandbox = await create_sandbox_server(stack.sandbox_settings(tmp_path, heartbeat_s=0.2, concurrency=4))
        monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", f"127.0.0.1:{sandbox.port}")
        monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", f"127.0.0.1:{stack.capture.port}")
        monkeypatch.setenv("HARNESSRL_HARNESS", "shell")
        options = {"harness_options": {"script": CALL}}
        loop = agent_loop(manager, tokenizer, 4096, 32, **options)
        short = agent_loop(manager, tokenizer, 4096, 2, **options)  # its trial's reply is too long: masked
        cut = agent_loop(FakeServerManager(), tokenizer, 4096, 32, max_model_len=16, **options)
        try:
            # Rows as `verl prepare` writes them (no global_steps).
            outs = await asyncio.gather(
                loop.run(PARAMS, task_path=str(good), task_id="good", uid="g1"),
                loop.run(PARAMS, task_path=str(good), task_id="good", uid="g1"),
                loop.run(PARAMS, task_path=str(good), task_id="good", uid="g2"),
                short.run(PARAMS, task_path=str(good), task_id="good", uid="g2"),
            )
            await val._GATEWAY.close()  # one window per worker: the next loop is another worker's
            overflow = await cut.run(PARAMS, task_path=str(good), task_id="good", uid="g3")
        finally:
            await sandbox.stop(0)
            await val._GATEWAY.close()

    # Versions are the replicas' (never the row's absent global_steps, never a silent 0).
    trained = outs[:3]
    assert [o.extra_fields["harnessrl_policy_versions"] for o in trained] == [[2] * 4] * 3, "each reply's oldest"
    assert all((o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"]) == (2, 3) for o in trained)
    masked = outs[3]
    assert masked.extra_fields["harnessrl_masked"] == "response_too_long"
    assert masked.extra_fields["min_global_steps"] == masked.extra_fields["max_global_steps"] == 3, "the latest"

    batch = await fully_async_batch(tokenizer, [outs[:2], outs[2:]])
    assert batch.meta_info["fully_async/partial/total_partial_num"] == 3, "the three resumed trials"
    assert batch.meta_info["fully_async/partial/max_partial_span"] == 1
    assert batch.batch["response_mask"].sum(-1).tolist() == [4, 4, 4, 0]
    loss, grad = train_step_until_the_gpu(batch)
    assert torch.isfinite(loss)
    adv = batch.batch["advantages"]
    assert adv[:2].abs().sum() == 0, "group g1: equal rewards, no advantage"
    # group g2: the masked row (reward 0) is out of its group's statistics: the valid row is a
    # group of one (verl's rule: mean 0, std 1), where verl's grpo would give it +0.71.
    assert adv[2, :4].tolist() == pytest.approx([1.0] * 4) and adv[3].abs().sum() == 0
    assert grad[3].abs().sum() == 0, "the masked row weighs 0"

    # A trial cut by verl's window (max_model_len 16): the gateway refused it before verl was
    # called, and the trial ends context_overflow, a policy reason (see VerlServerEngine).
    assert overflow.extra_fields["harnessrl_termination_reason"] == "TERMINATION_REASON_CONTEXT_OVERFLOW"


async def test_versions_come_from_verls_replicas_or_an_explicit_fallback() -> None:
    """Through a real gateway: a reply stamped with the version verl's replica reports
    (its oldest when the reply spans two); a replica that reports none gets the
    loop's ``initial_policy_version`` (explicit), and once one reported, the latest."""
    manager = FakeServerManager(versions=None)
    engine = val.VerlServerEngine(manager, vocab_size=49152, context_window=4096, initial_version=5)
    server, port = await val.serve_engine(engine)

    async def versions() -> set[int]:
        async with connect(f"127.0.0.1:{port}") as channel:
            req = gateway_pb2.GenerateRequest(
                request_id=f"r{len(manager.calls)}",
                trial_id="t1",
                thread="main",
                prompt_ids=arrays.pack_i32([10, 11, 12]),
                sampling=gateway_pb2.SamplingParams(temperature=1.0, max_tokens=4),
            )
            chunks = [c async for c in gateway_pb2_grpc.RolloutGatewayStub(channel).Generate(req)]
        return {v for c in chunks for v in arrays.unpack_i32(c.tokens.policy_versions).tolist()}

    try:
        assert await versions() == {5}, "no report: the explicit initial version"
        manager.versions = (7, 8)
        engine.govern("t1", PARAMS, response_length=4)
        assert await versions() == {7} and engine.latest("t1") == 8 and engine.policy_version == 8
        manager.versions = None
        assert await versions() == {8}, "a later reply without one: the latest reported"
    finally:
        await server.stop(0)


async def test_the_engines_window_is_verls(monkeypatch: pytest.MonkeyPatch) -> None:
    """actor_rollout_ref.rollout.max_model_len when set, else the model's own
    max_position_embeddings (verl's vLLM server's rule); the worker's gateway reports it."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:1")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    assert agent_loop(FakeServerManager(), tokenizer, 64, 8, max_model_len=1234).context_window == 1234
    loop = agent_loop(FakeServerManager(), tokenizer, 64, 8)
    assert loop.context_window == 8192, "SmolLM2's max_position_embeddings, not prompt + response length"
    try:
        await loop.run(PARAMS, task_path="/tasks/x", task_id="x", uid="g")
        assert val._GATEWAY.target is not None
        async with connect(val._GATEWAY.target) as channel:
            health = await gateway_pb2_grpc.RolloutGatewayStub(channel).Health(gateway_pb2.GatewayHealthRequest())
    finally:
        await val._GATEWAY.close()
    assert health.context_window == 8192


def test_an_estimator_that_counts_masked_rows_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra.errors import InstantiationException
    from transformers import AutoTokenizer

    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:1")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    for estimator in ("grpo", "gspo_not_ours"):
        with pytest.raises(InstantiationException, match=r"algorithm\.adv_estimator=harnessrl_grpo"):
            agent_loop(FakeServerManager(), tokenizer, 64, 8, adv_estimator=estimator)
    with pytest.raises(InstantiationException, match="max_model_len must be >= 2"):
        agent_loop(FakeServerManager(), tokenizer, 64, 8, max_model_len=1)


def test_a_window_that_cannot_be_told_is_refused_naming_the_setting(tmp_path: Path) -> None:
    from harnessrl.errors import InvalidArgument
    from stack.verl.checks import engine_context_window

    rollout = {"actor_rollout_ref": {"rollout": {"max_model_len": None}}}
    with pytest.raises(InvalidArgument, match=r"set actor_rollout_ref\.rollout\.max_model_len"):
        engine_context_window(OmegaConf.create(rollout))
    bad = OmegaConf.merge(rollout, {"actor_rollout_ref": {"model": {"path": str(tmp_path / "no-model")}}})
    with pytest.raises(InvalidArgument, match=r"cannot read max_position_embeddings of .*no-model"):
        engine_context_window(bad)
