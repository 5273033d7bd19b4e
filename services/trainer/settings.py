"""Settings of the trainer service (``[trainer]`` in a config file, env prefix ``HARNESSRL_TRAINER_``)."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_TRAINER_", extra="forbid", validate_default=True)
