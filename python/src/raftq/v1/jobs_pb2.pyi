from raftq.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MissedPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISSED_POLICY_SKIP: _ClassVar[MissedPolicy]
    MISSED_POLICY_RUN_ONCE: _ClassVar[MissedPolicy]
MISSED_POLICY_SKIP: MissedPolicy
MISSED_POLICY_RUN_ONCE: MissedPolicy

class PauseQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class ResumeQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class QueuePauseState(_message.Message):
    __slots__ = ("queue", "paused")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    queue: str
    paused: bool
    def __init__(self, queue: _Optional[str] = ..., paused: bool = ...) -> None: ...

class ListPausedQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPausedQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueLimits(_message.Message):
    __slots__ = ("queue", "max_running", "max_depth")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_running: int
    max_depth: int
    def __init__(self, queue: _Optional[str] = ..., max_running: _Optional[int] = ..., max_depth: _Optional[int] = ...) -> None: ...

class ListQueueLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueueLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[QueueLimits]
    def __init__(self, limits: _Optional[_Iterable[_Union[QueueLimits, _Mapping]]] = ...) -> None: ...

class SetFairnessWeightRequest(_message.Message):
    __slots__ = ("queue", "key", "weight")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    key: str
    weight: int
    def __init__(self, queue: _Optional[str] = ..., key: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class FairnessKey(_message.Message):
    __slots__ = ("queue", "key", "weight", "ready", "running", "throttled")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    queue: str
    key: str
    weight: int
    ready: int
    running: int
    throttled: bool
    def __init__(self, queue: _Optional[str] = ..., key: _Optional[str] = ..., weight: _Optional[int] = ..., ready: _Optional[int] = ..., running: _Optional[int] = ..., throttled: bool = ...) -> None: ...

class SetRateLimitRequest(_message.Message):
    __slots__ = ("queue", "key", "whole_queue", "per_second", "burst")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WHOLE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    queue: str
    key: str
    whole_queue: bool
    per_second: float
    burst: int
    def __init__(self, queue: _Optional[str] = ..., key: _Optional[str] = ..., whole_queue: bool = ..., per_second: _Optional[float] = ..., burst: _Optional[int] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("queue", "key", "whole_queue", "per_second", "burst", "tokens", "ready", "throttled")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WHOLE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    queue: str
    key: str
    whole_queue: bool
    per_second: float
    burst: int
    tokens: float
    ready: int
    throttled: bool
    def __init__(self, queue: _Optional[str] = ..., key: _Optional[str] = ..., whole_queue: bool = ..., per_second: _Optional[float] = ..., burst: _Optional[int] = ..., tokens: _Optional[float] = ..., ready: _Optional[int] = ..., throttled: bool = ...) -> None: ...

class ListRateLimitsRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class ListRateLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[RateLimit]
    def __init__(self, limits: _Optional[_Iterable[_Union[RateLimit, _Mapping]]] = ...) -> None: ...

class SetConcurrencyOverrideRequest(_message.Message):
    __slots__ = ("key", "limit", "ttl_ms", "expires_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    key: str
    limit: int
    ttl_ms: int
    expires_at: str
    def __init__(self, key: _Optional[str] = ..., limit: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., expires_at: _Optional[str] = ...) -> None: ...

class ConcurrencyOverride(_message.Message):
    __slots__ = ("key", "limit", "expires_at_ms", "running", "pending")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    key: str
    limit: int
    expires_at_ms: int
    running: int
    pending: int
    def __init__(self, key: _Optional[str] = ..., limit: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., running: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class ClearConcurrencyOverrideRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ClearConcurrencyOverrideResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: bool
    def __init__(self, cleared: bool = ...) -> None: ...

class ListConcurrencyOverridesRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ListConcurrencyOverridesResponse(_message.Message):
    __slots__ = ("overrides",)
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[ConcurrencyOverride]
    def __init__(self, overrides: _Optional[_Iterable[_Union[ConcurrencyOverride, _Mapping]]] = ...) -> None: ...

class ListFairnessRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class ListFairnessResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[FairnessKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[FairnessKey, _Mapping]]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("queue", "state", "created_from_ms", "created_to_ms", "page_size", "page_token")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_TO_MS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    state: _task_pb2.TaskState
    created_from_ms: int
    created_to_ms: int
    page_size: int
    page_token: str
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[_Union[_task_pb2.TaskState, str]] = ..., created_from_ms: _Optional[int] = ..., created_to_ms: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_task_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QueueCapacityRequest(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueCapacity(_message.Message):
    __slots__ = ("queue", "pending", "ready", "delayed", "running", "active_workers", "completed_1m", "completed_5m", "completed_15m", "rate_1m", "rate_5m", "rate_15m", "drain_seconds", "per_worker_rate", "workers_needed_1h", "workers_needed_4h", "workers_needed_8h", "paused", "max_running", "max_depth", "keys")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_1M_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_5M_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_15M_FIELD_NUMBER: _ClassVar[int]
    RATE_1M_FIELD_NUMBER: _ClassVar[int]
    RATE_5M_FIELD_NUMBER: _ClassVar[int]
    RATE_15M_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PER_WORKER_RATE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_NEEDED_1H_FIELD_NUMBER: _ClassVar[int]
    WORKERS_NEEDED_4H_FIELD_NUMBER: _ClassVar[int]
    WORKERS_NEEDED_8H_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    pending: int
    ready: int
    delayed: int
    running: int
    active_workers: int
    completed_1m: int
    completed_5m: int
    completed_15m: int
    rate_1m: float
    rate_5m: float
    rate_15m: float
    drain_seconds: float
    per_worker_rate: float
    workers_needed_1h: int
    workers_needed_4h: int
    workers_needed_8h: int
    paused: bool
    max_running: int
    max_depth: int
    keys: _containers.RepeatedCompositeFieldContainer[FairnessKey]
    def __init__(self, queue: _Optional[str] = ..., pending: _Optional[int] = ..., ready: _Optional[int] = ..., delayed: _Optional[int] = ..., running: _Optional[int] = ..., active_workers: _Optional[int] = ..., completed_1m: _Optional[int] = ..., completed_5m: _Optional[int] = ..., completed_15m: _Optional[int] = ..., rate_1m: _Optional[float] = ..., rate_5m: _Optional[float] = ..., rate_15m: _Optional[float] = ..., drain_seconds: _Optional[float] = ..., per_worker_rate: _Optional[float] = ..., workers_needed_1h: _Optional[int] = ..., workers_needed_4h: _Optional[int] = ..., workers_needed_8h: _Optional[int] = ..., paused: bool = ..., max_running: _Optional[int] = ..., max_depth: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[FairnessKey, _Mapping]]] = ...) -> None: ...

class QueueCapacityResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueCapacity]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueCapacity, _Mapping]]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("name", "task", "cron", "time_zone", "interval_ms", "missed_policy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MISSED_POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    task: _task_pb2.EnqueueRequest
    cron: str
    time_zone: str
    interval_ms: int
    missed_policy: MissedPolicy
    def __init__(self, name: _Optional[str] = ..., task: _Optional[_Union[_task_pb2.EnqueueRequest, _Mapping]] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., interval_ms: _Optional[int] = ..., missed_policy: _Optional[_Union[MissedPolicy, str]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("id", "name", "queue", "cron", "time_zone", "interval_ms", "missed_policy", "paused", "created_at_ms", "last_occurrence_ms", "next_occurrence_ms", "fired")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MISSED_POLICY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_OCCURRENCE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OCCURRENCE_MS_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    queue: str
    cron: str
    time_zone: str
    interval_ms: int
    missed_policy: MissedPolicy
    paused: bool
    created_at_ms: int
    last_occurrence_ms: int
    next_occurrence_ms: int
    fired: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., queue: _Optional[str] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., interval_ms: _Optional[int] = ..., missed_policy: _Optional[_Union[MissedPolicy, str]] = ..., paused: bool = ..., created_at_ms: _Optional[int] = ..., last_occurrence_ms: _Optional[int] = ..., next_occurrence_ms: _Optional[int] = ..., fired: _Optional[int] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ...) -> None: ...

class ScheduleRef(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
