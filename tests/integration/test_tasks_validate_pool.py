"""``harnessrl tasks validate`` takes a pool folder as ``run`` and ``tasks disjoint`` do:
each of its tasks is validated (real bubblewrap sandbox: oracle 1, no-op 0)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_support import run_cli
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_validate_accepts_a_pool(tmp_path: Path) -> None:
    make_task(tmp_path / "pool", "good")
    make_task(tmp_path / "pool", "lazy", solve_sh="#!/bin/bash\ntrue\n")
    (tmp_path / "pool" / "notes").mkdir()  # not a task: a pool's tasks are its folders with task.toml
    env = {
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp_path / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp_path / "c"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the tasks' verifiers need no network
    }
    out = run_cli("tasks", "validate", str(tmp_path / "pool"), "--json", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    report = {Path(r["path"]).name: r for r in json.loads(out.stdout)}
    assert sorted(report) == ["good", "lazy"]
    assert report["good"]["ok"] and report["lazy"]["reasons"] == ["oracle: scored 0.0, expected 1"]
