"""A newcomer's small frictions with ``harnessrl run`` / ``preflight``: a wrong ``--resume``
fails first in one line, a missing task path names the file and the field, and
``preflight`` leaves no run directory behind (scripted engine, real bubblewrap sandbox)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnessrl import paths
from tests.cli_support import run_cli
from tests.run_support import make_pool, tiny_model, write_config

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_resume_of_a_missing_run_fails_before_preflight(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path))
    out = run_cli("run", str(config), "--resume", "no-such-run")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "" and out.stderr.strip().splitlines() == [
        f"error: no run 'no-such-run' to resume under {tmp_path / 'runs'}"
    ]
    assert not (tmp_path / "runs" / "no-such-run").exists()


@pytest.mark.parametrize("field", ["train_tasks", "eval_tasks"])
def test_a_missing_task_path_names_the_file_and_the_field(tmp_path: Path, model: Path, field: str) -> None:
    pool = make_pool(tmp_path)
    missing = tmp_path / "no-such-pool"
    run = {"train_tasks": [str(missing)]} if field == "train_tasks" else {"eval_tasks": [str(missing)], "eval_k": 1}
    config = write_config(tmp_path, model, pool, run=run)
    for command in ("run", "preflight"):
        out = run_cli(command, str(config))
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{config}: [run] {field}: task path {missing} does not exist" in out.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_preflight_leaves_no_run_directory(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path, ("alpha",)))
    out = run_cli("preflight", str(config))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "preflight ok" in out.stdout
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], list(runs.rglob("*"))[:5]
