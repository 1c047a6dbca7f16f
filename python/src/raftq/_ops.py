"""Every unary call the producers make, as an :class:`~raftq._conn.Op`: the method path, the request built from
the caller's arguments, how the answer is read, and whether the call is a write (which decides what may be
retried). Both the sync and the asyncio producer run these, so the two cannot drift apart.
"""

from typing import Any, Dict, Iterable, List, Optional, Sequence, Union, cast

from ._conn import Op
from .errors import ProtocolError, RaftqError, from_reason
from .types import (
    Duration,
    Enqueued,
    NewTask,
    QueueCapacity,
    QueueStats,
    Schedule,
    Task,
    TaskPage,
    TaskResult,
    TaskState,
    duration_ms,
    seconds,
)
from .v1 import jobs_pb2, task_pb2

TASKS = "/raftq.v1.TaskService/"
JOBS = "/raftq.v1.Jobs/"

#: The outcome of one item of a batch: the accepted enqueue, or the error that refused it.
BatchItem = Union[Enqueued, RaftqError]


def _enqueued(r: task_pb2.EnqueueResponse) -> Enqueued:
    return Enqueued(r.task_id, r.duplicate, r.debounced)


def enqueue(task: NewTask) -> Op[Enqueued]:
    return Op(TASKS + "Enqueue", task.to_proto(), task_pb2.EnqueueResponse, _enqueued, write=True)


def enqueue_results(results: Sequence[task_pb2.EnqueueResult], expected: int) -> List[BatchItem]:
    """One result per item, in order; a wrong count is a protocol violation."""
    if len(results) != expected:
        raise ProtocolError(f"{len(results)} results for {expected} tasks")
    out: List[BatchItem] = []
    for r in results:
        which = r.WhichOneof("result")
        if which == "ok":
            out.append(_enqueued(r.ok))
        elif which == "error":
            out.append(from_reason(r.error.code, r.error.message))
        else:
            out.append(ProtocolError("an enqueue result with neither ok nor error"))
    return out


def enqueue_batch(tasks: Iterable[NewTask]) -> Op[List[BatchItem]]:
    req = task_pb2.EnqueueBatchRequest(items=[t.to_proto() for t in tasks])
    n = len(req.items)
    return Op(
        TASKS + "EnqueueBatch",
        req,
        task_pb2.EnqueueBatchResponse,
        lambda r: enqueue_results(r.results, n),
        write=True,
    )


def get(task_id: str) -> Op[Task]:
    return Op(TASKS + "GetTask", task_pb2.GetTaskRequest(id=task_id), task_pb2.Task, Task.from_proto, write=False)


def result(task_id: str, wait: Duration) -> Op[TaskResult]:
    return Op(
        TASKS + "GetResult",
        task_pb2.GetResultRequest(id=task_id, wait_ms=duration_ms(wait)),
        task_pb2.TaskResult,
        TaskResult.from_proto,
        write=False,
        extra_timeout=seconds(wait),
    )


def cancel(task_id: str) -> Op[TaskState]:
    return Op(
        TASKS + "Cancel",
        task_pb2.CancelRequest(id=task_id),
        task_pb2.CancelResponse,
        lambda r: TaskState.from_proto(r.state),
        write=True,
    )


def dead_letters(queue: str, limit: int) -> Op[List[Task]]:
    return Op(
        TASKS + "ListDeadLetters",
        task_pb2.ListDeadLettersRequest(queue=queue, limit=limit),
        task_pb2.ListDeadLettersResponse,
        lambda r: [Task.from_proto(t) for t in r.tasks],
        write=False,
    )


def _selection(queue: str, ids: Optional[Sequence[str]], all: bool) -> task_pb2.DeadLetterSelection:
    if all == (ids is not None):
        raise ValueError("give either ids or all=True")
    return task_pb2.DeadLetterSelection(queue=queue, ids=list(ids or ()), all=all)


def redrive(queue: str, ids: Optional[Sequence[str]], all: bool) -> Op[List[str]]:
    return Op(
        TASKS + "Redrive", _selection(queue, ids, all), task_pb2.DeadLetterIds, lambda r: list(r.ids), write=True
    )


def purge_dead_letters(queue: str, ids: Optional[Sequence[str]], all: bool) -> Op[List[str]]:
    return Op(
        TASKS + "PurgeDeadLetters",
        _selection(queue, ids, all),
        task_pb2.DeadLetterIds,
        lambda r: list(r.ids),
        write=True,
    )


def queue_stats(queues: Sequence[str]) -> Op[List[QueueStats]]:
    return Op(
        TASKS + "QueueStats",
        task_pb2.QueueStatsRequest(queues=list(queues)),
        task_pb2.QueueStatsResponse,
        lambda r: [QueueStats.from_proto(s) for s in r.queues],
        write=False,
    )


def report_progress(task_id: str, token: int, percent: int, message: str) -> Op[None]:
    """A heartbeat with progress: extends the lease to the server's default and records the progress."""
    req = task_pb2.AckRequest(
        task_id=task_id,
        token=token,
        heartbeat=task_pb2.Heartbeat(extend_ms=0, progress=task_pb2.Progress(percent=percent, message=message)),
    )
    # Idempotent (the same progress and extension again changes nothing that matters), so retried like a read.
    return Op(TASKS + "Ack", req, task_pb2.AckResponse, lambda r: None, write=False)


# Pausing and resuming are idempotent, so they are retried like reads (as in the Rust SDK).
def pause_queue(queue: str) -> Op[bool]:
    return Op(
        JOBS + "PauseQueue",
        jobs_pb2.PauseQueueRequest(queue=queue),
        jobs_pb2.QueuePauseState,
        lambda r: r.paused,
        write=False,
    )


def resume_queue(queue: str) -> Op[bool]:
    return Op(
        JOBS + "ResumeQueue",
        jobs_pb2.ResumeQueueRequest(queue=queue),
        jobs_pb2.QueuePauseState,
        lambda r: r.paused,
        write=False,
    )


def paused_queues() -> Op[List[str]]:
    return Op(
        JOBS + "ListPausedQueues",
        jobs_pb2.ListPausedQueuesRequest(),
        jobs_pb2.ListPausedQueuesResponse,
        lambda r: list(r.queues),
        write=False,
    )


def _limits(r: "jobs_pb2.QueueLimits") -> Dict[str, Any]:
    return {"queue": r.queue, "max_running": r.max_running or None, "max_depth": r.max_depth or None}


# Setting limits sets a state: idempotent, retried like a read.
def set_limits(queue: str, max_running: Optional[int], max_depth: Optional[int]) -> Op[Dict[str, Any]]:
    return Op(
        JOBS + "SetQueueLimits",
        jobs_pb2.QueueLimits(queue=queue, max_running=max_running or 0, max_depth=max_depth or 0),
        jobs_pb2.QueueLimits,
        _limits,
        write=False,
    )


def _rate(r: "jobs_pb2.RateLimit") -> Dict[str, Any]:
    return {
        "queue": r.queue,
        "key": None if r.whole_queue else r.key,
        "per_second": r.per_second,
        "burst": r.burst,
        "tokens": r.tokens,
        "ready": r.ready,
        "throttled": r.throttled,
    }


# Setting a rate limit sets a state (a repeat keeps the bucket's level): retried like a read.
def set_rate_limit(queue: str, key: Optional[str], per_second: float, burst: Optional[int]) -> Op[Dict[str, Any]]:
    req = jobs_pb2.SetRateLimitRequest(
        queue=queue, key=key or "", whole_queue=key is None, per_second=per_second, burst=burst or 0
    )
    return Op(JOBS + "SetRateLimit", req, jobs_pb2.RateLimit, _rate, write=False)


def rate_limits(queue: Optional[str]) -> Op[List[Dict[str, Any]]]:
    return Op(
        JOBS + "ListRateLimits",
        jobs_pb2.ListRateLimitsRequest(queue=queue or ""),
        jobs_pb2.ListRateLimitsResponse,
        lambda r: [_rate(x) for x in r.limits],
        write=False,
    )


def _fairness(r: "jobs_pb2.FairnessKey") -> Dict[str, Any]:
    return {
        "queue": r.queue,
        "key": r.key,
        "weight": r.weight,
        "ready": r.ready,
        "running": r.running,
        "throttled": r.throttled,
    }


# Setting a weight sets a state: idempotent, retried like a read.
def set_fairness_weight(queue: str, key: str, weight: int) -> Op[Dict[str, Any]]:
    req = jobs_pb2.SetFairnessWeightRequest(queue=queue, key=key, weight=weight)
    return Op(JOBS + "SetFairnessWeight", req, jobs_pb2.FairnessKey, _fairness, write=False)


def fairness(queue: Optional[str]) -> Op[List[Dict[str, Any]]]:
    return Op(
        JOBS + "ListFairness",
        jobs_pb2.ListFairnessRequest(queue=queue or ""),
        jobs_pb2.ListFairnessResponse,
        lambda r: [_fairness(x) for x in r.keys],
        write=False,
    )


def _override(o: "jobs_pb2.ConcurrencyOverride") -> Dict[str, Any]:
    return {
        "key": o.key,
        "limit": o.limit,
        "expires_at_ms": o.expires_at_ms or None,
        "running": o.running,
        "pending": o.pending,
    }


# Setting or clearing an override sets a state: retried like a read.
def set_concurrency_override(
    key: str, limit: int, ttl_s: Optional[float], expires_at: Optional[str]
) -> Op[Dict[str, Any]]:
    ttl_ms = 0 if ttl_s is None else max(1, int(ttl_s * 1000))
    req = jobs_pb2.SetConcurrencyOverrideRequest(key=key, limit=limit, ttl_ms=ttl_ms, expires_at=expires_at or "")
    return Op(JOBS + "SetConcurrencyOverride", req, jobs_pb2.ConcurrencyOverride, _override, write=False)


def clear_concurrency_override(key: str) -> Op[bool]:
    return Op(
        JOBS + "ClearConcurrencyOverride",
        jobs_pb2.ClearConcurrencyOverrideRequest(key=key),
        jobs_pb2.ClearConcurrencyOverrideResponse,
        lambda r: r.cleared,
        write=False,
    )


def concurrency_overrides(key: Optional[str]) -> Op[List[Dict[str, Any]]]:
    return Op(
        JOBS + "ListConcurrencyOverrides",
        jobs_pb2.ListConcurrencyOverridesRequest(key=key or ""),
        jobs_pb2.ListConcurrencyOverridesResponse,
        lambda r: [_override(x) for x in r.overrides],
        write=False,
    )


def queue_limits() -> Op[List[Dict[str, Any]]]:
    return Op(
        JOBS + "ListQueueLimits",
        jobs_pb2.ListQueueLimitsRequest(),
        jobs_pb2.ListQueueLimitsResponse,
        lambda r: [_limits(x) for x in r.limits],
        write=False,
    )


def list_tasks(
    queue: Optional[str],
    state: Optional[TaskState],
    created_from_ms: Optional[int],
    created_to_ms: Optional[int],
    page_size: int,
    page_token: Optional[str],
) -> Op[TaskPage]:
    req = jobs_pb2.ListTasksRequest(
        queue=queue or "",
        state=cast(Any, state.to_proto() if state else task_pb2.TASK_STATE_UNSPECIFIED),
        created_from_ms=created_from_ms or 0,
        created_to_ms=created_to_ms or 0,
        page_size=page_size,
        page_token=page_token or "",
    )
    return Op(
        JOBS + "ListTasks",
        req,
        jobs_pb2.ListTasksResponse,
        lambda r: TaskPage([Task.from_proto(t) for t in r.tasks], r.next_page_token or None),
        write=False,
    )


def capacity(queues: Sequence[str]) -> Op[List[QueueCapacity]]:
    return Op(
        JOBS + "QueueCapacity",
        jobs_pb2.QueueCapacityRequest(queues=list(queues)),
        jobs_pb2.QueueCapacityResponse,
        lambda r: [QueueCapacity.from_proto(c) for c in r.queues],
        write=False,
    )


def create_schedule(
    name: str,
    task: NewTask,
    cron: Optional[str],
    time_zone: str,
    every: Optional[Duration],
    run_missed_once: bool,
) -> Op[Schedule]:
    if (cron is None) == (every is None):
        raise ValueError("give either cron or every")
    req = jobs_pb2.CreateScheduleRequest(
        name=name,
        task=task.to_proto(),
        cron=cron or "",
        time_zone=time_zone,
        interval_ms=duration_ms(every),
        missed_policy=jobs_pb2.MISSED_POLICY_RUN_ONCE if run_missed_once else jobs_pb2.MISSED_POLICY_SKIP,
    )
    return Op(JOBS + "CreateSchedule", req, jobs_pb2.Schedule, Schedule.from_proto, write=True)


def schedules() -> Op[List[Schedule]]:
    return Op(
        JOBS + "ListSchedules",
        jobs_pb2.ListSchedulesRequest(),
        jobs_pb2.ListSchedulesResponse,
        lambda r: [Schedule.from_proto(s) for s in r.schedules],
        write=False,
    )


def pause_schedule(schedule_id: str, paused: bool) -> Op[Schedule]:
    method = "PauseSchedule" if paused else "ResumeSchedule"
    return Op(JOBS + method, jobs_pb2.ScheduleRef(id=schedule_id), jobs_pb2.Schedule, Schedule.from_proto, write=False)


def delete_schedule(schedule_id: str) -> Op[None]:
    return Op(
        JOBS + "DeleteSchedule",
        jobs_pb2.ScheduleRef(id=schedule_id),
        jobs_pb2.DeleteScheduleResponse,
        lambda r: None,
        write=True,
    )
