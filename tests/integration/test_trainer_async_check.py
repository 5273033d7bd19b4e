"""The simulator predicts the real loop: a scaled-down async run (sleeping trials
through the real capture store and the real TrainingLoop with its admission)
against the simulator's prediction for the same parameters, sync and k = 1.

A model-accuracy check, not a speed assertion: trials last seconds so that
gRPC and scheduling overheads stay small, and the prediction is a mean over
seeds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.trainer.simulator import TrialDistribution
from stack.async_check import DEFAULT_CHECK, check


def test_simulator_predicts_a_real_async_run_within_20_percent() -> None:
    results = check(DEFAULT_CHECK, trial_mean_s=3.0, seeds=4)
    assert [r.staleness for r in results] == [0, 1]
    for r in results:
        assert r.throughput_error <= 0.20, r
        assert abs(r.measured_idle - r.predicted_idle) <= 0.15, r
    sync, k1 = results
    assert k1.measured_steps_per_hour > 1.3 * sync.measured_steps_per_hour  # async is really faster here


@pytest.mark.slow
def test_simulator_predicts_a_heavy_tailed_run_within_20_percent() -> None:
    """The reference p99 read as the verification's: lognormal agents, a few verifications hang."""
    cfg = replace(DEFAULT_CHECK, trials=TrialDistribution(tail="verify"))
    for r in check(cfg, trial_mean_s=3.0, seeds=8):
        assert r.throughput_error <= 0.20, r
