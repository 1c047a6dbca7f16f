#!/usr/bin/env python3
"""Benchmarks of the Python SDK against real ``raftq serve`` processes it starts itself (temp data dirs,
ephemeral ports on 127.0.0.1, authentication on, fsync on as always).

- ``enqueue``: enqueue throughput of one Python process, ``AsyncProducer.enqueue_batch`` with ``--batch``
  tasks per request and ``--producers`` requests in flight.
- ``cycle-sync`` / ``cycle-async``: claim-and-complete cycles per second of one Python worker process with a
  no-op handler (plain, run in the worker's thread pool; or ``async def``), draining ``--tasks`` tasks enqueued
  just before (the enqueue above); ``--concurrency`` slots asking for ``--worker-batch`` tasks per Ready.
- ``cancel``: time from ``Producer.cancel`` being acknowledged to a running handler seeing its cancellation, on
  one node and with the worker's stream on a follower of a 3-node cluster (``--cancels`` samples each). With
  ``--rust-example`` (``cargo build --release -p raftq-client --example cancel_latency``) the Rust SDK's handler
  is measured the same way.

Each benchmark runs ``--runs`` times; the median and the spread (min-max) are printed at the end.

    cargo build --release -p raftq && python/bench.py --runs 3
"""

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

import raftq  # noqa: E402
from servers import REPO, Cluster  # noqa: E402


def enqueue(c: Cluster, queue: str, n: int, batch: int, producers: int) -> float:
    """Tasks enqueued per second (each acknowledged, i.e. fsynced on a quorum)."""

    async def main() -> float:
        async with raftq.AsyncProducer(addrs=c.addrs, token=c.token) as p:
            left = [n]

            async def one() -> None:
                while left[0] > 0:
                    k = min(batch, left[0])
                    left[0] -= k
                    out = await p.enqueue_batch([raftq.NewTask(queue, b"x") for _ in range(k)])
                    bad = [e for e in out if not isinstance(e, raftq.Enqueued)]
                    assert not bad, bad[:3]

            await p.queue_stats([queue])  # connected before the clock starts
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(producers)))
            return n / (time.perf_counter() - t0)

    return asyncio.run(main())


def cycle(c: Cluster, queue: str, n: int, concurrency: int, batch: int, use_async: bool) -> float:
    """Tasks claimed and completed per second by one worker (a no-op handler) draining ``n`` tasks."""

    async def noop_async(task: raftq.Task) -> None:
        return None

    def noop(task: raftq.Task) -> None:
        return None

    w = raftq.Worker(
        addrs=c.addrs, token=c.token, queues=[queue], concurrency=concurrency, batch_size=batch, lease=60
    )
    done: Dict[str, Any] = {}
    t0 = time.perf_counter()
    th = threading.Thread(
        target=lambda: done.update(s=w.run(noop_async if use_async else noop, install_signal_handlers=False))
    )
    th.start()
    while w.stats.completed < n:
        time.sleep(0.005)
        if not th.is_alive():
            raise RuntimeError("the worker stopped early")
    rate = n / (time.perf_counter() - t0)
    w.stop()
    th.join()
    assert done["s"].rejected == 0, done["s"]
    return rate


def cancel_latency(c: Cluster, worker_addr: str, producer_addr: str, n: int) -> Dict[str, float]:
    """Milliseconds from the cancel's acknowledgement (and from its sending) to the handler seeing it."""
    queue = f"cancel-{time.time_ns()}"
    started: Dict[str, threading.Event] = {}
    seen: Dict[str, float] = {}
    lock = threading.Lock()

    def handle(task: raftq.Task) -> raftq.Outcome:
        with lock:
            ev = started.setdefault(task.id, threading.Event())
        ev.set()
        assert task.cancellation is not None
        if task.cancellation.wait(30):
            seen[task.id] = time.monotonic()
        return raftq.Abandon()

    w = raftq.Worker(addrs=[worker_addr], token=c.token, queues=[queue], lease=60, heartbeat=20)
    th = threading.Thread(target=lambda: w.run(handle, install_signal_handlers=False))
    th.start()
    from_ack: List[float] = []
    from_send: List[float] = []
    with raftq.Producer(addrs=[producer_addr], token=c.token) as p:
        for _ in range(n):
            tid = p.enqueue(queue, b"x").task_id
            with lock:
                ev = started.setdefault(tid, threading.Event())
            assert ev.wait(30), "the task never started"
            sent = time.monotonic()
            p.cancel(tid)
            acked = time.monotonic()
            deadline = acked + 10
            while tid not in seen and time.monotonic() < deadline:
                time.sleep(0.0002)
            assert tid in seen, "the handler never saw the cancel"
            from_ack.append(max(0.0, seen[tid] - acked) * 1000)
            from_send.append((seen[tid] - sent) * 1000)
    w.stop()
    th.join()
    return summarize_latency(from_ack, from_send)


def summarize_latency(from_ack: List[float], from_send: List[float]) -> Dict[str, float]:
    def pct(v: List[float], q: float) -> float:
        s = sorted(v)
        return s[min(len(s) - 1, int(q * len(s)))]

    return {
        "from_ack_p50_ms": pct(from_ack, 0.5),
        "from_ack_p99_ms": pct(from_ack, 0.99),
        "from_ack_max_ms": max(from_ack),
        "from_send_p50_ms": pct(from_send, 0.5),
        "from_send_max_ms": max(from_send),
    }


def rust_cancel_latency(example: Path, c: Cluster, worker_addr: str, producer_addr: str, n: int) -> Dict[str, float]:
    out = subprocess.run(
        [str(example), "--producer", producer_addr, "--worker", worker_addr, "--token", c.token, "-n", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    d: Dict[str, List[float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return summarize_latency(d["from_ack_ms"], d["from_send_ms"])


def spread(values: List[float]) -> str:
    return f"median {statistics.median(values):10.1f}   min {min(values):10.1f}   max {max(values):10.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", default=["enqueue", "cycle-sync", "cycle-async", "cancel"])
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release" / "raftq")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=30000)
    ap.add_argument("--batch", type=int, default=500, help="tasks per EnqueueBatch")
    ap.add_argument("--producers", type=int, default=4, help="EnqueueBatch requests in flight")
    ap.add_argument("--concurrency", type=int, default=4, help="worker slots")
    ap.add_argument("--worker-batch", type=int, default=64, help="tasks per Ready")
    ap.add_argument("--cancels", type=int, default=50)
    ap.add_argument("--rust-example", type=Path, default=REPO / "target" / "release" / "examples" / "cancel_latency")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = ap.parse_args()
    # The cancel benchmark's handlers return after their delivery ended: the server refuses those outcomes, which
    # the worker logs as warnings. Expected here.
    logging.getLogger("raftq").setLevel(logging.ERROR)
    if not a.bin.exists():
        sys.exit(f"{a.bin} not found: cargo build --release -p raftq (or give --bin)")
    results: Dict[str, List[Any]] = {}

    def record(name: str, value: Any) -> None:
        results.setdefault(name, []).append(value)
        if not a.json:
            shown = f"{value:,.0f}/s" if isinstance(value, float) else json.dumps({k: round(v, 2) for k, v in value.items()})
            print(f"  {name}: {shown}", flush=True)

    modes = [m for m in ("cycle-sync", "cycle-async") if m in a.what] or (["enqueue"] if "enqueue" in a.what else [])
    for run in range(a.runs):
        if not a.json:
            print(f"run {run + 1}/{a.runs}", flush=True)
        if modes:
            c = Cluster(1, binary=a.bin).start()
            try:
                for mode in modes:
                    queue = f"{mode}-{run}"
                    rate = enqueue(c, queue, a.tasks, a.batch, a.producers)
                    if "enqueue" in a.what:
                        record(f"enqueue (batch {a.batch}, {a.producers} in flight)", rate)
                    if mode != "enqueue":
                        r = cycle(c, queue, a.tasks, a.concurrency, a.worker_batch, mode == "cycle-async")
                        record(f"{mode} (concurrency {a.concurrency}, {a.worker_batch}/Ready)", r)
            finally:
                c.close()
        if "cancel" in a.what:
            for nodes in (1, 3):
                c = Cluster(nodes, binary=a.bin).start()
                try:
                    leader = c.wait_leader()
                    lead = c.node(leader).grpc
                    where = lead if nodes == 1 else next(x.grpc for x in c.nodes if x.id != leader)
                    label = "one node" if nodes == 1 else "worker on a follower"
                    record(f"cancel -> python handler, {label} (ms)", cancel_latency(c, where, lead, a.cancels))
                    if a.rust_example.exists():
                        lat = rust_cancel_latency(a.rust_example, c, where, lead, a.cancels)
                        record(f"cancel -> rust handler, {label} (ms)", lat)
                finally:
                    c.close()
    if a.json:
        print(json.dumps(results))
        return
    print(f"\nsummary over {a.runs} runs")
    for name, values in results.items():
        if isinstance(values[0], float):
            print(f"{name}\n    {spread(values)}  tasks/s")
        else:
            for key in values[0]:
                print(f"{name} {key}\n    {spread([v[key] for v in values])}")


if __name__ == "__main__":
    main()
