"""Policy losses: verl's own functions, on rows that are whole trajectories.

The CPU path and the verl cluster path share one loss: ``policy_loss`` calls
``verl.trainer.ppo.core_algos.get_policy_loss_fn`` and ``agg_loss`` unchanged.

Where a multi-segment trajectory needs more than verl gives
-------------------------------------------------------------
verl treats each row of its loss tensors as one sequence, and in verl's agent
loop one row is one prompt + response. GSPO's sequence ratio
``s_i = exp(mean_t log(pi/pi_old))`` must span *all policy tokens of a
trajectory*, and our trajectories have several segments (one per history
rewrite, invariant 3), each a separate forward pass with its own prompt. So
rows here are trajectories, not segments: ``RowLayout`` packs the policy
tokens (mask 1) of every segment of a trajectory, in order, into one row, and
only then calls verl. The forward passes stay per segment (see
``services/trainer/cpu_trainer.py``, which also makes the row-coupled loss exact
under micro-batching). The same packing makes ``seq-mean-*`` aggregation
average over trajectories, as GRPO's "per response" mean intends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.workers.config import ActorConfig, PolicyLossConfig

from services.trainer.settings import AlgoSettings

# Our loss names -> (verl policy loss, default aggregation). "grpo" is the
# token-level clipped objective with a per-sequence mean, as in the GRPO paper.
LOSSES = {
    "gspo": ("gspo", "seq-mean-token-mean"),
    "vanilla": ("vanilla", "token-mean"),
    "grpo": ("vanilla", "seq-mean-token-mean"),
}


def clip_range(algo: AlgoSettings) -> tuple[float, float]:
    """GSPO's ratios are sequence-level geometric means, hence its much tighter default clip."""
    low_default, high_default = (3e-4, 4e-4) if algo.loss_mode == "gspo" else (0.2, 0.28)
    low = algo.clip_ratio_low if algo.clip_ratio_low is not None else low_default
    high = algo.clip_ratio_high if algo.clip_ratio_high is not None else high_default
    return low, high


def agg_mode(algo: AlgoSettings) -> str:
    return algo.loss_agg_mode or LOSSES[algo.loss_mode][1]


@lru_cache(maxsize=32)
def _actor_config(loss: str, agg: str, low: float, high: float, clip_c: float, scale: int | None) -> ActorConfig:
    return ActorConfig(
        strategy="cpu",
        rollout_n=1,  # unused by the losses; required by the config
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=clip_c,
        loss_agg_mode=agg,
        loss_scale_factor=scale,
        use_torch_compile=False,
        policy_loss=PolicyLossConfig(loss_mode=loss),
    )


def actor_config(algo: AlgoSettings) -> ActorConfig:
    low, high = clip_range(algo)
    return _actor_config(
        LOSSES[algo.loss_mode][0], agg_mode(algo), low, high, algo.clip_ratio_c, algo.loss_scale_factor
    )


@dataclass(frozen=True)
class RowLayout:
    """Where each sample's policy tokens sit in the [rows, width] loss tensors."""

    num_rows: int
    width: int
    # Per sample, in the order given: (row, first column, number of policy tokens).
    placements: tuple[tuple[int, int, int], ...]

    @classmethod
    def build(cls, rows_of_samples: Sequence[int], policy_tokens: Sequence[int], num_rows: int) -> RowLayout:
        used = [0] * num_rows
        placements = []
        for row, n in zip(rows_of_samples, policy_tokens, strict=True):
            placements.append((row, used[row], n))
            used[row] += n
        return cls(num_rows, max(used, default=0), tuple(placements))

    def scatter(self, per_sample: Sequence[torch.Tensor], fill: float = 0.0) -> torch.Tensor:
        """Per-sample vectors of policy-token values -> a [rows, width] tensor (differentiable)."""
        ref = per_sample[0] if per_sample else torch.zeros(0)
        out = torch.full((self.num_rows, self.width), fill, dtype=ref.dtype)
        index = []
        for row, start, n in self.placements:
            index.append(row * self.width + torch.arange(start, start + n))
        if not index:
            return out
        flat = out.view(-1).index_put((torch.cat(index),), torch.cat(list(per_sample)))
        return flat.view(self.num_rows, self.width)

    def gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """The inverse of ``scatter``."""
        return [rows[row, start : start + n] for row, start, n in self.placements]

    def mask(self) -> torch.Tensor:
        return self.scatter([torch.ones(n) for _, _, n in self.placements])


@dataclass(frozen=True)
class LossInputs:
    """[rows, width] tensors; rows are trajectories, columns their policy tokens."""

    log_prob: torch.Tensor  # current training weights (carries the gradient)
    old_log_prob: torch.Tensor  # proximal policy: training weights at step start
    rollout_log_prob: torch.Tensor  # the engine's sampled logprobs (per-token policy version)
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_log_prob: torch.Tensor | None = None


def is_weights(inp: LossInputs, algo: AlgoSettings) -> torch.Tensor | None:
    """Truncated importance weights exp(old - rollout), capped at ``tis_cap``.

    This corrects both train/inference numerics and staleness: each token's
    rollout logprob comes from the policy version that sampled it, so a
    response that spans a weight update (partial rollout) is corrected token
    by token.
    """
    if algo.proximal == "rollout" or algo.tis_cap is None:
        return None
    log_w = (inp.old_log_prob - inp.rollout_log_prob).detach() * inp.mask
    if algo.tis_level == "sequence":
        log_w = (log_w.sum(-1, keepdim=True) / inp.mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(log_w)
    return torch.exp(log_w.clamp(max=20.0)).clamp(max=algo.tis_cap) * inp.mask


def policy_loss(inp: LossInputs, algo: AlgoSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's scalar loss and its metrics, from verl's functions."""
    config = actor_config(algo)
    old = inp.rollout_log_prob if algo.proximal == "rollout" else inp.old_log_prob
    weights = is_weights(inp, algo)
    fn = get_policy_loss_fn(config.policy_loss.loss_mode)
    loss, verl_metrics = fn(
        old_log_prob=old,
        log_prob=inp.log_prob,
        advantages=inp.advantages,
        response_mask=inp.mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=weights,
    )
    metrics: dict[str, Any] = {f"loss/{k.removeprefix('actor/')}": v for k, v in verl_metrics.items()}
    metrics["loss/pg"] = float(loss.detach())
    if weights is not None and algo.tis_cap is not None:
        n = inp.mask.sum().clamp(min=1)
        metrics["loss/is_weight_mean"] = float((weights.sum() / n).detach())
        metrics["loss/is_clipped_frac"] = float((((weights >= algo.tis_cap) * inp.mask).sum() / n).detach())
    if algo.kl_coef > 0 and inp.ref_log_prob is not None:
        kl = kl_penalty(inp.log_prob, inp.ref_log_prob, algo.kl_type)  # type: ignore[arg-type]
        kl_loss = agg_loss(loss_mat=kl, loss_mask=inp.mask, loss_agg_mode=config.loss_agg_mode)
        loss = loss + algo.kl_coef * kl_loss
        metrics["loss/kl"] = float(kl_loss.detach())
    metrics["loss/total"] = float(loss.detach())
    return loss, metrics
