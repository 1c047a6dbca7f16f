from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_IN_PROGRESS: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
    TASK_STATE_DEAD_LETTERED: _ClassVar[TaskState]

class DependencyRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPENDENCY_RULE_ALL_COMPLETED: _ClassVar[DependencyRule]
    DEPENDENCY_RULE_ALL_RESOLVED: _ClassVar[DependencyRule]

class SingletonMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SINGLETON_MODE_REFUSE: _ClassVar[SingletonMode]
    SINGLETON_MODE_SKIP: _ClassVar[SingletonMode]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_IN_PROGRESS: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState
TASK_STATE_DEAD_LETTERED: TaskState
DEPENDENCY_RULE_ALL_COMPLETED: DependencyRule
DEPENDENCY_RULE_ALL_RESOLVED: DependencyRule
SINGLETON_MODE_REFUSE: SingletonMode
SINGLETON_MODE_SKIP: SingletonMode

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("worker_id", "token", "claimed_at_ms", "deadline_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    token: int
    claimed_at_ms: int
    deadline_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., token: _Optional[int] = ..., claimed_at_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "queue", "payload", "priority", "state", "attempts", "max_attempts", "tenant", "trace", "lease", "created_at_ms", "updated_at_ms", "visible_at_ms", "idempotency_key", "webhook_url", "last_error", "ended_at_ms", "dead_lettered_at_ms", "runs", "deadline_ms", "progress", "concurrency_key", "concurrency_limit", "follow_up_ids", "parent_id", "depends_on", "dependency_rule", "waiting_on", "schedule_id", "scheduled_for_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_URL_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCY_RULE_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    queue: str
    payload: bytes
    priority: int
    state: TaskState
    attempts: int
    max_attempts: int
    tenant: str
    trace: TraceContext
    lease: Lease
    created_at_ms: int
    updated_at_ms: int
    visible_at_ms: int
    idempotency_key: str
    webhook_url: str
    last_error: str
    ended_at_ms: int
    dead_lettered_at_ms: int
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    deadline_ms: int
    progress: Progress
    concurrency_key: str
    concurrency_limit: int
    follow_up_ids: _containers.RepeatedScalarFieldContainer[str]
    parent_id: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    dependency_rule: DependencyRule
    waiting_on: _containers.RepeatedScalarFieldContainer[str]
    schedule_id: str
    scheduled_for_ms: int
    def __init__(self, id: _Optional[str] = ..., queue: _Optional[str] = ..., payload: _Optional[bytes] = ..., priority: _Optional[int] = ..., state: _Optional[_Union[TaskState, str]] = ..., attempts: _Optional[int] = ..., max_attempts: _Optional[int] = ..., tenant: _Optional[str] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., visible_at_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., webhook_url: _Optional[str] = ..., last_error: _Optional[str] = ..., ended_at_ms: _Optional[int] = ..., dead_lettered_at_ms: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., deadline_ms: _Optional[int] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., concurrency_key: _Optional[str] = ..., concurrency_limit: _Optional[int] = ..., follow_up_ids: _Optional[_Iterable[str]] = ..., parent_id: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., dependency_rule: _Optional[_Union[DependencyRule, str]] = ..., waiting_on: _Optional[_Iterable[str]] = ..., schedule_id: _Optional[str] = ..., scheduled_for_ms: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("worker_id", "token", "started_at_ms", "ended_at_ms", "outcome", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    token: int
    started_at_ms: int
    ended_at_ms: int
    outcome: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., token: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("percent", "message", "at_ms")
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    percent: int
    message: str
    at_ms: int
    def __init__(self, percent: _Optional[int] = ..., message: _Optional[str] = ..., at_ms: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retry_after_ms: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("queue", "payload", "priority", "delay_ms", "run_at_ms", "max_attempts", "idempotency_key", "webhook_url", "trace", "deadline_in_ms", "concurrency_key", "concurrency_limit", "depends_on", "dependency_rule", "debounce", "singleton")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_URL_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_MS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCY_RULE_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_FIELD_NUMBER: _ClassVar[int]
    SINGLETON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    payload: bytes
    priority: int
    delay_ms: int
    run_at_ms: int
    max_attempts: int
    idempotency_key: str
    webhook_url: str
    trace: TraceContext
    deadline_in_ms: int
    concurrency_key: str
    concurrency_limit: int
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    dependency_rule: DependencyRule
    debounce: Debounce
    singleton: Singleton
    def __init__(self, queue: _Optional[str] = ..., payload: _Optional[bytes] = ..., priority: _Optional[int] = ..., delay_ms: _Optional[int] = ..., run_at_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., webhook_url: _Optional[str] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ..., deadline_in_ms: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., concurrency_limit: _Optional[int] = ..., depends_on: _Optional[_Iterable[str]] = ..., dependency_rule: _Optional[_Union[DependencyRule, str]] = ..., debounce: _Optional[_Union[Debounce, _Mapping]] = ..., singleton: _Optional[_Union[Singleton, _Mapping]] = ...) -> None: ...

class Debounce(_message.Message):
    __slots__ = ("key", "delay_ms", "max_wait_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    delay_ms: int
    max_wait_ms: int
    def __init__(self, key: _Optional[str] = ..., delay_ms: _Optional[int] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class Singleton(_message.Message):
    __slots__ = ("key", "mode")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: SingletonMode
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[SingletonMode, str]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("task_id", "duplicate", "debounced")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    duplicate: bool
    debounced: bool
    def __init__(self, task_id: _Optional[str] = ..., duplicate: bool = ..., debounced: bool = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class EnqueueResult(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: EnqueueResponse
    error: Error
    def __init__(self, ok: _Optional[_Union[EnqueueResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueResult]
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueResult, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetResultRequest(_message.Message):
    __slots__ = ("id", "wait_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    wait_ms: int
    def __init__(self, id: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("id", "state", "done", "result", "error", "attempts", "created_at_ms", "ended_at_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: TaskState
    done: bool
    result: bytes
    error: str
    attempts: int
    created_at_ms: int
    ended_at_ms: int
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., done: bool = ..., result: _Optional[bytes] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    def __init__(self, state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("queue", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    limit: int
    def __init__(self, queue: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class DeadLetterSelection(_message.Message):
    __slots__ = ("queue", "ids", "all")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., all: bool = ...) -> None: ...

class DeadLetterIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("worker_id", "queues", "count", "lease_ms", "wait_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    count: int
    lease_ms: int
    wait_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ..., lease_ms: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class Complete(_message.Message):
    __slots__ = ("result", "follow_ups")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UPS_FIELD_NUMBER: _ClassVar[int]
    result: bytes
    follow_ups: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, result: _Optional[bytes] = ..., follow_ups: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class Fail(_message.Message):
    __slots__ = ("error", "retryable")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    error: str
    retryable: bool
    def __init__(self, error: _Optional[str] = ..., retryable: bool = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("delay_ms", "reason")
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    delay_ms: int
    reason: str
    def __init__(self, delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Abandon(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("extend_ms", "progress")
    EXTEND_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    extend_ms: int
    progress: Progress
    def __init__(self, extend_ms: _Optional[int] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ...) -> None: ...

class Exception(_message.Message):
    __slots__ = ("reason", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    message: str
    def __init__(self, reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("task_id", "token", "complete", "fail", "nack", "abandon", "heartbeat", "exception")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    ABANDON_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    token: int
    complete: Complete
    fail: Fail
    nack: Nack
    abandon: Abandon
    heartbeat: Heartbeat
    exception: Exception
    def __init__(self, task_id: _Optional[str] = ..., token: _Optional[int] = ..., complete: _Optional[_Union[Complete, _Mapping]] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ..., abandon: _Optional[_Union[Abandon, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., exception: _Optional[_Union[Exception, _Mapping]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("state", "at_ms", "follow_up_ids")
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_IDS_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    at_ms: int
    follow_up_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[TaskState, str]] = ..., at_ms: _Optional[int] = ..., follow_up_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[AckRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[AckRequest, _Mapping]]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: AckResponse
    error: Error
    def __init__(self, ok: _Optional[_Union[AckResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class QueueStatsRequest(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("queue", "pending", "delayed", "in_progress", "completed", "failed", "cancelled", "dead_lettered", "paused")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    queue: str
    pending: int
    delayed: int
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    dead_lettered: int
    paused: bool
    def __init__(self, queue: _Optional[str] = ..., pending: _Optional[int] = ..., delayed: _Optional[int] = ..., in_progress: _Optional[int] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., paused: bool = ...) -> None: ...

class QueueStatsResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ...) -> None: ...
