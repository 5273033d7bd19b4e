"""``harnessrl eval``'s rows: a trial that completed with several rewards and none chosen
(Harbor's multi-key reward.json, [run] reward_key / reward_weights unset) is ``unscored``:
neither a success nor a failure, not in pass@k, each key's mean shown; an infrastructure
failure is counted apart from both."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.v1 import records_pb2, sandbox_pb2
from stack.evaluate import EvalResult, overall_row, summary_lines, task_row


def status(reason: int, reward: float | None = None, **rewards: float) -> sandbox_pb2.TrialStatus:
    s = sandbox_pb2.TrialStatus(termination_reason=reason, rewards=rewards)
    if reward is not None:
        s.has_reward, s.reward = True, reward
        s.rewards["reward"] = reward
    return s


COMPLETED = records_pb2.TERMINATION_REASON_COMPLETED


def test_several_rewards_and_none_chosen_are_unscored_not_failures() -> None:
    statuses = [
        status(COMPLETED, correctness=1.0, performance=0.5),
        status(COMPLETED, correctness=0.0, performance=1.0),
        status(COMPLETED, 1.0),
        status(records_pb2.TERMINATION_REASON_MAX_TURNS, 0.0),
        status(records_pb2.TERMINATION_REASON_VERIFIER_ERROR),
    ]
    row = task_row(0, "t", 2, statuses, threshold=1.0)
    assert (row["n"], row["successes"], row["unscored"], row["infra_failures"]) == (2, 1, 2, 1)
    assert row["pass@1"] == pytest.approx(0.5)  # over the 2 scored trials only
    assert row["rewards"] == {"correctness": 0.5, "performance": 0.75, "reward": 0.5}
    assert row["termination"] == {"completed": 3, "max_turns": 1, "verifier_error": 1}
    overall = overall_row(0, 2, [row, task_row(0, "u", 2, [status(COMPLETED, 1.0)], threshold=1.0)])
    assert (overall["n"], overall["successes"], overall["unscored"], overall["infra_failures"]) == (3, 2, 2, 1)
    lines = summary_lines(EvalResult(Path("/runs/r"), 0, 2, [row, overall]))
    assert any("rewards: correctness 0.500, performance 0.750" in line for line in lines), lines
    assert any(
        "2 completed trial(s) with several rewards and none chosen: not in n; set [run] reward_key" in line
        for line in lines
    ), lines


def test_a_single_reward_task_has_no_unscored_line() -> None:
    row = task_row(0, "t", 1, [status(COMPLETED, 1.0), status(COMPLETED, 0.0)], threshold=1.0)
    assert (row["n"], row["unscored"]) == (2, 0) and "rewards" not in row
    assert not any("none chosen" in line for line in summary_lines(EvalResult(Path("/r"), 0, 1, [row])))
