"""Pure mappings, no server: tasks to the protocol, outcomes to stream events, statuses to exceptions, the
retry rule, addresses, backoff."""

import datetime

import grpc
import pytest

import raftq
from raftq import _conn, errors, worker
from raftq.types import NewTask, duration_ms
from raftq.v1 import task_pb2


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, md=()):  # type: ignore[no-untyped-def]
        self._code, self._details, self._md = code, details, md

    def code(self):  # type: ignore[no-untyped-def]
        return self._code

    def details(self):  # type: ignore[no-untyped-def]
        return self._details

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return self._md


def test_new_task_fills_every_field_of_the_request():
    at = datetime.datetime.fromtimestamp(1_700_000_000.123, tz=datetime.timezone.utc)
    req = NewTask(
        "q", "p", priority=7, delay=2, run_at=at, max_attempts=3, idempotency_key="k", concurrency_key="c",
        concurrency_limit=0, depends_on=["a" * 32], all_resolved=True, deadline=datetime.timedelta(minutes=1),
        webhook_url="http://h/x", traceparent="00-tp", tracestate="ts",
    ).to_proto()
    assert req == task_pb2.EnqueueRequest(
        queue="q", payload=b"p", priority=7, delay_ms=2000, run_at_ms=1_700_000_000_123, max_attempts=3,
        idempotency_key="k", webhook_url="http://h/x", trace=task_pb2.TraceContext(traceparent="00-tp", tracestate="ts"),
        deadline_in_ms=60_000, concurrency_key="c", concurrency_limit=1, depends_on=["a" * 32],
        dependency_rule=task_pb2.DEPENDENCY_RULE_ALL_RESOLVED,
    )
    assert not NewTask("q").to_proto().HasField("trace")
    assert duration_ms(0.0001) == 1 and duration_ms(0) == 0 and duration_ms(None) == 0
    with pytest.raises(ValueError):
        duration_ms(-1)


def test_each_outcome_maps_to_its_event_with_the_fencing_token():
    item = lambda o: worker._Item("a" * 32, 7, o)  # noqa: E731
    ev = worker._unit_event([item(raftq.Complete(b"r"))], 1, False)
    assert ev.WhichOneof("event") == "result" and ev.result.token == 7 and ev.result.completed.result == b"r"
    empty = worker._unit_event([item(raftq.Complete())], 1, False)
    assert empty.result.WhichOneof("outcome") == "completed", "an empty result is still a completion"
    ev = worker._unit_event([item(raftq.Fail("boom", retryable=False))], 2, False)
    assert ev.result.failed.error == "boom" and not ev.result.failed.retryable
    ev = worker._unit_event([item(raftq.Nack(delay=1.5, reason="later"))], 3, False)
    assert (ev.nack.delay_ms, ev.nack.reason, ev.nack.token) == (1500, "later", 7)
    ev = worker._unit_event([item(raftq.Abandon())], 4, False)
    assert ev.WhichOneof("event") == "abandon" and ev.abandon.request_id == 4
    ev = worker._unit_event([item(raftq.RunException(raftq.MALFORMED_PAYLOAD, "bad"))], 5, False)
    assert ev.exception.exception.reason == "malformed-payload"
    follow = worker._unit_event([item(raftq.Complete(b"", follow_ups=[NewTask("next", b"x")]))], 6, False)
    assert follow.result.completed.follow_ups[0].queue == "next"


def test_batches_group_results_and_send_the_others_alone():
    items = [
        worker._Item("a", 1, raftq.Complete(b"")), worker._Item("b", 1, raftq.Abandon()),
        worker._Item("c", 1, raftq.Fail("x")), worker._Item("d", 1, raftq.Nack()),
    ]
    units = worker._plan(items, True)
    assert [[i.task_id for i in u] for u in units] == [["a", "c"], ["b"], ["d"]]
    ev = worker._unit_event(units[0], 9, True)
    assert ev.WhichOneof("event") == "result_batch" and len(ev.result_batch.results) == 2
    assert len(worker._plan(items, False)) == 4


def test_handler_return_values_normalize_to_outcomes():
    assert worker.normalize(None) == raftq.Complete(b"")
    assert worker.normalize("é") == raftq.Complete("é".encode())
    assert worker.normalize(raftq.Abandon()) == raftq.Abandon()
    bad = worker.normalize(42)
    assert isinstance(bad, raftq.Fail) and "int" in bad.error


def test_statuses_map_to_exceptions_like_the_rust_sdk():
    md = (("x-raftq-reason", "NOT_LEADER"), ("x-raftq-leader", "10.0.0.2:9091"))
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "NOT_LEADER: no", md), write=True)
    assert isinstance(e, raftq.NotLeaderError) and e.leader == "10.0.0.2:9091" and e.retryable
    md = (("x-raftq-reason", "RATE_LIMITED"), ("x-raftq-retry-after-ms", "250"))
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED: slow down", md), True)
    assert isinstance(e, raftq.ResourceExhaustedError) and e.retry_after_ms == 250 and e.retryable
    # No raftq reason: for a write the outcome is unknown, for a read it is a transport error.
    reset = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert isinstance(errors.from_rpc_error(reset, write=True), raftq.UnknownOutcomeError)
    assert isinstance(errors.from_rpc_error(reset, write=False), raftq.TransportError)
    refused = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    assert isinstance(errors.from_rpc_error(refused, write=True), raftq.TransportError), "never sent"
    unimpl = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNIMPLEMENTED, "no method"), write=True)
    assert unimpl.reason == "UNIMPLEMENTED" and not unimpl.retryable


def test_writes_retry_only_what_was_certainly_not_applied():
    step = _conn.next_step
    unknown = raftq.UnknownOutcomeError("t")
    unavailable = errors.from_reason("UNAVAILABLE", "raft stopped")
    assert step(True, unknown) == _conn.Step.STOP and step(False, unknown) == _conn.Step.LATER
    assert step(True, unavailable) == _conn.Step.STOP and step(False, unavailable) == _conn.Step.LATER
    assert step(True, raftq.TransportError("refused")) == _conn.Step.LATER
    assert step(True, errors.from_reason("NOT_LEADER", "", leader="a:1")) == _conn.Step.NOW
    assert step(True, errors.from_reason("NOT_LEADER", "")) == _conn.Step.LATER
    assert step(False, errors.from_reason("NOT_FOUND", "")) == _conn.Step.STOP
    for overload in ("QUEUE_FULL", "RATE_LIMITED", "TOO_MANY_STREAMS"):
        assert step(True, errors.from_reason(overload, "")) == _conn.Step.LATER, overload
    assert step(True, errors.from_reason("NOT_FOUND", "")) == _conn.Step.STOP


def test_addresses_are_normalized_and_bad_ones_named():
    assert _conn.parse_addr("127.0.0.1:9091", False).uri == "http://127.0.0.1:9091"
    assert _conn.parse_addr("127.0.0.1:9091", True).uri == "https://127.0.0.1:9091"
    assert _conn.parse_addr(" http://node-2:9091/ ", False).hostport == "node-2:9091"
    for bad in ("", "ftp://x:1", "nohost", "a b:1", "x:port"):
        with pytest.raises(ValueError):
            _conn.parse_addr(bad, False)


def test_redirects_follow_a_named_leader_once_and_skip_one_that_cannot_be_reached():
    a = _conn._Addresses(["127.0.0.1:1", "127.0.0.1:2"], None, None, None, 1.0)
    a.redirect("http://127.0.0.1:1", "127.0.0.1:3")
    cands, named, _ = a.candidates()
    assert named is not None and [c.uri for c in cands][0] == "http://127.0.0.1:3"
    a.connect_failed(named, named)
    assert a.candidates()[1] is None, "the hint is used once"
    a.redirect("http://127.0.0.1:1", "127.0.0.1:3")
    cands, named, _ = a.candidates()
    assert named is None and cands[0].uri == "http://127.0.0.1:2", "a leader that failed is not followed again"


def test_backoff_doubles_within_jitter_up_to_its_max():
    b = _conn.Backoff(0.1, 1.0)
    step = 0.1
    for _ in range(8):
        d = b.next_delay()
        assert step / 2 <= d <= step
        step = min(step * 2, 1.0)
    b.reset()
    assert b.next_delay() <= 0.1


def test_cancellation_is_set_once_and_wakes_threads_and_coroutines():
    import asyncio
    import threading

    c = worker.Cancellation()
    assert not c.is_set() and not c.wait(0.01)

    async def waiter():
        return await c.wait_async()

    async def main():
        t = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.01)
        threading.Thread(target=lambda: c.set(raftq.CANCELLED)).start()
        return await asyncio.wait_for(t, 5)

    assert asyncio.run(main()) == raftq.CANCELLED
    assert not c.set(raftq.SHUTDOWN) and c.reason == raftq.CANCELLED
    with pytest.raises(raftq.TaskCancelled):
        c.raise_if_set()
