from raftq.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("token", "worker_id")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    token: str
    worker_id: str
    def __init__(self, token: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class HelloAck(_message.Message):
    __slots__ = ("worker_id", "tenant_id", "max_create_items")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_CREATE_ITEMS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    tenant_id: str
    max_create_items: int
    def __init__(self, worker_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., max_create_items: _Optional[int] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("request_id", "queues", "lease_seconds", "count", "lease_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queues: _containers.RepeatedScalarFieldContainer[str]
    lease_seconds: int
    count: int
    lease_ms: int
    def __init__(self, request_id: _Optional[int] = ..., queues: _Optional[_Iterable[str]] = ..., lease_seconds: _Optional[int] = ..., count: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class TaskBatch(_message.Message):
    __slots__ = ("request_id", "tasks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.Task]
    def __init__(self, request_id: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[_task_pb2.Task, _Mapping]]] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("request_id", "task_id", "token", "completed", "failed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    token: int
    completed: _task_pb2.Complete
    failed: _task_pb2.Fail
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., token: _Optional[int] = ..., completed: _Optional[_Union[_task_pb2.Complete, _Mapping]] = ..., failed: _Optional[_Union[_task_pb2.Fail, _Mapping]] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("request_id", "results")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    results: _containers.RepeatedCompositeFieldContainer[Result]
    def __init__(self, request_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ...) -> None: ...

class NackTask(_message.Message):
    __slots__ = ("request_id", "task_id", "token", "delay_ms", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    token: int
    delay_ms: int
    reason: str
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., token: _Optional[int] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbandonTask(_message.Message):
    __slots__ = ("request_id", "task_id", "token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    token: int
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class HeartbeatTask(_message.Message):
    __slots__ = ("request_id", "task_id", "token", "extend_ms", "progress")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXTEND_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    token: int
    extend_ms: int
    progress: _task_pb2.Progress
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., token: _Optional[int] = ..., extend_ms: _Optional[int] = ..., progress: _Optional[_Union[_task_pb2.Progress, _Mapping]] = ...) -> None: ...

class ExceptionTask(_message.Message):
    __slots__ = ("request_id", "task_id", "token", "exception")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    token: int
    exception: _task_pb2.Exception
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., token: _Optional[int] = ..., exception: _Optional[_Union[_task_pb2.Exception, _Mapping]] = ...) -> None: ...

class WorkerEvent(_message.Message):
    __slots__ = ("hello", "ready", "result", "result_batch", "nack", "abandon", "heartbeat", "exception")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_BATCH_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    ABANDON_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    ready: Ready
    result: Result
    result_batch: ResultBatch
    nack: NackTask
    abandon: AbandonTask
    heartbeat: HeartbeatTask
    exception: ExceptionTask
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., result_batch: _Optional[_Union[ResultBatch, _Mapping]] = ..., nack: _Optional[_Union[NackTask, _Mapping]] = ..., abandon: _Optional[_Union[AbandonTask, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatTask, _Mapping]] = ..., exception: _Optional[_Union[ExceptionTask, _Mapping]] = ...) -> None: ...

class TaskAck(_message.Message):
    __slots__ = ("request_id", "task_id", "applied", "reason", "message", "state", "at_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    applied: bool
    reason: str
    message: str
    state: _task_pb2.TaskState
    at_ms: int
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., applied: bool = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., state: _Optional[_Union[_task_pb2.TaskState, str]] = ..., at_ms: _Optional[int] = ...) -> None: ...

class AckBatch(_message.Message):
    __slots__ = ("request_id", "acks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    acks: _containers.RepeatedCompositeFieldContainer[TaskAck]
    def __init__(self, request_id: _Optional[int] = ..., acks: _Optional[_Iterable[_Union[TaskAck, _Mapping]]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("request_id", "reason", "message", "leader_addr")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    reason: str
    message: str
    leader_addr: str
    def __init__(self, request_id: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., leader_addr: _Optional[str] = ...) -> None: ...

class LeaseRevoked(_message.Message):
    __slots__ = ("task_id", "token", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    token: int
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ServerEvent(_message.Message):
    __slots__ = ("hello_ack", "task_batch", "ack", "ack_batch", "error", "revoked")
    HELLO_ACK_FIELD_NUMBER: _ClassVar[int]
    TASK_BATCH_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ACK_BATCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    hello_ack: HelloAck
    task_batch: TaskBatch
    ack: TaskAck
    ack_batch: AckBatch
    error: StreamError
    revoked: LeaseRevoked
    def __init__(self, hello_ack: _Optional[_Union[HelloAck, _Mapping]] = ..., task_batch: _Optional[_Union[TaskBatch, _Mapping]] = ..., ack: _Optional[_Union[TaskAck, _Mapping]] = ..., ack_batch: _Optional[_Union[AckBatch, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ..., revoked: _Optional[_Union[LeaseRevoked, _Mapping]] = ...) -> None: ...

class Create(_message.Message):
    __slots__ = ("seq", "task")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    task: _task_pb2.EnqueueRequest
    def __init__(self, seq: _Optional[int] = ..., task: _Optional[_Union[_task_pb2.EnqueueRequest, _Mapping]] = ...) -> None: ...

class CreateBatch(_message.Message):
    __slots__ = ("seq", "tasks")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.EnqueueRequest]
    def __init__(self, seq: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[_task_pb2.EnqueueRequest, _Mapping]]] = ...) -> None: ...

class ProducerEvent(_message.Message):
    __slots__ = ("hello", "create", "create_batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    CREATE_BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    create: Create
    create_batch: CreateBatch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., create: _Optional[_Union[Create, _Mapping]] = ..., create_batch: _Optional[_Union[CreateBatch, _Mapping]] = ...) -> None: ...

class CreateAck(_message.Message):
    __slots__ = ("seq", "results", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    results: _containers.RepeatedCompositeFieldContainer[_task_pb2.EnqueueResult]
    error: _task_pb2.Error
    def __init__(self, seq: _Optional[int] = ..., results: _Optional[_Iterable[_Union[_task_pb2.EnqueueResult, _Mapping]]] = ..., error: _Optional[_Union[_task_pb2.Error, _Mapping]] = ...) -> None: ...

class ProducerServerEvent(_message.Message):
    __slots__ = ("hello_ack", "ack")
    HELLO_ACK_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello_ack: HelloAck
    ack: CreateAck
    def __init__(self, hello_ack: _Optional[_Union[HelloAck, _Mapping]] = ..., ack: _Optional[_Union[CreateAck, _Mapping]] = ...) -> None: ...
