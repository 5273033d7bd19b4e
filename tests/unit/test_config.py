"""Bad configs name the file and the field, and nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings, load_section
from harnessrl.errors import ConfigError


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_DEMO_", extra="forbid")
    workers: int = Field(2, ge=1, le=64)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_loads_section_defaults_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "[gateway]\nworkers = 4\nport = 5000\n")
    settings = load_section(DemoSettings, path, "gateway", {"port": 6000, "host": None})
    assert (settings.workers, settings.port, settings.host) == (4, 6000, "127.0.0.1")


def test_environment_applies_under_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_DEMO_WORKERS", "7")
    monkeypatch.setenv("HARNESSRL_DEMO_PORT", "7001")
    path = write(tmp_path, "[gateway]\nport = 5000\n")
    settings = load_section(DemoSettings, path, "gateway")
    assert (settings.workers, settings.port) == (7, 5000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gateway]\nwokers = 3\n", "unknown setting 'wokers'"),
        ("[gateway]\nworkers = 0\n", "workers: Input should be greater than or equal to 1"),
        ("[gateway]\nworkers = 'many'\n", "workers:"),
        ("[gateway]\nlog_level = 'loud'\n", "log_level:"),
        ("[gatewya]\n", "unknown section(s) ['gatewya']"),
        ("[gateway\n", "not valid TOML"),
        ("gateway = 3\n", "[gateway] must be a table"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_section(DemoSettings, path, "gateway")
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_section(DemoSettings, tmp_path / "nope.toml", "gateway")


def test_secrets_are_not_printed(tmp_path: Path) -> None:
    settings = load_section(DemoSettings, write(tmp_path, "[gateway]\nauth_token = 's3cret'\n"), "gateway")
    assert "s3cret" not in repr(settings)
    assert settings.auth_token is not None and settings.auth_token.get_secret_value() == "s3cret"


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_mb: int = Field(512, ge=1)


class NestedSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_NESTED_", extra="forbid")
    limits: Limits = Field(default_factory=Limits)


def test_nested_tables_come_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_NESTED_LIMITS__MEMORY_MB", "2048")
    assert load_section(NestedSettings, None, "gateway").limits.memory_mb == 2048
    monkeypatch.setenv("HARNESSRL_NESTED_LIMITS__MEMORY_GB", "2")
    with pytest.raises(ConfigError, match=r"unknown setting 'limits\.memory_gb'"):
        load_section(NestedSettings, None, "gateway")
