"""The local layer cache keys what the builder reads (issue 45, section 3), on a real
build: two tasks with the same environment/ and different ``[environment] workdir`` shared
one layer, so the second ran in the first one's workdir (its oracle scored 0). Now each gets
its own layer, and each oracle scores 1."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from services.sandbox.factory import build_runner
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from tests.sandbox_support import DEFAULT_TOML, make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _task(root: Path, name: str, workdir: str) -> Path:
    toml = DEFAULT_TOML + f'workdir = "{workdir}"\n'
    test_sh = (
        f'#!/bin/bash\nif [ "$(cat {workdir}/hello.txt 2>/dev/null)" = hello ]; '
        "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return make_task(root, name, toml=toml, test_sh=test_sh)


async def test_two_workdirs_over_one_environment_get_two_layers(tmp_path: Path) -> None:
    a, b = _task(tmp_path, "a", "/app"), _task(tmp_path, "b", "/srv/b")
    assert (a / "environment" / "Dockerfile").read_text() == (b / "environment" / "Dockerfile").read_text()
    settings = settings_for(tmp_path, cache_dir=tmp_path / "cache")
    runner = build_runner(settings)
    for task in (a, b):
        spec = TrialSpec(trial_id=f"wd-{uuid.uuid4().hex[:8]}", task_path=str(task), harness="oracle")
        outcome = await runner.run(spec)
        assert (outcome.termination_reason, outcome.reward) == (TerminationReason.COMPLETED, 1.0), (
            task.name,
            outcome.verifier_summary,
            outcome.error,
        )
    layers = sorted(p.name for p in (tmp_path / "cache" / "layers").iterdir() if p.is_dir())
    assert len(layers) == 2, layers
    keys = {load_task(t).environment_hash()[:32] for t in (a, b)}
    assert {name.split("-")[0] for name in layers} == keys
