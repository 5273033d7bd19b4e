"""The reward-hack detector's false positives (issue 45, section 2): every oracle solution of
the built-in pool (train and held out), of the sandbox's examples and of the SWE converter's
tasks that run here (a unittest record, and a pytest record graded with our plugin), run for
real on the local backend, must score 1 and raise no suspicious event. Slow (one trial per task, ~70):
``-m slow``; the figure it prints is the false-positive rate."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from services.sandbox.factory import build_runner
from services.sandbox.pools.swe import convert
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from tests.integration.test_sandbox_redteam_inprocess import build_swe_task
from tests.integration.test_tasks_swe_convert import make_repo
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


def converted_tasks(root: Path) -> list[Path]:
    """The SWE converter's tasks we can run here: a unittest record (test_tasks_swe_convert)
    and a ``python3 -m pytest`` record graded with our plugin (the red-team suite's)."""
    records = root / "unittest" / "r.jsonl"
    records.parent.mkdir(parents=True)
    records.write_text(json.dumps(make_repo(root / "unittest" / "repos")) + "\n")
    [unit] = convert(records, root / "unittest" / "repos", root / "unittest" / "out")
    return [unit, build_swe_task(root / "pytest")]


async def test_no_oracle_solution_is_flagged(tmp_path: Path) -> None:
    runner = build_runner(settings_for(tmp_path, cache_dir=tmp_path / "cache"))
    flagged: dict[str, list[str]] = {}
    unsolved: dict[str, str] = {}
    converted = converted_tasks(tmp_path / "converted")
    tasks = [toml.parent for toml in TASKS] + converted
    for task in tasks:
        spec = TrialSpec(trial_id=f"fp-{uuid.uuid4().hex[:8]}", task_path=str(task), harness="oracle")
        outcome = await runner.run(spec)
        name = str(task.relative_to(ROOT)) if task.is_relative_to(ROOT) else f"converted/{task.name}"
        if outcome.suspicious_events:
            flagged[name] = outcome.suspicious_events
        if (outcome.termination_reason, outcome.reward) != (TerminationReason.COMPLETED, 1.0):
            unsolved[name] = f"{outcome.termination_reason} {outcome.reward} {outcome.error} {outcome.verifier_summary}"
    print(
        f"suspicious false positives: {len(flagged)} of {len(tasks)} oracle solutions "
        f"({len(TASKS)} built-in and examples, {len(converted)} converted)"
    )
    assert len(TASKS) >= 60
    assert not unsolved, unsolved
    assert not flagged, flagged
