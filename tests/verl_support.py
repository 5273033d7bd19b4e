"""verl's own batch assembly without Ray or servers, for the verl CPU tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
from verl.trainer.ppo import core_algos


def verl_worker(tokenizer: Any, prompt_length: int, response_length: int) -> AgentLoopWorker:
    """verl's own AgentLoopWorker, without Ray and servers: only what its per-sample
    postprocess (padding, masks, routes, rm_scores) and batch assembly read."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.rollout_config = SimpleNamespace(prompt_length=prompt_length, response_length=response_length)  # type: ignore[assignment]
    worker.tokenizer, worker.processor, worker.mm_processor_kwargs = tokenizer, None, {}
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False  # type: ignore[assignment]
    return worker


async def verl_batch(worker: AgentLoopWorker, outputs: list[AgentLoopOutput]) -> Any:
    """The batch verl builds from these samples (what its trainer then reads)."""
    rows = [await worker._agent_loop_postprocess(o, False, raw_prompt=[]) for o in outputs]
    return worker._postprocess(rows)


def compute_advantage(batch: Any, adv_estimator: str, config: Any) -> Any:
    """verl's ``ray_trainer.compute_advantage``: GRPO by its own function, any other
    name through the registry with exactly these keyword arguments (its else branch)."""
    rewards, mask, uid = batch.batch["token_level_rewards"], batch.batch["response_mask"], batch.non_tensor_batch["uid"]
    if adv_estimator == "grpo":
        adv, ret = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        )
    else:
        fn = core_algos.get_adv_estimator_fn(adv_estimator)
        adv, ret = fn(token_level_rewards=rewards, response_mask=mask, config=config, index=uid)
    batch.batch["advantages"], batch.batch["returns"] = adv, ret
    return batch
