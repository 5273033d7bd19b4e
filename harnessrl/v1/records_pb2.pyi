from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TerminationReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINATION_REASON_UNSPECIFIED: _ClassVar[TerminationReason]
    TERMINATION_REASON_COMPLETED: _ClassVar[TerminationReason]
    TERMINATION_REASON_MAX_TURNS: _ClassVar[TerminationReason]
    TERMINATION_REASON_CONTEXT_OVERFLOW: _ClassVar[TerminationReason]
    TERMINATION_REASON_AGENT_TIMEOUT: _ClassVar[TerminationReason]
    TERMINATION_REASON_VERIFIER_TIMEOUT: _ClassVar[TerminationReason]
    TERMINATION_REASON_ENV_SETUP_FAILED: _ClassVar[TerminationReason]
    TERMINATION_REASON_VERIFIER_ERROR: _ClassVar[TerminationReason]
    TERMINATION_REASON_ENGINE_ERROR: _ClassVar[TerminationReason]
    TERMINATION_REASON_CANCELLED: _ClassVar[TerminationReason]
    TERMINATION_REASON_PROXY_ERROR: _ClassVar[TerminationReason]
TERMINATION_REASON_UNSPECIFIED: TerminationReason
TERMINATION_REASON_COMPLETED: TerminationReason
TERMINATION_REASON_MAX_TURNS: TerminationReason
TERMINATION_REASON_CONTEXT_OVERFLOW: TerminationReason
TERMINATION_REASON_AGENT_TIMEOUT: TerminationReason
TERMINATION_REASON_VERIFIER_TIMEOUT: TerminationReason
TERMINATION_REASON_ENV_SETUP_FAILED: TerminationReason
TERMINATION_REASON_VERIFIER_ERROR: TerminationReason
TERMINATION_REASON_ENGINE_ERROR: TerminationReason
TERMINATION_REASON_CANCELLED: TerminationReason
TERMINATION_REASON_PROXY_ERROR: TerminationReason

class RoutedExperts(_message.Message):
    __slots__ = ("data", "num_tokens", "num_layers", "top_k")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    num_tokens: int
    num_layers: int
    top_k: int
    def __init__(self, data: _Optional[bytes] = ..., num_tokens: _Optional[int] = ..., num_layers: _Optional[int] = ..., top_k: _Optional[int] = ...) -> None: ...

class TokenArrays(_message.Message):
    __slots__ = ("ids", "mask", "logprobs", "policy_versions", "routed_experts")
    IDS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    mask: bytes
    logprobs: bytes
    policy_versions: bytes
    routed_experts: RoutedExperts
    def __init__(self, ids: _Optional[bytes] = ..., mask: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., policy_versions: _Optional[bytes] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class SegmentKey(_message.Message):
    __slots__ = ("run_id", "trial_id", "thread", "segment_index")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trial_id: str
    thread: str
    segment_index: int
    def __init__(self, run_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., thread: _Optional[str] = ..., segment_index: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("key", "thread_kind", "trainable", "prompt_ids", "response", "num_turns", "finish_reason", "usage", "model", "chat_template_sha256", "started_at", "updated_at", "closed", "sampling")
    KEY_FIELD_NUMBER: _ClassVar[int]
    THREAD_KIND_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    key: SegmentKey
    thread_kind: str
    trainable: bool
    prompt_ids: bytes
    response: TokenArrays
    num_turns: int
    finish_reason: str
    usage: Usage
    model: str
    chat_template_sha256: str
    started_at: float
    updated_at: float
    closed: bool
    sampling: SegmentSampling
    def __init__(self, key: _Optional[_Union[SegmentKey, _Mapping]] = ..., thread_kind: _Optional[str] = ..., trainable: _Optional[bool] = ..., prompt_ids: _Optional[bytes] = ..., response: _Optional[_Union[TokenArrays, _Mapping]] = ..., num_turns: _Optional[int] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model: _Optional[str] = ..., chat_template_sha256: _Optional[str] = ..., started_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., closed: _Optional[bool] = ..., sampling: _Optional[_Union[SegmentSampling, _Mapping]] = ...) -> None: ...

class SegmentSampling(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "mode", "from_harness", "overridden")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FROM_HARNESS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDDEN_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    mode: str
    from_harness: _containers.RepeatedScalarFieldContainer[str]
    overridden: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., mode: _Optional[str] = ..., from_harness: _Optional[_Iterable[str]] = ..., overridden: _Optional[_Iterable[str]] = ...) -> None: ...

class PhaseTimings(_message.Message):
    __slots__ = ("setup_s", "agent_s", "verify_s", "teardown_s")
    SETUP_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_S_FIELD_NUMBER: _ClassVar[int]
    TEARDOWN_S_FIELD_NUMBER: _ClassVar[int]
    setup_s: float
    agent_s: float
    verify_s: float
    teardown_s: float
    def __init__(self, setup_s: _Optional[float] = ..., agent_s: _Optional[float] = ..., verify_s: _Optional[float] = ..., teardown_s: _Optional[float] = ...) -> None: ...

class ThreadInfo(_message.Message):
    __slots__ = ("name", "kind", "trainable", "num_segments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    trainable: bool
    num_segments: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., trainable: _Optional[bool] = ..., num_segments: _Optional[int] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("run_id", "trial_id", "task_id", "group_id", "group_size", "step", "harness", "segments", "threads", "reward", "has_reward", "termination_reason", "timings", "verifier_summary", "policy_versions_seen", "harness_exit_code", "finalized", "finalized_at", "metadata", "rewards", "task_steps")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_SEEN_FIELD_NUMBER: _ClassVar[int]
    HARNESS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TASK_STEPS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trial_id: str
    task_id: str
    group_id: str
    group_size: int
    step: int
    harness: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    threads: _containers.RepeatedCompositeFieldContainer[ThreadInfo]
    reward: float
    has_reward: bool
    termination_reason: TerminationReason
    timings: PhaseTimings
    verifier_summary: str
    policy_versions_seen: _containers.RepeatedScalarFieldContainer[int]
    harness_exit_code: int
    finalized: bool
    finalized_at: float
    metadata: _containers.ScalarMap[str, str]
    rewards: _containers.ScalarMap[str, float]
    task_steps: _containers.RepeatedCompositeFieldContainer[TaskStepResult]
    def __init__(self, run_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., step: _Optional[int] = ..., harness: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., threads: _Optional[_Iterable[_Union[ThreadInfo, _Mapping]]] = ..., reward: _Optional[float] = ..., has_reward: _Optional[bool] = ..., termination_reason: _Optional[_Union[TerminationReason, str]] = ..., timings: _Optional[_Union[PhaseTimings, _Mapping]] = ..., verifier_summary: _Optional[str] = ..., policy_versions_seen: _Optional[_Iterable[int]] = ..., harness_exit_code: _Optional[int] = ..., finalized: _Optional[bool] = ..., finalized_at: _Optional[float] = ..., metadata: _Optional[_Mapping[str, str]] = ..., rewards: _Optional[_Mapping[str, float]] = ..., task_steps: _Optional[_Iterable[_Union[TaskStepResult, _Mapping]]] = ...) -> None: ...

class TaskStepResult(_message.Message):
    __slots__ = ("name", "rewards", "verified")
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    name: str
    rewards: _containers.ScalarMap[str, float]
    verified: bool
    def __init__(self, name: _Optional[str] = ..., rewards: _Optional[_Mapping[str, float]] = ..., verified: _Optional[bool] = ...) -> None: ...
