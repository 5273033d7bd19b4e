"""``harnessrl tasks validate``: a task is valid when it parses, its oracle
(solution/solve.sh) scores 1 and a no-op agent scores 0, each trial ending
``completed``. Anything else is a rejection with the reason."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.errors import HarnessError
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec
from services.sandbox.trial.runner import TrialRunner

EXPECTED = {"oracle": 1.0, "nop": 0.0}


@dataclass
class TaskReport:
    path: str
    task_id: str = ""
    ok: bool = False
    reasons: list[str] = field(default_factory=list)
    outcomes: dict[str, TrialOutcome] = field(default_factory=dict)


async def validate_task(runner: TrialRunner, path: Path) -> TaskReport:
    report = TaskReport(path=str(path))
    try:
        task = load_task(path)
    except HarnessError as e:
        report.reasons.append(str(e))
        return report
    report.task_id = task.task_id
    for harness, expected in EXPECTED.items():
        spec = TrialSpec(trial_id=f"validate-{harness}-{uuid.uuid4().hex[:12]}", task_path=str(path), harness=harness)
        outcome = await runner.run(spec)
        report.outcomes[harness] = outcome
        if outcome.termination_reason != TerminationReason.COMPLETED:
            report.reasons.append(f"{harness}: ended {outcome.termination_reason}: {outcome.error}")
        elif outcome.reward != expected:
            report.reasons.append(f"{harness}: scored {outcome.reward}, expected {expected:g}")
    report.ok = not report.reasons
    return report
