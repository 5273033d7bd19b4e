"""The local backend's Dockerfile replay is faithful or fails loudly (invariant 8): Docker's
default PATH applies from FROM on, what a RUN writes outside the layer's roots is kept as a new
root or refused naming the instruction, never silently lost. Real bwrap, real trials."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import _pytest
import pytest

from services.sandbox.backends.base import ExecRequest, Limits, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.errors import UnsupportedInstruction
from services.sandbox.common.paths import TrialDirs
from services.sandbox.task.dockerfile import DEFAULT_PATH
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# The host's /usr/bin/python3 may lack pytest: the task brings it, as the red-team task does (a
# stand-in for the base image's own pytest); the venv sees it through --system-site-packages'
# sys.path, PYTHONPATH being honoured by every interpreter alike.
SITE = Path(_pytest.__file__).resolve().parents[1]
PYLIB = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")

# The everyday Harbor task of issue 14, as a new user writes it.
EVERYDAY = """\
FROM python:3.11-slim
COPY pylib/ /opt/pylib/
ENV PYTHONPATH=/opt/pylib PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv --system-site-packages /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY repo/ /app/
"""

TEST_SH = """\
#!/bin/bash
cd /app
mkdir -p /logs/verifier/out && cp calc.py /logs/verifier/out/
python3 -m pytest -q -p no:cacheprovider tests > /logs/verifier/pytest.log 2>&1
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""

# The venv the RUN made is the python3 the verifier runs, and the base PATH is still there.
TEST_ENV = """\
import shutil
import sys


def test_the_venv_and_the_base_path():
    assert sys.prefix == "/opt/venv"
    assert shutil.which("python3") == "/opt/venv/bin/python3"
    assert shutil.which("sed") and shutil.which("mkdir")
"""

SOLVE_SH = """\
#!/bin/bash
set -e
mkdir -p /app/fixed
cp /app/calc.py /app/fixed/
sed -i 's/a - b/a + b/' /app/calc.py
"""


def everyday_task(root: Path) -> Path:
    task = make_task(
        root,
        "everyday",
        dockerfile=EVERYDAY,
        context={
            "repo/calc.py": "def add(a, b):\n    return a - b\n",
            "repo/tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
            "repo/tests/test_env.py": TEST_ENV,
        },
        test_sh=TEST_SH,
        solve_sh=SOLVE_SH,
    )
    for name in PYLIB:
        src, dst = SITE / name, task / "environment" / "pylib" / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst)
    return task


async def run_trial(tmp: Path, cache: Path, task: Path, harness: str) -> TrialOutcome:
    settings = settings_for(tmp, cache_dir=cache)
    runner = TrialRunner(settings, LocalBackend(settings))
    return await runner.run(TrialSpec(trial_id=f"env-{uuid.uuid4().hex[:8]}", task_path=str(task), harness=harness))


async def test_the_everyday_task_scores_its_oracle(tmp_path: Path) -> None:
    task = everyday_task(tmp_path / "tasks")
    oracle = await run_trial(tmp_path / "a", tmp_path / "cache", task, "oracle")
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle
    nop = await run_trial(tmp_path / "b", tmp_path / "cache", task, "nop")
    assert (nop.termination_reason, nop.reward) == (TerminationReason.COMPLETED, 0.0), nop
    (layer,) = (tmp_path / "cache" / "layers").glob("*-v*[0-9]")
    meta = json.loads((layer / "layer.json").read_text())
    assert "/opt/venv" in meta["roots"] and meta["env"]["PATH"] == f"/opt/venv/bin:{DEFAULT_PATH}"


async def test_a_run_writing_a_host_system_path_fails_setup_naming_the_line(tmp_path: Path) -> None:
    for n, run in enumerate(["touch /usr/lib/x", "mkdir /etc/myapp || echo tolerated"]):
        dockerfile = f"FROM python:3.11-slim\nWORKDIR /app\nRUN {run}\n"
        task = make_task(tmp_path / "tasks", f"t{n}", dockerfile=dockerfile)
        outcome = await run_trial(tmp_path / f"t{n}", tmp_path / "cache", task, "oracle")
        assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED and outcome.reward is None
        assert f"Dockerfile line 3: 'RUN {run}' exited with" in outcome.error
        assert "read-only base image" in outcome.error


async def test_a_run_that_installs_packages_fails_setup_saying_why(tmp_path: Path) -> None:
    """As real Harbor tasks start (FROM ubuntu:24.04, RUN apt-get update && apt-get install):
    apt-get fails on the host's system before it writes anything (no 'Read-only file system'),
    so the error says that a package manager cannot change the local backend's base."""
    dockerfile = "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y curl\nWORKDIR /app\n"
    task = make_task(tmp_path / "tasks", "apt", dockerfile=dockerfile)
    outcome = await run_trial(tmp_path / "apt", tmp_path / "cache", task, "oracle")
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED and outcome.reward is None
    assert "Dockerfile line 2: 'RUN apt-get update" in outcome.error, outcome.error
    assert "runs a system package manager" in outcome.error and "use the docker backend" in outcome.error


async def start(backend: LocalBackend, task_dir: Path) -> Sandbox:
    spec = SandboxSpec(
        trial_id="t",
        task=load_task(task_dir),
        dirs=TrialDirs(backend.settings.work_dir / "t"),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )
    return await backend.start(spec)


async def test_path_from_the_base_reaches_run_steps_and_phases(tmp_path: Path) -> None:
    dockerfile = """\
    FROM debian:bookworm-slim
    ENV PATH=/opt/tools/bin:$PATH
    RUN mkdir -p /opt/tools/bin && printf '#!/bin/sh\\necho tool-ran\\n' > /opt/tools/bin/mytool \\
        && chmod +x /opt/tools/bin/mytool
    WORKDIR /app
    RUN mytool > from-run.txt && echo "$PATH" >> from-run.txt
    """
    backend = LocalBackend(settings_for(tmp_path))
    box = await start(backend, make_task(tmp_path / "tasks", dockerfile=dockerfile))
    try:
        assert box.env["PATH"] == f"/opt/tools/bin:{DEFAULT_PATH}"
        for phase in (Phase.AGENT, Phase.VERIFY):
            script = "cat from-run.txt; mytool; command -v mkdir sed"
            request = ExecRequest(argv=["/bin/bash", "-c", script], phase=phase, env=dict(box.env), timeout_s=20)
            result = await backend.exec(box, request)
            assert result.exit_code == 0, result.output
            assert result.output.decode().split("\n")[:5] == [
                "tool-ran",
                f"/opt/tools/bin:{DEFAULT_PATH}",
                "tool-ran",
                "/usr/bin/mkdir",
                "/usr/bin/sed",
            ]
    finally:
        await backend.stop(box)


async def test_run_writes_outside_the_roots_are_kept_as_narrow_roots(tmp_path: Path) -> None:
    dockerfile = """\
    FROM x
    WORKDIR /app
    COPY README.md /opt/lib/
    RUN mkdir -p /opt/venv/bin /data/sets /srv/www && echo v > /opt/venv/bin/v && echo s > /data/sets/a \\
        && echo w > /srv/www/index.html && echo scratch > /tmp/scratch
    RUN cat /opt/venv/bin/v /tmp/scratch > seen.txt
    """
    backend = LocalBackend(settings_for(tmp_path))
    box = await start(backend, make_task(tmp_path / "tasks", dockerfile=dockerfile))
    try:
        layer = box.handle.layer  # type: ignore[attr-defined]
        # /opt and /srv are a base image's (layers.BASE_DIRS, whatever the host holds): the roots are
        # what the RUN created under them. test_sandbox_local_host.py stages a leftover on the host.
        assert sorted(layer.roots) == ["/app", "/data", "/opt/lib", "/opt/venv", "/srv/www"]
        assert any("/tmp" in note and "scratch" in note for note in layer.ignored)
        script = "cat seen.txt /opt/venv/bin/v /data/sets/a /srv/www/index.html; ls /tmp | wc -l"
        request = ExecRequest(argv=["/bin/sh", "-c", script], phase=Phase.AGENT, env=dict(box.env), timeout_s=20)
        result = await backend.exec(box, request)
        assert result.output.decode().split("\n")[:6] == ["v", "scratch", "v", "s", "w", "0"]
    finally:
        await backend.stop(box)


@pytest.mark.parametrize(
    ("dockerfile", "fragment"),
    [
        ("FROM x\nWORKDIR /app\nRUN echo x > /marker\n", "line 3: 'RUN echo x > /marker': it wrote /marker directly"),
        ("FROM x\nWORKDIR /usr/src/app\n", "line 2: 'WORKDIR /usr/src/app': /usr/src/app is under /usr"),
        ("FROM x\nCOPY README.md /etc/myapp/\n", "line 2: 'COPY README.md /etc/myapp/': /etc/myapp is under /etc"),
    ],
)
async def test_what_cannot_be_kept_fails_naming_the_instruction(tmp_path: Path, dockerfile: str, fragment: str) -> None:
    backend = LocalBackend(settings_for(tmp_path))
    with pytest.raises(UnsupportedInstruction) as info:
        await start(backend, make_task(tmp_path / "tasks", dockerfile=dockerfile))
    assert fragment in str(info.value) and "docker backend" in str(info.value)
