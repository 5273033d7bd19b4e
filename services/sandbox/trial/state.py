"""The state of one run of a trial and what the runner's phases share: the failure flags,
the exec records in the artifacts, the phases' environment, and the outcome built from
the flags (``lifecycle.decide_termination``) with ``result.json`` beside the artifacts."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.context import Context

from services.sandbox.backends.base import ExecResult, Sandbox
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.relay import UnixRelay
from services.sandbox.harnesses import HarnessAdapter
from services.sandbox.task import dockerfile, verifier_policy
from services.sandbox.task.model import Task
from services.sandbox.task.steps import StepOutcome
from services.sandbox.trial.endpoints import ProxySummary, ProxyTrial
from services.sandbox.trial.lifecycle import (
    PhaseTimings,
    TerminationReason,
    TrialOutcome,
    TrialSpec,
    decide_termination,
)

log = logging.getLogger(__name__)


@dataclass
class Trial:
    """Mutable state of one run of a trial (flags feed decide_termination)."""

    spec: TrialSpec
    dirs: TrialDirs
    artifacts: Path
    task: Task | None = None
    harness: HarnessAdapter | None = None
    sandbox: Sandbox | None = None
    relay: UnixRelay | None = None
    relay_dir: Path | None = None
    proxy_trial: ProxyTrial | None = None
    proxy_registered: bool = False
    summary: ProxySummary = field(default_factory=ProxySummary)
    timings: PhaseTimings = field(default_factory=PhaseTimings)
    flags: dict[str, bool] = field(default_factory=dict)
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0
    tamper: list[str] = field(default_factory=list)
    # The detector's hits on the agent's change (``defences/suspicious``), once each.
    suspicious: list[str] = field(default_factory=list)
    verifier: verifier_policy.VerifierRun | None = None
    events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verifier_summary: str = ""
    # The trial's trace context when it started: the proxy parents model calls on it.
    trace_context: Context | None = None
    # A multi-step task's steps that ran, in order (``task_steps``).
    steps: list[StepOutcome] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.spec.task_id or (self.task.task_id if self.task else "")

    def fail(self, flag: str, message: str) -> None:
        self.flags[flag] = True
        self.errors.append(message)
        log.info("trial phase failed", extra={"kv": {"trial": self.spec.trial_id, "flag": flag, "error": message}})

    def record_exec(self, name: str, result: ExecResult) -> None:
        """``name``.log and ``name``.json in the artifacts (``name`` may hold a step's folder)."""
        log_file = self.artifacts / f"{name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_bytes(result.output)
        self.events += [f"{name}:{event}" for event in result.events()]
        meta = result.model_dump(exclude={"output"})
        (self.artifacts / f"{name}.json").write_text(json.dumps(meta, indent=1))


def phase_env(sandbox: Sandbox, extra: dict[str, str]) -> dict[str, str]:
    """The env of the agent and verify phases: the task's (the image's, or the local layer's, whose
    PATH already starts from Docker's default) over Docker's default PATH, which applies alone only
    where a sandbox reports no PATH; then the harness's or verifier's own."""
    base = {"PATH": dockerfile.DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb"}
    return {**base, **sandbox.env, "TMPDIR": "/tmp", **extra}


def fallback_outcome(t: Trial, error: str) -> TrialOutcome:
    """The outcome when ``build_outcome`` itself raised: verifier_error (the trial's result
    could not be computed, so it is never a reward), with what is known, nothing derived."""
    return TrialOutcome(
        termination_reason=TerminationReason.VERIFIER_ERROR,
        tamper_events=list(t.tamper),
        suspicious_events=list(t.suspicious),
        error="; ".join([*t.errors, error]),
        events=list(t.events),
        artifacts_dir=str(t.artifacts),
        task_id=t.spec.task_id,
    )


def build_outcome(t: Trial) -> TrialOutcome:
    """The one outcome of the run, also written to ``result.json`` in its artifacts."""
    f = t.flags
    reason = decide_termination(
        cancelled=f.get("cancelled", False),
        setup_failed=f.get("setup_failed", False),
        engine_error=f.get("engine_error", False),
        proxy_error=f.get("proxy_error", False),
        verifier_timed_out=f.get("verifier_timed_out", False),
        verifier_failed=f.get("verifier_failed", False),
        context_overflow=f.get("context_overflow", False),
        max_turns_reached=f.get("max_turns_reached", False),
        agent_timed_out=f.get("agent_timed_out", False),
    )
    no_reward = reason in (TerminationReason.CANCELLED, TerminationReason.ENV_SETUP_FAILED)
    outcome = TrialOutcome(
        termination_reason=reason,
        reward=None if no_reward else t.reward,
        rewards={} if no_reward else t.rewards,
        timings=t.timings,
        num_segments=t.summary.num_segments,
        harness_exit_code=t.exit_code,
        tamper_events=t.tamper,
        suspicious_events=t.suspicious,
        error="; ".join(t.errors),
        events=t.events,
        verifier_summary=t.verifier_summary,
        artifacts_dir=str(t.artifacts),
        task_id=t.task_id,
        requested_models=sorted(t.summary.requested_models),
        sampling_overrides=t.summary.sampling_overrides,
        steps=t.steps,
    )
    try:
        t.artifacts.mkdir(parents=True, exist_ok=True)
        (t.artifacts / "result.json").write_text(outcome.model_dump_json(indent=1))
    except OSError as e:
        # The worker still reports and finalizes the outcome; only the local copy is missing.
        log.exception("writing result.json failed", extra={"kv": {"trial": t.spec.trial_id}})
        outcome.error = "; ".join([*t.errors, f"result.json: {e}"])
    return outcome
