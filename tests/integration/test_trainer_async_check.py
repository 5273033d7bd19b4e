"""The simulator's check against the real loop runs end to end: a scaled-down async
run (sleeping trials through the real capture store and the real TrainingLoop with
its admission) beside the simulator's prediction for the same parameters, sync and
k = 1.

How close the prediction comes is a measurement of speed on a shared machine, so
it is a bench, not an assertion: ``harnessrl bench async --check`` (and
``--tail verify`` for the heavy-tailed run) prints measured and predicted side by
side with the 20 % target. Here: the check yields one sane row per staleness."""

from __future__ import annotations

import math
import re

import pytest

from stack.bench.async_check import DEFAULT_CHECK, check
from tests.cli_support import run_cli


def test_the_check_measures_a_real_loop_beside_its_prediction() -> None:
    results = check(DEFAULT_CHECK, trial_mean_s=1.0, seeds=1)
    assert [r.staleness for r in results] == [0, 1]
    for r in results:
        assert r.measured_steps_per_hour > 0 and r.predicted_steps_per_hour > 0, r
        assert math.isfinite(r.throughput_error), r
        assert 0 <= r.predicted_idle <= 1 and r.measured_idle <= 1, r


@pytest.mark.slow
def test_bench_async_check_prints_the_heavy_tailed_run_beside_its_prediction() -> None:
    """Where the 20 % comparison lives now: the bench prints it, with the target, for
    the reference p99 read as the verification's (lognormal agents, a few hang)."""
    proc = run_cli(
        "bench", "async", "--steps", "6", "--tasks", "4", "--tail", "verify", "--check", env={"COLUMNS": "240"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "simulator vs a real scaled run" in proc.stdout and "target <= 20 %" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if re.match(r"^\W*[01]\W", line)]
    assert len(rows) >= 2, proc.stdout
