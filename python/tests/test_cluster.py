"""A three-node cluster of real processes: a worker keeps working through a ``kill -9`` of the leader, and
nothing acknowledged is lost."""

import threading
import time

import raftq
from raftq import Producer, TaskState, Worker

from conftest import Running, wait_for


def test_worker_survives_kill9_of_the_leader_with_nothing_lost(cluster3):
    c = cluster3
    leader = c.wait_leader()
    queue = "kill9"
    seen = set()
    lock = threading.Lock()

    def handle(task):
        with lock:
            seen.add(task.text)
        return task.payload

    # The worker lists the leader first, so its stream is on the node that dies.
    order = [c.node(leader).grpc] + [x.grpc for x in c.nodes if x.id != leader]
    w = Worker(addrs=order, token=c.token, queues=[queue], concurrency=4, reconnect_backoff_max=0.5, lease=5)
    p = Producer(addrs=order, token=c.token, max_retries=30, retry_backoff_max=0.5, request_timeout=15)
    ids = {}

    def enqueue(i: int) -> None:
        # An unknown outcome is resolved by sending the same idempotency key again: a duplicate names the task.
        for _ in range(100):
            try:
                ids[i] = p.enqueue(queue, f"v{i}", idempotency_key=f"k{i}").task_id
                return
            except (raftq.UnknownOutcomeError, raftq.UnavailableError, raftq.TransportError):
                time.sleep(0.2)
        raise AssertionError(f"enqueue {i} never succeeded")

    with Running(w, handle) as r:
        for i in range(60):
            enqueue(i)
        wait_for(lambda: len(seen) >= 30, what="work before the kill")
        c.node(leader).kill9()
        for i in range(60, 120):
            enqueue(i)
        new_leader = c.wait_leader()
        assert new_leader != leader
        for i, tid in ids.items():
            res = p.result(tid, wait=30)
            assert res.state == TaskState.COMPLETED and res.result == f"v{i}".encode(), (i, res)
        summary = r.stop()
    p.close()
    assert seen == {f"v{i}" for i in range(120)}, "every acknowledged enqueue was worked"
    assert summary.reconnects >= 1, summary
    assert summary.completed + summary.rejected >= 120


def test_cancel_reaches_a_handler_whose_stream_is_on_a_follower(cluster3):
    c = cluster3
    leader = c.wait_leader()
    follower = next(x for x in c.nodes if x.id != leader)
    queue = "via-follower"
    seen = []
    started = threading.Event()

    def handle(task):
        started.set()
        task.cancellation.wait(20)
        seen.append(task.cancellation.reason)
        return b"late"

    w = Worker(addrs=[follower.grpc], token=c.token, queues=[queue])
    with Producer(addrs=[c.node(leader).grpc], token=c.token) as p, Running(w, handle) as r:
        e = p.enqueue(queue, b"x")
        assert started.wait(20)
        p.cancel(e.task_id)
        wait_for(lambda: seen, limit=5, what="the cancel reaching the follower's stream")
        summary = r.stop()
    assert seen == [raftq.CANCELLED] and summary.revoked == 1
