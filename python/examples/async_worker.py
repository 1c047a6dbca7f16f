"""A worker with an ``async def`` handler: cancelling the task (``raftq task cancel ID``) cancels the running
coroutine at once.

    RAFTQ_TOKEN=$(raftq token issue) python examples/async_worker.py
"""

import asyncio
import os

import raftq


async def handle(task: raftq.Task) -> bytes:
    try:
        await asyncio.sleep(5)  # the real work: an HTTP call, a query...
    except asyncio.CancelledError:
        print(f"task {task.id} stopped: {task.cancellation.reason}")
        raise
    return b"done"


async def main() -> None:
    worker = raftq.Worker(
        addrs=os.environ.get("RAFTQ_ADDR", "127.0.0.1:9091").split(","),
        token=os.environ.get("RAFTQ_TOKEN"),
        queues=["emails"],
        concurrency=64,
    )
    print(await worker.run_async(handle, install_signal_handlers=True))


asyncio.run(main())
