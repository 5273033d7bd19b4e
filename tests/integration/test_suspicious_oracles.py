"""The reward-hack detector's false positives (issue 45, section 2): every oracle solution of
the built-in pool (train and held out) and of the sandbox's examples, run for real on the
local backend, must score 1 and raise no suspicious event. Slow (one trial per task, ~70):
``-m slow``; the figure it prints is the false-positive rate."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from services.sandbox.factory import build_runner
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from tests.sandbox_support import settings_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
ROOT = Path(__file__).resolve().parents[2]
TASKS = sorted(
    [
        *(ROOT / "tasks" / "builtin").glob("*/*/task.toml"),
        *(ROOT / "services" / "sandbox" / "examples").glob("*/task.toml"),
    ]
)


async def test_no_oracle_solution_is_flagged(tmp_path: Path) -> None:
    runner = build_runner(settings_for(tmp_path, cache_dir=tmp_path / "cache"))
    flagged: dict[str, list[str]] = {}
    unsolved: dict[str, str] = {}
    for toml in TASKS:
        task = toml.parent
        spec = TrialSpec(trial_id=f"fp-{uuid.uuid4().hex[:8]}", task_path=str(task), harness="oracle")
        outcome = await runner.run(spec)
        name = str(task.relative_to(ROOT))
        if outcome.suspicious_events:
            flagged[name] = outcome.suspicious_events
        if (outcome.termination_reason, outcome.reward) != (TerminationReason.COMPLETED, 1.0):
            unsolved[name] = f"{outcome.termination_reason} {outcome.reward} {outcome.error}"
    print(f"suspicious false positives: {len(flagged)} of {len(TASKS)} oracle solutions")
    assert len(TASKS) >= 60
    assert not unsolved, unsolved
    assert not flagged, flagged
