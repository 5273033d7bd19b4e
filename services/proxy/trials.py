"""The trials a proxy serves: per-trial bearer tokens, capture state, counters,
and the admin operations (create, summary, close)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl import metrics, telemetry
from harnessrl.errors import AlreadyExists, HarnessError, ResourceExhausted
from harnessrl.rpc import check_target
from harnessrl.v1 import capture_pb2, records_pb2
from services.proxy.capture.records import append_request
from services.proxy.capture.state import Part, TrialCapture
from services.proxy.capture.writer import CaptureClient, TrialWriter
from services.proxy.chat.model import ChatModel
from services.proxy.errors import BadToken, CaptureFailed, ModelNotFound, TrialNotFound, WrongTrial, failure_kind
from services.proxy.gateway_client import EngineClient, EnginePool
from services.proxy.responses.store import ResponseStore
from services.proxy.settings import Settings

log = logging.getLogger(__name__)

MAX_MODEL_NAMES = 16  # distinct names recorded per trial; the rest count under "(other)"
MAX_REFUSALS = 5  # refusal messages kept per trial (all are counted)


class TrialSpec(BaseModel):
    """Body of ``POST /admin/trials``."""

    model_config = ConfigDict(extra="forbid")

    trial_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    run_id: str = Field(min_length=1, max_length=200)
    task_id: str = Field("", max_length=500)
    group_id: str = Field("", max_length=500)
    model: str = Field(
        "", max_length=500, description="An extra name the harness may ask for (an alias of the served model)."
    )
    max_turns: int = Field(0, ge=0, description="Model calls allowed (main and sub-agents); 0 = no limit.")
    gateway_target: str = Field(
        "",
        max_length=500,
        description="The rollout gateway (gRPC host:port, [ipv6]:port or unix:/path) this trial's model calls "
        "go to; empty: the proxy's own (settings.gateway_target).",
    )

    @field_validator("gateway_target")
    @classmethod
    def _dialable(cls, target: str) -> str:
        return check_target(target) if target else target


@dataclass(eq=False)
class Trial:
    spec: TrialSpec
    token: str
    capture: TrialCapture
    writer: TrialWriter
    engine: EngineClient  # the client of the trial's gateway (held in the pool until close)
    # Responses stored for previous_response_id: this trial's only, dropped at close.
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0, 0))
    closed: bool = False
    turns: int = 0
    context_overflow: bool = False
    engine_errors: int = 0
    aborted_turns: int = 0
    # Aborted turns whose client left mid-answer, kept for audit (never trained): their sampled tokens.
    abandoned_turns: int = 0
    abandoned_tokens: int = 0
    max_turns_reached: bool = False
    malformed_tool_calls: int = 0
    dropped_tool_calls: int = 0  # parsed calls not returned: past parallel_tool_calls=false's first
    stop_cut_tokens: int = 0  # sampled past a stop string, never given to the harness: not captured
    # Sampling parameters the harness asked for that the run pinned to its own (sampling = pin), by field.
    sampling_overrides: dict[str, int] = field(default_factory=dict)
    sampling_mode: str = "pin"  # the proxy's sampling setting the trial was served under
    # Requests this proxy refused itself (a 4xx of its own) and failures inside it:
    # either makes the trial an infrastructure failure (termination reason proxy_error).
    refused_requests: int = 0
    proxy_errors: int = 0
    refusals: list[str] = field(default_factory=list)
    # Model names the harness asked for, with how many calls each.
    requested_models: dict[str, int] = field(default_factory=dict)
    closing: asyncio.Future[dict[str, Any]] | None = None
    # The sandbox's trace (traceparent of the admin create call): every model call of
    # the trial is a span in it, though the harness itself sends no trace headers.
    trace_context: Context | None = None

    @property
    def max_turns(self) -> int:
        return self.spec.max_turns

    def asked_for(self, name: str) -> None:
        name = name[:200]
        if name not in self.requested_models and len(self.requested_models) >= MAX_MODEL_NAMES:
            name = "(other)"
        self.requested_models[name] = self.requested_models.get(name, 0) + 1

    def count_overrides(self, fields: Sequence[str]) -> None:
        """One call's overridden sampling fields: on the trial and in the metric."""
        for name in fields:
            self.sampling_overrides[name] = self.sampling_overrides.get(name, 0) + 1
            metrics.SAMPLING_OVERRIDES.labels("proxy", name).inc()

    def note_failure(self, exc: BaseException, path: str = "") -> None:
        """Counts a failed request against this trial (see ``errors.failure_kind``), once per exception."""
        if getattr(exc, "_harnessrl_noted", False):
            return
        kind = failure_kind(exc)
        if kind is None:
            return
        metrics.FAILURES.labels("proxy", kind).inc()
        if kind == "refused":
            self.refused_requests += 1
        else:
            self.proxy_errors += 1
        if len(self.refusals) < MAX_REFUSALS:
            status = exc.http_status if isinstance(exc, HarnessError) else 500
            detail = str(exc) if isinstance(exc, HarnessError) else f"internal error: {type(exc).__name__}: {exc}"
            self.refusals.append(f"{status} {path}: {detail}"[:500])
        try:
            exc._harnessrl_noted = True  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: it may be counted twice
            pass

    def summary(self) -> dict[str, Any]:
        threads = [
            {
                "name": t.name,
                "kind": t.kind,
                "trainable": t.trainable,
                "num_segments": len(t.segments),
                "num_turns": t.calls,
            }
            for t in self.capture.threads.values()
        ]
        return {
            "trial_id": self.spec.trial_id,
            "closed": self.closed,
            "num_segments": sum(x["num_segments"] for x in threads),
            "num_turns": self.turns,
            "threads": threads,
            "context_overflow": self.context_overflow,
            "engine_error": self.engine_errors > 0,
            "engine_errors": self.engine_errors,
            "aborted_turns": self.aborted_turns,
            "abandoned_turns": self.abandoned_turns,
            "abandoned_tokens": self.abandoned_tokens,
            "max_turns_reached": self.max_turns_reached,
            "malformed_tool_calls": self.malformed_tool_calls,
            "dropped_tool_calls": self.dropped_tool_calls,
            "stop_cut_tokens": self.stop_cut_tokens,
            "sampling": self.sampling_mode,
            "sampling_overrides": sum(self.sampling_overrides.values()),  # calls x fields the run pinned
            "sampling_overrides_by_field": dict(self.sampling_overrides),
            "refused_requests": self.refused_requests,
            "proxy_errors": self.proxy_errors,
            "refusals": list(self.refusals),
            "requested_models": dict(self.requested_models),
            "render_mismatches": self.capture.render_mismatches,
            "stored_responses": len(self.responses),  # held for previous_response_id; 0 once closed
            "responses_evicted": self.responses.evictions,  # stored responses the bound evicted
            "chained_responses": self.responses.chained,  # calls continued by previous_response_id
            "websocket_connections": self.responses.ws_connections,  # Responses WebSocket connections
            "capture_error": self.writer.error,
            "parts_appended": self.writer.appended,
            "chat_template": self.capture.renderer.template.name,
            "chat_template_sha256": self.capture.renderer.template.sha256,
        }


class ProxyCore:
    """The proxy's one service object: model, clients and trials."""

    def __init__(self, settings: Settings, model: ChatModel) -> None:
        self.settings = settings
        self.model = model
        # Client spans only when this process exports traces: they are the largest
        # fixed cost of a turn otherwise (see bench proxy).
        tracing = self.tracing = settings.otlp_endpoint is not None
        if tracing:
            telemetry.configure("proxy", settings.otlp_endpoint)
        token = settings.gateway_token.get_secret_value() if settings.gateway_token else None
        self.engines = EnginePool(
            settings.gateway_target, token, settings.engine_timeout_s, tracing, settings.gateway_idle_s
        )
        self.engine = self.engines.default
        ctoken = settings.capture_token.get_secret_value() if settings.capture_token else None
        self.capture = CaptureClient(
            settings.capture_target, ctoken, settings.capture_retries, tracing, settings.capture_try_timeout_s
        )
        self.trials: dict[str, Trial] = {}
        self._by_token: dict[str, Trial] = {}
        self._window = settings.context_window

    async def context_window(self, trial: Trial | None = None) -> int:
        """The configured window, else the one the trial's gateway (or the default) reports."""
        if self._window is not None:
            return self._window
        return await (trial.engine if trial is not None else self.engine).context_window()

    # -- admin ------------------------------------------------------------------

    def create(self, spec: TrialSpec) -> Trial:
        existing = self.trials.get(spec.trial_id)
        if existing is not None:
            if existing.spec != spec or existing.closed:
                raise AlreadyExists(f"trial {spec.trial_id} already exists with another body or is closed")
            return existing
        if sum(not t.closed for t in self.trials.values()) >= self.settings.max_trials:
            raise ResourceExhausted(f"this proxy already serves {self.settings.max_trials} open trials")
        s = self.settings
        capture = TrialCapture(
            self.model.renderer,
            trainable_kinds=s.trainable_thread_kinds,
            main_requires_tools=s.main_requires_tools,
            render_check=s.render_check,
        )
        writer = self.capture.writer(spec.trial_id)
        engine = self.engines.acquire(spec.gateway_target)
        store = ResponseStore(s.responses_store_max_count, s.responses_store_max_bytes)
        trial = Trial(
            spec, secrets.token_urlsafe(32), capture, writer, engine, responses=store, sampling_mode=s.sampling
        )
        metrics.ACTIVE_TRIALS.labels("proxy").inc()
        self.trials[spec.trial_id] = trial
        self._by_token[trial.token] = trial
        return trial

    def get(self, trial_id: str) -> Trial:
        trial = self.trials.get(trial_id)
        if trial is None:
            raise TrialNotFound(f"no trial {trial_id!r}")
        return trial

    async def close(self, trial_id: str) -> dict[str, Any]:
        """Closes every open segment and waits until all parts are durable; idempotent."""
        trial = self.get(trial_id)
        if trial.closing is None:
            trial.closing = asyncio.ensure_future(self._close(trial))
        return await asyncio.shield(trial.closing)

    async def _close(self, trial: Trial) -> dict[str, Any]:
        if not trial.closed:
            metrics.ACTIVE_TRIALS.labels("proxy").dec()
            self.engines.release(trial.spec.gateway_target)
        trial.closed = True
        trial.responses.clear()
        self._by_token.pop(trial.token, None)
        for part in trial.capture.close_all():
            trial.writer.submit(self.append_request(trial, part, "", None))
        await trial.writer.stop()
        if trial.writer.error:
            trial.closing = None  # let a later close report it again
            raise CaptureFailed(f"trial {trial.spec.trial_id}: capture not durable: {trial.writer.error}")
        trial.capture.release()
        self._forget_old_closed()
        return trial.summary()

    def _forget_old_closed(self) -> None:
        """A long-running proxy keeps the summaries of its last closed trials, not all."""
        closed = [t for t, trial in self.trials.items() if trial.closed]
        for trial_id in closed[: max(0, len(closed) - self.settings.keep_closed_trials)]:
            del self.trials[trial_id]

    # -- harness traffic ------------------------------------------------------------

    def authenticate(self, trial_id: str, token: str | None) -> Trial:
        """401 without a valid token (or after close), 403 with another trial's, 404 for an unknown trial."""
        trial = self.trials.get(trial_id)
        owner = self._by_token.get(token) if token else None
        if owner is not None and owner is not trial:
            if trial is None:
                raise TrialNotFound(f"no trial {trial_id!r}")
            raise WrongTrial("this API key belongs to another trial")
        if trial is None:
            raise TrialNotFound(f"no trial {trial_id!r}")
        if owner is None:
            raise BadToken("missing or invalid API key for this trial")
        return trial

    def check_model(self, trial: Trial, name: str) -> None:
        """Every name serves the trial's policy unless ``accept_any_model_name`` is off;
        the name asked for is recorded either way."""
        if not self.settings.accept_any_model_name:
            allowed = {trial.spec.model} | set(self.model.names) if trial.spec.model else set(self.model.names)
            if name not in allowed:
                raise ModelNotFound(
                    f"The model {name!r} does not exist or you do not have access to it; served: {sorted(allowed)}"
                )
        trial.asked_for(name)

    def append_request(
        self, trial: Trial, part: Part, finish: str, usage: records_pb2.Usage | None
    ) -> capture_pb2.AppendSegmentRequest:
        spec = trial.spec
        return append_request(
            spec.run_id,
            spec.trial_id,
            spec.task_id,
            spec.group_id,
            spec.model or self.model.names[0],
            self.model.template.sha256,
            part,
            finish,
            usage or records_pb2.Usage(),
        )

    async def aclose(self) -> None:
        """Shutting down: closes every trial still open. One whose parts cannot be made
        durable (its capture store went away, or the trial was already finalized without
        them: its sandbox gave up on the close) is a warning naming it, not a traceback that
        stops the others from being closed."""
        for trial in list(self.trials.values()):
            if not trial.closed:
                try:
                    await self.close(trial.spec.trial_id)
                except CaptureFailed as e:
                    log.warning("trial closed at shutdown without its last parts", extra={"kv": {"error": str(e)}})
        await self.engines.close()
        await self.capture.close()
