"""Settings of the dashboard (``[dashboard]`` in a config file, env prefix ``HARNESSRL_DASHBOARD_``).

The dashboard reads run directories (``runs_dir``, or the one ``run_dir``) and,
for a live run, the capture store and trainer over gRPC. It binds 127.0.0.1 by
default; bound anywhere else it refuses to start without ``auth_token``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from harnessrl import paths
from harnessrl.config import ServiceSettings


class AnalysisSettings(BaseModel):
    """Assisted analysis: off unless ``endpoint`` is set. The key never leaves the server."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str | None = Field(
        None, description="Base URL of an OpenAI-compatible API (…/v1) the user chose; unset disables analysis."
    )
    model: str = Field("gpt-4o-mini", min_length=1, description="Model name sent to the endpoint.")
    api_key: SecretStr | None = Field(None, description="Bearer key of the endpoint; stays server-side.")
    timeout_s: float = Field(60.0, gt=0, le=600, description="Timeout of one analysis request.")
    max_candidates: int = Field(5, ge=1, le=20, description="Most candidate explanations kept from one answer.")
    store_dir: Path | None = Field(
        None,
        description="Where candidates and verdicts are kept (<dir>/<run>/analysis.json); default: the run "
        "directory's dashboard/ folder (set it when run directories are mounted read-only).",
    )


class AlertSettings(BaseModel):
    """Thresholds of the anomaly detectors (alerts on the panels and the analysis summary)."""

    model_config = ConfigDict(extra="forbid")

    infra_share: float = Field(
        0.25, ge=0, le=1, description="Alert when infrastructure reasons end more than this share of a step's trials."
    )
    infra_spike_factor: float = Field(
        2.0, ge=1, description="... and that share is this many times the median share of the earlier steps."
    )
    turn_collapse_ratio: float = Field(
        0.5, gt=0, lt=1, description="Alert when mean turns fall below this fraction of their best earlier step."
    )
    min_pearson: float = Field(0.99, ge=-1, le=1, description="Alert when train/inference Pearson drops below.")
    zero_variance_growth: float = Field(
        0.25, ge=0, le=1, description="Alert when the zero-variance group share grows by this much over the run."
    )


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_DASHBOARD_", extra="forbid", validate_default=True)

    port: int = Field(8765, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    auth_token: SecretStr | None = Field(
        None,
        description="Token a browser gives once (login page or ?token=) for an HttpOnly cookie, or an API client "
        "as 'Authorization: Bearer'. Required unless bound to a loopback address.",
    )
    runs_dir: Path = Field(default_factory=paths.runs_dir, description="Root whose sub-folders are run directories.")
    run_dir: Path | None = Field(None, description="Serve this one run directory (its parent becomes the root).")
    web_dir: Path = Field(
        default_factory=lambda: paths.PROJECT_ROOT / "web" / "dist",
        description="The built web UI (scripts/build_web.sh writes it).",
    )
    capture_token: SecretStr | None = Field(None, description="Service credential of the capture store.")
    trainer_token: SecretStr | None = Field(None, description="Service credential of the trainer.")
    rpc_timeout_s: float = Field(30.0, gt=0, le=600, description="Deadline of one gRPC call to a live service.")
    poll_s: float = Field(2.0, ge=0.1, le=600, description="How often live runs are polled for SSE updates.")
    model_dir: Path | None = Field(
        None, description="Tokenizer folder for decoding tokens; default: the run's model under the harnessrl home."
    )
    tool_parser: str | None = Field(
        None, description="Tool-call format of the captured text; default: the run's [proxy] tool_parser, else hermes."
    )
    trace_url: str | None = Field(
        None,
        description="Link to a trial's trace in a running trace UI, e.g. Jaeger's "
        "http://127.0.0.1:16686/trace/{trace_id}; {trace_id}, {trial_id} and {run_id} are filled in. "
        "Unset: trajectories show no trace link.",
    )
    max_token_view: int = Field(
        20_000, ge=100, description="Tokens per segment sent to the token-level view; the rest is summarised."
    )
    analysis: AnalysisSettings = Field(default_factory=lambda: AnalysisSettings.model_validate({}))
    alerts: AlertSettings = Field(default_factory=lambda: AlertSettings.model_validate({}))

    @field_validator("trace_url")
    @classmethod
    def _trace_url_template(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http(s) URL")
        try:
            v.format(trace_id="t", trial_id="t", run_id="r")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"{v!r}: only {{trace_id}}, {{trial_id}} and {{run_id}} may be filled in ({type(e).__name__}: {e})"
            ) from e
        return v

    @model_validator(mode="after")
    def _refuse_open_non_loopback(self) -> Settings:
        if self.auth_token is None and not is_loopback(self.host):
            raise ValueError(f"host {self.host!r} is not a loopback address: set auth_token (no anonymous access)")
        if self.auth_token is not None and len(self.auth_token.get_secret_value()) < 8:
            raise ValueError("auth_token must have at least 8 characters")
        return self

    def root(self) -> Path:
        return self.run_dir.parent if self.run_dir is not None else self.runs_dir


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
