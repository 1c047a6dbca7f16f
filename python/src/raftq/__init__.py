"""raftq: producers and workers for raftq, a Raft-replicated task queue.

- :class:`Producer` / :class:`AsyncProducer`: enqueue (one, or a batch whose items succeed or fail one by one),
  read a task or its result (waiting for it), cancel, dead letters, queue stats, pause/resume, listings, the
  capacity view, schedules.
- :class:`Worker`: one worker stream shared by ``concurrency`` slots running a plain or ``async def`` handler;
  lease extension while it runs, reconnects to any listed node, leader changes followed, graceful shutdown on
  SIGTERM/SIGINT. Each delivered :class:`Task` carries its ``fencing_token`` and a ``cancellation`` the worker
  sets when the task is cancelled, its deadline passes or its lease is lost.
- Errors are :class:`RaftqError` subclasses carrying the server's ``reason`` and ``retryable``
  (:mod:`raftq.reasons` lists every reason). ``raftq.v1`` holds the generated protocol messages.
"""

from . import reasons
from ._conn import DEFAULT_ADDR
from ._ops import BatchItem
from .errors import (
    AlreadyRunningError,
    AuthenticationError,
    ClosedError,
    ConfigError,
    ConflictError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotLeaderError,
    PermissionDeniedError,
    PreconditionError,
    ProtocolError,
    RaftqError,
    ResourceExhaustedError,
    ServerError,
    TransportError,
    UnavailableError,
    UnknownOutcomeError,
)
from .producer import AsyncProducer, Producer, ProducerConfig
from .types import (
    Enqueued,
    Lease,
    NewTask,
    Progress,
    QueueCapacity,
    QueueStats,
    Run,
    Schedule,
    Task,
    TaskPage,
    TaskResult,
    TaskState,
    TraceContext,
)
from .worker import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    INTERNAL_ERROR,
    LEASE_EXPIRED,
    LEASE_LOST,
    MALFORMED_PAYLOAD,
    RESOURCE_UNAVAILABLE,
    SHUTDOWN,
    WORKER_SHUTDOWN,
    Abandon,
    Cancellation,
    Complete,
    Fail,
    Nack,
    Outcome,
    Rejection,
    RunException,
    TaskCancelled,
    Worker,
    WorkerConfig,
    WorkerStats,
    WorkerSummary,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncProducer", "Producer", "ProducerConfig", "Worker", "WorkerConfig", "WorkerStats", "WorkerSummary",
    "Task", "TaskState", "TaskResult", "NewTask", "Enqueued", "BatchItem", "Lease", "Run", "Progress",
    "TraceContext", "QueueStats", "QueueCapacity", "Schedule", "TaskPage",
    "Outcome", "Complete", "Fail", "Nack", "Abandon", "RunException", "Rejection", "Cancellation", "TaskCancelled",
    "CANCELLED", "DEADLINE_EXCEEDED", "LEASE_EXPIRED", "LEASE_LOST", "SHUTDOWN",
    "MALFORMED_PAYLOAD", "WORKER_SHUTDOWN", "RESOURCE_UNAVAILABLE", "INTERNAL_ERROR",
    "RaftqError", "ConfigError", "TransportError", "ProtocolError", "ClosedError", "AlreadyRunningError",
    "UnknownOutcomeError", "ServerError", "NotLeaderError", "InvalidArgumentError", "NotFoundError",
    "LeaseLostError", "ConflictError", "AuthenticationError", "PermissionDeniedError", "ResourceExhaustedError",
    "UnavailableError", "PreconditionError", "InternalError", "reasons", "DEFAULT_ADDR",
]
