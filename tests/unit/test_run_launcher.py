"""The launcher's plan: deterministic ids and task choice (a resumed run plans the
same groups), every task used equally often; the progress line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from stack.launcher import TrialTemplate, plan_step, task_for
from stack.progress import Snapshot, step_line

TASKS = [Path(f"/pool/t{i}") for i in range(5)]


def test_plan_is_deterministic_and_names_groups_and_trials() -> None:
    groups = plan_step("run-a", 3, TASKS, 2, 4, seed=7)
    assert groups == plan_step("run-a", 3, TASKS, 2, 4, seed=7)
    assert [g[0].group_id for g in groups] == ["run-a-s00003-g0", "run-a-s00003-g1"]
    assert [t.trial_id for t in groups[1]] == [f"run-a-s00003-g1-{i}" for i in range(4)]
    assert all(len({t.task for t in g}) == 1 for g in groups)  # one task per group
    assert plan_step("run-a", 3, TASKS, 2, 4, seed=8) != groups or len(TASKS) == 1


def test_every_task_is_used_equally_often() -> None:
    used = Counter(task_for(TASKS, 0, slot) for slot in range(50))
    assert set(used.values()) == {10}
    first_pass = [task_for(TASKS, 0, slot) for slot in range(5)]
    assert sorted(first_pass) == TASKS  # each pass is a permutation


def test_spec_carries_the_run_settings() -> None:
    template = TrialTemplate("run-a", "mini-swe-agent", "M", 4, 3, 60.0, 30.0, {"config": "compact"})
    trial = plan_step("run-a", 0, TASKS, 1, 4, seed=0)[0][2]
    spec = template.spec(trial, policy_version=5)
    assert (spec.trial_id, spec.group_id, spec.group_size, spec.step) == (trial.trial_id, trial.group_id, 4, 0)
    assert (spec.policy_version, spec.max_turns, spec.agent_timeout_s) == (5, 3, 60.0)
    assert dict(spec.harness_options) == {"config": "compact"} and spec.task_id == trial.task.name


def test_progress_line() -> None:
    snap = Snapshot(2, 3, {"done": 8, "agent": 2}, {"completed": 6, "agent_timeout": 2}, {"reward/mean": 0.25}, "", 61)
    line = step_line(snap)
    assert line.startswith("step 2/3  reward 0.250  pearson -  trials done 8")
    assert "reasons [agent_timeout 2, completed 6]" in line and line.endswith("61s")
