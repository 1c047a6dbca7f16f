"""Enqueue a few tasks with options, then wait for their results.

    RAFTQ_TOKEN=$(raftq token issue) python examples/producer.py
"""

import os

import raftq

with raftq.Producer(addrs=[os.environ.get("RAFTQ_ADDR", "127.0.0.1:9091")], token=os.environ.get("RAFTQ_TOKEN")) as p:
    a = p.enqueue("emails", b"hello", priority=5, max_attempts=3, idempotency_key="order-42")
    b = p.enqueue("emails", "later", delay=2, deadline=60)
    items = p.enqueue_batch([raftq.NewTask("emails", f"batch {i}") for i in range(10)])
    ids = [a.task_id, b.task_id] + [e.task_id for e in items if isinstance(e, raftq.Enqueued)]
    for task_id in ids:
        r = p.result(task_id, wait=30)
        print(task_id, r.state.value, r.result or r.error)
    print(p.queue_stats(["emails"]))
