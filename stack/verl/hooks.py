"""What harnessrl adds to verl's trainer process (verl 0.9.1).

verl loads this module in every process of a run when it is named in
``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py`` imports the listed modules on
``import verl``); ``harnessrl verl prepare`` puts it in the Hydra override
``ray_kwargs.ray_init.runtime_env.env_vars``, so every Ray actor has it. It adds:

1. **The ``harnessrl_grpo`` advantage estimator** (``algorithm.adv_estimator=harnessrl_grpo``),
   registered with verl's ``register_adv_est``. It is verl's GRPO (group mean, std
   normalised, unbiased std, one score per row), except that a masked row is out of
   its group's statistics and gets advantage 0. verl hands an estimator only
   ``token_level_rewards``, ``response_mask``, ``index`` (the group uid) and the
   algorithm config, never ``non_tensor_batch``; the validity flag
   (``extra_fields["harnessrl_valid"]``) reaches it as the row's all-zero
   ``response_mask``: every row with ``harnessrl_valid`` False is built by
   ``verl_agent_loop.masked_output``, whose mask is all 0, and a valid row has at
   least one sampled token. So a masked row weighs 0 in the loss (verl multiplies
   by the mask) and, with this estimator, does not move its group's mean/std.
2. **harnessrl's counts in verl's step metrics.** verl's trainers compute a step's
   data metrics with ``metric_utils.compute_data_metrics(batch)`` (the classic,
   separated/fully-async and v1 trainers alike) and offer no other hook for them;
   this module wraps that one function (the wrapper returns verl's metrics
   unchanged plus ``harnessrl/*`` keys computed from the batch's
   ``non_tensor_batch``): rows, masked rows, masked rows per reason, dropped
   segments (``harnessrl_dropped_segments``, see ``verl_agent_loop``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos, metric_utils

ESTIMATOR = "harnessrl_grpo"
METRIC_PREFIX = "harnessrl/"


def valid_rows(response_mask: torch.Tensor) -> torch.Tensor:
    """bool [bsz]: rows that train (a masked harnessrl row has an all-zero mask)."""
    return response_mask.sum(dim=-1) > 0


@core_algos.register_adv_est(ESTIMATOR)
def compute_harnessrl_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO over each group's valid rows only; masked rows get advantage 0.

    Returns (advantages, returns), both [bsz, response_length], as verl's
    estimators do. A group with one valid row has mean 0 and std 1 (verl's rule).
    """
    norm = bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True
    scores = token_level_rewards.sum(dim=-1)
    valid = valid_rows(response_mask)
    groups: dict[Any, list[int]] = {}
    for i in range(scores.shape[0]):
        if bool(valid[i]):
            groups.setdefault(index[i], []).append(i)
    out = torch.zeros_like(scores)
    with torch.no_grad():
        for rows in groups.values():
            group = scores[rows]
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = torch.mean(group), torch.std(group)
            out[rows] = (group - mean) / (std + epsilon) if norm else group - mean
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def harnessrl_metrics(batch: Any) -> dict[str, float]:
    """``harnessrl/*`` counts of one training batch (a verl DataProto); {} when no
    row comes from harnessrl's agent loop."""
    nt = getattr(batch, "non_tensor_batch", None) or {}
    if "harnessrl_valid" not in nt:
        return {}
    flags = [v for v in nt["harnessrl_valid"] if v is not None]
    if not flags:
        return {}
    masked = [str(w) for w, v in zip(nt.get("harnessrl_masked", [""] * len(flags)), flags, strict=False) if not v]
    dropped = sum(int(d or 0) for d in nt.get("harnessrl_dropped_segments", []))
    out = {
        "rows": float(len(flags)),
        "masked_rows": float(len(masked)),
        "masked_fraction": len(masked) / len(flags),
        "dropped_segments": float(dropped),
    }
    # One key per reason (masked/response_too_long, masked/infra/verifier_error, ...) and
    # masked/infra for all infrastructure reasons together (invariant 5: counted, not hidden).
    reasons = Counter((w or "unknown").replace(":", "/") for w in masked)
    reasons["infra"] = sum(n for w, n in reasons.items() if w.startswith("infra/"))
    out |= {f"masked/{why}": float(n) for why, n in reasons.items()}
    return {METRIC_PREFIX + k: v for k, v in out.items()}


def _wrap(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**original(batch, *args, **kwargs), **harnessrl_metrics(batch)}

    compute_data_metrics.__wrapped__ = original  # type: ignore[attr-defined]
    compute_data_metrics.harnessrl = True  # type: ignore[attr-defined]
    return compute_data_metrics


def install_metrics() -> None:
    """Wraps verl's ``compute_data_metrics`` once, where it is defined and in every
    already-imported module that took it by name (later imports get the wrapper)."""
    original = metric_utils.compute_data_metrics
    if getattr(original, "harnessrl", False):
        return
    wrapped = _wrap(original)
    metric_utils.compute_data_metrics = wrapped  # type: ignore[assignment]
    for module in list(sys.modules.values()):
        if getattr(module, "compute_data_metrics", None) is original:
            module.compute_data_metrics = wrapped  # type: ignore[attr-defined]


install_metrics()
