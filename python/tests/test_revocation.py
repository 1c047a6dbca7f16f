"""Revocation reaches the handler: the server pushes on the worker stream that a running task was cancelled,
its deadline passed or its lease expired; the handler's cancellation is set (an async handler is cancelled);
the fencing token guards downstream writes."""

import asyncio
import threading
import time

import raftq
from raftq import TaskState

from conftest import Running, producer, wait_for, worker




def test_without_heartbeats_the_lease_expires_the_handler_learns_it_and_its_late_result_is_refused(server, queue):
    seen = []
    reasons = []

    def handle(task):
        seen.append(task.fencing_token)
        if len(seen) == 1:
            # The first delivery outlives its lease: a heartbeat cannot help (disabled); the server redelivers.
            reasons.append(task.cancellation.wait(15) and task.cancellation.reason)
            return b"late"
        return b"second"

    with producer(server) as p:
        e = p.enqueue(queue, b"x", max_attempts=5)
        rejections = []
        w = worker(server, queue, lease=1.0, heartbeat=0, concurrency=2, on_rejection=rejections.append)
        with Running(w, handle) as r:
            res = p.result(e.task_id, wait=20)
            wait_for(lambda: rejections, what="the late result's rejection")
            summary = r.stop()
        assert res.state == TaskState.COMPLETED and res.result == b"second"
        assert len(seen) == 2 and seen[1] > seen[0], "a redelivery carries a larger fencing token"
        assert rejections[0].task_id == e.task_id and rejections[0].reason in ("LEASE_LOST", "NOT_IN_PROGRESS",
                                                                                "ALREADY_ENDED")
        assert summary.rejected >= 1
        assert reasons == [raftq.LEASE_EXPIRED], "the server told the handler its lease expired"
        assert summary.revoked == 1


def test_cancel_reaches_a_running_plain_handler(server, queue):
    seen = {}
    started = threading.Event()

    def handle(task):
        started.set()
        if task.cancellation.wait(20):
            seen["reason"] = task.cancellation.reason
            seen["at"] = task.cancellation.set_at
        return b"too late"

    with producer(server) as p:
        e = p.enqueue(queue, b"x")
        rejections = []
        with Running(worker(server, queue, on_rejection=rejections.append), handle) as r:
            assert started.wait(10)
            acked = time.monotonic()
            assert p.cancel(e.task_id) == TaskState.CANCELLED
            wait_for(lambda: "reason" in seen, limit=5, what="the handler seeing the cancel")
            wait_for(lambda: rejections, what="the refusal of the late result")
            summary = r.stop()
        assert seen["reason"] == raftq.CANCELLED
        assert seen["at"] - acked < 5, "pushed by the server, not found by a heartbeat"
        assert summary.revoked == 1 and summary.rejected == 1
        assert rejections[0].reason in ("NOT_IN_PROGRESS", "ALREADY_ENDED", "LEASE_LOST")
        t = p.get(e.task_id)
        assert t.state == TaskState.CANCELLED and t.runs[-1].outcome == "CANCELLED"


def test_cancel_cancels_a_running_async_handler(server, queue):
    seen = []

    async def handle(task):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(task.cancellation.reason)
            raise
        return b"never"

    with producer(server) as p:
        e = p.enqueue(queue, b"x")
        w = worker(server, queue)
        with Running(w, handle) as r:
            wait_for(lambda: p.get(e.task_id).state == TaskState.IN_PROGRESS, what="the claim")
            p.cancel(e.task_id)
            wait_for(lambda: seen, limit=5, what="the async handler's cancellation")
            summary = r.stop()
        assert seen == [raftq.CANCELLED] and summary.revoked == 1


def test_a_passed_deadline_reaches_the_handler(server, queue):
    seen = []

    def handle(task):
        task.cancellation.wait(20)
        seen.append(task.cancellation.reason)
        return b"late"

    with producer(server) as p:
        e = p.enqueue(queue, b"x", deadline=1.5)
        with Running(worker(server, queue), handle):
            wait_for(lambda: seen, what="the deadline reaching the handler")
        assert seen == [raftq.DEADLINE_EXCEEDED]
        res = p.result(e.task_id)
        assert res.state == TaskState.FAILED and res.error == "deadline-exceeded"


def test_fencing_token_guards_a_downstream_store(server, queue):
    """The pattern of the README: a store that refuses writes carrying an older token than it has seen."""

    class Store:
        def __init__(self):
            self.lock = threading.Lock()
            self.highest = {}
            self.values = {}

        def write(self, key, value, token):
            with self.lock:
                if token < self.highest.get(key, 0):
                    raise PermissionError(f"stale token {token} < {self.highest[key]}")
                self.highest[key] = token
                self.values[key] = value

    store = Store()
    stale = []
    first_started = threading.Event()

    def handle(task):
        if task.attempts == 1:
            first_started.set()
            task.cancellation.wait(15)  # lease expires; another delivery writes first
            time.sleep(0.5)
            try:
                store.write("k", "from first", task.fencing_token)
            except PermissionError as e:
                stale.append(str(e))
            return b"late"
        store.write("k", "from second", task.fencing_token)
        return b"ok"

    with producer(server) as p:
        e = p.enqueue(queue, b"x")
        with Running(worker(server, queue, lease=1.0, heartbeat=0, concurrency=2), handle):
            assert p.result(e.task_id, wait=20).result == b"ok"
            wait_for(lambda: stale, what="the stale write's refusal")
    assert store.values["k"] == "from second"
    assert stale[0].startswith("stale token")
