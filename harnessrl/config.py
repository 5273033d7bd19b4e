"""Settings: one pydantic settings object per service, loaded from a TOML file
section and the environment.

Precedence: explicit overrides (CLI flags) > the config file > environment
variables (``HARNESSRL_<SECTION>_<FIELD>``) > defaults. Every error names the
file, the section and the field, and nothing starts until the settings load.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from harnessrl.errors import ConfigError
from harnessrl.tls import TlsSettings

# Top-level tables a harnessrl config file may hold; anything else is a typo.
SECTIONS = (
    "run",
    "proxy",
    "gateway",
    "sandbox",
    "capture_store",
    "trainer",
    "dashboard",
    "tasks",
    "eval",
    "telemetry",
)

S = TypeVar("S", bound=BaseSettings)


class ServiceSettings(BaseSettings):
    """Fields every gRPC service has. Subclasses set ``env_prefix``."""

    # Nested tables come from the environment as HARNESSRL_<SECTION>_<TABLE>__<FIELD>.
    model_config = SettingsConfigDict(extra="forbid", validate_default=True, env_nested_delimiter="__")

    host: str = Field("127.0.0.1", description="Address to bind; 127.0.0.1 unless deployed.")
    port: int = Field(0, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    log_level: str = Field("WARNING", pattern=r"(?i)^(debug|info|warning|error|critical)$")
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/gRPC endpoint for traces, e.g. http://127.0.0.1:4317 (https:// verifies the collector "
        "against tls.ca_file); unset disables export.",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Serve Prometheus /metrics on this port (gRPC services); unset: off."
    )
    shutdown_grace_s: float = Field(5.0, ge=0, le=600, description="Grace period for in-flight RPCs on SIGTERM.")
    auth_token: SecretStr | None = Field(
        None, description="Bearer token callers must present in gRPC metadata; unset disables auth."
    )
    tls: TlsSettings = Field(
        default_factory=lambda: TlsSettings.model_validate({}),
        description="Transport security ([<section>.tls], env HARNESSRL_<SECTION>_TLS__<FIELD>): the "
        "certificate served, the client CA of mTLS, the CA that verifies the servers dialled.",
    )


def read_toml(path: Path) -> dict[str, Any]:
    """Reads a config file; unknown top-level tables are an error naming the file."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: config file not found") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {unknown}; valid sections: {list(SECTIONS)}")
    return data


def load_section(cls: type[S], path: Path | None, section: str, overrides: dict[str, Any] | None = None) -> S:
    """Builds ``cls`` from ``[section]`` of ``path`` (optional), the environment and overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        table = read_toml(path).get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}] must be a table")
        data.update(table)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    where = f"{path}: [{section}]" if path else f"[{section}] (environment)"
    return validate(cls, data, where)


def validate(cls: type[S], data: dict[str, Any], where: str) -> S:
    try:
        return cls(**data)
    except ValidationError as e:
        names = _from_environment(cls, data, e)
        if names:  # the file did not set the field: blame the variable that did
            where = f"environment {', '.join(names)} (under {where})"
        raise ConfigError(f"{where}: {format_validation_error(e)}") from e


def _from_environment(cls: type[BaseSettings], data: dict[str, Any], e: ValidationError) -> list[str]:
    """The environment variables behind the failing fields that ``data`` (the file) does not set."""
    prefix = str(cls.model_config.get("env_prefix") or "")
    if not prefix:
        return []
    env = {k.upper(): k for k in os.environ}
    names: list[str] = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        if not loc or loc[0] in data:
            continue
        for var in ((prefix + "__".join(loc)).upper(), (prefix + loc[0]).upper()):
            if var in env and env[var] not in names:
                names.append(env[var])
                break
    return names


def format_validation_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown setting {field!r}")
        else:
            parts.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)
