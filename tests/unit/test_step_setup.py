"""A step's ``workdir/`` (files for the working directory and its ``setup.sh``) as the task
loads: read as Harbor reads it, what cannot be uploaded refused naming the file."""

from __future__ import annotations

import os
from pathlib import Path

from services.sandbox.task.model import load_task
from tests.unit.test_task_steps import refused, steps_task


def test_a_steps_workdir_loads(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    workdir = task / "steps" / "two" / "workdir"
    (workdir / "data").mkdir(parents=True)
    (workdir / "data" / "names.txt").write_text("Ada\n")
    (workdir / "setup.sh").write_text("echo ready\n")
    assert [s.name for s in load_task(task).steps] == ["one", "two"]


def test_what_a_steps_workdir_cannot_upload_is_refused_naming_the_file(tmp_path: Path) -> None:
    task = steps_task(tmp_path / "link")
    workdir = task / "steps" / "one" / "workdir"
    workdir.mkdir()
    os.symlink("/etc/passwd", workdir / "passwd")
    refused(task, "steps/one/workdir/passwd: a link in a step's workdir/ is not supported")

    task = steps_task(tmp_path / "file")
    (task / "steps" / "two" / "workdir").write_text("not a directory")
    refused(task, "steps/two/workdir: must be a directory")

    task = steps_task(tmp_path / "setup")
    (task / "steps" / "one" / "workdir" / "setup.sh").mkdir(parents=True)
    refused(task, "steps/one/workdir/setup.sh: must be a file")
