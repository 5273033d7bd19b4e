"""What the verl agent loop checks in verl's own config when verl builds it: the
engine's real context window, and an advantage estimator that keeps masked rows out
of its group statistics. Each is a clear ``InvalidArgument`` (verl's Hydra
``instantiate`` wraps it) before any trial runs."""

from __future__ import annotations

import functools
from typing import Any

from harnessrl.errors import InvalidArgument

AGENT_NAME = "harnessrl_agent"


def engine_context_window(config: Any) -> int:
    """The window verl's replicas enforce, as verl's vLLM server computes it
    (``vLLMHttpServer._validate_configs``): ``actor_rollout_ref.rollout.max_model_len``
    when set, else the model's ``max_position_embeddings``. Not prompt_length +
    response_length: those bound verl's padded tensors, not what the engine accepts
    (a longer multi-turn context is a row too long, masked, not an engine refusal)."""
    from omegaconf import OmegaConf

    limit = OmegaConf.select(config, "actor_rollout_ref.rollout.max_model_len", default=None)
    if limit is not None:
        if int(limit) < 2:
            raise InvalidArgument(f"{AGENT_NAME}: actor_rollout_ref.rollout.max_model_len must be >= 2, got {limit}")
        return int(limit)
    path = OmegaConf.select(config, "actor_rollout_ref.model.path", default=None)
    if not path:
        raise InvalidArgument(
            f"{AGENT_NAME}: cannot tell verl's context window: set actor_rollout_ref.rollout.max_model_len "
            "(or actor_rollout_ref.model.path)"
        )
    remote = bool(OmegaConf.select(config, "actor_rollout_ref.model.trust_remote_code", default=False))
    return _model_window(str(path), remote)


# verl builds one agent loop per sample: the model's config is read once per worker process.
@functools.lru_cache(maxsize=8)
def _model_window(path: str, trust_remote_code: bool) -> int:
    from transformers import AutoConfig
    from verl.workers.rollout.utils import get_max_position_embeddings

    try:
        return get_max_position_embeddings(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
    except (OSError, ValueError) as e:
        raise InvalidArgument(
            f"{AGENT_NAME}: cannot read max_position_embeddings of {path} ({e}); "
            "set actor_rollout_ref.rollout.max_model_len"
        ) from e


def check_estimator(config: Any) -> None:
    """Refuses a run whose advantage estimator would count masked rows (reward 0, weight
    0) in their group's mean and std: every trial can end masked (an infrastructure
    failure), and only ``harnessrl_grpo`` leaves such rows out (``stack/verl/hooks.py``).
    A config that names no estimator (not verl's trainer) is not judged."""
    from omegaconf import OmegaConf

    from stack.verl.hooks import ESTIMATOR

    estimator = OmegaConf.select(config, "algorithm.adv_estimator", default=None)
    if estimator is not None and str(estimator) != ESTIMATOR:
        raise InvalidArgument(
            f"{AGENT_NAME}: algorithm.adv_estimator={estimator} counts masked rows (failed trials, reward 0) in "
            f"their group's statistics; use algorithm.adv_estimator={ESTIMATOR} with "
            "VERL_USE_EXTERNAL_MODULES=stack.verl.hooks (harnessrl verl prepare writes both)"
        )
