"""A worker with plain (threaded) handlers: SIGTERM or Ctrl-C stops it gracefully.

    RAFTQ_TOKEN=$(raftq token issue) python examples/worker.py
"""

import logging
import os
import time

import raftq

logging.basicConfig(level=logging.INFO)


def handle(task: raftq.Task) -> raftq.Outcome:
    if not task.payload:
        return raftq.RunException(raftq.MALFORMED_PAYLOAD, "empty payload")
    for step in range(10):
        if task.cancellation.is_set():  # cancelled, deadline passed, or lease lost: stop at once
            return raftq.Abandon()
        task.report_progress(step * 10, f"step {step}")
        time.sleep(0.1)
    return raftq.Complete(b"sent: " + task.payload)


worker = raftq.Worker(
    addrs=os.environ.get("RAFTQ_ADDR", "127.0.0.1:9091").split(","),
    token=os.environ.get("RAFTQ_TOKEN"),
    queues=["emails"],
    concurrency=8,
    lease=30,
)
print(worker.run(handle))
