"""The committed protocol modules (src/raftq/v1) are what the protos generate: regenerated with the pinned
grpcio-tools and compared byte for byte. The generator runs in ``$RAFTQ_PROTOC_PYTHON`` (an interpreter with
grpcio-tools 1.62.3; python/ci.sh makes one), else in this interpreter."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gen_protos  # noqa: E402

from raftq.v1 import stream_pb2, task_pb2  # noqa: E402


def test_generated_modules_match_the_protos():
    python = os.environ.get("RAFTQ_PROTOC_PYTHON", sys.executable)
    if python == sys.executable and importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("no grpcio-tools: set RAFTQ_PROTOC_PYTHON (python/ci.sh does)")
    assert gen_protos.stale(python) == [], "run python/gen_protos.py and commit the result"


def test_every_rpc_the_sdk_calls_exists_in_the_protocol():
    from raftq import _ops, _session

    methods = set()
    for mod in (task_pb2, stream_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            methods |= {f"/raftq.v1.{svc.name}/{m.name}" for m in svc.methods}
    from raftq.v1 import jobs_pb2

    methods |= {f"/raftq.v1.Jobs/{m.name}" for m in jobs_pb2.DESCRIPTOR.services_by_name["Jobs"].methods}
    used = {v.path for v in _all_ops(_ops)} | {_session.WORKER_STREAM}
    assert used <= methods, used - methods


def _all_ops(ops):  # type: ignore[no-untyped-def]
    from raftq import NewTask

    t = NewTask("q")
    return [
        ops.enqueue(t), ops.enqueue_batch([t]), ops.get("x"), ops.result("x", 1), ops.cancel("x"),
        ops.dead_letters("q", 1), ops.redrive("q", None, True), ops.purge_dead_letters("q", ["x"], False),
        ops.queue_stats([]), ops.report_progress("x", 1, 1, ""), ops.pause_queue("q"), ops.resume_queue("q"),
        ops.paused_queues(), ops.list_tasks(None, None, None, None, 0, None), ops.capacity([]),
        ops.create_schedule("n", t, None, "", 60, False), ops.schedules(), ops.pause_schedule("x", True),
        ops.pause_schedule("x", False), ops.delete_schedule("x"), ops.set_limits("q", 1, None), ops.queue_limits(),
        ops.set_rate_limit("q", "k", 0.5, None), ops.set_rate_limit("q", None, 20, 5), ops.rate_limits(None),
        ops.set_fairness_weight("q", "k", 3), ops.fairness(None),
        ops.set_concurrency_override("k", 3, None, None), ops.set_concurrency_override("k", 3, 60, None),
        ops.set_concurrency_override("k", 3, None, "2030-01-01T00:00:00Z"), ops.clear_concurrency_override("k"),
        ops.concurrency_overrides(None),
    ]
