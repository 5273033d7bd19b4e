"""The local layer cache's key is computed from exactly what the builder reads
(``task/build_inputs.py``): each input, changed in turn, changes the key; what the builder
does not read (the instruction, the tests, the build timeout) does not. The docker backend's
base images honour a compose file's build args (``FROM ${ARG}``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from services.sandbox.backends.docker_images import base_images
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

TOML = """schema_version = "1.4"
[task]
name = "test/{name}"
[environment]
workdir = "/app"
build_timeout_sec = 600
env = {{ A = "1" }}
"""


def _toml(task: Path, old: str, new: str) -> None:
    path = task / "task.toml"
    path.write_text(path.read_text().replace(old, new))


def _compose(task: Path, args: str) -> None:
    text = f"services:\n  main:\n    build: {{context: ., args: {{{args}}}}}\n"
    (task / "environment" / "docker-compose.yaml").write_text(text)


CHANGES: dict[str, Callable[[Path], object]] = {
    "[environment] workdir": lambda t: _toml(t, 'workdir = "/app"', 'workdir = "/srv/app"'),
    "[environment] env": lambda t: _toml(t, 'A = "1"', 'A = "2"'),
    "[environment] docker_image": lambda t: _toml(t, "[environment]\n", '[environment]\ndocker_image = "x:1"\n'),
    "a context file's content": lambda t: (t / "environment" / "README.md").write_text("other\n"),
    "a context file's mode": lambda t: os.chmod(t / "environment" / "README.md", 0o755),
    "a new context file": lambda t: (t / "environment" / "extra.txt").write_text("x"),
    "a new empty directory": lambda t: (t / "environment" / "empty").mkdir(),
    "a symlink's target": lambda t: (t / "environment" / "link").symlink_to("README.md"),
    "the Dockerfile": lambda t: (t / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n"),
    "the .dockerignore": lambda t: (t / "environment" / ".dockerignore").write_text("README.md\n"),
    "a compose build arg": lambda t: _compose(t, "BASE: debian:bookworm-slim"),
}


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    task = make_task(tmp_path, "k", toml=TOML)
    _compose(task, "BASE: python:3.11-slim")
    return task


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_input_changes_the_key(task_dir: Path, change: str) -> None:
    key = load_task(task_dir).environment_hash()  # read now: it hashes the files as they are
    assert load_task(task_dir).environment_hash() == key
    CHANGES[change](task_dir)
    assert load_task(task_dir).environment_hash() != key, change


def test_what_the_builder_does_not_read_keeps_the_key(task_dir: Path) -> None:
    key = load_task(task_dir).environment_hash()
    (task_dir / "instruction.md").write_text("Other words.")
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n")
    _toml(task_dir, "build_timeout_sec = 600", "build_timeout_sec = 900")
    assert load_task(task_dir).environment_hash() == key


def test_two_workdirs_over_one_environment_are_two_keys(tmp_path: Path) -> None:
    """The regression of issue 45: the workdir was not in the key."""
    a = make_task(tmp_path, "a", toml=TOML)
    b = make_task(tmp_path, "b", toml=TOML.replace('workdir = "/app"', 'workdir = "/srv"'))
    assert load_task(a).environment_hash() != load_task(b).environment_hash()


def test_base_images_take_the_compose_build_args(tmp_path: Path) -> None:
    task = make_task(tmp_path, "c", dockerfile="ARG BASE=debian:bookworm-slim\nFROM ${BASE}\n")
    assert base_images(load_task(task)) == ["debian:bookworm-slim"]
    _compose(task, "BASE: python:3.11-slim")
    assert base_images(load_task(task)) == ["python:3.11-slim"]
