"""Runs a task's healthcheck (``task/healthcheck.py`` declares it) after the sandbox starts
and before the agent, with Harbor's (and Docker ``HEALTHCHECK``'s) retry semantics; the
facts from Harbor and where harnessrl differs are in the declared part's docstring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task import dockerfile

if TYPE_CHECKING:
    from services.sandbox.backends.base import Backend, ExecResult, Sandbox
    from services.sandbox.task.healthcheck import Healthcheck
    from services.sandbox.task.model import Task

log = logging.getLogger(__name__)

_OUTPUT_TAIL = 600


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
