"""Settings of the remote sandbox front (env prefix ``HARNESSRL_SANDBOX_REMOTE_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings
from harnessrl.rpc import check_target


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_SANDBOX_REMOTE_", extra="forbid", validate_default=True)

    executor_url: str = Field(
        "http://127.0.0.1:8090", description="Base URL of the executor that runs the trials (its HTTP API)."
    )
    executor_token: SecretStr | None = Field(None, description="Bearer token the executor requires; unset: none.")
    poll_s: float = Field(0.5, gt=0, le=60, description="How often a running trial's execution is polled.")
    lease_s: float = Field(
        10.0, gt=0, le=3600, description="An execution unreachable this long is lost: retried or failed."
    )
    max_attempts: int = Field(2, ge=1, le=10, description="Attempts of a trial whose execution was lost.")
    request_timeout_s: float = Field(10.0, gt=0, le=600, description="Timeout of one call to the executor.")
    capture_target: str | None = Field(
        None, description="host:port of the capture store, where the front finalizes the trials it ends itself."
    )
    capture_token: SecretStr | None = Field(None, description="Bearer token of the capture store, if it wants one.")

    @field_validator("capture_target")
    @classmethod
    def _dialable(cls, value: str | None) -> str | None:
        return check_target(value) if value is not None else None

    @field_validator("executor_url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1].strip("/")) == 0:
            raise ValueError(f"executor_url must be http(s)://host:port (got {value!r})")
        return value.rstrip("/")
