"""``.dockerignore`` on both backends (invariant 8): ``COPY .`` and ``COPY dir/`` of a context with exclusions, ``!``
exceptions, ``**``, a leading ``/`` and ``./``, an excluded directory with a re-included file and
the Dockerfile itself excluded gives the same files in a local sandbox (real bubblewrap) as in a
docker one (the session's private engine, 20.10, classic builder through the docker SDK).
BuildKit's ``Dockerfile.dockerignore`` is honoured by neither, and the local layer says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import Backend, ExecRequest, Limits, Phase, SandboxSpec
from services.sandbox.backends.docker import DockerBackend
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\nCOPY . /ctx/\nCOPY build/ /bld/\n"

IGNORE = """\
# a comment, then a blank line

secret.txt
*.log
!keep.log
build/
!build/keep.txt
/docs/**/*.md
!docs/keep/**
**/__pycache__
./local-only
data/*/raw
tmp/*
Dockerfile
"""

CONTEXT = {
    ".dockerignore": IGNORE,
    # BuildKit would prefer this file and so drop keep.log; the classic builder does not read it.
    "Dockerfile.dockerignore": "keep.log\n",
    "secret.txt": "s",
    "app.log": "l",
    "keep.log": "k",
    "build/out.bin": "b",
    "build/keep.txt": "b",
    "docs/a/b.md": "d",
    "docs/a/b.txt": "d",
    "docs/keep/c.md": "d",
    "pkg/mod.py": "m",
    "pkg/__pycache__/mod.pyc": "c",
    "local-only": "x",
    "data/x/raw/f": "r",
    "data/x/cooked": "c",
    "tmp/scratch": "t",
    "src/main.py": "m",
}

# What `docker build` lets through: README.md is make_task's; tmp/ stays, empty.
EXPECTED = [
    ".",
    "./.dockerignore",
    "./Dockerfile.dockerignore",
    "./README.md",
    "./build",
    "./build/keep.txt",
    "./data",
    "./data/x",
    "./data/x/cooked",
    "./docs",
    "./docs/a",
    "./docs/a/b.txt",
    "./docs/keep",
    "./docs/keep/c.md",
    "./keep.log",
    "./pkg",
    "./pkg/mod.py",
    "./src",
    "./src/main.py",
    "./tmp",
    "-- COPY build/",
    ".",
    "./keep.txt",
]


async def copied_files(backend: Backend, task_dir: Path, name: str) -> list[str]:
    spec = SandboxSpec(
        trial_id=name,
        task=load_task(task_dir),
        dirs=TrialDirs(backend.settings.work_dir / name),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )
    box = await backend.start(spec)
    try:
        script = "cd /ctx && find . | LC_ALL=C sort; echo '-- COPY build/'; cd /bld && find . | LC_ALL=C sort"
        request = ExecRequest(
            argv=["/bin/sh", "-c", script], phase=Phase.AGENT, env={"PATH": "/usr/bin:/bin"}, timeout_s=30
        )
        result = await backend.exec(box, request)
        assert result.exit_code == 0, result.output
        return result.output.decode().splitlines()
    finally:
        await backend.stop(box)


async def test_both_backends_copy_what_dockerignore_lets_through(tmp_path: Path, docker_engine: DockerEngine) -> None:
    task = make_task(tmp_path / "tasks", "ignore", dockerfile=DOCKERFILE, context=CONTEXT)
    local = LocalBackend(settings_for(tmp_path / "local"))
    docker_settings = DockerBackendSettings(host=docker_engine.host, verify_network="none")
    docker = DockerBackend(settings_for(tmp_path / "docker", backend="docker", docker=docker_settings))
    on_local = await copied_files(local, task, "ignore-local")
    on_docker = await copied_files(docker, task, "ignore-docker")
    assert on_docker == EXPECTED, "the engine's own reading of the .dockerignore changed: update EXPECTED"
    assert on_local == on_docker


async def test_the_local_layer_notes_the_buildkit_ignore_file_and_drops_its_filtered_copy(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "ignore", dockerfile=DOCKERFILE, context=CONTEXT)
    backend = LocalBackend(settings_for(tmp_path))
    on_local = await copied_files(backend, task, "ignore-local")
    assert on_local == EXPECTED
    (layer,) = (tmp_path / "cache" / "layers").glob("*-v*[0-9]")
    assert sorted(p.name for p in layer.iterdir()) == ["layer.json", "root"], "the filtered context is not cached"
    meta = (layer / "layer.json").read_text()
    assert "Dockerfile.dockerignore (BuildKit only" in meta


async def test_copying_an_excluded_file_fails_setup_naming_the_line(tmp_path: Path) -> None:
    dockerfile = "FROM python:3.11-slim\nWORKDIR /app\nCOPY secret.txt /app/\n"
    task = make_task(tmp_path / "tasks", "excluded", dockerfile=dockerfile, context={".dockerignore": "secret.txt\n"})
    (task / "environment" / "secret.txt").write_text("s")
    with pytest.raises(EnvSetupError, match=r"line 3: 'secret.txt' not found in the build context \(or excluded"):
        await copied_files(LocalBackend(settings_for(tmp_path)), task, "excluded")
