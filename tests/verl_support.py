"""verl's own batch assembly without Ray or servers, for the verl CPU tests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hydra
import numpy as np
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
)
from verl.trainer.ppo import core_algos
from verl.workers.rollout.replica import TokenOutput

STACK_VERL = Path(__file__).resolve().parents[1] / "stack" / "verl"
AGENT_LOOPS = STACK_VERL / "agent_loops.yaml"


class FakeServerManager:
    """verl's server manager interface (generate -> TokenOutput), deterministic."""

    def __init__(self, versions: tuple[int | None, int | None] | None = None) -> None:
        self.calls: list[tuple[str, list[int], dict[str, Any]]] = []
        # (min_global_steps, max_global_steps) each reply reports, as verl's server manager
        # does (llm_server.py); None: the keys are absent (a server that reports none).
        self.versions = versions

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        self.calls.append((request_id, prompt_ids, sampling_params))
        n = 4
        ids = [(sum(prompt_ids) + i) % 1000 + 3 for i in range(n)]
        routes = np.arange((len(prompt_ids) + n) * 2 * 2).reshape(-1, 2, 2) % 8
        extra: dict[str, Any] = {}
        if self.versions is not None:
            low, high = self.versions
            extra = {"global_steps": high, "min_global_steps": low, "max_global_steps": high}
        return TokenOutput(
            token_ids=ids,
            log_probs=[-0.5 - 0.1 * i for i in range(n)],
            routed_experts=routes.tolist(),
            extra_fields=extra,
        )


def agent_loop(
    manager: FakeServerManager,
    tokenizer: Any,
    prompt_length: int,
    response_length: int,
    *,
    max_model_len: int | None = None,
    adv_estimator: str = "harnessrl_grpo",
    **kw: Any,
) -> Any:
    """Exactly how verl's AgentLoopWorker builds an agent loop from agent_loop_config_path,
    with the sections of verl's trainer config the loop reads (the model is the default
    model; ``max_model_len`` None is verl's default: the model's own window)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from harnessrl import paths

    rollout = {"prompt_length": prompt_length, "response_length": response_length, "n": 2}
    rollout["max_model_len"] = max_model_len
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": rollout, "model": {"path": str(paths.default_model_dir())}},
            "algorithm": {"adv_estimator": adv_estimator},
        }
    )
    (entry,) = OmegaConf.load(AGENT_LOOPS)
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="llama",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        tools=ToolListWrap([]),
        **kw,
    )


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
