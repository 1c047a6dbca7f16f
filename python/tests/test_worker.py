"""Worker behaviour against a real node: lease extension of a handler that outlives its lease, lease loss
reaching the handler, graceful shutdown (in-process and on SIGTERM), the fencing token, progress reports."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import raftq
from raftq import TaskState

from conftest import Running, producer, wait_for, worker

HERE = Path(__file__).resolve().parent




def test_heartbeats_keep_the_lease_of_a_handler_that_outlives_it(server, queue):
    def handle(task):
        time.sleep(4.0)  # more than twice the lease
        return b"done"

    with producer(server) as p:
        e = p.enqueue(queue, b"slow")
        w = worker(server, queue, lease=1.5, heartbeat=0.4)
        with Running(w, handle) as r:
            res = p.result(e.task_id, wait=20)
            summary = r.stop()
        assert res.state == TaskState.COMPLETED and res.attempts == 1, res
        assert summary.lease_extensions >= 5 and summary.rejected == 0, summary
        assert len(p.get(e.task_id).runs) == 1, "never redelivered"


def test_progress_reports_travel_on_the_stream_and_show_on_the_task(server, queue):
    with producer(server) as p:
        e = p.enqueue(queue, b"x")
        gate = threading.Event()

        def handle(task):
            task.report_progress(40, "halfway")
            gate.wait(10)
            return b"ok"

        with Running(worker(server, queue), handle):
            t = wait_for(lambda: (lambda t: t if t.progress else None)(p.get(e.task_id)), what="progress")
            assert (t.progress.percent, t.progress.message) == (40, "halfway")
            gate.set()
            assert p.result(e.task_id, wait=10).state == TaskState.COMPLETED


def test_shutdown_lets_handlers_finish_within_the_grace_and_abandons_the_rest(server, queue):
    started = threading.Barrier(3)
    reasons = {}

    def handle(task):
        started.wait(10)
        if task.text == "quick":
            time.sleep(0.5)
            return b"finished"
        task.cancellation.wait(30)  # cooperative: stops when told
        reasons[task.text] = task.cancellation.reason
        return b"never sent"

    with producer(server) as p:
        quick = p.enqueue(queue, b"quick").task_id
        slow = p.enqueue(queue, b"slow", max_attempts=1).task_id
        w = worker(server, queue, concurrency=2, shutdown_grace=1.5)
        r = Running(w, handle)
        started.wait(10)
        t0 = time.monotonic()
        summary = r.stop()
        took = time.monotonic() - t0
        assert p.get(quick).state == TaskState.COMPLETED
        s = p.get(slow)
        # Abandoned: back to pending at once, the attempt given back (max_attempts=1 would dead-letter it).
        assert s.state == TaskState.PENDING and s.attempts == 0 and s.runs[-1].outcome == "ABANDONED", s
        assert reasons == {"slow": raftq.SHUTDOWN}
        assert summary.completed == 1 and summary.abandoned == 1
        assert took < 10


def test_a_worker_process_shuts_down_gracefully_on_sigterm(server, queue):
    with producer(server) as p:
        e = p.enqueue(queue, b"sleep")
        env = dict(os.environ, RAFTQ_ADDR=server.addrs[0], RAFTQ_TOKEN=server.token, RAFTQ_QUEUE=queue)
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "sleepy_worker.py")], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"  # the handler runs
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, out
        assert "completed=1" in out
        assert p.get(e.task_id).state == TaskState.COMPLETED


def test_a_stream_the_worker_closes_itself_is_reopened_and_work_goes_on(server, queue):
    """What a NOT_LEADER or a failing node does: the worker drops its stream and opens the next one."""
    with producer(server) as p:
        w = worker(server, queue)
        with Running(w, lambda t: t.payload) as r:
            first = p.enqueue(queue, b"1").task_id
            assert p.result(first, wait=10).state == TaskState.COMPLETED
            run = w._run
            assert run is not None and run.session is not None
            run.loop.call_soon_threadsafe(run.session.fail, run.conn)
            wait_for(lambda: w.stats.reconnects == 1, what="the stream reopened")
            second = p.enqueue(queue, b"2").task_id
            assert p.result(second, wait=10).state == TaskState.COMPLETED
            summary = r.stop()
        assert summary.completed == 2 and summary.reconnects == 1


class HoldingProxy:
    """A TCP proxy to ``target`` (host:port) whose server-to-client bytes can be held back (kept, in order) between
    :meth:`hold` and :meth:`release`, which passes on all that was held in one write."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.lock = threading.Lock()
        self.held = False
        self.pending: "dict[socket.socket, bytes]" = {}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def hold(self) -> None:
        with self.lock:
            self.held = True

    def release(self) -> None:
        with self.lock:
            self.held = False
            for dst, data in self.pending.items():
                try:
                    dst.sendall(data)
                except OSError:
                    pass
            self.pending.clear()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self.pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self.pump, args=(server, client, True), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        while True:
            try:
                data = src.recv(16384)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            with self.lock:
                if holdable and self.held:
                    self.pending[dst] = self.pending.get(dst, b"") + data
                    continue
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.release()
        self.sock.close()


def test_a_slot_asks_for_its_next_task_before_its_last_outcome_is_acknowledged(server, queue):
    # The worker reaches the node through a proxy that holds back what the node sends once the first handler
    # has run: the first outcome's ack, and any task, stay with the proxy.
    proxy = HoldingProxy(server.addrs[0])
    handled = []
    with producer(server) as p:
        first = p.enqueue(queue, b"1").task_id
        second = p.enqueue(queue, b"2").task_id

        def handle(task):
            handled.append(task.id)
            if task.id == first:
                proxy.hold()
            return b"ok"

        w = raftq.Worker(addrs=[proxy.addr], token=server.token, queues=[queue], concurrency=1, batch_size=1)
        try:
            with Running(w, handle) as r:
                # The node applied the first outcome and claimed the second task for the slot's next Ready while
                # the worker had received neither: the Ready went out with the outcome, not after its ack.
                wait_for(lambda: p.get(first).state == TaskState.COMPLETED, what="the first outcome applied")
                wait_for(lambda: p.get(second).state == TaskState.IN_PROGRESS, what="the second task claimed")
                assert handled == [first]
                assert w.stats.snapshot().completed == 0, "no ack reached the worker yet"
                proxy.release()
                assert p.result(second, wait=10).state == TaskState.COMPLETED
                summary = r.stop()
        finally:
            proxy.close()
    assert handled == [first, second]
    assert (summary.claimed, summary.completed, summary.rejected, summary.unconfirmed) == (2, 2, 0, 0), summary


def test_a_task_cancelled_while_its_slot_waits_for_its_last_acks_is_not_run_untold(server, queue):
    # The second task is claimed for the slot's next Ready while the node's answers are held, then cancelled: the
    # worker reads the first ack, the second task and the end of its delivery together, in whatever order its
    # slot and its stream reader get to them. The cancelled task is not run, or its handler is told.
    proxy = HoldingProxy(server.addrs[0])
    runs = []
    with producer(server) as p:
        first = p.enqueue(queue, b"1").task_id
        second = p.enqueue(queue, b"2").task_id

        def handle(task):
            if task.id == first:
                proxy.hold()
                runs.append((task.id, False))
            else:
                runs.append((task.id, task.cancellation.wait(5)))
            return b"ok"

        w = raftq.Worker(addrs=[proxy.addr], token=server.token, queues=[queue], concurrency=1, batch_size=1)
        try:
            with Running(w, handle) as r:
                wait_for(lambda: p.get(second).state == TaskState.IN_PROGRESS, what="the second task claimed")
                assert p.cancel(second) == TaskState.CANCELLED
                proxy.release()
                wait_for(lambda: w.stats.snapshot().revoked == 1, what="the end of the delivery reached the worker")
                summary = r.stop()
        finally:
            proxy.close()
        assert p.get(second).state == TaskState.CANCELLED
    assert runs[0] == (first, False), runs
    assert len(runs) == 1 or runs[1] == (second, True), f"the cancelled task's handler was not told: {runs}"
    assert (summary.claimed, summary.revoked, summary.unconfirmed) == (2, 1, 0), summary
