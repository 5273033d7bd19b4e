"""The async simulator: calibrated to the reference trial distribution, k = 0 is
synchronous, staleness is bounded, and a CLI table prints."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from services.trainer.bench import trial_calibration
from services.trainer.simulator import SimConfig, TrialDistribution, simulate

SMALL = SimConfig(tasks_per_step=8, group_size=4, workers=64, steps=8, train_s=300, sync_s=30)


def test_trial_distribution_matches_the_reference() -> None:
    cal = trial_calibration(TrialDistribution(), n=100_000)
    assert cal["mean_trial_s"] == pytest.approx(920, rel=0.03)
    assert cal["agent_frac"] == pytest.approx(0.91, abs=0.01)
    assert cal["setup_frac"] == pytest.approx(0.023, abs=0.003)
    assert cal["verify_frac"] == pytest.approx(0.039, abs=0.004)
    assert cal["verify_p99_s"] == pytest.approx(928, rel=0.05)


def test_sync_waits_for_every_rollout_and_never_trains_stale() -> None:
    r = simulate(replace(SMALL, staleness=0))
    assert r.steps == 8 and r.dropped_groups == 0 and r.mean_staleness == 0
    # Sync: each step lasts at least the slowest trial plus training and sync.
    assert r.seconds >= 8 * (300 + 30)
    assert r.trainer_idle_fraction == pytest.approx(1 - 8 * 330 / r.seconds)


def test_async_is_faster_and_staleness_stays_bounded() -> None:
    sync = simulate(replace(SMALL, staleness=0))
    for k in (1, 2, 3):
        r = simulate(replace(SMALL, staleness=k))
        assert r.steps_per_hour > sync.steps_per_hour
        assert r.trainer_idle_fraction < sync.trainer_idle_fraction
        assert 0 <= r.mean_staleness <= k


def test_partial_rollout_off_pays_the_drain() -> None:
    on = simulate(replace(SMALL, staleness=2, partial_rollout=True))
    off = simulate(replace(SMALL, staleness=2, partial_rollout=False, call_mean_s=120))
    assert off.steps_per_hour < on.steps_per_hour


def test_deterministic_for_a_seed() -> None:
    assert simulate(SMALL) == simulate(SMALL)


def test_bench_async_prints_a_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "bench", "async", "--steps", "3", "--tasks", "4", "--workers", "64"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "sync" in proc.stdout and "async k=3" in proc.stdout and "vs sync" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "harnessrl", "bench", "async", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "steps" in bad.stderr
