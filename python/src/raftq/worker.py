"""The worker: one worker stream shared by ``concurrency`` slots, each looping Ready -> tasks -> handler ->
outcome -> checked ack. A supervisor keeps the stream open (reconnecting with backoff, following the leader);
slots and their running handlers outlive a lost stream, and outcomes are sent on the next one. Shutdown stops
Readys, lets handlers finish within the grace, abandons the rest.

Handlers are plain functions (run in a thread pool of ``concurrency`` threads) or ``async def`` functions (run
on the worker's event loop). A handler returns an outcome (:class:`Complete`, :class:`Fail`, :class:`Nack`,
:class:`Abandon`, :class:`RunException`), or bytes/str/None for a completion; an exception it raises fails the
task retryably. While it runs, its lease is extended every ``heartbeat``; when the task is cancelled, its
deadline passes or its lease is lost, ``task.cancellation`` is set (and an ``async`` handler's asyncio task is
cancelled) within milliseconds: the server pushes that on the stream.

Invariants: every claimed task gets exactly one final outcome sent (the handler's, or Abandon), and every answer
to an outcome is checked; a refusal is logged, counted and reported (``on_rejection``, ``rejections``), never
dropped.
"""

import asyncio
import collections
import concurrent.futures
import inspect
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field, fields
from typing import (
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import grpc

from . import _session
from ._conn import DEFAULT_ADDR, AsyncConnector, Backoff, TokenProvider, validate_target
from ._session import MaybeSent, NotSent, Session
from .errors import (
    AlreadyRunningError,
    ConfigError,
    NotLeaderError,
    ProtocolError,
    RaftqError,
    ServerError,
    UnknownOutcomeError,
    from_reason,
    from_rpc_error,
)
from .types import Duration, NewTask, Payload, Task, duration_ms, to_bytes
from .v1 import stream_pb2, task_pb2

log = logging.getLogger("raftq.worker")

#: After the shutdown grace, outcomes (including the abandons of cut-off handlers) get this long for their
#: answers before they are counted unconfirmed: one leader election plus a commit.
ACK_DRAIN = 5.0
#: A stream retired at shutdown waits this long at most for its requests in flight to be answered.
RETIRE_MAX = 2.0
RETIRE_POLL = 0.005
#: Largest ``concurrency`` and ``batch_size`` (the server's default ``max_batch_items``).
MAX_CONCURRENCY = 4096
MAX_BATCH_SIZE = 1000
#: Rejections kept for :meth:`Worker.rejections`.
REJECTIONS_KEPT = 1024
#: Ends of deliveries kept for tasks not yet admitted to a slot; older ones are forgotten.
ENDED_EARLY_KEPT = 1024

# The exception reasons a handler may end a run with (see RunException).
MALFORMED_PAYLOAD = "malformed-payload"
WORKER_SHUTDOWN = "worker-shutdown"
RESOURCE_UNAVAILABLE = "resource-unavailable"
INTERNAL_ERROR = "internal-error"

# Why a delivery ended before its handler (Cancellation.reason).
CANCELLED = "CANCELLED"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
LEASE_EXPIRED = "LEASE_EXPIRED"
LEASE_LOST = "LEASE_LOST"
SHUTDOWN = "SHUTDOWN"


# ---- outcomes ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Complete:
    """Done; ``result`` is what producers read back. ``follow_ups`` are created with the completion, all or
    nothing (one Raft entry); they take no idempotency or concurrency key."""

    result: Payload = b""
    follow_ups: Sequence[NewTask] = ()


@dataclass(frozen=True)
class Fail:
    """The handler tried and could not. ``retryable`` retries the task after its backoff while attempts remain
    (then dead-letters it); ``False`` fails it for good."""

    error: str
    retryable: bool = True


@dataclass(frozen=True)
class Nack:
    """Not now: the task goes back to pending after ``delay`` (0: the task's backoff). Uses the attempt."""

    delay: Duration = 0
    reason: str = ""


@dataclass(frozen=True)
class Abandon:
    """Give the task back at once without using an attempt."""


@dataclass(frozen=True)
class RunException:
    """End the run with an exception: ``malformed-payload`` (fails for good), ``worker-shutdown`` (retried at
    once, no attempt used), ``resource-unavailable`` or ``internal-error`` (retried after the backoff)."""

    reason: str
    message: str = ""


Outcome = Union[Complete, Fail, Nack, Abandon, RunException]
#: What a handler may return: an outcome, or the result of a completion (bytes, str, or None for empty).
HandlerResult = Union[Outcome, bytes, bytearray, memoryview, str, None]
Handler = Callable[[Task], Union[HandlerResult, Awaitable[HandlerResult]]]


def normalize(r: Any) -> Outcome:
    """The outcome a handler's return value stands for."""
    if isinstance(r, (Complete, Fail, Nack, Abandon, RunException)):
        return r
    if r is None or isinstance(r, (bytes, bytearray, memoryview, str)):
        return Complete(to_bytes(r))
    return Fail(f"the handler returned {type(r).__name__}, not an outcome, bytes, str or None", retryable=True)


def _failed(task_id: str, e: BaseException) -> Outcome:
    log.error("task handler raised", exc_info=e, extra={"task_id": task_id})
    return Fail(f"{type(e).__name__}: {e}", retryable=True)


# ---- the handler's signal ---------------------------------------------------------------------------------------


class TaskCancelled(Exception):
    """Raised by :meth:`Cancellation.raise_if_set`: the delivery is over (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the task's delivery ended: {reason}")
        self.reason = reason


# One lock for every Cancellation: held only to read or set a few fields, so a delivery costs no lock or event
# of its own until a thread actually waits on it.
_SIGNAL_LOCK = threading.Lock()


class Cancellation:
    """Set when a task's delivery ends before its handler does. ``reason`` is ``CANCELLED`` (a client cancelled
    it), ``DEADLINE_EXCEEDED``, ``LEASE_EXPIRED`` (the server gave the task to someone else), ``LEASE_LOST`` (a
    lease extension was refused) or ``SHUTDOWN`` (the worker's shutdown grace ran out). Any outcome sent after
    it is refused by the server; stop work and return.

    Thread-safe: a plain handler polls :meth:`is_set` or blocks in :meth:`wait`; an ``async`` handler awaits
    :meth:`wait_async` (and is cancelled anyway, unless the worker's ``cancel_async_handlers`` is off).
    """

    __slots__ = ("_reason", "_event", "_waiters", "set_at")

    def __init__(self) -> None:
        self._reason: Optional[str] = None
        self._event: Optional[threading.Event] = None
        self._waiters: List[Tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]] = []
        #: ``time.monotonic()`` when it was set.
        self.set_at: Optional[float] = None

    @property
    def reason(self) -> Optional[str]:
        return self._reason

    def is_set(self) -> bool:
        return self._reason is not None

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until set or ``timeout`` seconds passed; returns whether it is set."""
        with _SIGNAL_LOCK:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            ev = self._event
        return ev.wait(timeout)

    async def wait_async(self) -> str:
        """Waits until set; returns the reason."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        with _SIGNAL_LOCK:
            if self._reason is None:
                self._waiters.append((loop, fut))
            else:
                fut.set_result(None)
        await fut
        return self._reason or ""

    def raise_if_set(self) -> None:
        """Raises :class:`TaskCancelled` when set."""
        if self._reason is not None:
            raise TaskCancelled(self._reason)

    def set(self, reason: str) -> bool:
        """Sets it (once); false when it was set already."""
        with _SIGNAL_LOCK:
            if self._reason is not None:
                return False
            self._reason = reason
            self.set_at = time.monotonic()
            ev, waiters, self._waiters = self._event, self._waiters, []
        if ev is not None:
            ev.set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)
        return True

    def __repr__(self) -> str:
        return f"Cancellation(reason={self._reason!r})"


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


# ---- configuration and counters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    """An outcome the server refused."""

    task_id: str
    #: The stable reason (``LEASE_LOST``: the lease ran out and the task was redelivered; ``NOT_IN_PROGRESS``,
    #: ``ALREADY_ENDED``, ``NOT_FOUND``, ``INVALID_ARGUMENT``, ...).
    reason: str
    message: str
    outcome: Outcome
    #: An earlier send of this outcome got no answer, so it may have been applied and this refusal may only
    #: report it.
    maybe_applied: bool


def _default_worker_id() -> str:
    return f"worker-{os.getpid()}-{random.getrandbits(32):08x}"


@dataclass
class WorkerConfig:
    """How a :class:`Worker` runs. Durations are seconds."""

    #: Queues to take tasks from (1 to 64).
    queues: Sequence[str] = ()
    #: Server addresses (``host:port``, ``http://host:port``, ``https://host:port``), tried in order.
    addrs: Sequence[str] = field(default_factory=lambda: [DEFAULT_ADDR])
    #: Bearer token sent in Hello and with the stream request.
    token: Optional[str] = None
    #: Asked for a token each time a stream opens (the first and every reconnect), so a worker outlives its
    #: tokens: the server closes a stream when its token expires and the worker reopens it with the next one.
    token_provider: Optional[TokenProvider] = None
    #: The CA (PEM) servers are verified with; addresses without a scheme then use TLS.
    tls_ca_pem: Optional[bytes] = None
    #: This worker's name in leases; 1-256 characters.
    worker_id: str = field(default_factory=_default_worker_id)
    #: Slots: handlers running at once on the one stream (and threads for plain handlers).
    concurrency: int = 1
    #: Lease asked for each delivery; a task not reported within it (and not extended) is redelivered.
    lease: float = 30.0
    #: Tasks asked for by one Ready. Above 1, a slot runs the batch's handlers one after another and sends
    #: their completed and failed outcomes in one ResultBatch.
    batch_size: int = 1
    #: Extend held leases this often while handlers run (by ``lease`` each time). None: a third of the lease
    #: (room for two lost extensions); 0: never.
    heartbeat: Optional[float] = None
    #: On shutdown, how long running handlers may take to finish before their tasks are abandoned.
    shutdown_grace: float = 30.0
    #: First delay before reconnecting a lost stream; it doubles up to ``reconnect_backoff_max``.
    reconnect_backoff_min: float = 0.1
    reconnect_backoff_max: float = 5.0
    #: Longest wait for a connection to one address.
    connect_timeout: float = 5.0
    #: Cancel an ``async`` handler's asyncio task when its delivery ends (cancel, deadline, lease lost).
    cancel_async_handlers: bool = True
    #: Called (on the worker's event loop) with each outcome the server refuses.
    on_rejection: Optional[Callable[[Rejection], None]] = None

    def heartbeat_every(self) -> Optional[float]:
        if self.heartbeat is None:
            return self.lease / 3
        return self.heartbeat or None

    def validate(self) -> None:
        """Raises :class:`ConfigError` listing every violated rule."""
        e: List[str] = []
        validate_target(self.addrs, self.token, self.tls_ca_pem, e)
        if not self.worker_id or len(self.worker_id) > 256:
            e.append("worker_id must be 1 to 256 characters")
        if isinstance(self.queues, str) or not self.queues or len(self.queues) > 64:
            e.append("queues must be a list of 1 to 64 queue names")
        else:
            for q in self.queues:
                if not _valid_queue(q):
                    e.append(
                        f"queue name {q!r} must start with a letter or digit and hold only letters, digits, "
                        "'.', '_', ':' and '-'"
                    )
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            e.append(f"concurrency must be 1 to {MAX_CONCURRENCY}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            e.append(f"batch_size must be 1 to {MAX_BATCH_SIZE}")
        if self.lease < 0.001:
            e.append("lease must be at least 1 ms")
        hb = self.heartbeat
        if hb is not None and (hb < 0 or (hb > 0 and hb >= self.lease)):
            e.append(f"heartbeat ({hb}) must be 0 (off) or shorter than the lease ({self.lease}); a third of it is good")
        if self.shutdown_grace < 0:
            e.append("shutdown_grace must be >= 0")
        if self.reconnect_backoff_min <= 0 or self.reconnect_backoff_min > self.reconnect_backoff_max:
            e.append("reconnect_backoff_min must be > 0 and <= reconnect_backoff_max")
        if self.connect_timeout <= 0:
            e.append("connect_timeout must be > 0")
        if e:
            raise ConfigError(e)

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["token"] = "<redacted>" if self.token else None
        shown["token_provider"] = "<fn>" if self.token_provider else None
        return "WorkerConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def _valid_queue(q: str) -> bool:
    return (
        bool(q)
        and q[0].isascii()
        and q[0].isalnum()
        and all(c.isascii() and (c.isalnum() or c in "._:-") for c in q)
    )


@dataclass(frozen=True)
class WorkerSummary:
    """The worker's counters at one moment (everything since the worker was created)."""

    claimed: int
    completed: int
    failed: int
    nacked: int
    abandoned: int
    exceptions: int
    #: Outcomes the server refused (see :class:`Rejection`).
    rejected: int
    #: Outcomes without an answer at shutdown: they may or may not have been applied.
    unconfirmed: int
    lease_extensions: int
    reconnects: int
    #: Running tasks whose delivery the server ended (cancel, deadline, lease expiry) while the handler ran.
    revoked: int


class WorkerStats:
    """Live counters, readable while the worker runs (updated on the worker's event loop)."""

    def __init__(self) -> None:
        for f in fields(WorkerSummary):
            setattr(self, f.name, 0)

    def snapshot(self) -> WorkerSummary:
        return WorkerSummary(**{f.name: getattr(self, f.name) for f in fields(WorkerSummary)})

    def add(self, name: str, n: int = 1) -> None:
        setattr(self, name, getattr(self, name) + n)


# ---- the worker -------------------------------------------------------------------------------------------------


class _Flag:
    """A one-way flag waitable with ``asyncio.wait`` (waiting never cancels it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fut: "asyncio.Future[None]" = loop.create_future()

    def set(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)

    def is_set(self) -> bool:
        return self.fut.done()

    async def wait(self, timeout: Optional[float] = None) -> bool:
        await asyncio.wait({self.fut}, timeout=timeout)
        return self.fut.done()


@dataclass
class _Held:
    """A task a slot holds: its token, its handler's signal and asyncio task, whether its outcome is on its way."""

    task: Task
    token: int
    cancellation: Cancellation
    atask: Optional["asyncio.Task[Any]"] = None
    delivering: bool = False


@dataclass
class _Item:
    task_id: str
    token: int
    outcome: Outcome


class _ProgressLink:
    """Lets a handler report progress on its task through the worker's stream."""

    def __init__(self, run: "_Run", held: _Held) -> None:
        self.run = run
        self.held = held

    def report(self, percent: int, message: str) -> None:
        loop = self.run.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("call `await task.report_progress_async(...)` from an async handler")
        fut = asyncio.run_coroutine_threadsafe(self.run.progress(self.held, percent, message), loop)
        fut.result()

    async def report_async(self, percent: int, message: str) -> None:
        await self.run.progress(self.held, percent, message)


def _report_progress(task: Task, percent: int, message: str = "") -> None:
    link = getattr(task, "_link", None)
    if link is None:
        raise RuntimeError("only a task delivered to a worker handler can report progress (see Producer)")
    link.report(percent, message)


async def _report_progress_async(task: Task, percent: int, message: str = "") -> None:
    link = getattr(task, "_link", None)
    if link is None:
        raise RuntimeError("only a task delivered to a worker handler can report progress (see AsyncProducer)")
    await link.report_async(percent, message)


# Bound on Task so handlers write `task.report_progress(40, "halfway")`.
Task.report_progress = _report_progress  # type: ignore[attr-defined]
Task.report_progress_async = _report_progress_async  # type: ignore[attr-defined]


class Worker:
    """A long-lived worker. Create it, then :meth:`run` it with a handler (blocks until SIGTERM/SIGINT or
    :meth:`stop`), or ``await`` :meth:`run_async` inside an asyncio program.

    >>> def handle(task):  # doctest: +SKIP
    ...     send_email(task.payload, fencing_token=task.fencing_token)
    ...     return b"sent"
    >>> Worker(queues=["emails"], concurrency=4, token=token).run(handle)  # doctest: +SKIP
    """

    def __init__(self, config: Optional[WorkerConfig] = None, **kwargs: Any) -> None:
        if config is not None and kwargs:
            raise TypeError("give a WorkerConfig or keyword options, not both")
        self.config = config or WorkerConfig(**kwargs)
        self.config.validate()
        self.stats = WorkerStats()
        self._rejections: Deque[Rejection] = collections.deque(maxlen=REJECTIONS_KEPT)
        self._run: Optional[_Run] = None
        self._running = threading.Lock()
        self._stop_requested = False

    def rejections(self) -> List[Rejection]:
        """The last outcomes the server refused (up to 1024), oldest first."""
        return list(self._rejections)

    def run(self, handler: Handler, install_signal_handlers: bool = True) -> WorkerSummary:
        """Runs the worker on a new event loop until SIGTERM/SIGINT (when called from the main thread and
        ``install_signal_handlers``) or :meth:`stop`, then shuts down gracefully and returns the counters."""
        return asyncio.run(self.run_async(handler, install_signal_handlers=install_signal_handlers))

    async def run_async(self, handler: Handler, install_signal_handlers: bool = False) -> WorkerSummary:
        """Runs the slots until :meth:`stop` (or a signal, with ``install_signal_handlers``), then shuts down
        gracefully: no more Readys, running handlers get ``shutdown_grace`` to finish, what still runs is
        abandoned. A refusal that no retry can fix (a bad token, a queue the server refuses) ends the run with
        that error after the same graceful shutdown."""
        if not self._running.acquire(blocking=False):
            raise AlreadyRunningError("the worker is already running")
        loop = asyncio.get_running_loop()
        installed: List[signal.Signals] = []
        try:
            run = _Run(self, handler, loop)
            self._run = run
            if self._stop_requested:
                run.stopping.set()
            if install_signal_handlers and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    try:
                        loop.add_signal_handler(sig, run.stop)
                        installed.append(sig)
                    except (NotImplementedError, RuntimeError):
                        pass
            return await run.main()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._run = None
            self._stop_requested = False
            self._running.release()

    def stop(self) -> None:
        """Begins the graceful shutdown (thread-safe; a no-op when not running)."""
        run = self._run
        if run is None:
            self._stop_requested = True
            return
        run.loop.call_soon_threadsafe(run.stop)


class _Run:
    """Everything one run of a worker shares: the supervisor, the reader, the slots and the janitor."""

    def __init__(self, worker: Worker, handler: Handler, loop: asyncio.AbstractEventLoop) -> None:
        self.worker = worker
        self.cfg = worker.config
        self.stats = worker.stats
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)
        )
        self.loop = loop
        c = self.cfg
        self.conn = AsyncConnector(c.addrs, c.token, c.token_provider, c.tls_ca_pem, c.connect_timeout)
        self.lease_ms = duration_ms(c.lease)
        self.next_id = 1
        self.session: Optional[Session] = None
        self.session_changed: "asyncio.Future[None]" = loop.create_future()
        #: Shutdown began: no more Readys.
        self.stopping = _Flag(loop)
        #: The grace ran out: running handlers are dropped and their tasks abandoned.
        self.grace_over = _Flag(loop)
        #: Outcomes still without an answer are counted unconfirmed.
        self.give_up = _Flag(loop)
        #: Everything is done: the supervisor closes the stream.
        self.closing = _Flag(loop)
        self.fatal: Optional[RaftqError] = None
        self.running: Dict[str, _Held] = {}
        # Ends of deliveries this worker does not hold (yet): (task id, token) -> reason. A claim's answer and the
        # end of one of its deliveries can both be read before the slot takes the batch; admitting it looks here.
        self.ended_early: "collections.OrderedDict[Tuple[str, int], str]" = collections.OrderedDict()
        self.orphans: "asyncio.Queue[task_pb2.Task]" = asyncio.Queue()
        self.pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        # Plain handlers of a batch stop starting once shutdown began (read from the pool's threads).
        self.stopping_now = False

    def stop(self) -> None:
        self.stopping_now = True
        self.stopping.set()

    def rid(self) -> int:
        r = self.next_id
        self.next_id += 1
        return r

    # ---- the run ----

    async def main(self) -> WorkerSummary:
        cfg = self.cfg
        if not self.is_async:
            self.pool = concurrent.futures.ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="raftq-handler")
        supervisor = self.loop.create_task(self.supervise())
        janitor_stop = _Flag(self.loop)
        janitor = self.loop.create_task(self.janitor(janitor_stop))
        slots = {self.loop.create_task(self.slot(n)) for n in range(cfg.concurrency)}
        log.info("worker %s started: queues %s, concurrency %d", cfg.worker_id, list(cfg.queues), cfg.concurrency)
        try:
            await self.stopping.wait()
            log.info("worker %s stopping", cfg.worker_id)
            _, pending = await asyncio.wait(slots, timeout=cfg.shutdown_grace)
            if pending:
                self.grace_over.set()
                self.cut_off()
                _, pending = await asyncio.wait(pending, timeout=ACK_DRAIN)
                if pending:
                    self.give_up.set()
                    await asyncio.wait(pending)
            janitor_stop.set()
            _, pending = await asyncio.wait({janitor}, timeout=ACK_DRAIN)
            if pending:
                self.give_up.set()
                await asyncio.wait(pending)
        finally:
            self.stop()
            self.grace_over.set()
            self.give_up.set()
            self.closing.set()
            for t in list(slots) + [janitor]:
                t.cancel()
            await asyncio.wait({supervisor}, timeout=RETIRE_MAX + 1)
            supervisor.cancel()
            if self.session is not None:
                self.session.close()
            await self.conn.close()
            if self.pool is not None:
                self.pool.shutdown(wait=False)
        summary = self.stats.snapshot()
        log.info("worker %s stopped: %s", cfg.worker_id, summary)
        for t in slots:
            if not t.cancelled() and t.exception() is not None:
                log.error("a worker slot ended abnormally", exc_info=t.exception())
        if self.fatal is not None:
            raise self.fatal
        return summary

    def cut_off(self) -> None:
        """The shutdown grace ran out: running ``async`` handlers are cancelled (plain ones are told, and their
        tasks abandoned without waiting for them, in ``run_sync_handlers``)."""
        for h in list(self.running.values()):
            if h.atask is not None and not h.atask.done():
                log.warning("shutdown grace ran out; abandoning running task %s", h.task.id)
                h.cancellation.set(SHUTDOWN)
                h.atask.cancel()

    def fail(self, e: RaftqError, hard: bool) -> None:
        """Ends the run with ``e`` once shut down; ``hard`` when nothing can be delivered any more either."""
        if self.fatal is None:
            self.fatal = e
        self.stop()
        if hard:
            self.grace_over.set()
            self.cut_off()
            self.give_up.set()

    # ---- the stream ----

    def publish(self, s: Optional[Session]) -> None:
        self.session = s
        fut, self.session_changed = self.session_changed, self.loop.create_future()
        fut.set_result(None)

    def live_session(self) -> Optional[Session]:
        s = self.session
        return s if s is not None and s.is_live() else None

    async def wait_session(self, *flags: _Flag) -> Optional[Session]:
        """The open stream, waiting for the supervisor to open one; None once one of ``flags`` is set."""
        while True:
            s = self.live_session()
            if s is not None:
                return s
            if any(f.is_set() for f in flags):
                return None
            await _first(self.session_changed, *(f.fut for f in flags))

    async def supervise(self) -> None:
        """Keeps one stream open: opens it, publishes it to the slots, reads it until it ends, reopens it with
        backoff (to the leader when one was named, else the next address)."""
        cfg = self.cfg
        backoff = Backoff(cfg.reconnect_backoff_min, cfg.reconnect_backoff_max)
        replaces_lost = False
        while not self.closing.is_set():
            try:
                session = await Session.open(self.conn, self.conn.token(), cfg.worker_id)
            except RaftqError as e:
                if _fatal_on_open(e, cfg.token_provider is not None):
                    log.error("the server refused the worker stream: %s", e)
                    self.fail(e, hard=True)
                    return
                log.warning("cannot open the worker stream: %s", e)
                await self.closing.wait(backoff.next_delay())
                continue
            if replaces_lost:
                self.stats.add("reconnects")
            replaces_lost = False
            log.info("worker stream open on %s", session.target.uri)
            started = time.monotonic()
            self.publish(session)
            watcher = self.loop.create_task(self.watch(session))
            end = await self.read(session)
            watcher.cancel()
            session.close()
            self.publish(None)
            if end == "stopped":
                return
            if end == "retired":
                log.debug("worker stream retired at shutdown")
                continue
            replaces_lost = True
            log.warning("worker stream on %s lost (%s); reconnecting", session.target.uri, end)
            if session.answered or time.monotonic() - started >= cfg.reconnect_backoff_max:
                backoff.reset()
            await self.closing.wait(backoff.next_delay())

    async def watch(self, session: Session) -> None:
        """Retires the stream when shutdown begins while Readys of it are outstanding: it takes no new requests
        and closes once those in flight are answered. Closing is the only way to withdraw a Ready the server
        holds; otherwise it could claim the very tasks this worker abandons while shutting down. Closes it when
        the run ends."""
        await _first(self.stopping.fut, self.closing.fut)
        if not self.closing.is_set() and session.readys > 0:
            session.draining = True
            deadline = time.monotonic() + RETIRE_MAX
            while not session.drain() and time.monotonic() < deadline and not self.closing.is_set():
                await asyncio.sleep(RETIRE_POLL)
            session.retired = True
            session.close()
        await self.closing.wait()
        session.close()

    async def read(self, session: Session) -> str:
        """Routes the stream's events to the requests waiting for them until the stream ends; says how."""
        call = session.call
        while True:
            try:
                ev = await call.read()
            except grpc.aio.AioRpcError as e:
                if session.retired:
                    return "retired"
                if self.closing.is_set():
                    return "stopped"
                if session.closed:
                    return "closed by the worker"
                err = _session_error(e)
                if isinstance(err, NotLeaderError):
                    self.conn.redirect(session.target.uri, err.leader)
                else:
                    self.conn.failed(session.target.uri)
                return str(err)
            except asyncio.CancelledError:
                # A call cancelled here (a retire, a NOT_LEADER, a failed request) raises CancelledError in
                # read(); only a cancellation of the supervisor itself propagates.
                if session.retired:
                    return "retired"
                if self.closing.is_set():
                    return "stopped"
                if session.closed:
                    return "closed by the worker"
                raise
            if ev is grpc.aio.EOF:
                if session.retired:
                    return "retired"
                self.conn.failed(session.target.uri)
                return "the server ended the stream"
            which = ev.WhichOneof("event")
            if which == "revoked":
                self.revoked(ev.revoked)
                continue
            routed = _session.route(ev)
            if routed is None:
                continue
            rid, reply = routed
            if session.answer(rid, reply):
                continue
            kind, body = reply
            if kind == "batch":
                for t in body:
                    self.orphans.put_nowait(t)
            elif kind == "error":
                log.warning("worker stream error (request %d): %s %s", rid, body.reason, body.message)
                if body.reason == "NOT_LEADER":
                    session.not_leader(self.conn, body.leader_addr or None)

    def revoked(self, r: Any) -> None:
        """The server ended a delivery this worker holds (cancel, deadline, lease expiry): tell its handler."""
        held = self.running.get(r.task_id)
        if held is None:
            if len(self.ended_early) >= ENDED_EARLY_KEPT:
                self.ended_early.popitem(last=False)
            self.ended_early[(r.task_id, r.token)] = r.reason or CANCELLED
            return
        if held.token != r.token or held.delivering:
            return
        self.stats.add("revoked")
        self.signal(held, r.reason or CANCELLED)

    def signal(self, held: _Held, reason: str) -> None:
        if held.cancellation.set(reason):
            log.info("task %s: delivery ended (%s); telling its handler", held.task.id, reason)
        if held.atask is not None and self.cfg.cancel_async_handlers and not held.atask.done():
            held.atask.cancel()

    # ---- slots ----

    async def slot(self, n: int) -> None:
        """One slot: claim, handle, report, until shutdown. The slot's next Ready goes out as soon as its handlers
        have returned, while their outcomes wait for their acks: a slot is not idle for a commit round between two
        batches. Its next handlers start once both the acks and the next tasks are in."""
        reporting: "Optional[asyncio.Task[None]]" = None
        try:
            while True:
                tasks = await self.claim()
                # Running from the moment the claim is answered: the end of a delivery pushed while the slot
                # still waits for its last acks reaches the task's cancellation.
                batch = self.admit(tasks) if tasks else []
                if reporting is not None:
                    await reporting
                    reporting = None
                if tasks is None:
                    break
                # An empty batch: the server's hold ran out with nothing to do. Re-arm at once.
                if batch:
                    items = await self.handle(batch)
                    reporting = self.loop.create_task(self.report(batch, items))
        finally:
            if reporting is not None and not reporting.done():
                reporting.cancel()
        log.debug("worker slot %d stopped", n)

    async def claim(self) -> Optional[List[task_pb2.Task]]:
        """Sends a Ready and waits for its tasks; None once shutdown began."""
        cfg = self.cfg
        while True:
            session = await self.wait_session(self.stopping)
            if session is None or self.stopping.is_set():
                return None
            rid = self.rid()
            session.readys += 1
            try:
                fut = await session.send(rid, _session.ready_event(rid, list(cfg.queues), self.lease_ms, cfg.batch_size))
            except NotSent:
                session.readys -= 1
                continue
            if not fut.done():
                await _first(fut, self.stopping.fut)
            if not fut.done():
                # Shutdown began: the Ready stays outstanding; tasks that still come for it are given back
                # (orphans), and the watcher retires the stream so the server drops it.
                if session.forget(rid):
                    return None
                await asyncio.wait({fut})
            session.readys -= 1
            if fut.cancelled() or fut.exception() is not None:
                continue  # the stream was lost: wait for the next one
            kind, body = fut.result()
            if kind == "batch":
                session.answered = True
                self.stats.add("claimed", len(body))
                return list(body)
            if kind == "error":
                err = _session.stream_error(body)
                if isinstance(err, NotLeaderError):
                    session.not_leader(self.conn, err.leader)
                elif err.retryable or isinstance(err, UnknownOutcomeError):
                    log.warning("a Ready failed (%s); reconnecting", err)
                    session.fail(self.conn)
                else:
                    log.error("the server refused this worker's Ready: %s", err)
                    self.fail(err, hard=False)
                    return None
            else:
                log.warning("unexpected answer to a Ready (%s); reconnecting", kind)
                session.fail(self.conn)

    def admit(self, protos: List[task_pb2.Task]) -> List[_Held]:
        """Registers a claimed batch's tasks as running."""
        held: List[_Held] = []
        for p in protos:
            task = Task.from_proto(p)
            c = Cancellation()
            task.cancellation = c
            h = _Held(task, task.fencing_token, c)
            task._link = _ProgressLink(self, h)  # type: ignore[attr-defined]
            held.append(h)
            self.running[task.id] = h
            reason = self.ended_early.pop((task.id, h.token), None) if self.ended_early else None
            if reason is not None:
                self.stats.add("revoked")
                self.signal(h, reason)
        return held

    async def handle(self, held: List[_Held]) -> "List[_Item]":
        """Runs the handlers of one batch (one after another) while extending its leases."""
        every = self.cfg.heartbeat_every()
        beat = self.loop.create_task(self.heartbeat(held, every)) if every else None
        try:
            if self.is_async:
                outcomes = [await self.run_async_handler(h) for h in held]
            else:
                outcomes = await self.run_sync_handlers(held)
        finally:
            if beat is not None:
                beat.cancel()
        for h in held:
            h.delivering = True
        return [_Item(h.task.id, h.token, o) for h, o in zip(held, outcomes)]

    async def report(self, held: List[_Held], items: "List[_Item]") -> None:
        """Sends a batch's outcomes and checks their acks."""
        try:
            units = _plan(items, self.cfg.batch_size > 1)
            if len(units) == 1:
                await self.deliver(units[0])
            else:
                await asyncio.gather(*(self.deliver(u) for u in units))
        finally:
            for h in held:
                if self.running.get(h.task.id) is h:
                    del self.running[h.task.id]

    async def run_async_handler(self, h: _Held) -> Outcome:
        # Shutdown began, or the delivery already ended: tasks not yet started go back at once.
        if self.stopping.is_set() or h.cancellation.is_set():
            return Abandon()
        try:
            coro = self.handler(h.task)
        except Exception as e:  # noqa: BLE001 - a handler's failure is the task's failure
            return _failed(h.task.id, e)
        if not inspect.isawaitable(coro):
            return normalize(coro)
        t: "asyncio.Task[Any]" = self.loop.create_task(coro)  # type: ignore[arg-type]
        h.atask = t
        try:
            result = await t
        except asyncio.CancelledError:
            if not t.cancelled():
                raise  # this slot itself was cancelled, not the handler
            # Cancelled because its delivery ended (or the shutdown grace ran out, see `cut_off`): any outcome is
            # refused; give it back (the server's refusal is recorded as a rejection).
            return Abandon()
        except Exception as e:  # noqa: BLE001 - a handler's failure is the task's failure
            return _failed(h.task.id, e)
        return normalize(result)

    async def run_sync_handlers(self, held: List[_Held]) -> List[Outcome]:
        done: List[Outcome] = []
        handler = self.handler

        def work() -> None:
            for h in held:
                if self.stopping_now or h.cancellation.is_set():
                    done.append(Abandon())
                    continue
                try:
                    done.append(normalize(handler(h.task)))
                except Exception as e:  # noqa: BLE001 - a handler's failure is the task's failure
                    done.append(_failed(h.task.id, e))

        assert self.pool is not None
        fut = self.loop.run_in_executor(self.pool, work)
        await _first(fut, self.grace_over.fut)
        if fut.done():
            fut.result()
            return done
        # The grace ran out: the thread cannot be stopped; its handler is told, its task abandoned.
        finished = list(done)
        for h in held[len(finished) :]:
            log.warning("shutdown grace ran out; abandoning running task %s", h.task.id)
            h.cancellation.set(SHUTDOWN)
        return finished + [Abandon() for _ in held[len(finished) :]]

    async def heartbeat(self, held: List[_Held], every: float) -> None:
        """Extends every held lease by ``lease``, every ``every``, until cancelled."""
        while True:
            await asyncio.sleep(every)
            session = self.live_session()
            if session is None:
                continue  # no stream now: skip this beat; the lease has two more before it runs out
            beats = [h for h in held if not h.delivering and not h.cancellation.is_set()]
            await asyncio.gather(*(self.beat(session, h) for h in beats))

    async def beat(self, session: Session, h: _Held) -> None:
        rid = self.rid()
        try:
            kind, body = await session.request(rid, _session.heartbeat_event(rid, h.task.id, h.token, self.lease_ms))
        except (NotSent, MaybeSent):
            return
        if kind == "ack":
            if body.applied:
                self.stats.add("lease_extensions")
            elif not h.delivering:
                log.warning("task %s: lease extension refused (%s %s)", h.task.id, body.reason, body.message)
                self.signal(h, LEASE_LOST)
        elif kind == "error" and body.reason == "NOT_LEADER":
            session.not_leader(self.conn, body.leader_addr or None)

    async def progress(self, h: _Held, percent: int, message: str) -> None:
        """A lease extension carrying progress, on the stream; raises the server's refusal."""
        while True:
            session = await self.wait_session(self.give_up)
            if session is None:
                raise RaftqError("the worker is shutting down")
            rid = self.rid()
            try:
                kind, body = await session.request(
                    rid, _session.heartbeat_event(rid, h.task.id, h.token, self.lease_ms, (percent, message))
                )
            except (NotSent, MaybeSent):
                continue
            if kind == "ack":
                if not body.applied:
                    raise from_reason(body.reason, body.message)
                return
            if kind == "error":
                err = _session.stream_error(body)
                if isinstance(err, NotLeaderError):
                    session.not_leader(self.conn, err.leader)
                    continue
                raise err
            raise ProtocolError(f"unexpected answer to a heartbeat: {kind}")

    # ---- outcomes ----

    async def deliver(self, unit: List[_Item]) -> None:
        """Sends one request's outcomes until an answer comes: on the next stream after a lost one, to the
        leader after NOT_LEADER. Resending is safe because every outcome carries its fencing token: the server
        applies at most one. Gives up only when the run does. After two failures in a row on one stream (a node
        cut off from the leader) the stream is dropped so the next one goes to another node."""
        cfg = self.cfg
        backoff = Backoff(cfg.reconnect_backoff_min, cfg.reconnect_backoff_max)
        maybe_applied = False
        failed_here = 0
        batch = len(unit) > 1
        while True:
            session = await self.wait_session(self.give_up)
            if session is None:
                return self.unconfirmed(unit)
            rid = self.rid()
            try:
                fut = await session.send(rid, _unit_event(unit, rid, batch))
            except NotSent:
                continue
            if not fut.done():
                await _first(fut, self.give_up.fut)
            if not fut.done():
                session.forget(rid)
                return self.unconfirmed(unit)
            if fut.cancelled() or fut.exception() is not None:
                maybe_applied = True  # sent (or queued), then the stream was lost
                continue
            kind, body = fut.result()
            if kind == "ack" and not batch:
                session.answered = True
                return self.settle(unit[0], body, maybe_applied)
            if kind == "acks" and batch:
                session.answered = True
                if len(body) != len(unit) or any(i.task_id != a.task_id for i, a in zip(unit, body)):
                    log.warning("%d acks do not match %d results", len(body), len(unit))
                    return self.unconfirmed(unit)
                for i, a in zip(unit, body):
                    self.settle(i, a, maybe_applied)
                return
            if kind == "error":
                err = _session.stream_error(body)
                if isinstance(err, NotLeaderError):
                    session.not_leader(self.conn, err.leader)  # refused before proposing: nothing applied
                    continue
                if isinstance(err, UnknownOutcomeError) or err.retryable:
                    maybe_applied = maybe_applied or isinstance(err, UnknownOutcomeError)
                    failed_here += 1
                    if failed_here >= 2:
                        log.info("results keep failing on %s; moving to another node", session.target.uri)
                        session.fail(self.conn)
                        failed_here = 0
                    if await self.give_up.wait(backoff.next_delay()):
                        return self.unconfirmed(unit)
                    continue
                for i in unit:
                    self.reject(i, body.reason, body.message, maybe_applied)
                return
            log.warning("unexpected answer to a task outcome: %s", kind)
            return self.unconfirmed(unit)

    def settle(self, item: _Item, ack: Any, maybe_applied: bool) -> None:
        if ack.applied:
            o = item.outcome
            name = {
                Complete: "completed",
                Fail: "failed",
                Nack: "nacked",
                Abandon: "abandoned",
                RunException: "exceptions",
            }[type(o)]
            self.stats.add(name)
        else:
            self.reject(item, ack.reason or "UNKNOWN", ack.message, maybe_applied)

    def reject(self, item: _Item, reason: str, message: str, maybe_applied: bool) -> None:
        self.stats.add("rejected")
        log.warning(
            "the server refused the outcome of task %s: %s %s (maybe applied before: %s)",
            item.task_id,
            reason,
            message,
            maybe_applied,
        )
        r = Rejection(item.task_id, reason, message, item.outcome, maybe_applied)
        self.worker._rejections.append(r)
        if self.cfg.on_rejection is not None:
            try:
                self.cfg.on_rejection(r)
            except Exception:  # noqa: BLE001 - a callback's failure must not stop the worker
                log.exception("on_rejection raised")

    def unconfirmed(self, unit: List[_Item]) -> None:
        self.stats.add("unconfirmed", len(unit))
        for i in unit:
            log.warning("no answer to the outcome of task %s before shutdown; it may or may not be applied", i.task_id)

    async def janitor(self, stop: _Flag) -> None:
        """Gives back tasks that arrived for a Ready nobody waited for any more."""
        while True:
            get = self.loop.create_task(self.orphans.get())
            await _first(get, stop.fut)
            if not get.done():
                get.cancel()
                break
            await self.give_back(get.result())
        while not self.orphans.empty():
            await self.give_back(self.orphans.get_nowait())

    async def give_back(self, t: task_pb2.Task) -> None:
        self.stats.add("claimed")
        log.info("giving back task %s, which arrived after its slot stopped waiting", t.id)
        await self.deliver([_Item(t.id, t.lease.token, Abandon())])


async def _first(*futs: "asyncio.Future[Any]") -> None:
    """Waits until one of ``futs`` is done (never cancelling them)."""
    await asyncio.wait(set(futs), return_when=asyncio.FIRST_COMPLETED)


def _is_result(o: Outcome) -> bool:
    return isinstance(o, (Complete, Fail))


def _plan(items: List[_Item], batch: bool) -> List[List[_Item]]:
    """Groups outcomes into requests: with ``batch``, completed and failed outcomes travel together in one
    ResultBatch (the server has no batch form of nack, abandon and exception, so those go one by one)."""
    results = [i for i in items if _is_result(i.outcome)]
    others = [i for i in items if not _is_result(i.outcome)]
    units: List[List[_Item]] = []
    if batch and len(results) > 1:
        units.append(results)
    else:
        units.extend([i] for i in results)
    units.extend([i] for i in others)
    return units


def _result(rid: int, i: _Item) -> stream_pb2.Result:
    o = i.outcome
    r = stream_pb2.Result(request_id=rid, task_id=i.task_id, token=i.token)
    if isinstance(o, Complete):
        r.completed.result = to_bytes(o.result)
        if o.follow_ups:
            r.completed.follow_ups.extend(t.to_proto() for t in o.follow_ups)
        else:
            r.completed.SetInParent()
    elif isinstance(o, Fail):
        r.failed.error = o.error
        r.failed.retryable = o.retryable
    return r


def _unit_event(unit: List[_Item], rid: int, batch: bool) -> stream_pb2.WorkerEvent:
    """The event that sends ``unit`` as request ``rid``."""
    if batch:
        return stream_pb2.WorkerEvent(
            result_batch=stream_pb2.ResultBatch(request_id=rid, results=[_result(rid, i) for i in unit])
        )
    i = unit[0]
    o = i.outcome
    if isinstance(o, (Complete, Fail)):
        return stream_pb2.WorkerEvent(result=_result(rid, i))
    if isinstance(o, Nack):
        return stream_pb2.WorkerEvent(
            nack=stream_pb2.NackTask(
                request_id=rid, task_id=i.task_id, token=i.token, delay_ms=duration_ms(o.delay), reason=o.reason
            )
        )
    if isinstance(o, RunException):
        return stream_pb2.WorkerEvent(
            exception=stream_pb2.ExceptionTask(
                request_id=rid,
                task_id=i.task_id,
                token=i.token,
                exception=task_pb2.Exception(reason=o.reason, message=o.message),
            )
        )
    return stream_pb2.WorkerEvent(abandon=stream_pb2.AbandonTask(request_id=rid, task_id=i.task_id, token=i.token))


def _session_error(e: grpc.aio.AioRpcError) -> RaftqError:
    return from_rpc_error(e, write=False)


def _fatal_on_open(e: RaftqError, has_provider: bool) -> bool:
    """Errors on opening a stream that another try will not fix. An expired token is fixed by a provider."""
    if isinstance(e, ServerError):
        if e.reason == "TOKEN_EXPIRED":
            return not has_provider
        return e.reason in (
            "UNAUTHENTICATED",
            "PERMISSION_DENIED",
            "INVALID_ARGUMENT",
            "UNIMPLEMENTED",
            "SCOPE_REQUIRED",
        ) or (e.reason or "").startswith("TOKEN_")
    return isinstance(e, (ConfigError, ProtocolError))

