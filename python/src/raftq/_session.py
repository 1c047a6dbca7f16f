"""One worker stream: opening it (Hello, HelloAck), its send queue, and matching the server's answers to waiting
requests by request id. A session never reconnects itself; the worker's supervisor opens the next one.
"""

import asyncio
import logging
from typing import Any, Dict, List, Optional, Tuple

import grpc
import grpc.aio

from ._conn import AsyncConnector, Target
from .errors import NotLeaderError, ProtocolError, RaftqError, TransportError, from_reason, from_rpc_error
from .v1 import stream_pb2, task_pb2

log = logging.getLogger("raftq.worker")

WORKER_STREAM = "/raftq.v1.WorkerStream/Stream"
#: Longest wait for a stream's HelloAck; the server itself gives a client 10 s to send its Hello.
HELLO_TIMEOUT = 10.0
#: Events queued for the stream's send side before senders wait: flow control without unbounded memory (the
#: server uses the same depth for its side).
STREAM_SEND_BUFFER = 256


class NotSent(Exception):
    """The request never left: the session was already closed or retiring."""


class MaybeSent(Exception):
    """The request was queued or sent, then the session ended: the server may have acted on it."""


#: The server's answer to one request: ("batch", [Task]), ("ack", TaskAck), ("acks", [TaskAck]),
#: ("error", StreamError).
Reply = Tuple[str, Any]


class Session:
    """An open worker stream."""

    def __init__(self, target: Target, call: Any) -> None:
        self.target = target
        self.call = call
        self.pending: Dict[int, "asyncio.Future[Reply]"] = {}
        self.closed = False
        #: Retiring at shutdown: takes no new requests, closes once those in flight are answered.
        self.draining = False
        #: Something was served on this session: the reconnect backoff may start over.
        self.answered = False
        #: Readys sent and not yet answered; a slot that stops waiting at shutdown leaves its Ready counted.
        self.readys = 0
        #: Set when the session was retired on purpose (not lost).
        self.retired = False
        self._out: "asyncio.Queue[Optional[stream_pb2.WorkerEvent]]" = asyncio.Queue(STREAM_SEND_BUFFER)
        self._writer = asyncio.get_running_loop().create_task(self._write())

    @classmethod
    async def open(cls, conn: AsyncConnector, token: str, worker_id: str) -> "Session":
        """Connects, sends Hello and waits for HelloAck."""
        target, ch, cache = await conn.channel()
        mc = cache.get(WORKER_STREAM)
        if mc is None:
            mc = ch.stream_stream(
                WORKER_STREAM,
                request_serializer=stream_pb2.WorkerEvent.SerializeToString,
                response_deserializer=stream_pb2.ServerEvent.FromString,
            )
            cache[WORKER_STREAM] = mc
        call = mc(metadata=conn.metadata())
        try:
            await call.write(stream_pb2.WorkerEvent(hello=stream_pb2.Hello(token=token, worker_id=worker_id)))
            first = await asyncio.wait_for(call.read(), HELLO_TIMEOUT)
        except asyncio.TimeoutError:
            call.cancel()
            conn.failed(target.uri)
            raise TransportError(f"no HelloAck from {target.uri} within {HELLO_TIMEOUT}s") from None
        except grpc.aio.AioRpcError as e:
            call.cancel()
            err = from_rpc_error(e, write=False)
            if isinstance(err, NotLeaderError):
                conn.redirect(target.uri, err.leader)
            elif isinstance(err, TransportError):
                conn.failed(target.uri)
            raise err from None
        if first is grpc.aio.EOF or first.WhichOneof("event") != "hello_ack":
            call.cancel()
            raise ProtocolError(f"expected HelloAck, got {first!r}")
        return cls(target, call)

    async def _write(self) -> None:
        try:
            while True:
                ev = await self._out.get()
                if ev is None:
                    return
                await self.call.write(ev)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - any failure to send ends the session; the reader reports why
            log.debug("worker stream send side ended: %s", e)
            self.close()

    def is_live(self) -> bool:
        return not self.closed and not self.draining

    async def send(self, rid: int, event: stream_pb2.WorkerEvent) -> "asyncio.Future[Reply]":
        """Sends ``event`` as request ``rid``; the future gets its answer (``MaybeSent`` if the session ends)."""
        if not self.is_live():
            raise NotSent()
        fut: "asyncio.Future[Reply]" = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        try:
            self._out.put_nowait(event)
        except asyncio.QueueFull:
            await self._out.put(event)
        if self.closed and not fut.done():
            self.pending.pop(rid, None)
            raise NotSent()
        return fut

    async def request(self, rid: int, event: stream_pb2.WorkerEvent) -> Reply:
        """Sends and waits for the answer; raises ``NotSent`` or ``MaybeSent`` when there is none."""
        fut = await self.send(rid, event)
        try:
            return await fut
        finally:
            self.pending.pop(rid, None)

    def forget(self, rid: int) -> bool:
        """Stops waiting for ``rid``: true when its answer had not come (a late one is an orphan)."""
        fut = self.pending.pop(rid, None)
        if fut is None:
            return False
        if not fut.done():
            fut.cancel()
            return True
        return False

    def answer(self, rid: int, reply: Reply) -> bool:
        """Hands ``reply`` to request ``rid``; false when nobody waits for it."""
        fut = self.pending.pop(rid, None)
        if fut is None or fut.done():
            return False
        fut.set_result(reply)
        return True

    def drain(self) -> bool:
        """Stops taking new requests; true when none is in flight any more, so the session may close."""
        self.draining = True
        return not any(not f.done() for f in self.pending.values())

    def close(self) -> None:
        """Ends the session: its stream closes and every waiting request learns it was lost."""
        if self.closed:
            return
        self.closed = True
        waiting, self.pending = self.pending, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(MaybeSent())
        try:
            self._out.put_nowait(None)
        except asyncio.QueueFull:
            self._writer.cancel()
        self.call.cancel()

    def not_leader(self, conn: AsyncConnector, leader: Optional[str]) -> None:
        """This node is not the leader: close, and have the next session go to ``leader`` (or the next address)."""
        log.info("worker stream on %s is not on the leader (leader: %s)", self.target.uri, leader or "unknown")
        conn.redirect(self.target.uri, leader)
        self.close()

    def fail(self, conn: AsyncConnector) -> None:
        """Something failed in a way another server may not: close and move on to the next address."""
        conn.failed(self.target.uri)
        self.close()


def route(event: stream_pb2.ServerEvent) -> Optional[Tuple[int, Reply]]:
    """The request an answer is for, and the answer; ``None`` for events that answer nothing."""
    which = event.WhichOneof("event")
    if which == "task_batch":
        return event.task_batch.request_id, ("batch", list(event.task_batch.tasks))
    if which == "ack":
        return event.ack.request_id, ("ack", event.ack)
    if which == "ack_batch":
        return event.ack_batch.request_id, ("acks", list(event.ack_batch.acks))
    if which == "error":
        return event.error.request_id, ("error", event.error)
    return None


def ready_event(rid: int, queues: List[str], lease_ms: int, count: int) -> stream_pb2.WorkerEvent:
    return stream_pb2.WorkerEvent(ready=stream_pb2.Ready(request_id=rid, queues=queues, lease_ms=lease_ms, count=count))


def heartbeat_event(
    rid: int, task_id: str, token: int, extend_ms: int, progress: Optional[Tuple[int, str]] = None
) -> stream_pb2.WorkerEvent:
    hb = stream_pb2.HeartbeatTask(request_id=rid, task_id=task_id, token=token, extend_ms=extend_ms)
    if progress is not None:
        hb.progress.CopyFrom(task_pb2.Progress(percent=progress[0], message=progress[1]))
    return stream_pb2.WorkerEvent(heartbeat=hb)


def stream_error(e: stream_pb2.StreamError) -> RaftqError:
    return from_reason(e.reason, e.message, leader=e.leader_addr or None)

