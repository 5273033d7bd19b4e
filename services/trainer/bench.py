"""Benchmarks of the trainer: ``harnessrl bench async`` (the simulator: sync vs
async, staleness 0-3, partial rollout on/off) and ``harnessrl bench trainer``
(CPU training tokens/s and peak memory of SmolLM2 at 1k and 4k tokens/sample)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from services.trainer.simulator import SimConfig, SimResult, TrialDistribution, simulate

# -- async (simulated) ------------------------------------------------------------------------


def trial_calibration(dist: TrialDistribution, n: int = 200_000, seed: int = 0) -> dict[str, float]:
    """What the sampled trial distribution really looks like (to check it against the reference)."""
    phases = dist.sample(np.random.default_rng(seed), n)
    total = phases.sum(1)
    return {
        "mean_trial_s": float(total.mean()),
        "agent_frac": float(phases[:, 1].sum() / total.sum()),
        "setup_frac": float(phases[:, 0].sum() / total.sum()),
        "verify_frac": float(phases[:, 2].sum() / total.sum()),
        "verify_p99_s": float(np.quantile(phases[:, 2], 0.99)),
        "trial_p99_s": float(np.quantile(total, 0.99)),
    }


def async_table(base: SimConfig) -> list[tuple[str, SimResult]]:
    """Sync (k = 0) first: the baseline every other row is compared with."""
    rows = [("sync", simulate(replace(base, staleness=0, partial_rollout=True)))]
    for k in (1, 2, 3):
        for partial in (True, False):
            rows.append((f"async k={k}", simulate(replace(base, staleness=k, partial_rollout=partial))))
    return rows


# -- trainer (measured) -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerRow:
    tokens_per_sample: int
    samples: int
    checkpointing: bool
    seconds: float
    tokens_per_s: float
    peak_rss_gib: float


def measure_trainer(tokens: int, samples: int, checkpointing: bool) -> TrainerRow:
    """One configuration in a fresh process, so that its peak RSS is its own."""
    code = f"from services.trainer.bench import _child; _child({tokens}, {samples}, {checkpointing})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return TrainerRow(tokens, samples, checkpointing, **data)


def _child(tokens: int, samples: int, checkpointing: bool) -> None:
    """Times a warm training step (the second) on ``samples`` random-token samples of ``tokens`` tokens."""
    from harnessrl import arrays
    from harnessrl.v1 import records_pb2
    from services.trainer.engine import CpuTrainer
    from services.trainer.settings import Settings

    optim = {"gradient_checkpointing": checkpointing, "token_budget": tokens, "lr": 1e-6}
    settings = Settings.model_validate({"optim": optim})
    trainer = CpuTrainer(settings)
    rng = np.random.default_rng(0)
    prompt_len = tokens // 2
    response_len = tokens - prompt_len

    def group(step: int) -> tuple[str, list[records_pb2.Trajectory]]:
        trajs = []
        for i in range(samples):
            seg = records_pb2.Segment(trainable=True, prompt_ids=arrays.pack_i32(rng.integers(3, 40000, prompt_len)))
            seg.response.CopyFrom(
                arrays.make_tokens(
                    rng.integers(3, 40000, response_len),
                    np.ones(response_len, dtype=np.int32),
                    -rng.exponential(2.0, response_len),
                    np.zeros(response_len, dtype=np.int32),
                )
            )
            trajs.append(
                records_pb2.Trajectory(
                    trial_id=f"{step}-{i}",
                    group_id=f"g{step}",
                    reward=float(i % 2),
                    has_reward=True,
                    termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
                    segments=[seg],
                )
            )
        return f"g{step}", trajs

    trainer.train_step([group(0)])
    started = time.monotonic()
    trainer.train_step([group(1)])
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out: dict[str, Any] = {
        "seconds": seconds,
        "tokens_per_s": tokens * samples / seconds,
        "peak_rss_gib": peak,
    }
    print(json.dumps(out))


def print_async(base: SimConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cal = trial_calibration(base.trials)
    console.print(
        f"trials: mean {cal['mean_trial_s']:.0f} s, agent {cal['agent_frac']:.1%}, setup {cal['setup_frac']:.1%}, "
        f"verify {cal['verify_frac']:.1%} (p99 {cal['verify_p99_s']:.0f} s); {base.tasks_per_step} tasks x "
        f"{base.group_size} per step, {base.workers} workers, train {base.train_s:.0f} s, sync {base.sync_s:.0f} s"
    )
    rows = async_table(base)
    baseline = rows[0][1].steps_per_hour
    table = Table(title="harnessrl bench async (simulated)")
    for col in ("mode", "partial rollout", "steps/hour", "vs sync", "trainer idle", "dropped groups", "staleness"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name, r in rows:
        table.add_row(
            name,
            "on" if r.config.partial_rollout else "off",
            f"{r.steps_per_hour:.2f}",
            f"{r.steps_per_hour / baseline:.2f}x",
            f"{r.trainer_idle_fraction:.0%}",
            str(r.dropped_groups),
            f"{r.mean_staleness:.2f}",
        )
    console.print(table)


def print_trainer(samples: int) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = [
        measure_trainer(1024, samples, checkpointing=False),
        measure_trainer(1024, samples, checkpointing=True),
        measure_trainer(4096, samples, checkpointing=True),
    ]
    table = Table(title="harnessrl bench trainer (CPU, fp32, SmolLM2-135M, one warm step)")
    for col in ("tokens/sample", "samples", "grad checkpointing", "seconds", "tokens/s", "peak RSS GiB"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.tokens_per_sample),
            str(r.samples),
            "on" if r.checkpointing else "off",
            f"{r.seconds:.1f}",
            f"{r.tokens_per_s:.0f}",
            f"{r.peak_rss_gib:.2f}",
        )
    Console().print(table)
