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

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
