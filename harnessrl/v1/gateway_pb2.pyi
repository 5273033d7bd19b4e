from harnessrl.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed", "return_routed_experts", "top_logprobs", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    return_routed_experts: bool
    top_logprobs: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., return_routed_experts: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("k", "ids", "logprobs")
    K_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    k: int
    ids: bytes
    logprobs: bytes
    def __init__(self, k: _Optional[int] = ..., ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "trial_id", "thread", "prompt_ids", "sampling", "whole_reply", "wide_events")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WHOLE_REPLY_FIELD_NUMBER: _ClassVar[int]
    WIDE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trial_id: str
    thread: str
    prompt_ids: bytes
    sampling: SamplingParams
    whole_reply: bool
    wide_events: bool
    def __init__(self, request_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., thread: _Optional[str] = ..., prompt_ids: _Optional[bytes] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., whole_reply: _Optional[bool] = ..., wide_events: _Optional[bool] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("tokens", "finish_reason", "usage", "replica", "top_logprobs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    tokens: _records_pb2.TokenArrays
    finish_reason: str
    usage: _records_pb2.Usage
    replica: str
    top_logprobs: TopLogprobs
    def __init__(self, tokens: _Optional[_Union[_records_pb2.TokenArrays, _Mapping]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_records_pb2.Usage, _Mapping]] = ..., replica: _Optional[str] = ..., top_logprobs: _Optional[_Union[TopLogprobs, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id", "trial_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trial_id: str
    def __init__(self, request_id: _Optional[str] = ..., trial_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: int
    def __init__(self, aborted: _Optional[int] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("held",)
    HELD_FIELD_NUMBER: _ClassVar[int]
    held: int
    def __init__(self, held: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("resumed",)
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    resumed: int
    def __init__(self, resumed: _Optional[int] = ...) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("version", "checkpoint_path", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    version: int
    checkpoint_path: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("version", "seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    seconds: float
    def __init__(self, version: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class GatewayHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaHealth(_message.Message):
    __slots__ = ("name", "state", "in_flight", "policy_version", "engine", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    in_flight: int
    policy_version: int
    engine: str
    error: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., in_flight: _Optional[int] = ..., policy_version: _Optional[int] = ..., engine: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class GatewayHealthResponse(_message.Message):
    __slots__ = ("model", "context_window", "policy_version", "paused", "replicas")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    context_window: int
    policy_version: int
    paused: bool
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaHealth]
    def __init__(self, model: _Optional[str] = ..., context_window: _Optional[int] = ..., policy_version: _Optional[int] = ..., paused: _Optional[bool] = ..., replicas: _Optional[_Iterable[_Union[ReplicaHealth, _Mapping]]] = ...) -> None: ...
