"""The full lifecycle through the SDK against a real node: enqueue with options, work, read the result; the
same with asyncio; retries to the dead-letter queue; idempotency; batches; queue operations."""

import asyncio
import threading
import time

import pytest

import raftq
from raftq import Complete, Fail, NewTask, TaskState

from conftest import Running, producer, wait_for, worker




def test_sync_worker_completes_a_task_and_the_producer_reads_its_result(server, queue):
    seen = []

    def handle(task):
        seen.append((task.id, task.payload, task.attempts, task.fencing_token, task.lease.worker_id))
        return task.payload.upper()

    with producer(server) as p:
        e = p.enqueue(queue, b"hello", priority=7, max_attempts=3, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
        t = p.get(e.task_id)
        assert (t.state, t.priority, t.max_attempts, t.queue) == (TaskState.PENDING, 7, 3, queue)
        assert t.trace is not None and t.trace.traceparent.startswith("00-aaaa")
        w = worker(server, queue, worker_id="py-lifecycle")
        with Running(w, handle) as r:
            res = p.result(e.task_id, wait=20)
            assert res.done and res.state == TaskState.COMPLETED and res.result == b"HELLO"
            summary = r.stop()
        assert summary.completed == 1 and summary.rejected == 0 and summary.claimed == 1
        (tid, payload, attempts, token, holder) = seen[0]
        assert (tid, payload, attempts, holder) == (e.task_id, b"hello", 1, "py-lifecycle")
        done = p.get(e.task_id)
        assert done.state == TaskState.COMPLETED and done.lease is None
        assert [(r.token, r.outcome) for r in done.runs] == [(token, "COMPLETED")]


def test_async_worker_and_async_producer(server, queue):
    async def handle(task):
        await asyncio.sleep(0.01)
        return Complete(b"async:" + task.payload)

    async def main():
        async with raftq.AsyncProducer(addrs=server.addrs, token=server.token) as p:
            results = await p.enqueue_batch([NewTask(queue, f"t{i}") for i in range(20)])
            ids = [r.task_id for r in results]
            w = worker(server, queue, concurrency=4)
            run = asyncio.ensure_future(w.run_async(handle))
            outs = await asyncio.gather(*(p.result(i, wait=20) for i in ids))
            w.stop()
            summary = await run
            return outs, summary

    outs, summary = asyncio.run(main())
    assert sorted(o.result for o in outs) == sorted(f"async:t{i}".encode() for i in range(20))
    assert all(o.state == TaskState.COMPLETED for o in outs)
    assert summary.completed == 20


def test_batches_of_tasks_per_ready_each_ack_checked(server, queue):
    with producer(server) as p:
        ids = [r.task_id for r in p.enqueue_batch([NewTask(queue, str(i)) for i in range(30)])]
        w = worker(server, queue, batch_size=8, concurrency=2)
        with Running(w, lambda t: Fail("odd", retryable=False) if int(t.text) % 2 else t.payload) as r:
            outs = [p.result(i, wait=20) for i in ids]
            summary = r.stop()
    assert [o.state for o in outs] == [TaskState.FAILED if i % 2 else TaskState.COMPLETED for i in range(30)]
    assert summary.completed == 15 and summary.failed == 15 and summary.rejected == 0


def test_retryable_failures_are_retried_until_the_task_is_dead_lettered_then_redriven_and_purged(server, queue):
    attempts = []

    def handle(task):
        attempts.append(task.attempts)
        raise RuntimeError("downstream is down")

    with producer(server) as p:
        e = p.enqueue(queue, b"x", max_attempts=3)
        with Running(worker(server, queue), handle):
            wait_for(lambda: p.get(e.task_id).state == TaskState.DEAD_LETTERED, what="dead-lettered")
        assert attempts == [1, 2, 3]
        t = p.get(e.task_id)
        assert "RuntimeError: downstream is down" in t.last_error
        assert [r.outcome for r in t.runs] == ["RETRIED", "RETRIED", "RETRIED"]
        assert [d.id for d in p.dead_letters(queue)] == [e.task_id]
        assert p.queue_stats([queue])[0].dead_lettered == 1
        assert p.redrive(queue, ids=[e.task_id]) == [e.task_id]
        assert p.get(e.task_id).state == TaskState.PENDING
        # Fail it for good three times again, then purge it.
        with Running(worker(server, queue), lambda t: Fail("again", retryable=True)):
            wait_for(lambda: p.get(e.task_id).state == TaskState.DEAD_LETTERED, what="dead-lettered again")
        assert p.purge_dead_letters(queue, all=True) == [e.task_id]
        with pytest.raises(raftq.NotFoundError) as err:
            p.get(e.task_id)
        assert err.value.reason == "NOT_FOUND" and not err.value.retryable


def test_non_retryable_failure_nack_abandon_and_exception_outcomes(server, queue):
    outcome_by_payload = {
        "fail": Fail("bad input", retryable=False),
        "exc": raftq.RunException(raftq.MALFORMED_PAYLOAD, "not json"),
    }
    calls = {}

    def handle(task):
        calls[task.text] = calls.get(task.text, 0) + 1
        if task.text == "nack" and task.attempts == 1:
            return raftq.Nack(delay=0.2, reason="later")
        if task.text == "abandon" and calls["abandon"] == 1:
            return raftq.Abandon()
        return outcome_by_payload.get(task.text, b"ok")

    with producer(server) as p:
        ids = {k: p.enqueue(queue, k, max_attempts=5).task_id for k in ("fail", "exc", "nack", "abandon")}
        with Running(worker(server, queue), handle):
            results = {k: p.result(i, wait=20) for k, i in ids.items()}
        assert results["fail"].state == TaskState.FAILED and results["fail"].error == "bad input"
        assert results["exc"].state == TaskState.FAILED
        assert p.get(ids["exc"]).runs[-1].reason == raftq.MALFORMED_PAYLOAD
        assert results["nack"].state == TaskState.COMPLETED and results["nack"].attempts == 2
        # Abandon gives the attempt back.
        assert results["abandon"].state == TaskState.COMPLETED and results["abandon"].attempts == 1
        assert calls["abandon"] == 2


def test_idempotency_key_returns_the_original_task(server, queue):
    with producer(server) as p:
        a = p.enqueue(queue, b"1", idempotency_key="order-42")
        b = p.enqueue(queue, b"2", idempotency_key="order-42")
        c = p.enqueue(queue, b"3", idempotency_key="order-43")
        assert (a.duplicate, b.duplicate, c.duplicate) == (False, True, False)
        assert b.task_id == a.task_id and c.task_id != a.task_id
        assert p.get(a.task_id).payload == b"1"
        batch = p.enqueue_batch([NewTask(queue, "x", idempotency_key="order-42"), NewTask(queue, "y")])
        assert batch[0].task_id == a.task_id and batch[0].duplicate


def test_debounce_and_singleton_keys(server, queue):
    with producer(server) as p:
        # Cluster version 3 comes a moment after the node starts.
        def first_debounce():  # type: ignore[no-untyped-def]
            try:
                return p.enqueue(queue, b"1", debounce_key="doc", debounce_delay=60, debounce_max_wait=120)
            except raftq.ServerError as e:
                assert e.reason == "FEATURE_NOT_ACTIVE", e
                return None

        a = wait_for(first_debounce, what="cluster version 3")
        b = p.enqueue(queue, b"2", debounce_key="doc", debounce_delay=60)
        assert (a.duplicate, a.debounced, b.duplicate, b.debounced) == (False, False, True, True)
        assert b.task_id == a.task_id and p.get(a.task_id).payload == b"2"
        s = p.enqueue(queue, b"s", singleton_key="nightly")
        with pytest.raises(raftq.ConflictError) as refused:
            p.enqueue(queue, b"s2", singleton_key="nightly")
        assert refused.value.reason == "SINGLETON_ACTIVE" and not refused.value.retryable
        assert s.task_id in refused.value.message
        skipped = p.enqueue(queue, b"s3", singleton_key="nightly", singleton_skip=True)
        assert (skipped.task_id, skipped.duplicate) == (s.task_id, True)
        p.cancel(s.task_id)
        assert p.enqueue(queue, b"s4", singleton_key="nightly").task_id != s.task_id


def test_enqueue_batch_items_succeed_or_fail_one_by_one(server, queue):
    with producer(server) as p:
        out = p.enqueue_batch([NewTask(queue, "ok"), NewTask(queue, "bad", priority=12), NewTask("-bad", "x")])
        assert isinstance(out[0], raftq.Enqueued)
        assert isinstance(out[1], raftq.InvalidArgumentError) and out[1].reason == "INVALID_ARGUMENT"
        assert "priority" in out[1].message
        assert isinstance(out[2], raftq.InvalidArgumentError)
        assert p.enqueue_batch([]) == []


def test_delay_deadline_dependencies_and_concurrency_options_reach_the_server(server, queue):
    with producer(server) as p:
        parent = p.enqueue(queue, b"p")
        child = p.enqueue(
            queue, b"c", depends_on=[parent.task_id], all_resolved=True, deadline=60, concurrency_key="k",
            concurrency_limit=2, delay=0.5, webhook_url="http://127.0.0.1:1/hook",
        )
        t = p.get(child.task_id)
        assert t.depends_on == [parent.task_id] and t.all_resolved and t.waiting_on == [parent.task_id]
        assert t.concurrency_key == "k" and t.concurrency_limit == 2
        # The server stamps the deadline and visible time from its clock at the enqueue (a ms apart at most).
        assert abs(t.deadline_ms - t.created_at_ms - 60_000) <= 50
        assert abs(t.visible_at_ms - t.created_at_ms - 500) <= 50
        assert t.webhook_url == "http://127.0.0.1:1/hook"
        at = p.enqueue(queue, b"later", run_at=time.time() + 3600)
        assert p.get(at.task_id).visible_at_ms > t.created_at_ms + 3_000_000
        assert p.cancel(at.task_id) == TaskState.CANCELLED
        with pytest.raises(raftq.ConflictError) as err:
            p.cancel(at.task_id)
        assert err.value.reason == "ALREADY_ENDED"


def test_pause_resume_listing_capacity_and_schedules(server, queue):
    with producer(server) as p:
        assert p.pause_queue(queue) is True
        assert queue in p.paused_queues()
        e = p.enqueue(queue, b"held")
        got = threading.Event()
        with Running(worker(server, queue), lambda t: got.set()):
            assert not got.wait(0.5), "a paused queue serves no claims"
            assert p.resume_queue(queue) is False
            assert got.wait(10)
            assert p.result(e.task_id, wait=10).state == TaskState.COMPLETED
        page = p.list_tasks(queue=queue, state=TaskState.COMPLETED)
        assert [t.id for t in page.tasks] == [e.task_id] and page.next_page_token is None
        cap = p.capacity([queue])[0]
        assert cap.queue == queue and cap.completed[0] >= 1
        s = p.create_schedule("py-every", NewTask(queue, b"tick"), every=3600)
        assert s.interval_ms == 3_600_000 and not s.paused
        assert s.id in [x.id for x in p.schedules()]
        assert p.pause_schedule(s.id).paused and not p.resume_schedule(s.id).paused
        p.delete_schedule(s.id)
        assert s.id not in [x.id for x in p.schedules()]


def test_a_depth_limit_refuses_with_queue_full_and_the_sdk_backs_off_until_there_is_room(server, queue):
    with producer(server, max_retries=10) as p:
        # The limits need cluster version 2, which a fresh node raises within a second of starting.
        wait_for(lambda: _try(lambda: p.set_queue_limits(queue, max_depth=1)), limit=10, what="cluster version 2")
        assert {"queue": queue, "max_running": None, "max_depth": 1} in p.queue_limits()
        first = p.enqueue(queue, b"first")
        with producer(server, max_retries=0) as quick:
            with pytest.raises(raftq.errors.ServerError) as e:
                quick.enqueue(queue, b"refused")
            assert e.value.reason == "QUEUE_FULL" and e.value.retryable
        got = threading.Event()
        with Running(worker(server, queue), lambda t: got.set()):
            # Refused until the worker takes the first task; the SDK retries after its backoff and gets in.
            second = p.enqueue(queue, b"second")
            assert got.wait(10)
            assert p.result(second.task_id, wait=10).state == TaskState.COMPLETED
        assert p.result(first.task_id, wait=10).state == TaskState.COMPLETED
        p.set_queue_limits(queue)
        assert all(l["queue"] != queue for l in p.queue_limits())


def test_a_rate_limited_key_is_held_to_its_bucket_while_a_weighted_key_is_served(server, queue):
    done = {"slow": 0, "fast": 0}
    lock = threading.Lock()

    def handle(task):  # type: ignore[no-untyped-def]
        with lock:
            done[task.payload.decode()] += 1

    with producer(server) as p:
        # Weights and buckets need cluster version 2, which a fresh node raises within a second of starting.
        wait_for(lambda: _try(lambda: p.set_fairness_weight(queue, "fast", 3)), limit=10, what="cluster version 2")
        bucket = p.set_rate_limit(queue, per_second=0.1, burst=1, key="slow")
        assert (bucket["key"], bucket["per_second"], bucket["burst"]) == ("slow", 0.1, 1)
        for key in ("slow", "fast"):
            p.enqueue_batch([NewTask(queue, key.encode(), concurrency_key=key, concurrency_limit=100)] * 6)
        keys = {k["key"]: k for k in p.fairness(queue)}
        assert (keys["fast"]["weight"], keys["fast"]["ready"], keys["slow"]["weight"], keys["slow"]["ready"]) == (3, 6, 1, 6)
        assert [(b["key"], b["burst"]) for b in p.rate_limits(queue)] == [("slow", 1)]
        started = time.monotonic()
        with Running(worker(server, queue), handle):
            wait_for(lambda: done["fast"] == 6, limit=20, what="the fast key drained")
            elapsed = time.monotonic() - started
            # One token to start with, then one per 10 s: the slow key cannot have run more, however slow this
            # machine was; the rest of its tasks wait, reported as throttled.
            with lock:
                slow = done["slow"]
            assert slow <= 1 + int(elapsed * 0.1) + 1, (slow, elapsed)
            throttled = {k["key"]: k for k in p.fairness(queue)}["slow"]
            assert throttled["throttled"] and throttled["ready"] == 6 - slow
            # Removing the bucket lets the key's tasks run at once.
            p.set_rate_limit(queue, per_second=0, key="slow")
            wait_for(lambda: done["slow"] == 6, limit=20, what="the slow key drained once unlimited")
        assert p.rate_limits(queue) == []
        p.set_fairness_weight(queue, "fast", 1)
        assert all(k["key"] != "fast" for k in p.fairness(queue))


def _try(call):  # type: ignore[no-untyped-def]
    """Makes the call; False while the cluster does not run the version it needs yet."""
    try:
        call()
        return True
    except raftq.errors.ServerError as e:
        if e.reason == "FEATURE_NOT_ACTIVE":
            return False
        raise


def test_a_concurrency_override_is_set_listed_and_cleared(server, queue):
    key = queue + "-key"
    with producer(server) as p:
        # Overrides need cluster version 3, which a fresh node raises within a second of starting.
        wait_for(lambda: _try_set_override(p, key), limit=10, what="cluster version 3")
        p.enqueue(queue, b"a", concurrency_key=key, concurrency_limit=1)
        rows = p.concurrency_overrides(key)
        assert [(r["key"], r["limit"], r["expires_at_ms"], r["pending"]) for r in rows] == [(key, 4, None, 1)]
        timed = p.set_concurrency_override(key, 2, ttl_s=3600)
        assert timed["limit"] == 2 and timed["expires_at_ms"] > 0
        with pytest.raises(raftq.errors.ServerError) as e:
            p.set_concurrency_override(key, 0)
        assert e.value.reason == "INVALID_ARGUMENT" and not e.value.retryable
        assert p.clear_concurrency_override(key) and not p.clear_concurrency_override(key)
        assert all(r["key"] != key for r in p.concurrency_overrides())


def _try_set_override(p, key):  # type: ignore[no-untyped-def]
    try:
        return p.set_concurrency_override(key, 4)["limit"] == 4
    except raftq.errors.ServerError as e:
        if e.reason == "FEATURE_NOT_ACTIVE":
            return False
        raise
