"""Advantages, losses and agreement against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import agg_loss

from harnessrl.errors import ConfigError
from services.trainer import agreement
from services.trainer.advantages import estimator, score_groups
from services.trainer.losses import LossInputs, RowLayout, clip_range, policy_loss
from services.trainer.samples import StepCounters, TrajectoryRow
from services.trainer.settings import AlgoSettings

SQRT3 = math.sqrt(3)


def rows(rewards: list[float], valid: list[bool] | None = None, group: str = "g") -> list[TrajectoryRow]:
    valid = valid or [True] * len(rewards)
    return [TrajectoryRow(f"{group}-{i}", group, r, v, ()) for i, (r, v) in enumerate(zip(rewards, valid, strict=True))]


def advantages(groups: list[tuple[str, list[TrajectoryRow]]], **algo: object) -> tuple[list[float], StepCounters]:
    counters = StepCounters()
    scored = score_groups(groups, AlgoSettings(**algo), counters)  # type: ignore[arg-type]
    return [s.advantage for s in scored], counters


def test_grpo_is_group_relative_and_std_normalised() -> None:
    # mean 0.5, unbiased std sqrt(1/3): (1 - 0.5) / 0.57735 = 0.866
    adv, counters = advantages([("g", rows([1, 0, 1, 0]))])
    assert adv == pytest.approx([SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2, -SQRT3 / 2], rel=1e-5)
    assert counters.counts["groups/successes_2_of_4"] == 1


def test_dr_grpo_and_rloo() -> None:
    adv, _ = advantages([("g", rows([1, 0, 1, 0]))], norm_adv_by_std=False)
    assert adv == pytest.approx([0.5, -0.5, 0.5, -0.5])
    # RLOO: r_i minus the mean of the others: 1 - 1/3 = 2/3
    adv, _ = advantages([("g", rows([1, 0, 1, 0]))], adv_estimator="rloo")
    assert adv == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3], rel=1e-5)


def test_invalid_trajectories_stay_out_of_group_statistics() -> None:
    # Group [1, 0, 0] + one verifier error: mean 1/3, std sqrt(1/3).
    adv, counters = advantages([("g", rows([1, 0, 0, 0], [True, True, True, False]))])
    assert len(adv) == 3
    assert adv == pytest.approx([(2 / 3) * SQRT3, -(1 / 3) * SQRT3, -(1 / 3) * SQRT3], rel=1e-5)
    assert counters.counts["groups/successes_1_of_3"] == 1


def test_degenerate_groups_are_counted_and_skipped() -> None:
    groups = [
        ("fail", rows([0, 0, 0], group="fail")),
        ("pass", rows([1, 1, 1], group="pass")),
        ("empty", []),
        ("invalid", rows([1, 0], [False, False], group="invalid")),
        ("lonely", rows([1, 0], [True, False], group="lonely")),
        ("ok", rows([1, 0], group="ok")),
    ]
    adv, counters = advantages(groups)
    c = counters.counts
    assert adv[:6] == [0.0] * 6  # zero-variance groups: no signal, but no crash
    assert len(adv) == 8
    assert c["groups/zero_variance"] == 2 and c["groups/all_fail"] == 1 and c["groups/all_pass"] == 1
    assert c["skipped/empty_groups"] == 1
    assert c["skipped/all_invalid_groups"] == 1
    assert c["skipped/too_few_valid_groups"] == 1
    assert c["groups/used"] == 3 and c["groups/seen"] == 6
    assert c["groups/successes_0_of_3"] == 1 and c["groups/successes_3_of_3"] == 1


def test_zero_variance_groups_leave_the_loss_when_asked() -> None:
    groups = [
        ("fail", rows([0, 0], group="fail")),
        ("ok", rows([1, 0], group="ok")),
        ("pass", rows([1, 1], group="pass")),
    ]
    kept, _ = advantages(groups)
    dropped, counters = advantages(groups, drop_zero_variance_groups=True)
    assert len(kept) == 6 and dropped == kept[2:4]  # the informative group's advantages are unchanged
    c = counters.counts
    assert c["skipped/zero_variance_groups"] == 2 and c["groups/zero_variance"] == 2 and c["groups/used"] == 1


def test_unknown_estimator_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match="grpo"):
        estimator("gae")


def loss_inputs(
    lp: list[list[float]],
    old: list[list[float]],
    adv: float | list[float],
    rollout: list[list[float]] | None = None,
) -> LossInputs:
    log_prob = torch.tensor(lp, requires_grad=True)
    a = torch.tensor(adv if isinstance(adv, list) else [adv] * len(lp)).unsqueeze(-1).expand_as(log_prob)
    return LossInputs(
        log_prob=log_prob,
        old_log_prob=torch.tensor(old),
        rollout_log_prob=torch.tensor(rollout if rollout is not None else old),
        advantages=a.clone(),
        mask=torch.ones_like(log_prob),
    )


def test_gspo_ratio_spans_every_segment_of_a_trajectory() -> None:
    # Two segments of one trajectory: log-ratios [0.1, -0.3] and [0.2]; mean 0, so s = 1 (unclipped).
    layout = RowLayout.build([0, 0], [2, 1], num_rows=1)
    lp = layout.scatter([torch.tensor([-0.9, -1.3]), torch.tensor([-0.8])]).requires_grad_()
    old = layout.scatter([torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])])
    inp = LossInputs(lp, old, old, torch.full((1, 3), 2.0), layout.mask())
    loss, _ = policy_loss(inp, AlgoSettings(tis_cap=None))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-2.0, rel=1e-6)  # -A * s
    assert lp.grad is not None
    assert lp.grad[0].tolist() == pytest.approx([-2 / 3] * 3, rel=1e-6)  # -A * s / |y|
    # Per segment (what verl alone would do) the first segment's ratio is exp(-0.1): outside GSPO's clip.
    seg_rows = RowLayout.build([0, 1], [2, 1], num_rows=2)
    lp2 = seg_rows.scatter([torch.tensor([-0.9, -1.3]), torch.tensor([-0.8])]).requires_grad_()
    old2 = seg_rows.scatter([torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])])
    loss2, _ = policy_loss(LossInputs(lp2, old2, old2, torch.full((2, 2), 2.0), seg_rows.mask()), AlgoSettings())
    assert float(loss2.detach()) != pytest.approx(-2.0, rel=1e-3)


def test_gspo_clips_the_sequence_ratio() -> None:
    # mean log-ratio 0.3 -> s = e^0.3 > 1 + 4e-4: clipped, constant, no gradient.
    inp = loss_inputs([[-0.7, -0.7]], [[-1.0, -1.0]], 1.5)
    loss, metrics = policy_loss(inp, AlgoSettings(tis_cap=None))
    loss.backward()
    low, high = clip_range(AlgoSettings())
    assert (low, high) == (3e-4, 4e-4)
    assert float(loss.detach()) == pytest.approx(-1.5 * (1 + high), rel=1e-6)
    assert inp.log_prob.grad is not None and inp.log_prob.grad.abs().max() == 0
    assert metrics["loss/pg_clipfrac"] == 1.0


def test_token_level_ppo_clip_and_dual_clip() -> None:
    algo = AlgoSettings(loss_mode="vanilla", tis_cap=None)
    # A = 1, ratios e^0.1 (inside) and e^0.5 (clipped at 1.28): token-mean of [-1.10517, -1.28]
    loss, _ = policy_loss(loss_inputs([[-0.9, -0.5]], [[-1.0, -1.0]], 1.0), algo)
    assert float(loss.detach()) == pytest.approx((-math.exp(0.1) - 1.28) / 2, rel=1e-6)
    # A = -1: ratio 0.5 -> max(0.5, 0.8) = 0.8; ratio 4 -> max(4, 1.28) = 4, dual clip min(4, c=3) = 3
    loss, _ = policy_loss(loss_inputs([[math.log(0.5), math.log(4.0)]], [[0.0, 0.0]], -1.0), algo)
    assert float(loss.detach()) == pytest.approx((0.8 + 3.0) / 2, rel=1e-6)


def test_grpo_loss_averages_per_trajectory_first() -> None:
    # ratio 1 everywhere; rows of 1 and 3 tokens with A = 1 and A = -1 (mask pads row 0).
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    inp = LossInputs(lp, torch.zeros(2, 3), torch.zeros(2, 3), adv, mask)
    grpo, _ = policy_loss(inp, AlgoSettings(loss_mode="grpo", tis_cap=None))
    vanilla, _ = policy_loss(inp, AlgoSettings(loss_mode="vanilla", tis_cap=None))
    assert float(grpo.detach()) == pytest.approx((-1 + 1) / 2)  # seq-mean-token-mean
    assert float(vanilla.detach()) == pytest.approx((-1 + 3) / 4)  # token-mean


def test_truncated_importance_weights() -> None:
    # old - rollout = [ln 3, ln 0.5] -> weights [min(3, 2), 0.5]; ratio 1, A = 1: mean(-2, -0.5)
    inp = loss_inputs([[-1.0, -1.0]], [[-1.0, -1.0]], 1.0, rollout=[[-1.0 - math.log(3), -1.0 + math.log(2)]])
    algo = AlgoSettings(loss_mode="vanilla", tis_cap=2.0)
    loss, metrics = policy_loss(inp, algo)
    assert float(loss.detach()) == pytest.approx(-1.25, rel=1e-6)
    assert metrics["loss/is_clipped_frac"] == 0.5
    seq, _ = policy_loss(inp, algo.model_copy(update={"tis_level": "sequence"}))
    # sequence level: exp(mean(ln 3, ln 0.5)) = sqrt(1.5) on both tokens
    assert float(seq.detach()) == pytest.approx(-math.sqrt(1.5), rel=1e-6)
    off, _ = policy_loss(inp, algo.model_copy(update={"tis_cap": None}))
    assert float(off.detach()) == pytest.approx(-1.0)


def test_proximal_rollout_uses_engine_logprobs_as_old_policy() -> None:
    inp = loss_inputs([[-1.0]], [[-1.0]], 1.0, rollout=[[-1.1]])
    loss, _ = policy_loss(inp, AlgoSettings(loss_mode="vanilla", proximal="rollout"))
    assert float(loss.detach()) == pytest.approx(-math.exp(0.1), rel=1e-6)


def test_kl_term_is_added() -> None:
    inp = loss_inputs([[-1.0, -2.0]], [[-1.0, -2.0]], 0.0)
    inp = LossInputs(**{**inp.__dict__, "ref_log_prob": torch.tensor([[-1.5, -2.5]])})
    loss, metrics = policy_loss(inp, AlgoSettings(loss_mode="vanilla", kl_coef=0.1, kl_type="k1", tis_cap=None))
    assert metrics["loss/kl"] == pytest.approx(0.5)
    assert float(loss.detach()) == pytest.approx(0.05)


def test_aggregation_modes() -> None:
    mat = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(agg_loss(mat, mask, "token-mean")) == pytest.approx(2.0)
    assert float(agg_loss(mat, mask, "token-sum")) == pytest.approx(6.0)
    assert float(agg_loss(mat, mask, "seq-mean-token-mean")) == pytest.approx(2.25)
    assert float(agg_loss(mat, mask, "seq-mean-token-sum")) == pytest.approx(3.0)
    assert float(agg_loss(mat, mask, "seq-mean-token-sum-norm")) == pytest.approx(1.0)


def test_row_layout_round_trip() -> None:
    layout = RowLayout.build([1, 0, 1], [2, 1, 3], num_rows=2)
    parts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0]), torch.tensor([4.0, 5.0, 6.0])]
    packed = layout.scatter(parts)
    assert packed.tolist() == [[3, 0, 0, 0, 0], [1, 2, 4, 5, 6]]
    assert [p.tolist() for p in layout.gather(packed)] == [[1, 2], [3], [4, 5, 6]]
    assert layout.mask().tolist() == [[1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_agreement_metrics() -> None:
    a = agreement.compute([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0 - math.log(3)])
    assert a.tokens == 3
    assert a.max_abs_diff == pytest.approx(math.log(3))
    assert a.mean_abs_diff == pytest.approx(math.log(3) / 3)
    # weights [1, 1, 3]: (5)^2 / (3 * 11)
    assert a.ess == pytest.approx(25 / 33)
    assert a.log_ratio_quantiles[0.5] == pytest.approx(0.0)
    assert agreement.compute([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]).pearson == pytest.approx(1.0)
    assert agreement.alerts(a, 0.9999, 0.9) and not agreement.alerts(a, 0.5, 0.5)
    empty = agreement.compute([], [])
    assert empty.tokens == 0 and not agreement.alerts(empty, 0.99, 0.9)
    assert np.isnan(empty.pearson)
