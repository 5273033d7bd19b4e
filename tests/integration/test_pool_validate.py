"""Every built-in task validates in the local backend: the oracle scores 1, a no-op agent 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.factory import build_runner
from services.sandbox.validate import validate_task
from stack.disjoint import task_dirs
from tests.sandbox_support import settings_for

POOL = Path(__file__).resolve().parents[2] / "tasks" / "builtin"
ALL = task_dirs([POOL / "train", POOL / "heldout"])
# One task per family (its first held-out instance) keeps the default suite fast.
ONE_PER_FAMILY = sorted({p.name.rsplit("-", 1)[0]: p for p in reversed(ALL)}.values())


async def _check(paths: list[Path], tmp_path: Path) -> None:
    runner = build_runner(settings_for(tmp_path))
    failures = {}
    for path in paths:
        report = await validate_task(runner, path)
        if not report.ok:
            failures[path.name] = report.reasons
    assert not failures, failures


async def test_one_task_per_family_validates(tmp_path: Path) -> None:
    assert len(ONE_PER_FAMILY) == 6
    await _check(ONE_PER_FAMILY, tmp_path)


@pytest.mark.slow
async def test_every_builtin_task_validates(tmp_path: Path) -> None:
    await _check(ALL, tmp_path)
