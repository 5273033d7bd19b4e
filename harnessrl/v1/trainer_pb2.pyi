from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("run_id", "step", "policy_version", "state", "groups_pending", "trainer_idle_fraction", "alerts")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PENDING_FIELD_NUMBER: _ClassVar[int]
    TRAINER_IDLE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    policy_version: int
    state: str
    groups_pending: int
    trainer_idle_fraction: float
    alerts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., state: _Optional[str] = ..., groups_pending: _Optional[int] = ..., trainer_idle_fraction: _Optional[float] = ..., alerts: _Optional[_Iterable[str]] = ...) -> None: ...

class MetricsRequest(_message.Message):
    __slots__ = ("since_step",)
    SINCE_STEP_FIELD_NUMBER: _ClassVar[int]
    since_step: int
    def __init__(self, since_step: _Optional[int] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("step", "wall_time", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    step: int
    wall_time: float
    values: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., wall_time: _Optional[float] = ..., values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class MetricsResponse(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepMetrics]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepMetrics, _Mapping]]] = ...) -> None: ...
