"""Harbor's ``[environment.healthcheck]``: a readiness check run after the sandbox starts
and before the agent, with Harbor's (and Docker ``HEALTHCHECK``'s) retry semantics.

Facts from Harbor 0.26 (``models/task/config.py`` ``HealthcheckConfig``,
``environments/base.py`` ``run_healthcheck``, ``trial/trial.py`` ``_prepare``):

- it runs once the environment has started, before agent setup; the first attempt
  that exits 0 ends it (the trial goes on);
- during ``start_period_sec`` (from the first attempt) failures do not count and the
  next attempt comes ``start_interval_sec`` later; after it, each failure counts and
  ``retries`` consecutive ones end the trial; between them ``interval_sec``;
- the command runs with bash in the working directory with the environment's env;
- a failed healthcheck (``HealthcheckError``) is an environment failure Harbor neither
  grades nor counts as a reward: here ``env_setup_failed`` (infrastructure, weight 0),
  the agent never runs.

Where harnessrl differs, on purpose (``harbor_fields`` says it too): the check runs as
the sandbox user (uid 1000, as the agent it is readying; Harbor uses the image's USER),
with no network but the sandbox's own loopback, and an attempt that runs past
``timeout_sec`` counts as a failed attempt, as in Docker (Harbor's docker environment
ends the trial at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.sandbox import dockerfile
from services.sandbox.errors import EnvSetupError

if TYPE_CHECKING:  # tasks.py imports the model from here; the backends import tasks.py
    from services.sandbox.backends.base import Backend, ExecResult, Sandbox
    from services.sandbox.tasks import Task

log = logging.getLogger(__name__)

_OUTPUT_TAIL = 600


class Healthcheck(BaseModel):
    """``[environment.healthcheck]`` (Harbor's ``HealthcheckConfig``, its defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(description="Shell command (bash -c); exit 0 means healthy.")
    interval_sec: float = Field(default=5.0, ge=0, description="Between attempts after the start period.")
    timeout_sec: float = Field(default=30.0, gt=0, description="Limit of one attempt.")
    start_period_sec: float = Field(default=0.0, ge=0, description="Grace period: failures do not count.")
    start_interval_sec: float = Field(default=5.0, ge=0, description="Between attempts in the start period.")
    retries: int = Field(default=3, ge=0, description="Consecutive failures after the start period that fail it.")

    @field_validator("command")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a shell command, got an empty string")
        return v


class HealthcheckFailed(EnvSetupError):
    """The task's healthcheck never passed: env_setup_failed, the agent never ran."""


async def wait_until_healthy(backend: Backend, sandbox: Sandbox, task: Task) -> list[str]:
    """Runs the task's healthcheck until it passes (returns the trial's events) or fails
    as Harbor's does (raises HealthcheckFailed naming the command and its last output).
    No healthcheck: nothing runs, no event."""
    from services.sandbox.backends.base import ExecRequest, Network, Phase

    hc = task.config.environment.healthcheck
    if hc is None:
        return []
    env = {"PATH": dockerfile.DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **sandbox.env, "TMPDIR": "/tmp"}
    request = ExecRequest(
        argv=["/bin/bash", "-c", hc.command],
        phase=Phase.SETUP,
        env=env,
        timeout_s=hc.timeout_sec,
        network=Network.NONE,
    )
    started = time.monotonic()
    start_period_end = started + hc.start_period_sec
    attempts = failures = 0
    while True:
        in_start_period = time.monotonic() < start_period_end
        result = await backend.exec(sandbox, request)
        attempts += 1
        if result.exit_code == 0 and not result.timed_out:
            elapsed = time.monotonic() - started
            log.info("healthcheck passed", extra={"kv": {"trial": sandbox.spec.trial_id, "attempts": attempts}})
            return [f"healthcheck:passed after {attempts} attempt(s) in {elapsed:.1f}s"]
        if in_start_period:
            await asyncio.sleep(hc.start_interval_sec)
            continue
        failures += 1
        if failures >= hc.retries:
            raise HealthcheckFailed(_failure(hc, result, failures, attempts))
        await asyncio.sleep(hc.interval_sec)


def _failure(hc: Healthcheck, result: ExecResult, failures: int, attempts: int) -> str:
    how = f"ran past timeout_sec = {hc.timeout_sec:g}" if result.timed_out else f"exited {result.exit_code}"
    tail = result.output.decode(errors="replace").strip()[-_OUTPUT_TAIL:] or "(no output)"
    return (
        f"[environment.healthcheck] never passed: {hc.command!r} failed {failures} consecutive time(s) "
        f"after the start period ({attempts} attempt(s) in all); the last {how}: {tail}"
    )
