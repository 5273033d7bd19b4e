"""The trial lifecycle as data: transitions, terminal states, the one termination reason."""

from __future__ import annotations

import itertools

import pytest

from harnessrl.v1 import records_pb2, sandbox_pb2
from services.sandbox.trial.lifecycle import (
    POLICY_REASONS,
    TERMINAL_STATES,
    VALID_TRANSITIONS,
    TerminationReason,
    TrialOutcome,
    TrialRecord,
    TrialSpec,
    TrialState,
    decide_termination,
)


def test_every_state_has_a_row_and_terminal_states_have_no_exit() -> None:
    assert set(VALID_TRANSITIONS) == set(TrialState)
    for state in TERMINAL_STATES:
        assert VALID_TRANSITIONS[state] == frozenset()
    assert TrialState.DONE in TERMINAL_STATES


def test_happy_path_and_forbidden_moves() -> None:
    record = TrialRecord(spec=TrialSpec(trial_id="a", task_path="/t", harness="nop"))
    for state in (TrialState.SETUP, TrialState.AGENT, TrialState.VERIFY, TrialState.TEARDOWN, TrialState.DONE):
        record = record.transition(state)
    with pytest.raises(ValueError, match="invalid transition done -> queued"):
        record.transition(TrialState.QUEUED)
    fresh = TrialRecord(spec=record.spec)
    with pytest.raises(ValueError, match="queued -> verify"):
        fresh.transition(TrialState.VERIFY)


def test_running_states_can_fall_back_to_queued_for_a_retry() -> None:
    for state in (TrialState.SETUP, TrialState.AGENT, TrialState.VERIFY, TrialState.TEARDOWN):
        assert TrialState.QUEUED in VALID_TRANSITIONS[state]


FLAGS = (
    "cancelled",
    "setup_failed",
    "engine_error",
    "proxy_error",
    "verifier_timed_out",
    "verifier_failed",
    "context_overflow",
    "max_turns_reached",
    "agent_timed_out",
)


def test_no_flag_is_completed_and_each_flag_alone_has_its_reason() -> None:
    assert decide_termination() == TerminationReason.COMPLETED
    expected = {
        "cancelled": TerminationReason.CANCELLED,
        "setup_failed": TerminationReason.ENV_SETUP_FAILED,
        "engine_error": TerminationReason.ENGINE_ERROR,
        "proxy_error": TerminationReason.PROXY_ERROR,
        "verifier_timed_out": TerminationReason.VERIFIER_TIMEOUT,
        "verifier_failed": TerminationReason.VERIFIER_ERROR,
        "context_overflow": TerminationReason.CONTEXT_OVERFLOW,
        "max_turns_reached": TerminationReason.MAX_TURNS,
        "agent_timed_out": TerminationReason.AGENT_TIMEOUT,
    }
    for flag, reason in expected.items():
        assert decide_termination(**{flag: True}) == reason


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(FLAGS, 2)))
def test_infrastructure_failures_win_over_policy_outcomes(a: str, b: str) -> None:
    reason = decide_termination(**{a: True, b: True})
    reasons = {decide_termination(**{a: True}), decide_termination(**{b: True})}
    assert reason in reasons
    if any(r not in POLICY_REASONS for r in reasons):
        assert reason not in POLICY_REASONS


def test_spec_roundtrips_through_the_proto_and_rejects_bad_fields() -> None:
    spec = TrialSpec(trial_id="t-1", task_path="/t", harness="shell", harness_options={"script": "true"}, max_turns=3)
    assert TrialSpec.from_proto(spec.to_proto()) == spec
    with pytest.raises(ValueError):
        TrialSpec(trial_id="../escape", task_path="/t", harness="nop")
    with pytest.raises(ValueError):
        TrialSpec(trial_id="t", task_path="", harness="nop")


def test_status_carries_reason_reward_tamper_and_suspicious_events() -> None:
    record = TrialRecord(spec=TrialSpec(trial_id="t", run_id="r", task_path="/t", harness="nop"))
    outcome = TrialOutcome(
        termination_reason=TerminationReason.VERIFIER_ERROR,
        tamper_events=["restored x"],
        suspicious_events=["suspicious: gc-objects in calc.py"],
        num_segments=2,
    )
    record = record.transition(TrialState.SETUP).transition(TrialState.DONE, outcome=outcome)
    status = record.to_status()
    assert status.state == sandbox_pb2.TRIAL_STATE_DONE
    assert status.termination_reason == records_pb2.TERMINATION_REASON_VERIFIER_ERROR
    assert not status.has_reward
    assert list(status.tamper_events) == ["restored x"]
    assert list(status.suspicious_events) == ["suspicious: gc-objects in calc.py"]
    assert status.num_segments == 2
    done = record.model_copy(
        update={"outcome": TrialOutcome(termination_reason=TerminationReason.COMPLETED, reward=0.0)}
    )
    assert done.to_status().has_reward and done.to_status().reward == 0.0
