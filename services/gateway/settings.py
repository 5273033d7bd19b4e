"""Settings of the gateway service (``[gateway]`` in a config file, env prefix ``HARNESSRL_GATEWAY_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings
from harnessrl.torchdevice import DEVICE_HELP, check_device_name


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_GATEWAY_", extra="forbid", validate_default=True)

    engine: str = Field(
        "local",
        min_length=1,
        description="Engine selection: 'local' (transformers on CPU), 'vllm' (pool of vLLM servers), "
        "'scripted:PATH' (scripted policy from a JSON file, for tests) or 'module.path:ClassName'.",
    )
    model_path: Path | None = Field(
        None,
        description="Plain Hugging Face model folder (weights for 'local', tokenizer for 'scripted'); "
        "default: the model prepared by setup (harnessrl.paths.default_model_dir()).",
    )
    model_name: str | None = Field(None, description="Model name reported by Health; default: the folder's name.")
    context_window: int | None = Field(
        None, ge=2, le=100_000_000, description="Override of the model's context window (tokens)."
    )
    initial_version: int = Field(0, ge=0, description="Policy version of the weights loaded at start.")
    replicas: int = Field(1, ge=1, le=64, description="Number of local engine replicas ('local' and custom engines).")
    engine_options: dict[str, str] = Field(
        default_factory=dict, description="Free-form options passed to a 'module:Class' engine."
    )

    # Pause / drain.
    pause_wait_s: float = Field(
        30.0, ge=0, le=3600, description="How long a new request waits while paused before UNAVAILABLE (retryable)."
    )
    max_waiting: int = Field(
        4096, ge=0, le=1_000_000, description="Requests allowed to wait while paused; beyond it, UNAVAILABLE at once."
    )

    # Streaming to the proxy.
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="Coalesce a reply's streamed tokens: tokens that arrive within this many ms of the last "
        "message sent wait and go together when the window ends, or with the reply's end, in one message "
        "(ids, logprobs and versions unchanged; versions are stamped when a token arrives). The first token "
        "and the finish are never held, so TTFT and the reply's end are not delayed. Each message costs the "
        "gateway and the proxy CPU (gRPC, one SSE event to a streaming harness); 0 sends every engine chunk "
        "as it comes. A whole reply (GenerateRequest.whole_reply: an unstreamed call) is one message whatever this is.",
    )

    # Routing across replicas.
    max_attempts: int = Field(
        3, ge=1, le=16, description="Replicas tried for a request that fails before its first token."
    )
    eject_after_failures: int = Field(
        2, ge=1, le=100, description="Consecutive failures after which a replica is ejected from routing."
    )
    health_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Seconds between health probes; a passing probe reinstates an ejected replica.",
    )

    # Local engine (transformers on CPU).
    max_batch_size: int = Field(8, ge=1, le=256, description="Sequences decoded together per step (local engine).")
    prefill_chunk_tokens: int = Field(
        512, ge=16, le=1_000_000, description="Prompt tokens prefilled per step, interleaved with decode steps."
    )
    prefix_cache_entries: int = Field(
        16, ge=0, le=10_000, description="(trial, thread) KV caches kept for reuse across turns (LRU); 0 disables."
    )
    prefix_cache_tokens: int = Field(
        131_072, ge=0, description="Bound on the tokens held by the cross-turn KV caches of the local engine."
    )
    prefix_cache_mib: int = Field(
        1024,
        ge=0,
        description="Bound on the memory (MiB) the cross-turn KV caches of the local engine hold; least "
        "recently used first out (a trial whose cache left prefills its next turn again). A trial's caches "
        "also go when it ends (Abort by trial; harnessrl run's launcher sends it) and at a weight update.",
    )
    torch_threads: int | None = Field(None, ge=1, le=1024, description="torch.set_num_threads; default: torch's.")
    device: str = Field("cpu", description=f"Where the local engine runs: {DEVICE_HELP}.")
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="The local engine's weights; sampling always reads fp32 logits."
    )
    logprobs_mode: Literal["processed", "raw"] = Field(
        "processed",
        description="'processed': logprob under the distribution sampled from (temperature, top-k, top-p "
        "applied; greedy uses temperature 1); 'raw': log-softmax of the raw logits.",
    )

    # Scripted engine.
    scripted_log_path: Path | None = Field(
        None, description="JSONL log of every scripted generation (overrides the script's log_path)."
    )

    # vLLM engine.
    vllm_urls: list[str] = Field(
        default_factory=list, description="Base URLs of the vLLM OpenAI servers, e.g. http://127.0.0.1:8000."
    )
    vllm_api_key: SecretStr | None = Field(None, description="Bearer token of the vLLM servers, if they require one.")
    vllm_model: str | None = Field(None, description="Model name served by vLLM; default: the first of /v1/models.")
    vllm_timeout_s: float = Field(600.0, gt=0, le=86_400, description="Timeout of one vLLM HTTP request.")
    vllm_stream_interval: int = Field(
        16,
        ge=1,
        le=4096,
        description="Tokens per streamed event from vLLM: a reply's first token and its end come at once, "
        "the rest in events of this many tokens, read from vLLM's token endpoint (servers started with "
        "--enable-scale-out), whose per-token weight versions keep versions exact across a pause. Each event "
        "wakes the gateway and the proxy: on long replies that is most of the hot path's CPU per token. "
        "1, or a server without that endpoint (then a warning, once): one event per token from /v1/completions.",
    )
    vllm_stream_interval_wide: int = Field(
        64,
        ge=1,
        le=4096,
        description="Tokens per streamed vLLM event when the caller watches no stop string "
        "(GenerateRequest.wide_events: the proxy, for a streaming client that stops on no string), "
        "if more than vllm_stream_interval. With a stop string the proxy keeps narrow events: vLLM is "
        "given the stops and ends the reply itself, but the proxy watches and cuts at them too, and "
        "sooner is cheaper when it must abort; without one, wider events only make the harness's text come in larger "
        "pieces, and cost the gateway and the proxy one wake each (bench vllm-path, streamed 1024-token "
        "replies at 1 in flight: 0.049 CPU-ms per token at 64 vs 0.078 at 16). The first token still comes at once.",
    )
    vllm_max_concurrency: int = Field(
        256, ge=1, le=100_000, description="Requests in flight per vLLM server (used for least-loaded routing)."
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        return check_device_name(value)

    @field_validator("engine")
    @classmethod
    def _engine_syntax(cls, value: str) -> str:
        """Catches a malformed selection string when the config loads (the registry
        checks that the named engine exists when the server starts)."""
        value = value.strip()
        name, sep, arg = value.partition(":")
        if value in ("local", "vllm") or (name == "scripted" and arg) or (sep and name and arg and "/" not in name):
            return value
        raise ValueError(
            f"unknown engine {value!r}; valid: 'local', 'vllm', 'scripted:PATH' or 'module.path:ClassName'"
        )
