"""A local trial leaves the host as it found it, and its outcome does not depend on what the host
holds: mount points are made in bubblewrap's own root (its tmpfs, or a RUN's capture directory),
never on the host, and the layer's roots come from what the RUN wrote, not from which directories
the host happens to have (a leftover /opt/venv once turned the root /opt/venv into /opt/venv/bin).
Real bwrap, real trials through the runner."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path, PurePosixPath

import pytest

from services.sandbox.backends.local import NET_DIR, LocalBackend
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# Host directories whose entries a trial must not change (not /tmp or /run: other processes use them).
WATCHED = ("/", "/opt", "/srv", "/home", "/mnt", "/media", "/var", "/usr/local")

DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /app
RUN python3 -m venv --without-pip /opt/{u} && mkdir -p /opt/{u}-tools/bin /srv/{u}/www /var/lib/{u} /{u}-data/sets \\
    && echo t > /opt/{u}-tools/bin/t && echo w > /srv/{u}/www/index.html && echo d > /{u}-data/sets/a \\
    && echo l > /var/lib/{u}/l
"""

TEST_SH = """\
#!/bin/bash
ok=1
[ "$(/opt/{u}/bin/python3 -c 'import sys; print(sys.prefix)')" = /opt/{u} ] || ok=0
[ "$(cat /opt/{u}-tools/bin/t /srv/{u}/www/index.html /{u}-data/sets/a /var/lib/{u}/l | tr -d '\\n')" = twdl ] || ok=0
echo $ok > /logs/verifier/reward.txt
"""


@pytest.fixture
def unique() -> str:
    return f"hrl-{uuid.uuid4().hex[:10]}"


def expected_roots(u: str) -> list[str]:
    return sorted(["/app", f"/opt/{u}", f"/opt/{u}-tools", f"/srv/{u}", f"/var/lib/{u}", f"/{u}-data"])


def named_paths(u: str) -> list[str]:
    """Every path a trial's mounts name (the sandbox's layout, the layer's roots), their parents,
    and what the RUN writes."""
    layout = [str(getattr(SandboxPaths(), f.name)) for f in fields(SandboxPaths)]
    written = [f"/opt/{u}/bin", f"/opt/{u}-tools/bin/t", f"/srv/{u}/www", f"/var/lib/{u}/l", f"/{u}-data/sets"]
    paths = {*layout, *expected_roots(u), *written, str(NET_DIR), "/etc/passwd", "/etc/group"}
    return sorted(paths | {str(p) for path in paths for p in PurePosixPath(path).parents})


def host_state(paths: list[str]) -> dict[str, object]:
    state: dict[str, object] = {d: sorted(os.listdir(d)) for d in WATCHED if os.path.isdir(d)}
    for path in paths:
        state[path] = os.lstat(path).st_ino if os.path.lexists(path) else None
        if os.path.isdir(path) and not os.path.islink(path) and path not in WATCHED and path != "/":
            state[f"{path}/*"] = sorted(os.listdir(path))
    return state


async def run_once(tmp: Path, task: Path) -> tuple[TerminationReason, float | None, list[str]]:
    settings = settings_for(tmp)
    outcome = await TrialRunner(settings, LocalBackend(settings)).run(
        TrialSpec(trial_id=f"host-{uuid.uuid4().hex[:8]}", task_path=str(task), harness="oracle")
    )
    assert not outcome.error, outcome.error
    (layer,) = (tmp / "cache" / "layers").glob("*-v*[0-9]")
    roots = sorted(json.loads((layer / "layer.json").read_text())["roots"])
    return outcome.termination_reason, outcome.reward, roots


def task_for(root: Path, u: str) -> Path:
    return make_task(root, "host", dockerfile=DOCKERFILE.format(u=u), test_sh=TEST_SH.replace("{u}", u))


async def test_two_trials_leave_the_host_as_found_and_agree(tmp_path: Path, unique: str) -> None:
    task = task_for(tmp_path / "tasks", unique)
    paths = named_paths(unique)
    before = host_state(paths)
    first = await run_once(tmp_path / "a", task)
    assert host_state(paths) == before
    second = await run_once(tmp_path / "b", task)  # a cold cache: the layer is built again
    assert host_state(paths) == before
    assert first == second == (TerminationReason.COMPLETED, 1.0, expected_roots(unique))


@pytest.fixture
def leftovers(unique: str) -> Iterator[list[Path]]:
    """Empty host directories where the RUN will write, as an earlier run could have left them;
    removed afterwards (rmdir: only if still empty, so nothing else is ever deleted)."""
    if not os.access("/opt", os.W_OK):
        pytest.skip("needs write access to /opt to stage a leftover")
    made = [Path(f"/opt/{unique}"), Path(f"/opt/{unique}-tools")]
    for path in made:
        path.mkdir()
    try:
        yield made
    finally:
        for path in made:
            path.rmdir()


async def test_leftovers_on_the_host_change_neither_roots_nor_outcome(
    tmp_path: Path, unique: str, leftovers: list[Path]
) -> None:
    task = task_for(tmp_path / "tasks", unique)
    paths = named_paths(unique)
    before = host_state(paths)
    outcome = await run_once(tmp_path / "a", task)
    assert host_state(paths) == before, "the leftovers stay empty, nothing else appears"
    assert outcome == (TerminationReason.COMPLETED, 1.0, expected_roots(unique))
