"""The trial lifecycle as data: states, allowed transitions, terminal states,
termination reasons and the one function that picks a trial's reason.

A trial moves QUEUED -> SETUP -> AGENT -> VERIFY -> TEARDOWN -> DONE (a multi-step
task, ``task_steps``: AGENT -> VERIFY once per step, VERIFY -> AGENT between them). Any
running state may fall back to QUEUED when its worker loses the lease, or its
attempt crashed in the worker, and the retry policy allows another attempt; any
state may jump to TEARDOWN (a phase failed) or, before it started, to DONE
(cancelled while queued).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.rpc import check_target
from harnessrl.v1 import records_pb2, sandbox_pb2
from services.sandbox.task.steps import StepOutcome

# A weight of a reward: a real finite number (no bool, no numeric string, no NaN/inf).
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class TrialState(StrEnum):
    QUEUED = "queued"
    SETUP = "setup"
    AGENT = "agent"
    VERIFY = "verify"
    TEARDOWN = "teardown"
    DONE = "done"


TERMINAL_STATES: frozenset[TrialState] = frozenset({TrialState.DONE})

VALID_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    TrialState.QUEUED: frozenset({TrialState.SETUP, TrialState.DONE}),
    TrialState.SETUP: frozenset({TrialState.AGENT, TrialState.TEARDOWN, TrialState.QUEUED, TrialState.DONE}),
    TrialState.AGENT: frozenset({TrialState.VERIFY, TrialState.TEARDOWN, TrialState.QUEUED, TrialState.DONE}),
    # VERIFY -> AGENT: the next step of a multi-step task ([[steps]]).
    TrialState.VERIFY: frozenset({TrialState.AGENT, TrialState.TEARDOWN, TrialState.QUEUED, TrialState.DONE}),
    TrialState.TEARDOWN: frozenset({TrialState.DONE, TrialState.QUEUED}),
    TrialState.DONE: frozenset(),
}


class TerminationReason(StrEnum):
    """Invariant 5: exactly one per trial."""

    COMPLETED = "completed"
    MAX_TURNS = "max_turns"
    CONTEXT_OVERFLOW = "context_overflow"
    AGENT_TIMEOUT = "agent_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    ENV_SETUP_FAILED = "env_setup_failed"
    VERIFIER_ERROR = "verifier_error"
    ENGINE_ERROR = "engine_error"
    CANCELLED = "cancelled"
    PROXY_ERROR = "proxy_error"


# Outcomes of the policy keep their reward; the rest get weight 0 in the loss.
POLICY_REASONS: frozenset[TerminationReason] = frozenset(
    {
        TerminationReason.COMPLETED,
        TerminationReason.MAX_TURNS,
        TerminationReason.CONTEXT_OVERFLOW,
        TerminationReason.AGENT_TIMEOUT,
    }
)


def is_valid_transition(src: TrialState, dst: TrialState) -> bool:
    return dst in VALID_TRANSITIONS[src]


def decide_termination(
    *,
    cancelled: bool = False,
    setup_failed: bool = False,
    engine_error: bool = False,
    proxy_error: bool = False,
    verifier_timed_out: bool = False,
    verifier_failed: bool = False,
    context_overflow: bool = False,
    max_turns_reached: bool = False,
    agent_timed_out: bool = False,
) -> TerminationReason:
    """Picks the one reason. Infrastructure failures win over policy outcomes
    (an infra failure must never pass for a reward), and among policy outcomes
    the most specific one wins."""
    ordered = (
        (cancelled, TerminationReason.CANCELLED),
        (setup_failed, TerminationReason.ENV_SETUP_FAILED),
        (engine_error, TerminationReason.ENGINE_ERROR),
        (proxy_error, TerminationReason.PROXY_ERROR),
        (verifier_timed_out, TerminationReason.VERIFIER_TIMEOUT),
        (verifier_failed, TerminationReason.VERIFIER_ERROR),
        (context_overflow, TerminationReason.CONTEXT_OVERFLOW),
        (max_turns_reached, TerminationReason.MAX_TURNS),
        (agent_timed_out, TerminationReason.AGENT_TIMEOUT),
    )
    return next((reason for flag, reason in ordered if flag), TerminationReason.COMPLETED)


class PhaseTimings(BaseModel):
    """Wall-clock seconds per phase."""

    setup_s: float = 0.0
    agent_s: float = 0.0
    verify_s: float = 0.0
    teardown_s: float = 0.0

    def to_proto(self) -> records_pb2.PhaseTimings:
        return records_pb2.PhaseTimings(**self.model_dump())


class TrialSpec(BaseModel):
    """What to run: mirrors ``harnessrl.v1.TrialSpec``. Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trial_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    run_id: str = ""
    task_path: str = Field(min_length=1)
    task_id: str = ""
    group_id: str = ""
    group_size: int = Field(default=1, ge=0)
    step: int = 0
    harness: str = Field(min_length=1)
    policy_version: int = 0
    max_turns: int = Field(default=0, ge=0)
    agent_timeout_s: float = Field(default=0.0, ge=0)
    verifier_timeout_s: float = Field(default=0.0, ge=0)
    harness_options: dict[str, str] = Field(default_factory=dict)
    model: str = ""
    # The gateway (gRPC target) the trial's model calls go to; "" = the proxy's own.
    gateway_target: str = Field(default="", max_length=500)
    # The submitter's trace context (``traceparent``), carried through the queue so the
    # trial's spans join the trace of the trainer step that enqueued it. Not in the
    # proto spec and not part of a spec's identity (``same_as``).
    trace_context: dict[str, str] = Field(default_factory=dict)
    # Which of the verifier's rewards trains, per run (``integrity.select_reward``):
    # both unset is what Harbor reports as a trial's reward ("reward", or the only key).
    reward_key: str = Field(default="", max_length=128)
    reward_weights: dict[str, FiniteFloat] = Field(default_factory=dict, max_length=64)

    @field_validator("gateway_target")
    @classmethod
    def _dialable(cls, target: str) -> str:
        return check_target(target) if target else target

    @model_validator(mode="after")
    def _one_selection(self) -> TrialSpec:
        if self.reward_key and self.reward_weights:
            raise ValueError("set reward_key or reward_weights, not both")
        if any(not key for key in self.reward_weights):
            raise ValueError("reward_weights has an empty key")
        return self

    def same_as(self, other: TrialSpec) -> bool:
        return self.model_copy(update={"trace_context": {}}) == other.model_copy(update={"trace_context": {}})

    @classmethod
    def from_proto(cls, msg: sandbox_pb2.TrialSpec) -> TrialSpec:
        data: dict[str, Any] = {f.name: getattr(msg, f.name) for f in msg.DESCRIPTOR.fields}
        data["harness_options"] = dict(msg.harness_options)
        data["reward_weights"] = dict(msg.reward_weights)
        return cls.model_validate(data)

    def to_proto(self) -> sandbox_pb2.TrialSpec:
        return sandbox_pb2.TrialSpec(**self.model_dump(exclude={"trace_context"}))


class TrialOutcome(BaseModel):
    """What a finished run of a trial produced (the runner's result)."""

    termination_reason: TerminationReason
    # The value that trains: the run's selection over ``rewards``; None when there is none.
    reward: float | None = None
    # Every value the verifier wrote (each key of reward.json; {"reward": v} for reward.txt),
    # kept even when the run's selection did not match them (then reward is None).
    rewards: dict[str, float] = Field(default_factory=dict)
    timings: PhaseTimings = Field(default_factory=PhaseTimings)
    num_segments: int = 0
    harness_exit_code: int = 0
    tamper_events: list[str] = Field(default_factory=list)
    # Patterns of reward hacks in the agent's change (``defences/suspicious``): counted,
    # and the reward zeroed where ``[sandbox.integrity] suspicious = "zero"``.
    suspicious_events: list[str] = Field(default_factory=list)
    error: str = ""
    events: list[str] = Field(default_factory=list)
    verifier_summary: str = ""
    artifacts_dir: str = ""
    task_id: str = ""
    # Model names the harness asked the proxy for (each served the trial's policy).
    requested_models: list[str] = Field(default_factory=list)
    # Sampling parameters the harness asked for that the run pinned to its own (the proxy's count).
    sampling_overrides: int = 0
    # A multi-step task's steps that ran, in order, each with its own rewards ([[steps]]);
    # ``rewards`` then combines them by the task's multi_step_reward_strategy.
    steps: list[StepOutcome] = Field(default_factory=list)


class TrialRecord(BaseModel):
    """The stored state of a trial (queue + status). Updated only through
    checked transitions (``transition``)."""

    spec: TrialSpec
    state: TrialState = TrialState.QUEUED
    attempt: int = 0
    # Attempts that raised out of the worker's own code and were given back (``requeue``).
    crashes: int = 0
    worker: str = ""
    cancel_requested: bool = False
    outcome: TrialOutcome | None = None
    error: str = ""
    updated_at: float = Field(default_factory=time.time)

    @property
    def trial_id(self) -> str:
        return self.spec.trial_id

    def transition(self, dst: TrialState, **changes: Any) -> TrialRecord:
        """A copy in state ``dst``; raises ValueError on a transition the table forbids."""
        if not is_valid_transition(self.state, dst):
            raise ValueError(f"trial {self.trial_id}: invalid transition {self.state} -> {dst}")
        return self.model_copy(update={"state": dst, "updated_at": time.time(), **changes})

    def to_status(self) -> sandbox_pb2.TrialStatus:
        out = self.outcome
        status = sandbox_pb2.TrialStatus(
            trial_id=self.trial_id,
            run_id=self.spec.run_id,
            state=_STATE_TO_PROTO[self.state],
            attempt=self.attempt,
            worker=self.worker,
            error=self.error or (out.error if out else ""),
            updated_at=self.updated_at,
        )
        if out is not None:
            status.termination_reason = REASON_TO_PROTO[out.termination_reason]
            status.has_reward = out.reward is not None
            status.reward = out.reward or 0.0
            status.timings.CopyFrom(out.timings.to_proto())
            status.num_segments = out.num_segments
            status.harness_exit_code = out.harness_exit_code
            status.tamper_events.extend(out.tamper_events)
            status.suspicious_events.extend(out.suspicious_events)
            status.rewards.update(out.rewards)
        return status


_STATE_TO_PROTO = {
    TrialState.QUEUED: sandbox_pb2.TRIAL_STATE_QUEUED,
    TrialState.SETUP: sandbox_pb2.TRIAL_STATE_SETUP,
    TrialState.AGENT: sandbox_pb2.TRIAL_STATE_AGENT,
    TrialState.VERIFY: sandbox_pb2.TRIAL_STATE_VERIFY,
    TrialState.TEARDOWN: sandbox_pb2.TRIAL_STATE_TEARDOWN,
    TrialState.DONE: sandbox_pb2.TRIAL_STATE_DONE,
}

REASON_TO_PROTO = {
    reason: records_pb2.TerminationReason.Value(f"TERMINATION_REASON_{reason.name}") for reason in TerminationReason
}
