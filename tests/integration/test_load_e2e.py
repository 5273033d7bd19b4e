"""``harnessrl bench e2e`` on a small scale: the same code as the 512-trial load
test, asserting zero lost records (never timing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from harnessrl.paths import default_model_dir
from stack.bench.loadtest import LoadConfig, LoadResult, run_load

pytestmark = pytest.mark.skipif(
    not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"
)


def check_nothing_lost(row: LoadResult, trials: int, turns: int, group_size: int) -> None:
    assert row.errors == []
    assert row.acked_turns == trials * turns
    assert row.captured_turns == row.acked_turns
    assert row.finalized == trials
    assert (row.groups_ready, row.groups) == (trials // group_size, trials // group_size)
    assert row.lost_records == 0
    assert len(row.latencies_s) == trials * turns


async def test_sixteen_concurrent_trials_lose_no_record() -> None:
    baseline, loaded = await run_load(LoadConfig(trials=16, turns=3, group_size=4))
    check_nothing_lost(baseline, 4, 3, 4)
    check_nothing_lost(loaded, 16, 3, 4)
    assert (baseline.concurrency, loaded.concurrency) == (1, 16)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_sandboxed_trials_lose_no_record() -> None:
    """The same check with every trial in a real bubblewrap sandbox run by a sandbox worker."""
    baseline, loaded = await run_load(LoadConfig(trials=8, turns=2, group_size=4, sandbox=True))
    check_nothing_lost(baseline, 4, 2, 4)
    check_nothing_lost(loaded, 8, 2, 4)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", "bench", "e2e", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_cli_distributed_store_reports_zero_lost_records() -> None:
    done = bench("--trials", "16", "--turns", "2", "--group-size", "4", "--distributed")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "distributed (Redis + S3)" in done.stdout
    assert "32 turns acknowledged, 32 captured; 16/16 trials finalized; 4/4 groups ready" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trials", "10", "--group-size", "4"], "must be a multiple of group_size"),
        (["--trials", "0"], "--trials"),
        (["--turns", "x"], "--turns"),
    ],
)
def test_cli_rejects_bad_options_before_starting_anything(args: list[str], message: str) -> None:
    done = bench(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "starting" not in done.stderr


def test_lost_records_count_missing_turns_and_unfinalized_trials() -> None:
    row = LoadResult(
        "x", 4, 4, 1.0, [0.1], acked_turns=8, captured_turns=6, finalized=3, groups_ready=0, groups=1, errors=[]
    )
    assert row.lost_records == 3
