"""The SDK's task types and their conversions from and to the generated protocol messages (``raftq.v1``).

Times are milliseconds since the Unix epoch (``*_ms`` fields, the leader's clock) or, for durations the caller
gives, seconds as ``float`` or ``datetime.timedelta``.
"""

import datetime
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from .v1 import jobs_pb2, task_pb2

if TYPE_CHECKING:  # pragma: no cover
    from .worker import Cancellation

#: A duration: seconds, or a ``timedelta``.
Duration = Union[float, int, datetime.timedelta]
#: Bytes as they travel; ``str`` is encoded as UTF-8.
Payload = Union[bytes, bytearray, memoryview, str]


def duration_ms(d: Optional[Duration]) -> int:
    """Whole milliseconds (a non-zero duration under 1 ms counts as 1 ms, so it is not read as "unset")."""
    if d is None:
        return 0
    s = d.total_seconds() if isinstance(d, datetime.timedelta) else float(d)
    if s < 0:
        raise ValueError(f"a duration cannot be negative: {d!r}")
    if s == 0:
        return 0
    return max(1, int(s * 1000))


def seconds(d: Duration) -> float:
    """A duration in seconds."""
    return d.total_seconds() if isinstance(d, datetime.timedelta) else float(d)


def to_bytes(p: Optional[Payload]) -> bytes:
    """Payloads and results as bytes."""
    if p is None:
        return b""
    if isinstance(p, str):
        return p.encode("utf-8")
    return bytes(p)


class TaskState(str, enum.Enum):
    """Where a task is in its lifecycle."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    DEAD_LETTERED = "DEAD_LETTERED"
    #: A state this SDK does not know (a newer server).
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        """True for states a task never leaves (completed, failed, cancelled)."""
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED)

    @classmethod
    def from_proto(cls, v: int) -> "TaskState":
        return _STATE_FROM_PB.get(v, TaskState.UNKNOWN)

    def to_proto(self) -> int:
        return _STATE_TO_PB.get(self, task_pb2.TASK_STATE_UNSPECIFIED)


_STATE_FROM_PB: Dict[int, "TaskState"] = {
    task_pb2.TASK_STATE_PENDING: TaskState.PENDING,
    task_pb2.TASK_STATE_IN_PROGRESS: TaskState.IN_PROGRESS,
    task_pb2.TASK_STATE_COMPLETED: TaskState.COMPLETED,
    task_pb2.TASK_STATE_FAILED: TaskState.FAILED,
    task_pb2.TASK_STATE_CANCELLED: TaskState.CANCELLED,
    task_pb2.TASK_STATE_DEAD_LETTERED: TaskState.DEAD_LETTERED,
}
_STATE_TO_PB: Dict["TaskState", int] = {v: k for k, v in _STATE_FROM_PB.items()}


@dataclass(frozen=True)
class TraceContext:
    """W3C trace context carried with a task."""

    traceparent: str
    tracestate: str = ""


@dataclass(frozen=True)
class Lease:
    """The current delivery of a task: who holds it, until when, and its fencing token."""

    worker_id: str
    #: Unique to this delivery; every result must carry it. Tokens only grow: pass it to downstream stores so
    #: they can refuse writes from an older delivery.
    token: int
    claimed_at_ms: int
    #: When the lease runs out unless extended.
    deadline_ms: int


@dataclass(frozen=True)
class Run:
    """One delivery of a task."""

    worker_id: str
    token: int
    started_at_ms: int
    #: 0 while the run is open.
    ended_at_ms: int
    #: Empty while open; else COMPLETED, FAILED, RETRIED, ABANDONED, LEASE_EXPIRED, EXCEPTION, CANCELLED or
    #: DEADLINE_EXCEEDED.
    outcome: str
    #: The exception reason, ``deadline-exceeded``, or the error or nack reason.
    reason: str


@dataclass(frozen=True)
class Progress:
    """Progress a worker reported with a heartbeat."""

    percent: int
    message: str
    at_ms: int


@dataclass
class Task:
    """A task as the server stores it. A task handed to a worker's handler also carries its
    :attr:`cancellation` (set when the task is cancelled, its deadline passes or its lease is lost) and its
    fencing token (:attr:`fencing_token`)."""

    id: str
    queue: str
    payload: bytes
    priority: int
    state: TaskState
    #: Deliveries so far, this one included.
    attempts: int
    max_attempts: int
    tenant: str
    trace: Optional[TraceContext]
    #: Set while the task is in progress.
    lease: Optional[Lease]
    created_at_ms: int
    updated_at_ms: int
    visible_at_ms: int
    idempotency_key: str
    webhook_url: str
    last_error: str
    ended_at_ms: int
    dead_lettered_at_ms: int
    runs: List[Run]
    deadline_ms: int
    progress: Optional[Progress]
    concurrency_key: str
    concurrency_limit: int
    follow_up_ids: List[str]
    parent_id: str
    depends_on: List[str]
    #: True: it waits for its dependencies to end whatever their outcome; false: for them to complete.
    all_resolved: bool
    waiting_on: List[str]
    schedule_id: str
    scheduled_for_ms: int
    #: For a task delivered to a handler: the signal that its delivery is over before the handler is (cancel,
    #: deadline, lease lost, shutdown). ``None`` for tasks read with a producer.
    cancellation: Optional["Cancellation"] = field(default=None, compare=False, repr=False)

    @property
    def fencing_token(self) -> int:
        """The fencing token of this delivery (0 when the task carries no lease)."""
        return self.lease.token if self.lease else 0

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode("utf-8")

    @classmethod
    def from_proto(cls, t: task_pb2.Task) -> "Task":
        return cls(
            id=t.id,
            queue=t.queue,
            payload=t.payload,
            priority=t.priority,
            state=TaskState.from_proto(t.state),
            attempts=t.attempts,
            max_attempts=t.max_attempts,
            tenant=t.tenant,
            trace=TraceContext(t.trace.traceparent, t.trace.tracestate) if t.HasField("trace") else None,
            lease=Lease(t.lease.worker_id, t.lease.token, t.lease.claimed_at_ms, t.lease.deadline_ms)
            if t.HasField("lease")
            else None,
            created_at_ms=t.created_at_ms,
            updated_at_ms=t.updated_at_ms,
            visible_at_ms=t.visible_at_ms,
            idempotency_key=t.idempotency_key,
            webhook_url=t.webhook_url,
            last_error=t.last_error,
            ended_at_ms=t.ended_at_ms,
            dead_lettered_at_ms=t.dead_lettered_at_ms,
            runs=[Run(r.worker_id, r.token, r.started_at_ms, r.ended_at_ms, r.outcome, r.reason) for r in t.runs]
            if t.runs
            else [],
            deadline_ms=t.deadline_ms,
            progress=Progress(t.progress.percent, t.progress.message, t.progress.at_ms)
            if t.HasField("progress")
            else None,
            concurrency_key=t.concurrency_key,
            concurrency_limit=t.concurrency_limit,
            follow_up_ids=list(t.follow_up_ids) if t.follow_up_ids else [],
            parent_id=t.parent_id,
            depends_on=list(t.depends_on) if t.depends_on else [],
            all_resolved=t.dependency_rule == task_pb2.DEPENDENCY_RULE_ALL_RESOLVED,
            waiting_on=list(t.waiting_on) if t.waiting_on else [],
            schedule_id=t.schedule_id,
            scheduled_for_ms=t.scheduled_for_ms,
        )


@dataclass(frozen=True)
class TaskResult:
    """The outcome of a task as far as it is known (:meth:`Producer.result`)."""

    id: str
    state: TaskState
    #: True when the state is terminal (completed, failed, cancelled).
    done: bool
    #: The worker's result, for a completed task.
    result: bytes
    #: The failure, for a failed task.
    error: str
    attempts: int
    created_at_ms: int
    ended_at_ms: int

    @classmethod
    def from_proto(cls, r: task_pb2.TaskResult) -> "TaskResult":
        return cls(
            r.id, TaskState.from_proto(r.state), r.done, r.result, r.error, r.attempts, r.created_at_ms, r.ended_at_ms
        )


@dataclass(frozen=True)
class Enqueued:
    """An accepted enqueue."""

    #: The new task's id, or the original task's id for a duplicate.
    task_id: str
    #: Nothing was created: the idempotency key was seen before, a debounce key's pending task took the enqueue,
    #: or a singleton key's active task stood for it (``singleton_skip``).
    duplicate: bool
    #: A debounce key's pending task took this enqueue: its payload, priority and start changed.
    debounced: bool = False


@dataclass
class NewTask:
    """A task to enqueue. Every option of the server is here; unset options take the server's defaults::

        NewTask("emails", b"hello", priority=5, delay=10, max_attempts=3, idempotency_key="order-42")
    """

    queue: str
    payload: Payload = b""
    #: 0-9, higher is claimed first.
    priority: int = 0
    #: Not claimable before this much time has passed.
    delay: Optional[Duration] = None
    #: Not claimable before this time (a ``datetime``, or seconds since the Unix epoch); wins over ``delay``.
    run_at: Optional[Union[datetime.datetime, float]] = None
    #: Deliveries allowed before the task is dead-lettered (0: the server's default).
    max_attempts: int = 0
    #: A repeat of this key within the server's window returns the original task, marked duplicate.
    idempotency_key: str = ""
    #: At most ``concurrency_limit`` tasks of the tenant with this key run at once (0 counts as 1).
    concurrency_key: str = ""
    concurrency_limit: int = 0
    #: Ids of tasks this one waits for: claimable once all completed (or ended, with ``all_resolved``).
    depends_on: Sequence[str] = ()
    all_resolved: bool = False
    #: The task must end within this long from its enqueue, or it fails with reason ``deadline-exceeded``.
    deadline: Optional[Duration] = None
    #: An ``http://`` URL told about the task's end.
    webhook_url: str = ""
    #: W3C trace context to carry with the task.
    traceparent: str = ""
    tracestate: str = ""
    #: Debounce by this key (the tenant's, in this queue): while its task is pending and never claimed, an
    #: enqueue replaces that task's payload and priority and moves its start to now + ``debounce_delay`` (never
    #: past ``debounce_max_wait`` after its first enqueue; None: no cap) instead of creating a task. Not with
    #: ``delay``, ``run_at`` or ``idempotency_key``. Needs cluster version 3.
    debounce_key: str = ""
    debounce_delay: Optional[Duration] = None
    debounce_max_wait: Optional[Duration] = None
    #: Singleton by this key (the tenant's, in this queue): while its task is pending or in progress, an enqueue
    #: is refused (a ConflictError with reason SINGLETON_ACTIVE) or, with ``singleton_skip``, answered with that
    #: task marked duplicate. Needs cluster version 3.
    singleton_key: str = ""
    singleton_skip: bool = False

    def to_proto(self) -> task_pb2.EnqueueRequest:
        run_at_ms = 0
        if isinstance(self.run_at, datetime.datetime):
            run_at_ms = max(0, int(self.run_at.timestamp() * 1000))
        elif self.run_at is not None:
            run_at_ms = max(0, int(float(self.run_at) * 1000))
        req = task_pb2.EnqueueRequest(
            queue=self.queue,
            payload=to_bytes(self.payload),
            priority=self.priority,
            delay_ms=duration_ms(self.delay),
            run_at_ms=run_at_ms,
            max_attempts=self.max_attempts,
            idempotency_key=self.idempotency_key,
            webhook_url=self.webhook_url,
            deadline_in_ms=duration_ms(self.deadline),
            concurrency_key=self.concurrency_key,
            concurrency_limit=max(1, self.concurrency_limit) if self.concurrency_key else 0,
            depends_on=list(self.depends_on),
            dependency_rule=task_pb2.DEPENDENCY_RULE_ALL_RESOLVED
            if self.all_resolved
            else task_pb2.DEPENDENCY_RULE_ALL_COMPLETED,
        )
        if self.traceparent or self.tracestate:
            req.trace.traceparent = self.traceparent
            req.trace.tracestate = self.tracestate
        if self.debounce_key:
            req.debounce.key = self.debounce_key
            req.debounce.delay_ms = duration_ms(self.debounce_delay)
            req.debounce.max_wait_ms = duration_ms(self.debounce_max_wait)
        if self.singleton_key:
            req.singleton.key = self.singleton_key
            req.singleton.mode = task_pb2.SINGLETON_MODE_SKIP if self.singleton_skip else task_pb2.SINGLETON_MODE_REFUSE
        return req


@dataclass(frozen=True)
class QueueStats:
    """Tasks per state in one queue."""

    queue: str
    pending: int
    delayed: int
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    dead_lettered: int
    #: Paused: accepts enqueues, serves no claims.
    paused: bool

    @classmethod
    def from_proto(cls, s: task_pb2.QueueStats) -> "QueueStats":
        return cls(
            s.queue, s.pending, s.delayed, s.in_progress, s.completed, s.failed, s.cancelled, s.dead_lettered, s.paused
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of a listing."""

    #: In id order (ids begin with their creation time).
    tasks: List[Task]
    #: Where the next page starts; ``None`` on the last page.
    next_page_token: Optional[str]


@dataclass(frozen=True)
class QueueCapacity:
    """The capacity view of one queue."""

    queue: str
    paused: bool
    pending: int
    ready: int
    delayed: int
    running: int
    active_workers: int
    #: Completed in the last 1, 5 and 15 minutes.
    completed: List[int]
    #: Completions per second over the last 1, 5 and 15 minutes.
    rate: List[float]
    #: Seconds to finish pending + running at the 5-minute rate; ``None`` when nothing completes.
    drain_seconds: Optional[float]
    #: Tasks one worker completes per second; ``None`` when unknown.
    per_worker_rate: Optional[float]
    #: Workers needed to drain pending + running within 1, 4 and 8 hours; ``None`` when unknown.
    workers_needed: List[Optional[int]]
    #: The queue's running cap and depth limit; ``None``: no limit.
    max_running: Optional[int] = None
    max_depth: Optional[int] = None
    #: Its fairness keys with ready or running tasks or a weight: ``key``, ``weight``, ``ready``, ``running``,
    #: ``throttled`` (as :meth:`Producer.fairness` reports them).
    keys: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_proto(cls, c: jobs_pb2.QueueCapacity) -> "QueueCapacity":
        def needed(n: int) -> Optional[int]:
            return n if n >= 0 else None

        return cls(
            queue=c.queue,
            paused=c.paused,
            pending=c.pending,
            ready=c.ready,
            delayed=c.delayed,
            running=c.running,
            active_workers=c.active_workers,
            completed=[c.completed_1m, c.completed_5m, c.completed_15m],
            rate=[c.rate_1m, c.rate_5m, c.rate_15m],
            drain_seconds=c.drain_seconds if c.drain_seconds >= 0 else None,
            per_worker_rate=c.per_worker_rate if c.per_worker_rate >= 0 else None,
            workers_needed=[needed(c.workers_needed_1h), needed(c.workers_needed_4h), needed(c.workers_needed_8h)],
            max_running=c.max_running or None,
            max_depth=c.max_depth or None,
            keys=[
                {"key": k.key, "weight": k.weight, "ready": k.ready, "running": k.running, "throttled": k.throttled}
                for k in c.keys
            ],
        )


@dataclass(frozen=True)
class Schedule:
    """A recurring task."""

    id: str
    name: str
    queue: str
    #: The cron expression, or empty for an interval.
    cron: str
    time_zone: str
    #: The interval, or 0 for a cron schedule.
    interval_ms: int
    #: The latest missed occurrence runs once (else missed ones are skipped).
    run_missed_once: bool
    paused: bool
    created_at_ms: int
    #: The last occurrence fired or skipped, or 0.
    last_occurrence_ms: int
    #: The next occurrence, or 0 when paused.
    next_occurrence_ms: int
    #: Tasks created so far.
    fired: int

    @classmethod
    def from_proto(cls, s: jobs_pb2.Schedule) -> "Schedule":
        return cls(
            id=s.id,
            name=s.name,
            queue=s.queue,
            cron=s.cron,
            time_zone=s.time_zone,
            interval_ms=s.interval_ms,
            run_missed_once=s.missed_policy == jobs_pb2.MISSED_POLICY_RUN_ONCE,
            paused=s.paused,
            created_at_ms=s.created_at_ms,
            last_occurrence_ms=s.last_occurrence_ms,
            next_occurrence_ms=s.next_occurrence_ms,
            fired=s.fired,
        )
