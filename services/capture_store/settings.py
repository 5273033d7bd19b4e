"""Settings of the capture store (``[capture_store]``, env prefix ``HARNESSRL_CAPTURE_STORE_``).

Two backends with the same semantics: ``embedded`` (SQLite index + local pack
files under ``store_dir``, the quickstart default) and ``distributed`` (Redis
index, counters and ready streams + S3 blobs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from harnessrl import paths
from harnessrl.config import ServiceSettings


class RetryPolicy(BaseModel):
    """Bounded exponential backoff around backend I/O (Redis, S3, SQLite locks).

    A caller sees success only once data is durable; while a backend is down
    the service retries for at most ``total_s``, then answers UNAVAILABLE.
    """

    model_config = ConfigDict(extra="forbid")

    initial_s: float = Field(0.05, gt=0, le=10, description="First backoff delay.")
    max_s: float = Field(2.0, gt=0, le=60, description="Longest single backoff delay.")
    total_s: float = Field(30.0, ge=0, le=3600, description="Give up (UNAVAILABLE) after this long.")


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_CAPTURE_STORE_", extra="forbid", validate_default=True)

    backend: Literal["embedded", "distributed"] = Field(
        "embedded", description="embedded: SQLite + local files; distributed: Redis + S3."
    )
    store_dir: Path | None = Field(
        None, description="Embedded store directory (index.sqlite3 + blobs/); default <harnessrl home>/capture."
    )
    sqlite_path: Path | None = Field(None, description="Override of the SQLite index path (embedded).")
    blob_dir: Path | None = Field(None, description="Override of the pack-file directory (embedded).")
    fsync: bool = Field(True, description="fsync pack files before acknowledging (embedded). Only tests turn it off.")
    pack_max_bytes: int = Field(256 * 2**20, ge=2**20, description="Roll to a new pack file past this size.")

    redis_url: str | None = Field(None, description="Redis URL of the index (distributed), e.g. redis://host:6379/0.")
    redis_password: SecretStr | None = Field(None, description="Redis password, if not in the URL.")
    redis_prefix: str = Field("hrl", pattern=r"^[A-Za-z0-9_.-]{1,32}$", description="Prefix of every Redis key.")
    s3_endpoint: str | None = Field(None, description="S3 endpoint URL (distributed); path-style addressing.")
    s3_bucket: str | None = Field(None, description="Bucket holding segment blobs.")
    s3_prefix: str = Field("harnessrl", pattern=r"^[A-Za-z0-9_./-]{1,128}$", description="Key prefix in the bucket.")
    s3_region: str = Field("us-east-1")
    s3_access_key: SecretStr | None = Field(None, description="S3 access key id.")
    s3_secret_key: SecretStr | None = Field(None, description="S3 secret access key.")
    s3_create_bucket: bool = Field(False, description="Create the bucket at startup if it is missing.")
    startup_wait_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="At start, wait this long for Redis and S3 to answer (they may start later); 0: fail at once.",
    )

    logprob_dtype: Literal["float32", "float16"] = Field(
        "float32", description="On-disk logprob precision; float16 halves it but is lossy."
    )
    zstd_level: int = Field(3, ge=1, le=19, description="zstd level of part blobs.")
    retry: RetryPolicy = Field(default_factory=lambda: RetryPolicy.model_validate({}))

    max_part_tokens: int = Field(1_000_000, ge=1, description="Largest part (tokens) an append may carry.")
    max_prompt_tokens: int = Field(2_000_000, ge=1, description="Largest prompt (tokens) of a segment.")
    max_response_bytes: int = Field(
        200 * 2**20, ge=2**20, description="GetTrajectory refuses to build a larger message (gRPC limit is 256 MiB)."
    )
    max_batch_parts: int = Field(512, ge=1, description="Most parts committed together (group commit).")
    ready_lease_s: float = Field(
        30.0, gt=0, le=3600, description="A WatchReady subscriber silent this long is presumed dead."
    )
    run_token_key: SecretStr | None = Field(
        None,
        description="When set, every RPC must carry x-harnessrl-run-token = HMAC-SHA256(key, run_id) of the run it "
        "names (per-run namespace); mint tokens with `harnessrl capture run-token`.",
    )

    @model_validator(mode="after")
    def _check_backend(self) -> Settings:
        if self.backend == "distributed":
            missing = [f for f in ("redis_url", "s3_endpoint", "s3_bucket") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"backend 'distributed' needs {', '.join(missing)}")
        return self

    def resolved_store_dir(self) -> Path:
        return self.store_dir if self.store_dir is not None else paths.home() / "capture"

    def resolved_sqlite_path(self) -> Path:
        return self.sqlite_path if self.sqlite_path is not None else self.resolved_store_dir() / "index.sqlite3"

    def resolved_blob_dir(self) -> Path:
        return self.blob_dir if self.blob_dir is not None else self.resolved_store_dir() / "blobs"
