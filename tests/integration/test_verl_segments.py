"""Every trainable segment of a trajectory (earlier main segments before a
compaction, sub-agent threads) against verl's own classes on CPU: as a list of
AgentLoopOutput rows (verl's v1 worker) or, for verl's classic worker that takes
one row per sample, one row plus a count of the dropped ones that reaches verl's
step metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from harnessrl import paths
from stack import verl_hooks
from stack import verl_outputs as vo
from tests.trainer_support import TR, segment, trajectory
from tests.verl_support import compute_advantage, verl_batch, verl_worker


def compacted(tid: str = "t", reward: float = 1.0, long_sub: bool = False) -> Any:
    """main/0 (before a compaction), main/1 (after), a trainable sub-agent thread and
    an excluded title thread."""
    sub_ids = [7] * (20 if long_sub else 2)
    return trajectory(
        tid,
        "g",
        reward,
        [
            segment([1, 2], [3, 4], [1, 1], [-1.0, -1.25], index=0),
            segment([1, 9], [5, 6, 7], [1, 0, 1], [-0.2, 0.0, -0.3], index=1),
            segment([8], sub_ids, [1] * len(sub_ids), [-0.4] * len(sub_ids), thread="sub-1"),
            segment([8], [9], [1], [-0.1], thread="title", trainable=False),
        ],
    )


def test_every_trainable_segment_is_a_row_with_the_trajectorys_reward_main_last() -> None:
    outs = vo.trajectory_to_outputs(compacted(), response_length=8, prompt_length=8)
    assert all(isinstance(o, AgentLoopOutput) for o in outs)
    assert [o.extra_fields["harnessrl_segment"] for o in outs] == ["sub-1/0", "main/0", "main/1"]
    assert [o.reward_score for o in outs] == [1.0, 1.0, 1.0]
    assert all(o.extra_fields["harnessrl_valid"] and o.extra_fields["harnessrl_trial_id"] == "t" for o in outs)
    sub, first, last = outs
    assert (first.prompt_ids, first.response_ids, first.response_logprobs) == ([1, 2], [3, 4], [-1.0, -1.25])
    assert (last.response_ids, last.response_mask) == ([5, 6, 7], [1, 0, 1])
    assert sub.response_ids == [7, 7]
    assert last.extra_fields["harnessrl_dropped_segments"] == 0
    assert [s["thread"] for s in last.extra_fields["harnessrl_segments"]] == ["title"], "untrained, carried"
    rows = [o.as_dict() for o in outs]  # verl's own conversion of each row to tensors (what its v1 worker stores)
    assert [r["responses"].tolist() for r in rows] == [[7, 7], [3, 4], [5, 6, 7]]


def test_a_segment_that_cannot_be_a_row_is_dropped_and_counted() -> None:
    outs = vo.trajectory_to_outputs(compacted(long_sub=True), response_length=8, prompt_length=8)
    assert [o.extra_fields["harnessrl_segment"] for o in outs] == ["main/0", "main/1"]
    assert outs[-1].extra_fields["harnessrl_dropped_segments"] == 1
    assert {s["thread"] for s in outs[-1].extra_fields["harnessrl_segments"]} == {"title", "sub-1"}


def test_an_untrainable_trial_is_one_masked_row_in_either_shape() -> None:
    failed = trajectory("x", "g", 1.0, [segment([1], [2], [1], [-1.0])], TR.TERMINATION_REASON_VERIFIER_ERROR)
    (row,) = vo.trajectory_to_outputs(failed, 8)
    assert row.extra_fields["harnessrl_masked"] == "infra:verifier_error" and row.response_mask == [0]
    assert vo.trajectory_to_output(failed, 8).extra_fields["harnessrl_masked"] == "infra:verifier_error"
    # The final segment too long: the whole trial is masked (its reward belongs to that segment).
    long_final = trajectory(
        "y", "g", 1.0, [segment([1], [2], [1], [-1.0]), segment([1], [3] * 9, [1] * 9, [-1.0] * 9, index=1)]
    )
    (row,) = vo.trajectory_to_outputs(long_final, 8)
    assert row.extra_fields["harnessrl_masked"] == "response_too_long"


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_one_row_per_trial_counts_the_dropped_segments_in_verls_step_metrics() -> None:
    """verl's classic worker (the fully-async trainer's) takes one row per sample: the
    main thread's last segment; the two other trainable segments are dropped, and
    the count reaches the metrics verl computes for the step."""
    from transformers import AutoTokenizer
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import metric_utils

    one = vo.trajectory_to_output(compacted("a"), 8, prompt_length=8)
    assert one.extra_fields["harnessrl_segment"] == "main/1" and one.response_ids == [5, 6, 7]
    assert one.extra_fields["harnessrl_dropped_segments"] == 2
    assert sorted(s["thread"] + f"/{s['index']}" for s in one.extra_fields["harnessrl_segments"]) == [
        "main/0",
        "sub-1/0",
        "title/0",
    ]
    other = vo.trajectory_to_output(compacted("b", reward=0.0), 8, prompt_length=8)
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    batch = await verl_batch(verl_worker(tokenizer, 8, 8), [one, other])
    batch.non_tensor_batch["uid"] = np.array(["g", "g"], dtype=object)
    batch.batch["token_level_scores"] = batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig())
    metrics = metric_utils.compute_data_metrics(batch=batch, use_critic=False)
    assert metrics["harnessrl/dropped_segments"] == 4.0 and metrics["harnessrl/masked_rows"] == 0.0
