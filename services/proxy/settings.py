"""Settings of the proxy (``[proxy]`` in a config file, env prefix ``HARNESSRL_PROXY_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings
from harnessrl.paths import default_model_dir


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_PROXY_", extra="forbid", validate_default=True)

    gateway_target: str = Field("127.0.0.1:50051", description="host:port of the rollout gateway (gRPC).")
    gateway_token: SecretStr | None = Field(None, description="Service credential for the gateway, if it wants one.")
    capture_target: str = Field("127.0.0.1:50052", description="host:port of the capture store (gRPC).")
    capture_token: SecretStr | None = Field(None, description="Service credential for the capture store's writes.")
    admin_token: SecretStr | None = Field(
        None, description="Bearer token of the admin API (/admin/...); unset refuses every admin call."
    )
    uds_path: Path | None = Field(
        None, description="Also serve the same app on this Unix socket (sandboxes without network)."
    )

    model_dir: Path = Field(
        default_factory=default_model_dir, description="HF folder of the served model (tokenizer, template)."
    )
    served_model_names: list[str] = Field(
        default_factory=list, description="Names the served model goes by; empty: the model folder's name."
    )
    accept_any_model_name: bool = Field(
        True,
        description="Serve the trial's policy under whatever model name the harness sends (harnesses send their "
        "own defaults, e.g. Claude Code's); the names asked for are recorded in the trial summary. False: only "
        "served_model_names and the trial's model are served, any other name is a 404.",
    )
    chat_template: str = Field(
        "auto",
        description="'auto' (own template if it renders tools, else a per-model override), 'model', "
        "a builtin, or a .jinja path.",
    )
    template_overrides: dict[str, str] = Field(
        default_factory=lambda: {"SmolLM2-135M-Instruct": "hermes-chatml"},
        description="Per-model template override (model folder name -> builtin or path), used by 'auto'.",
    )
    tool_parser: str = Field(
        "hermes",
        description="Tool-call parser: hermes, qwen3_coder, json, fenced (with the fenced-chatml template) "
        "or module:Class.",
    )
    reasoning_parser: bool = Field(True, description="Split a leading <think>...</think> into reasoning/thinking.")

    sampling: Literal["pin", "honour"] = Field(
        "pin",
        description="Whose sampling parameters win when a harness sends its own: 'pin' (training runs): the run's "
        "temperature/top_p/top_k below, each override counted (harnessrl_sampling_overrides_total, the trial's "
        "sampling_overrides); 'honour': the harness's, the run's values where it names none. Every segment "
        "records what it was sampled with.",
    )
    temperature: float | None = Field(
        1.0, ge=0, le=5, description="The run's sampling temperature; None: the request's (1.0 if it names none)."
    )
    top_p: float | None = Field(1.0, gt=0, le=1, description="The run's top-p; None: the request's (1.0 if none).")
    top_k: int | None = Field(0, ge=0, description="The run's top-k (0 off); None: the request's (0 if none).")
    return_routed_experts: bool = Field(
        False, description="Ask the engine for MoE routes (R3) and capture them with every sampled token."
    )
    default_max_tokens: int = Field(4096, ge=1, description="max_tokens when the request names none.")
    max_tokens_cap: int | None = Field(
        None,
        ge=1,
        description="The most new tokens one call may sample (a training run's response length): a harness "
        "asking for more gets this, each such call counted as a max_tokens override (the trial's "
        "sampling_overrides, harnessrl_sampling_overrides_total); None: the harness's own, up to the window.",
    )
    context_window: int | None = Field(
        None, ge=16, description="Context window; unset asks the gateway (GatewayHealth.context_window)."
    )

    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_trials: int = Field(10_000, ge=1, description="Open trials this proxy serves at once.")
    keep_closed_trials: int = Field(
        10_000, ge=0, description="Summaries of closed trials kept for GET /admin/trials/<id> (oldest dropped)."
    )
    responses_store_max_count: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="Responses API: responses one trial keeps for previous_response_id (least recently used "
        "evicted first; naming an evicted one is a 400). 0 stores none.",
    )
    responses_store_max_bytes: int = Field(
        8 * 1024 * 1024,
        ge=0,
        le=1 << 34,
        description="Responses API: bytes of stored input and output items one trial keeps (an estimate from "
        "their text; same eviction). A client that sends the whole input without store=false has each turn's "
        "input stored: this bounds that memory.",
    )
    trainable_thread_kinds: list[str] = Field(default_factory=lambda: ["main", "subagent"])
    main_requires_tools: bool = Field(True, description="The main thread is the first one whose request carries tools.")
    render_check: bool = Field(
        False, description="Also render every extended turn from scratch and compare (tests; costs O(context))."
    )
    capture_retries: int = Field(5, ge=0, le=100, description="Retries of a failed AppendSegment (idempotent).")
    capture_try_timeout_s: float = Field(
        15.0, gt=0, le=600, description="Deadline of one AppendSegment try, waiting for a (re)starting capture store."
    )
    gc_tuning: bool = Field(
        True, description="`proxy serve` only: gc.freeze() after startup and a higher gen-0 threshold."
    )
    stream_headers_after_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="A streamed answer whose first token has not come within this many seconds (a long prefill, "
        "a loaded engine) gets its 200 and headers now and keep-alives until it comes (Node's fetch drops a "
        "request with no headers in 300 s, Gemini CLI's in 60 s); an error after that (context overflow, engine "
        "failure) is sent in the stream in the protocol's own error shape. Before it, errors are HTTP statuses.",
    )
    stream_keepalive_s: float = Field(
        15.0,
        gt=0,
        le=240,
        description="Seconds between keep-alives while a streamed answer's first token is coming: an SSE comment "
        "(OpenAI chat, Responses), event: ping (Anthropic), a blank line (Gemini SSE) or whitespace in the "
        "JSON array (Gemini without alt=sse).",
    )
    engine_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest wait for the next chunk of a Generate call (time the gateway is paused excluded).",
    )
    gateway_idle_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="Seconds a channel to a gateway that trials named (not gateway_target) stays open after "
        "its last trial closed.",
    )
