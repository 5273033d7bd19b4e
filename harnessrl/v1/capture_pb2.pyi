from harnessrl.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendSegmentRequest(_message.Message):
    __slots__ = ("key", "part_index", "thread_kind", "trainable", "prompt_ids", "tokens", "finish_reason", "usage", "model", "chat_template_sha256", "close", "task_id", "group_id", "sampling")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    THREAD_KIND_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    key: _records_pb2.SegmentKey
    part_index: int
    thread_kind: str
    trainable: bool
    prompt_ids: bytes
    tokens: _records_pb2.TokenArrays
    finish_reason: str
    usage: _records_pb2.Usage
    model: str
    chat_template_sha256: str
    close: bool
    task_id: str
    group_id: str
    sampling: _records_pb2.SegmentSampling
    def __init__(self, key: _Optional[_Union[_records_pb2.SegmentKey, _Mapping]] = ..., part_index: _Optional[int] = ..., thread_kind: _Optional[str] = ..., trainable: _Optional[bool] = ..., prompt_ids: _Optional[bytes] = ..., tokens: _Optional[_Union[_records_pb2.TokenArrays, _Mapping]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_records_pb2.Usage, _Mapping]] = ..., model: _Optional[str] = ..., chat_template_sha256: _Optional[str] = ..., close: _Optional[bool] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., sampling: _Optional[_Union[_records_pb2.SegmentSampling, _Mapping]] = ...) -> None: ...

class AppendSegmentResponse(_message.Message):
    __slots__ = ("duplicate", "segment_tokens")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    segment_tokens: int
    def __init__(self, duplicate: _Optional[bool] = ..., segment_tokens: _Optional[int] = ...) -> None: ...

class FinalizeTrajectoryRequest(_message.Message):
    __slots__ = ("run_id", "trial_id", "task_id", "group_id", "group_size", "step", "harness", "reward", "has_reward", "termination_reason", "timings", "verifier_summary", "harness_exit_code", "metadata", "rewards", "task_steps")
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
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    HARNESS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
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
    reward: float
    has_reward: bool
    termination_reason: _records_pb2.TerminationReason
    timings: _records_pb2.PhaseTimings
    verifier_summary: str
    harness_exit_code: int
    metadata: _containers.ScalarMap[str, str]
    rewards: _containers.ScalarMap[str, float]
    task_steps: _containers.RepeatedCompositeFieldContainer[_records_pb2.TaskStepResult]
    def __init__(self, run_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., step: _Optional[int] = ..., harness: _Optional[str] = ..., reward: _Optional[float] = ..., has_reward: _Optional[bool] = ..., termination_reason: _Optional[_Union[_records_pb2.TerminationReason, str]] = ..., timings: _Optional[_Union[_records_pb2.PhaseTimings, _Mapping]] = ..., verifier_summary: _Optional[str] = ..., harness_exit_code: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., rewards: _Optional[_Mapping[str, float]] = ..., task_steps: _Optional[_Iterable[_Union[_records_pb2.TaskStepResult, _Mapping]]] = ...) -> None: ...

class FinalizeTrajectoryResponse(_message.Message):
    __slots__ = ("group_ready", "duplicate")
    GROUP_READY_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    group_ready: bool
    duplicate: bool
    def __init__(self, group_ready: _Optional[bool] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GetTrajectoryRequest(_message.Message):
    __slots__ = ("run_id", "trial_id", "include_tokens")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trial_id: str
    include_tokens: bool
    def __init__(self, run_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., include_tokens: _Optional[bool] = ...) -> None: ...

class ListTrajectoriesRequest(_message.Message):
    __slots__ = ("run_id", "step", "task_id", "group_id", "termination_reason", "min_reward", "max_reward", "finalized_only", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_REASON_FIELD_NUMBER: _ClassVar[int]
    MIN_REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_REWARD_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    task_id: str
    group_id: str
    termination_reason: _records_pb2.TerminationReason
    min_reward: float
    max_reward: float
    finalized_only: bool
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., termination_reason: _Optional[_Union[_records_pb2.TerminationReason, str]] = ..., min_reward: _Optional[float] = ..., max_reward: _Optional[float] = ..., finalized_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTrajectoriesResponse(_message.Message):
    __slots__ = ("trajectories", "next_page_token")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[_records_pb2.Trajectory]
    next_page_token: str
    def __init__(self, trajectories: _Optional[_Iterable[_Union[_records_pb2.Trajectory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchReadyRequest(_message.Message):
    __slots__ = ("subscribe", "ack")
    class Subscribe(_message.Message):
        __slots__ = ("run_id", "consumer_group", "consumer")
        RUN_ID_FIELD_NUMBER: _ClassVar[int]
        CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
        CONSUMER_FIELD_NUMBER: _ClassVar[int]
        run_id: str
        consumer_group: str
        consumer: str
        def __init__(self, run_id: _Optional[str] = ..., consumer_group: _Optional[str] = ..., consumer: _Optional[str] = ...) -> None: ...
    class Ack(_message.Message):
        __slots__ = ("group_id",)
        GROUP_ID_FIELD_NUMBER: _ClassVar[int]
        group_id: str
        def __init__(self, group_id: _Optional[str] = ...) -> None: ...
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    subscribe: WatchReadyRequest.Subscribe
    ack: WatchReadyRequest.Ack
    def __init__(self, subscribe: _Optional[_Union[WatchReadyRequest.Subscribe, _Mapping]] = ..., ack: _Optional[_Union[WatchReadyRequest.Ack, _Mapping]] = ...) -> None: ...

class ReadyGroup(_message.Message):
    __slots__ = ("run_id", "group_id", "task_id", "step", "trial_ids", "redeliveries")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRIAL_IDS_FIELD_NUMBER: _ClassVar[int]
    REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    group_id: str
    task_id: str
    step: int
    trial_ids: _containers.RepeatedScalarFieldContainer[str]
    redeliveries: int
    def __init__(self, run_id: _Optional[str] = ..., group_id: _Optional[str] = ..., task_id: _Optional[str] = ..., step: _Optional[int] = ..., trial_ids: _Optional[_Iterable[str]] = ..., redeliveries: _Optional[int] = ...) -> None: ...

class DeleteRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class DeleteRunResponse(_message.Message):
    __slots__ = ("trajectories_deleted",)
    TRAJECTORIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    trajectories_deleted: int
    def __init__(self, trajectories_deleted: _Optional[int] = ...) -> None: ...
