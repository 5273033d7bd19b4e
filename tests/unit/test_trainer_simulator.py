"""The async simulator: calibrated to the reference trial distribution, driven by the
loop's own admission policy, k = 0 is synchronous, staleness is bounded, the k = 1
pipeline bound holds, and a CLI table prints."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from services.trainer.bench import fluid_bound, trial_calibration
from services.trainer.simulator import SimConfig, TrialDistribution, simulate

SMALL = SimConfig(tasks_per_step=8, group_size=4, workers=64, steps=8, train_s=300, sync_s=30)


@pytest.mark.parametrize("tail", ["trial", "verify"])
def test_trial_distribution_matches_the_reference(tail: str) -> None:
    cal = trial_calibration(TrialDistribution(tail=tail), n=100_000)  # type: ignore[arg-type]
    assert cal["mean_trial_s"] == pytest.approx(920, rel=0.03)
    assert cal["agent_frac"] == pytest.approx(0.91, abs=0.01)
    assert cal["setup_frac"] == pytest.approx(0.023, abs=0.003)
    assert cal["verify_frac"] == pytest.approx(0.039, abs=0.004)
    p99 = cal["trial_p99_s"] if tail == "trial" else cal["verify_p99_s"]
    assert p99 == pytest.approx(928, rel=0.05)


def test_sync_waits_for_every_rollout_and_never_trains_stale() -> None:
    r = simulate(replace(SMALL, staleness=0))
    assert r.steps == 8 and r.dropped_groups == 0 and r.mean_staleness == 0 and r.max_staleness == 0
    # Sync: each step lasts at least the slowest trial plus training and sync.
    assert r.seconds >= 8 * (900 + 300 + 30)
    assert r.trainer_idle_fraction == pytest.approx(1 - 8 * 330 / r.seconds)


@pytest.mark.parametrize("tail", ["trial", "verify"])
def test_async_is_faster_and_staleness_stays_bounded(tail: str) -> None:
    base = replace(SMALL, trials=TrialDistribution(tail=tail))  # type: ignore[arg-type]
    sync = simulate(replace(base, staleness=0))
    for k in (1, 2, 3):
        r = simulate(replace(base, staleness=k))
        assert r.steps_per_hour > sync.steps_per_hour
        assert r.trainer_idle_fraction < sync.trainer_idle_fraction
        assert r.dropped_groups == 0 and 0 <= r.mean_staleness <= r.max_staleness <= k
        assert 0 < r.mean_slots_busy <= 1


def test_k1_respects_the_pipeline_bound_and_the_fleet_bounds_throughput() -> None:
    cfg = SimConfig(steps=14)
    sync = simulate(replace(cfg, staleness=0)).steady_steps_per_hour
    for k in (1, 2):
        r = simulate(replace(cfg, staleness=k))
        bound_x, bound_idle = fluid_bound(cfg, k)
        assert r.steady_steps_per_hour / sync <= bound_x * 1.02
        assert r.steady_idle_fraction >= bound_idle - 0.02
    assert fluid_bound(cfg, 1)[0] <= 2.0
    half_fleet = simulate(replace(cfg, staleness=2, workers=512)).steady_steps_per_hour
    assert half_fleet < simulate(replace(cfg, staleness=2)).steady_steps_per_hour


def test_partial_rollout_off_pays_the_drain() -> None:
    on = simulate(replace(SMALL, staleness=2, partial_rollout=True))
    off = simulate(replace(SMALL, staleness=2, partial_rollout=False, call_mean_s=120))
    assert off.steps_per_hour < on.steps_per_hour


def test_deterministic_for_a_seed() -> None:
    assert simulate(SMALL) == simulate(SMALL)


def test_bench_async_prints_a_table() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    args = [sys.executable, "-m", "stack.cli", "bench", "async"]
    proc = subprocess.run(
        [*args, "--steps", "6", "--tasks", "4", "--workers", "64"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    for text in ("sync", "async k=3", "vs sync", "targets at k=1", "what reaches the targets"):
        assert text in proc.stdout
    for bad_args, word in ((["--steps", "1"], "steps"), (["--tail", "x"], "tail"), (["--workers", "4"], "workers")):
        bad = subprocess.run([*args, *bad_args], capture_output=True, text=True, timeout=60, env=env)
        assert bad.returncode == 2 and word in bad.stderr, bad.stderr
