from harnessrl.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrialState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIAL_STATE_UNSPECIFIED: _ClassVar[TrialState]
    TRIAL_STATE_QUEUED: _ClassVar[TrialState]
    TRIAL_STATE_SETUP: _ClassVar[TrialState]
    TRIAL_STATE_AGENT: _ClassVar[TrialState]
    TRIAL_STATE_VERIFY: _ClassVar[TrialState]
    TRIAL_STATE_TEARDOWN: _ClassVar[TrialState]
    TRIAL_STATE_DONE: _ClassVar[TrialState]
TRIAL_STATE_UNSPECIFIED: TrialState
TRIAL_STATE_QUEUED: TrialState
TRIAL_STATE_SETUP: TrialState
TRIAL_STATE_AGENT: TrialState
TRIAL_STATE_VERIFY: TrialState
TRIAL_STATE_TEARDOWN: TrialState
TRIAL_STATE_DONE: TrialState

class TrialSpec(_message.Message):
    __slots__ = ("trial_id", "run_id", "task_path", "task_id", "group_id", "group_size", "step", "harness", "policy_version", "max_turns", "agent_timeout_s", "verifier_timeout_s", "harness_options", "model", "gateway_target", "reward_key", "reward_weights")
    class HarnessOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RewardWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_PATH_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    HARNESS_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_TARGET_FIELD_NUMBER: _ClassVar[int]
    REWARD_KEY_FIELD_NUMBER: _ClassVar[int]
    REWARD_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    run_id: str
    task_path: str
    task_id: str
    group_id: str
    group_size: int
    step: int
    harness: str
    policy_version: int
    max_turns: int
    agent_timeout_s: float
    verifier_timeout_s: float
    harness_options: _containers.ScalarMap[str, str]
    model: str
    gateway_target: str
    reward_key: str
    reward_weights: _containers.ScalarMap[str, float]
    def __init__(self, trial_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_path: _Optional[str] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., step: _Optional[int] = ..., harness: _Optional[str] = ..., policy_version: _Optional[int] = ..., max_turns: _Optional[int] = ..., agent_timeout_s: _Optional[float] = ..., verifier_timeout_s: _Optional[float] = ..., harness_options: _Optional[_Mapping[str, str]] = ..., model: _Optional[str] = ..., gateway_target: _Optional[str] = ..., reward_key: _Optional[str] = ..., reward_weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SubmitTrialRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TrialSpec
    def __init__(self, spec: _Optional[_Union[TrialSpec, _Mapping]] = ...) -> None: ...

class SubmitTrialResponse(_message.Message):
    __slots__ = ("trial_id", "created")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    created: bool
    def __init__(self, trial_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class GetTrialRequest(_message.Message):
    __slots__ = ("trial_id",)
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    def __init__(self, trial_id: _Optional[str] = ...) -> None: ...

class TrialStatus(_message.Message):
    __slots__ = ("trial_id", "run_id", "state", "termination_reason", "reward", "has_reward", "timings", "num_segments", "attempt", "worker", "error", "harness_exit_code", "tamper_events", "updated_at", "rewards", "suspicious_events")
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HARNESS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TAMPER_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    SUSPICIOUS_EVENTS_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    run_id: str
    state: TrialState
    termination_reason: _records_pb2.TerminationReason
    reward: float
    has_reward: bool
    timings: _records_pb2.PhaseTimings
    num_segments: int
    attempt: int
    worker: str
    error: str
    harness_exit_code: int
    tamper_events: _containers.RepeatedScalarFieldContainer[str]
    updated_at: float
    rewards: _containers.ScalarMap[str, float]
    suspicious_events: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trial_id: _Optional[str] = ..., run_id: _Optional[str] = ..., state: _Optional[_Union[TrialState, str]] = ..., termination_reason: _Optional[_Union[_records_pb2.TerminationReason, str]] = ..., reward: _Optional[float] = ..., has_reward: _Optional[bool] = ..., timings: _Optional[_Union[_records_pb2.PhaseTimings, _Mapping]] = ..., num_segments: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[str] = ..., error: _Optional[str] = ..., harness_exit_code: _Optional[int] = ..., tamper_events: _Optional[_Iterable[str]] = ..., updated_at: _Optional[float] = ..., rewards: _Optional[_Mapping[str, float]] = ..., suspicious_events: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchTrialsRequest(_message.Message):
    __slots__ = ("run_id", "trial_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trial_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., trial_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelTrialRequest(_message.Message):
    __slots__ = ("trial_id",)
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    def __init__(self, trial_id: _Optional[str] = ...) -> None: ...

class CancelTrialResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...
