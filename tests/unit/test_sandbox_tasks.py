"""Harbor task parsing: valid tasks load; every defect is an error naming the task and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.common.errors import TaskError
from services.sandbox.task.model import NetworkMode, load_task
from tests.sandbox_support import DEFAULT_TOML, make_task

EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "hello"


def test_example_task_parses() -> None:
    task = load_task(EXAMPLE)
    assert task.task_id == "harnessrl/hello"
    assert task.config.schema_version == "1.4"
    assert task.config.agent.timeout_sec == 120
    assert task.config.environment.network_mode == NetworkMode.NO_NETWORK
    assert task.config.metadata == {"difficulty": "trivial"}
    assert "hello.txt" in task.instruction
    assert task.dockerfile is not None


def _expect(task: Path, *fragments: str) -> None:
    with pytest.raises(TaskError) as info:
        load_task(task)
    message = str(info.value)
    assert str(task) in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("toml_text", "fragments"),
    [
        ('schema_version = "9.9"\n', ["schema_version", "9.9", "unknown schema version"]),
        ("[agent]\ntimeout_sec = 'soon'\n", ["agent.timeout_sec"]),
        ("[verifier]\ntimeout_sec = -1\n", ["verifier.timeout_sec"]),
        ("[environment]\ngpus = 1\n", ["environment.gpus", "GPU"]),
        ("[environment]\nos = 'windows'\n", ["environment.os"]),
        ("[environment]\nworkdir = 'app'\n", ["environment.workdir", "absolute"]),
        ("[task]\nname = 'no-slash'\n", ["task.name", "org/name"]),
        ("[[steps]]\nname = 'a'\n", ["steps/a/: missing", "steps[0].name"]),
        ("[verifier]\nenvironment_mode = 'separate'\n", ["verifier", "shared"]),
        ("[agent]\nnetwork_mode = 'public'\nallowed_hosts = ['x.org']\n", ["allowed_hosts"]),
        ("[agent\n", ["not valid TOML"]),
    ],
)
def test_invalid_task_toml_names_the_field(tmp_path: Path, toml_text: str, fragments: list[str]) -> None:
    _expect(make_task(tmp_path, toml=toml_text), *fragments)


def test_missing_files_are_named(tmp_path: Path) -> None:
    task = make_task(tmp_path, "a")
    (task / "task.toml").unlink()
    _expect(task, "missing task.toml")
    task = make_task(tmp_path, "b")
    (task / "instruction.md").unlink()
    _expect(task, "missing instruction.md")
    task = make_task(tmp_path, "c", instruction="  \n")
    _expect(task, "instruction.md is empty")
    task = make_task(tmp_path, "d")
    (task / "tests" / "test.sh").unlink()
    _expect(task, "tests/test.sh")
    task = make_task(tmp_path, "e", dockerfile=None)
    (task / "environment" / "Dockerfile").unlink(missing_ok=True)
    _expect(task, "Dockerfile", "docker_image")
    _expect(tmp_path / "nope", "not a directory")


def test_prebuilt_image_without_dockerfile_is_valid(tmp_path: Path) -> None:
    task = make_task(tmp_path, toml=DEFAULT_TOML + 'docker_image = "python:3.12"\n', dockerfile=None)
    (task / "environment" / "Dockerfile").unlink(missing_ok=True)
    assert load_task(task).config.environment.docker_image == "python:3.12"


def test_legacy_allow_internet_and_version_alias(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, toml='version = "1.0"\n[environment]\nallow_internet = false\n'))
    assert task.config.schema_version == "1.0"
    assert task.config.environment.network_mode == NetworkMode.NO_NETWORK


def test_environment_hash_tracks_the_build_context(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path)
    first = load_task(task_dir).environment_hash()
    assert load_task(task_dir).environment_hash() == first
    (task_dir / "environment" / "README.md").write_text("changed\n")
    assert load_task(task_dir).environment_hash() != first
    (task_dir / "instruction.md").write_text("Other words.")  # not part of the environment
    second = load_task(task_dir).environment_hash()
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n")
    assert load_task(task_dir).environment_hash() == second
