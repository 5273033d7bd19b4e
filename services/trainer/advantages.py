"""Group-relative advantages, computed by verl's estimators.

One reward per trajectory (outcome supervision). Only valid trajectories enter
a group's statistics: an infrastructure failure is neither a success nor a
failure (invariant 5). Groups that cannot give a baseline (empty, all invalid,
fewer than ``min_valid_per_group`` valid) are skipped and counted, and so are
groups with equal rewards when ``drop_zero_variance_groups`` is set (DAPO's
dynamic-sampling filter, without its resampling: such a group has advantage 0
everywhere, so it moves nothing but the loss's denominator).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from harnessrl.errors import ConfigError
from services.trainer.samples import StepCounters, TrajectoryRow
from services.trainer.settings import ADV_ESTIMATORS, AlgoSettings


@dataclass(frozen=True)
class ScoredRow:
    """A valid trajectory kept for the loss, with its advantage."""

    row: TrajectoryRow
    advantage: float


def estimator(name: str):  # type: ignore[no-untyped-def]
    """verl's estimator by name; the error lists the outcome-only ones we support."""
    if name not in ADV_ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {name!r}; valid: {list(ADV_ESTIMATORS)}")
    return get_adv_estimator_fn(name)


def group_stats(group_id: str, rows: Sequence[TrajectoryRow], algo: AlgoSettings, counters: StepCounters) -> bool:
    """Counts the group's outcome distribution; False if it cannot be used."""
    counters.add("groups/seen")
    if not rows:
        counters.skip("empty_groups", "group", group=group_id)
        return False
    valid = [r for r in rows if r.valid]
    if not valid:
        counters.skip("all_invalid_groups", "group", group=group_id, size=len(rows))
        return False
    if len(valid) < algo.min_valid_per_group:
        counters.skip("too_few_valid_groups", "group", group=group_id, valid=len(valid))
        return False
    rewards = np.array([r.reward for r in valid])
    successes = int((rewards >= algo.success_threshold).sum())
    counters.add(f"groups/successes_{successes}_of_{len(valid)}")
    if np.ptp(rewards) == 0:
        counters.add("groups/zero_variance")
        if successes == 0:
            counters.add("groups/all_fail")
        elif successes == len(valid):
            counters.add("groups/all_pass")
        if algo.drop_zero_variance_groups:
            counters.add("skipped/zero_variance_groups")  # common and expected: counted, not logged
            return False
    counters.add("groups/used")
    return True


def score_groups(
    groups: Sequence[tuple[str, Sequence[TrajectoryRow]]], algo: AlgoSettings, counters: StepCounters
) -> list[ScoredRow]:
    """Advantages of every valid trajectory of every usable group, in input order."""
    kept = [(gid, r) for gid, rows in groups if group_stats(gid, rows, algo, counters) for r in rows if r.valid]
    if not kept:
        return []
    fn = estimator(algo.adv_estimator)
    rewards = torch.tensor([[r.reward] for _, r in kept], dtype=torch.float32)
    kwargs = {
        "token_level_rewards": rewards,
        "response_mask": torch.ones_like(rewards),
        "index": np.array([gid for gid, _ in kept], dtype=object),
        "epsilon": algo.adv_epsilon,
        "norm_adv_by_std_in_grpo": algo.norm_adv_by_std,
        "config": None,
    }
    accepted = inspect.signature(fn).parameters
    advantages, _ = fn(**{k: v for k, v in kwargs.items() if k in accepted})
    return [ScoredRow(r, float(a)) for (_, r), a in zip(kept, advantages[:, 0].tolist(), strict=True)]
