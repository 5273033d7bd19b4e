"""Before each step's agent of a multi-step task (``[[steps]]``): the step's ``workdir/``
files, its ``setup.sh``, then its ``[steps.healthcheck]``, as Harbor prepares a step.

Facts from Harbor 0.26 (``trial/multi_step.py`` ``_prepare_step``, ``_upload_step_workdir``,
``_run_step_setup``, ``_run_step_healthcheck``; ``models/task/paths.py``):

- ``steps/NAME/workdir/`` is uploaded into the environment's working directory before every
  step's agent, the first step's too; its contents are merged into what is there
  (``docker cp workdir/. main:WORKDIR``): a file replaces the file of its name, a directory
  merges into the directory of its name, everything else stays;
- ``workdir/setup.sh`` (a reserved name, uploaded with the rest) then runs as
  ``bash WORKDIR/setup.sh``, as the step's agent user, from the working directory, with the
  environment's env; a non-zero exit fails the step before its agent, and no step after it
  runs;
- then the step's healthcheck, with the task-level one's semantics; it fails the step the same way
  (a setup.sh that failed skips it);
- every input must stay within the task directory (Harbor's ``validate_input_tree``).

Here: a failed setup.sh or healthcheck ends the trial as ``env_setup_failed`` (the step's
agent never ran: nothing is a reward), its error naming the step. Differences, on purpose:
setup.sh runs as the sandbox user (uid 1000, the agent of every step here), with no network
(the agent's own is the model proxy only), under the step's agent timeout (else the task's,
else ``SETUP_TIMEOUT_S``; Harbor has none); a link inside ``workdir/`` is refused when the task
loads (it would name a worker path inside the sandbox).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task import dockerfile
from services.sandbox.task.steps import SETUP, WORKDIR
from services.sandbox.trial.healthcheck import HealthcheckFailed, wait_until_healthy

if TYPE_CHECKING:
    from services.sandbox.backends.base import Backend, Sandbox
    from services.sandbox.task.model import Task
    from services.sandbox.task.steps import Step

SETUP_TIMEOUT_S = 600.0
_OUTPUT_TAIL = 600
# Prints, NUL-separated, those of its arguments (paths under the cwd) that are directories.
_EXISTING_DIRS = 'for d in "$@"; do if [ -d "$d" ] && [ ! -L "$d" ]; then printf "%s\\0" "$d"; fi; done'


class StepSetupFailed(EnvSetupError):
    """A step's setup.sh failed, or its healthcheck never passed: env_setup_failed."""


async def prepare(backend: Backend, sandbox: Sandbox, task: Task, step: Step) -> list[str]:
    """Harbor's step preparation, in its order: upload ``workdir/``, run ``setup.sh``, wait for
    the step's healthcheck. ``task`` is the trial's task (not a step's view). Returns the
    trial's events; raises StepSetupFailed naming the step."""
    events: list[str] = []
    source = task.path / "steps" / step.name / WORKDIR
    if source.is_dir():
        events += await _upload_merged(backend, sandbox, source, step.name)
        if (source / SETUP).is_file():
            timeout = step.config.agent.timeout_sec or task.config.agent.timeout_sec or SETUP_TIMEOUT_S
            events.append(await _run_setup(backend, sandbox, step.name, timeout))
    try:
        checked = await wait_until_healthy(backend, sandbox, task.for_step(step))
    except HealthcheckFailed as e:
        why = str(e).removeprefix("[environment.healthcheck] ")
        raise StepSetupFailed(f"step {step.name!r}: [steps.healthcheck] {why}") from None
    return events + checked


async def _upload_merged(backend: Backend, sandbox: Sandbox, source: Path, name: str) -> list[str]:
    """``source``'s contents into the working directory, merged as ``docker cp source/.`` does."""
    from services.sandbox.backends.base import ExecRequest, Phase

    workdir = sandbox.paths.workdir
    subdirs = await asyncio.to_thread(_subdirs, source)
    existing: set[str] = set()
    if subdirs:
        probe = ExecRequest(
            argv=["/bin/bash", "-c", _EXISTING_DIRS, "bash", *subdirs],
            phase=Phase.SETUP,
            env=_env(sandbox),
            cwd=str(workdir),
            timeout_s=60.0,
        )
        result = await backend.exec(sandbox, probe)
        if result.exit_code != 0:
            raise StepSetupFailed(f"step {name!r}: listing {workdir} failed: {_tail(result.output)}")
        existing = {p for p in result.output.decode(errors="replace").split("\0") if p}
    uploads = await asyncio.to_thread(_plan, source, existing)
    for rel in uploads:
        await backend.upload(sandbox, source / rel, workdir / PurePosixPath(rel))
    return [f"step {name!r}: workdir/ uploaded to {workdir} ({len(uploads)} entries)"]


async def _run_setup(backend: Backend, sandbox: Sandbox, name: str, timeout_s: float) -> str:
    from services.sandbox.backends.base import ExecRequest, Phase

    script = str(sandbox.paths.workdir / SETUP)
    request = ExecRequest(
        argv=["bash", script],
        phase=Phase.SETUP,
        env=_env(sandbox),
        cwd=str(sandbox.paths.workdir),
        timeout_s=timeout_s,
    )
    started = time.monotonic()
    result = await backend.exec(sandbox, request)
    if result.timed_out or result.exit_code != 0:
        how = f"ran past {timeout_s:g}s" if result.timed_out else f"exited {result.exit_code}"
        raise StepSetupFailed(
            f"step {name!r}: steps/{name}/{WORKDIR}/{SETUP} {how}, before the step's agent: {_tail(result.output)}"
        )
    return f"step {name!r}: {SETUP} ran in {time.monotonic() - started:.1f}s"


def _subdirs(source: Path) -> list[str]:
    return [p.relative_to(source).as_posix() for p in sorted(source.rglob("*")) if p.is_dir()]


def _plan(source: Path, existing: set[str]) -> list[str]:
    """What to upload: each entry of ``source``, but a directory the sandbox has already is
    merged into (its entries instead, recursively)."""
    uploads: list[str] = []
    folders = [source]
    while folders:
        for child in sorted(folders.pop(0).iterdir()):
            rel = child.relative_to(source).as_posix()
            if child.is_dir() and rel in existing:
                folders.append(child)
            else:
                uploads.append(rel)  # a new entry, or one that replaces its namesake
    return uploads


def _env(sandbox: Sandbox) -> dict[str, str]:
    return {"PATH": dockerfile.DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **sandbox.env, "TMPDIR": "/tmp"}


def _tail(output: bytes) -> str:
    return output.decode(errors="replace").strip()[-_OUTPUT_TAIL:] or "(no output)"
