"""Producers: enqueue tasks and read them back, cancel them, handle dead letters, queues and schedules.
:class:`Producer` blocks (plain ``grpc``); :class:`AsyncProducer` is the same API for asyncio (``grpc.aio``).

Each call goes to the last server that answered, starting with the first of ``addrs``; a ``NOT_LEADER`` answer
sends it to the leader it names (or the next address). Reads are retried on any transient error; writes only
after ``NOT_LEADER`` or a failed connect, and an unknown outcome is raised as :class:`UnknownOutcomeError`,
never retried behind the caller's back.
"""

import asyncio
import time
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, TypeVar

import grpc

from . import _ops
from ._conn import (
    DEFAULT_ADDR,
    AsyncConnector,
    Backoff,
    Op,
    Step,
    SyncConnector,
    TokenProvider,
    multicallable,
    next_step,
    validate_target,
)
from ._ops import BatchItem
from .errors import ConfigError, RaftqError, TransportError, from_rpc_error
from .types import (
    Duration,
    Enqueued,
    NewTask,
    Payload,
    QueueCapacity,
    QueueStats,
    Schedule,
    Task,
    TaskPage,
    TaskResult,
    TaskState,
)

T = TypeVar("T")


@dataclass
class ProducerConfig:
    """How a producer connects and retries. Durations are seconds."""

    #: Server addresses (``host:port``, ``http://host:port`` or ``https://host:port``), tried in order.
    addrs: Sequence[str] = field(default_factory=lambda: [DEFAULT_ADDR])
    #: Bearer token (a JWT) sent with every request.
    token: Optional[str] = None
    #: Asked for the token of every request (takes precedence over ``token``): for tokens that expire.
    token_provider: Optional[TokenProvider] = None
    #: The CA (PEM) servers are verified with; addresses without a scheme then use TLS.
    tls_ca_pem: Optional[bytes] = None
    #: Longest wait for a connection to one address.
    connect_timeout: float = 5.0
    #: Longest wait for one answer (a result's wait is added on top). Long enough for a write that waits out a
    #: leader election (the server reports UNKNOWN_OUTCOME after its own write timeout, 10 s by default).
    request_timeout: float = 30.0
    #: How many more times a request is tried when that is safe.
    max_retries: int = 5
    #: First delay between tries; it doubles up to ``retry_backoff_max``.
    retry_backoff_min: float = 0.1
    retry_backoff_max: float = 2.0

    def validate(self) -> None:
        """Raises :class:`ConfigError` listing every violated rule."""
        problems: List[str] = []
        validate_target(self.addrs, self.token, self.tls_ca_pem, problems)
        if self.connect_timeout <= 0:
            problems.append("connect_timeout must be > 0")
        if self.request_timeout <= 0:
            problems.append("request_timeout must be > 0")
        if self.max_retries < 0:
            problems.append("max_retries must be >= 0")
        if self.retry_backoff_min <= 0 or self.retry_backoff_min > self.retry_backoff_max:
            problems.append("retry_backoff_min must be > 0 and <= retry_backoff_max")
        if problems:
            raise ConfigError(problems)

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["token"] = "<redacted>" if self.token else None
        shown["token_provider"] = "<fn>" if self.token_provider else None
        return "ProducerConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def _config(config: Optional[ProducerConfig], kwargs: Any) -> ProducerConfig:
    if config is not None and kwargs:
        raise TypeError("give a ProducerConfig or keyword options, not both")
    cfg = config or ProducerConfig(**kwargs)
    cfg.validate()
    return cfg


def _new_task(queue: str, payload: Payload, options: Any) -> NewTask:
    return NewTask(queue, payload, **options)


class Producer:
    """Enqueues tasks and reads them back (blocking calls). Thread-safe; close it (or use ``with``) when done.

    >>> with Producer(addrs=["127.0.0.1:9091"], token=token) as p:  # doctest: +SKIP
    ...     e = p.enqueue("emails", b"hello", priority=5, idempotency_key="order-42")
    ...     print(p.result(e.task_id, wait=10))
    """

    def __init__(self, config: Optional[ProducerConfig] = None, **kwargs: Any) -> None:
        self.config = _config(config, kwargs)
        c = self.config
        self._conn = SyncConnector(c.addrs, c.token, c.token_provider, c.tls_ca_pem, c.connect_timeout)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection."""
        self._conn.close()

    def _run(self, op: Op[T]) -> T:
        cfg = self.config
        backoff = Backoff(cfg.retry_backoff_min, cfg.retry_backoff_max)
        tries = 0
        while True:
            tries += 1
            target = None
            try:
                target, ch, cache = self._conn.channel()
                mc = multicallable("unary", ch, cache, op)
                resp = mc(op.request, timeout=cfg.request_timeout + op.extra_timeout, metadata=self._conn.metadata())
                return op.parse(resp)
            except grpc.RpcError as e:
                err = from_rpc_error(e, op.write)
            except TransportError as e:
                err = e
            self._conn.after_failure(target, err)
            step = next_step(op.write, err, tries, cfg.max_retries)
            if step == Step.STOP:
                raise err
            if step == Step.LATER:
                time.sleep(backoff.next_delay())

    def enqueue(self, queue: str, payload: Payload = b"", **options: Any) -> Enqueued:
        """Enqueues one task; ``options`` are the fields of :class:`NewTask` (priority, delay, run_at,
        max_attempts, idempotency_key, concurrency_key, concurrency_limit, depends_on, all_resolved, deadline,
        webhook_url, traceparent, tracestate, debounce_key, debounce_delay, debounce_max_wait, singleton_key,
        singleton_skip)."""
        return self._run(_ops.enqueue(_new_task(queue, payload, options)))

    def enqueue_task(self, task: NewTask) -> Enqueued:
        """Enqueues one :class:`NewTask`."""
        return self._run(_ops.enqueue(task))

    def enqueue_batch(self, tasks: Sequence[NewTask]) -> List[BatchItem]:
        """Enqueues many tasks in one request (one Raft entry). Items succeed or fail one by one: each element
        of the answer is an :class:`Enqueued` or the :class:`RaftqError` that refused that item. An exception is
        for the request as a whole (nothing was enqueued, or the outcome is unknown)."""
        if not tasks:
            return []
        return self._run(_ops.enqueue_batch(tasks))

    def get(self, task_id: str) -> Task:
        """The task as it is now (a linearizable read on the leader)."""
        return self._run(_ops.get(task_id))

    def result(self, task_id: str, wait: Duration = 0) -> TaskResult:
        """The task's result, waiting up to ``wait`` (bounded by the server's maximum) for it to end; ``done``
        in the answer says whether it has."""
        return self._run(_ops.result(task_id, wait))

    def cancel(self, task_id: str) -> TaskState:
        """Cancels a pending, running or dead-lettered task; returns its new state. A running task's worker is
        told at once (its handler's cancellation is set)."""
        return self._run(_ops.cancel(task_id))

    def dead_letters(self, queue: str, limit: int = 100) -> List[Task]:
        """Dead-lettered tasks of a queue, oldest first."""
        return self._run(_ops.dead_letters(queue, limit))

    def redrive(self, queue: str, ids: Optional[Sequence[str]] = None, all: bool = False) -> List[str]:
        """Puts dead-lettered tasks (``ids``, or ``all=True``) back to pending with fresh attempts."""
        return self._run(_ops.redrive(queue, ids, all))

    def purge_dead_letters(self, queue: str, ids: Optional[Sequence[str]] = None, all: bool = False) -> List[str]:
        """Deletes dead-lettered tasks (``ids``, or ``all=True``); needs the ``admin`` scope."""
        return self._run(_ops.purge_dead_letters(queue, ids, all))

    def queue_stats(self, queues: Sequence[str] = ()) -> List[QueueStats]:
        """Counts by state of ``queues`` (empty: every queue of the tenant)."""
        return self._run(_ops.queue_stats(queues))

    def report_progress(self, task: Task, percent: int, message: str = "") -> None:
        """Reports progress on a task this process is running, with a lease extension to the server's default
        lease (inside a worker handler, ``task.report_progress`` uses the worker's stream instead)."""
        return self._run(_ops.report_progress(task.id, task.fencing_token, percent, message))

    def pause_queue(self, queue: str) -> bool:
        """Pauses a queue: it keeps accepting enqueues and serves no claims."""
        return self._run(_ops.pause_queue(queue))

    def resume_queue(self, queue: str) -> bool:
        """Resumes a paused queue."""
        return self._run(_ops.resume_queue(queue))

    def paused_queues(self) -> List[str]:
        """The tenant's paused queues."""
        return self._run(_ops.paused_queues())

    def set_queue_limits(
        self, queue: str, max_running: Optional[int] = None, max_depth: Optional[int] = None
    ) -> Dict[str, Any]:
        """Sets a queue's flow-control limits (``queue=""``: the tenant's ``max_depth`` over all its queues);
        ``None`` is no limit. Enqueues past ``max_depth`` waiting tasks wait on the leader for room (the server's
        ``depth_hold_ms``), then are refused with ``QUEUE_FULL`` (retried after a backoff); claims past
        ``max_running`` running tasks wait. Needs the admin scope."""
        return self._run(_ops.set_limits(queue, max_running, max_depth))

    def queue_limits(self) -> List[Dict[str, Any]]:
        """The tenant's limits, the tenant's own under queue ``""``."""
        return self._run(_ops.queue_limits())

    def set_rate_limit(
        self, queue: str, per_second: float, burst: Optional[int] = None, key: Optional[str] = None
    ) -> Dict[str, Any]:
        """Sets a token bucket: the whole queue's (``key=None``) or a fairness key's (``""``: the queue's tasks
        without a concurrency key). ``per_second`` tokens (to a thousandth) refill ``burst`` (default: the rate,
        at least 1); each claimed task takes a token of its queue's and its key's bucket, and a key or queue
        without one is passed over until one refills. ``per_second=0`` removes it. Needs the admin scope."""
        return self._run(_ops.set_rate_limit(queue, key, per_second, burst))

    def rate_limits(self, queue: Optional[str] = None) -> List[Dict[str, Any]]:
        """The token buckets of a queue (``None``: of every queue of the tenant): rate, burst, tokens now,
        ready tasks and ``throttled``; ``key`` is ``None`` for the whole queue's."""
        return self._run(_ops.rate_limits(queue))

    def set_fairness_weight(self, queue: str, key: str, weight: int) -> Dict[str, Any]:
        """Sets the weight of a fairness key of a queue (a concurrency key; ``""`` for the queue's tasks without
        one): claims serve the queue's keys with ready tasks in proportion to their weights. 1 to 1000; 1 is the
        default (setting it removes the weight). Needs the admin scope."""
        return self._run(_ops.set_fairness_weight(queue, key, weight))

    def fairness(self, queue: Optional[str] = None) -> List[Dict[str, Any]]:
        """The fairness keys of a queue (``None``: of every queue of the tenant) that have a weight other than 1
        or ready tasks: weight, ready and running tasks, and ``throttled`` (out of rate-limit tokens)."""
        return self._run(_ops.fairness(queue))

    def set_concurrency_override(
        self, key: str, limit: int, ttl_s: Optional[float] = None, expires_at: Optional[str] = None
    ) -> Dict[str, Any]:
        """Overrides a concurrency key's limit (every queue of the tenant): while in force, ``limit`` replaces the
        limit the key's tasks carry. ``ttl_s`` or ``expires_at`` (RFC 3339) end it, after which the tasks' own
        limits apply again with no further call; neither: until cleared. Lowering it stops nothing that runs.
        Needs the admin scope and cluster version 3."""
        return self._run(_ops.set_concurrency_override(key, limit, ttl_s, expires_at))

    def clear_concurrency_override(self, key: str) -> bool:
        """Removes a key's override (the tasks' limits apply again at once); whether one was in force."""
        return self._run(_ops.clear_concurrency_override(key))

    def concurrency_overrides(self, key: Optional[str] = None) -> List[Dict[str, Any]]:
        """The tenant's overrides in force: limit, ``expires_at_ms`` (``None``: until cleared), and the key's
        running and pending tasks."""
        return self._run(_ops.concurrency_overrides(key))

    def list_tasks(
        self,
        queue: Optional[str] = None,
        state: Optional[TaskState] = None,
        created_from_ms: Optional[int] = None,
        created_to_ms: Optional[int] = None,
        page_size: int = 0,
        page_token: Optional[str] = None,
    ) -> TaskPage:
        """One page of the tenant's tasks matching every condition given."""
        return self._run(_ops.list_tasks(queue, state, created_from_ms, created_to_ms, page_size, page_token))

    def capacity(self, queues: Sequence[str] = ()) -> List[QueueCapacity]:
        """The capacity view of ``queues`` (empty: every queue of the tenant)."""
        return self._run(_ops.capacity(queues))

    def create_schedule(
        self,
        name: str,
        task: NewTask,
        cron: Optional[str] = None,
        time_zone: str = "",
        every: Optional[Duration] = None,
        run_missed_once: bool = False,
    ) -> Schedule:
        """A schedule that enqueues ``task`` at each occurrence: a 5-field ``cron`` expression (in ``time_zone``,
        an IANA name, default UTC) or ``every`` interval."""
        return self._run(_ops.create_schedule(name, task, cron, time_zone, every, run_missed_once))

    def schedules(self) -> List[Schedule]:
        """The tenant's schedules."""
        return self._run(_ops.schedules())

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self._run(_ops.pause_schedule(schedule_id, True))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return self._run(_ops.pause_schedule(schedule_id, False))

    def delete_schedule(self, schedule_id: str) -> None:
        return self._run(_ops.delete_schedule(schedule_id))


class AsyncProducer:
    """:class:`Producer` for asyncio: the same methods, awaited. Use it from one event loop; close it (or use
    ``async with``) when done."""

    def __init__(self, config: Optional[ProducerConfig] = None, **kwargs: Any) -> None:
        self.config = _config(config, kwargs)
        c = self.config
        self._conn = AsyncConnector(c.addrs, c.token, c.token_provider, c.tls_ca_pem, c.connect_timeout)

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._conn.close()

    async def _run(self, op: Op[T]) -> T:
        cfg = self.config
        backoff = Backoff(cfg.retry_backoff_min, cfg.retry_backoff_max)
        tries = 0
        while True:
            tries += 1
            target = None
            try:
                target, ch, cache = await self._conn.channel()
                mc = multicallable("unary", ch, cache, op)
                resp = await mc(
                    op.request, timeout=cfg.request_timeout + op.extra_timeout, metadata=self._conn.metadata()
                )
                return op.parse(resp)
            except grpc.RpcError as e:
                err: RaftqError = from_rpc_error(e, op.write)
            except TransportError as e:
                err = e
            self._conn.after_failure(target, err)
            step = next_step(op.write, err, tries, cfg.max_retries)
            if step == Step.STOP:
                raise err
            if step == Step.LATER:
                await asyncio.sleep(backoff.next_delay())

    async def enqueue(self, queue: str, payload: Payload = b"", **options: Any) -> Enqueued:
        """See :meth:`Producer.enqueue`."""
        return await self._run(_ops.enqueue(_new_task(queue, payload, options)))

    async def enqueue_task(self, task: NewTask) -> Enqueued:
        return await self._run(_ops.enqueue(task))

    async def enqueue_batch(self, tasks: Sequence[NewTask]) -> List[BatchItem]:
        """See :meth:`Producer.enqueue_batch`."""
        if not tasks:
            return []
        return await self._run(_ops.enqueue_batch(tasks))

    async def get(self, task_id: str) -> Task:
        return await self._run(_ops.get(task_id))

    async def result(self, task_id: str, wait: Duration = 0) -> TaskResult:
        return await self._run(_ops.result(task_id, wait))

    async def cancel(self, task_id: str) -> TaskState:
        return await self._run(_ops.cancel(task_id))

    async def dead_letters(self, queue: str, limit: int = 100) -> List[Task]:
        return await self._run(_ops.dead_letters(queue, limit))

    async def redrive(self, queue: str, ids: Optional[Sequence[str]] = None, all: bool = False) -> List[str]:
        return await self._run(_ops.redrive(queue, ids, all))

    async def purge_dead_letters(
        self, queue: str, ids: Optional[Sequence[str]] = None, all: bool = False
    ) -> List[str]:
        return await self._run(_ops.purge_dead_letters(queue, ids, all))

    async def queue_stats(self, queues: Sequence[str] = ()) -> List[QueueStats]:
        return await self._run(_ops.queue_stats(queues))

    async def report_progress(self, task: Task, percent: int, message: str = "") -> None:
        return await self._run(_ops.report_progress(task.id, task.fencing_token, percent, message))

    async def pause_queue(self, queue: str) -> bool:
        return await self._run(_ops.pause_queue(queue))

    async def resume_queue(self, queue: str) -> bool:
        return await self._run(_ops.resume_queue(queue))

    async def paused_queues(self) -> List[str]:
        return await self._run(_ops.paused_queues())

    async def set_queue_limits(
        self, queue: str, max_running: Optional[int] = None, max_depth: Optional[int] = None
    ) -> Dict[str, Any]:
        return await self._run(_ops.set_limits(queue, max_running, max_depth))

    async def queue_limits(self) -> List[Dict[str, Any]]:
        return await self._run(_ops.queue_limits())

    async def set_rate_limit(
        self, queue: str, per_second: float, burst: Optional[int] = None, key: Optional[str] = None
    ) -> Dict[str, Any]:
        return await self._run(_ops.set_rate_limit(queue, key, per_second, burst))

    async def rate_limits(self, queue: Optional[str] = None) -> List[Dict[str, Any]]:
        return await self._run(_ops.rate_limits(queue))

    async def set_fairness_weight(self, queue: str, key: str, weight: int) -> Dict[str, Any]:
        return await self._run(_ops.set_fairness_weight(queue, key, weight))

    async def fairness(self, queue: Optional[str] = None) -> List[Dict[str, Any]]:
        return await self._run(_ops.fairness(queue))

    async def set_concurrency_override(
        self, key: str, limit: int, ttl_s: Optional[float] = None, expires_at: Optional[str] = None
    ) -> Dict[str, Any]:
        return await self._run(_ops.set_concurrency_override(key, limit, ttl_s, expires_at))

    async def clear_concurrency_override(self, key: str) -> bool:
        return await self._run(_ops.clear_concurrency_override(key))

    async def concurrency_overrides(self, key: Optional[str] = None) -> List[Dict[str, Any]]:
        return await self._run(_ops.concurrency_overrides(key))

    async def list_tasks(
        self,
        queue: Optional[str] = None,
        state: Optional[TaskState] = None,
        created_from_ms: Optional[int] = None,
        created_to_ms: Optional[int] = None,
        page_size: int = 0,
        page_token: Optional[str] = None,
    ) -> TaskPage:
        return await self._run(_ops.list_tasks(queue, state, created_from_ms, created_to_ms, page_size, page_token))

    async def capacity(self, queues: Sequence[str] = ()) -> List[QueueCapacity]:
        return await self._run(_ops.capacity(queues))

    async def create_schedule(
        self,
        name: str,
        task: NewTask,
        cron: Optional[str] = None,
        time_zone: str = "",
        every: Optional[Duration] = None,
        run_missed_once: bool = False,
    ) -> Schedule:
        return await self._run(_ops.create_schedule(name, task, cron, time_zone, every, run_missed_once))

    async def schedules(self) -> List[Schedule]:
        return await self._run(_ops.schedules())

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(_ops.pause_schedule(schedule_id, True))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(_ops.pause_schedule(schedule_id, False))

    async def delete_schedule(self, schedule_id: str) -> None:
        return await self._run(_ops.delete_schedule(schedule_id))

