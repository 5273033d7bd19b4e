"""Settings of the capture store (``[capture_store]``, env prefix ``HARNESSRL_CAPTURE_STORE_``)."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_CAPTURE_STORE_", extra="forbid", validate_default=True)
