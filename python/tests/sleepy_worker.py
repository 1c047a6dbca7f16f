"""A worker process for the SIGTERM test: its handler sleeps 1.5 s; prints "started" when it begins."""

import os
import sys
import time

import raftq


def handle(task: raftq.Task) -> bytes:
    print("started", flush=True)
    time.sleep(1.5)
    return b"slept"


summary = raftq.Worker(
    addrs=[os.environ["RAFTQ_ADDR"]], token=os.environ["RAFTQ_TOKEN"], queues=[os.environ["RAFTQ_QUEUE"]]
).run(handle)
print(f"stopped completed={summary.completed}", flush=True)
sys.exit(0)
