"""Every run's run.json names its model and the folder of its tokenizer (what the
dashboard decodes the captured tokens with), for the default model and a configured one."""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl.paths import default_model_dir
from services.dashboard.rundir import open_run
from stack import runconfig
from stack.rundir import RunDirectory


def write(tmp: Path, extra: str = "") -> Path:
    path = tmp / "run.toml"
    path.write_text(f'[run]\nrun_id = "r"\ntrain_tasks = ["x"]\nruns_dir = "runs"\n{extra}')
    return path


def test_run_json_records_model_and_tokenizer(tmp_path: Path) -> None:
    cfg = runconfig.load(write(tmp_path))
    run = RunDirectory(cfg)
    run.create(resume=False)
    run.write_info("running")
    info = json.loads(run.info_path.read_text())
    assert info["model"] == default_model_dir().name and info["tokenizer"] == str(default_model_dir())
    assert open_run(tmp_path / "runs", "r").info.tokenizer == str(default_model_dir())  # type: ignore[union-attr]


def test_a_configured_model_is_its_own_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    cfg = runconfig.load(write(tmp_path, 'model_path = "m"\nmodel = "policy"\n'))
    run = RunDirectory(cfg)
    run.create(resume=False)
    run.write_info("done")
    info = json.loads(run.info_path.read_text())
    assert info["model"] == "policy" and info["tokenizer"] == str(tmp_path / "m")
