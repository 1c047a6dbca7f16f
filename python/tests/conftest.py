"""Fixtures: real ``raftq serve`` processes (see servers.py) and small helpers shared by the tests."""

import os
import time
from typing import Iterator, Optional

import pytest

from servers import Cluster, NoBinary, mint, raftq_bin  # noqa: F401 - re-exported for the tests


@pytest.fixture(scope="session", autouse=True)
def _binary() -> None:
    try:
        raftq_bin()
    except NoBinary as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def server() -> Iterator[Cluster]:
    """One node shared by the tests that do not kill it (each test uses its own queues)."""
    c = Cluster(1).start()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cluster3() -> Iterator[Cluster]:
    c = Cluster(3).start()
    c.wait_leader()
    try:
        yield c
    finally:
        c.close()


_queue_seq = 0


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name of this test's own."""
    global _queue_seq
    _queue_seq += 1
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"q{_queue_seq}-{name}-{os.getpid()}"


def wait_for(cond, limit: float = 20, what: str = "condition", every: float = 0.05):  # type: ignore[no-untyped-def]
    """Polls ``cond`` until it returns something truthy; fails after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what} not reached within {limit}s"
        time.sleep(every)


class Running:
    """A worker running ``handler`` in a background thread (its own event loop) until :meth:`stop`."""

    def __init__(self, worker, handler) -> None:  # type: ignore[no-untyped-def]
        import threading

        self.worker = worker
        self.summary = None
        self.error: Optional[BaseException] = None

        def main() -> None:
            try:
                self.summary = worker.run(handler, install_signal_handlers=False)
            except BaseException as e:  # noqa: BLE001 - reported by stop()
                self.error = e

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()

    def stop(self, limit: float = 60):  # type: ignore[no-untyped-def]
        self.worker.stop()
        self.thread.join(limit)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        return self.summary

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.worker.stop()
        self.thread.join(60)


def producer(server: Cluster, **kw):  # type: ignore[no-untyped-def]
    """A producer of ``server``'s default tenant."""
    import raftq

    kw.setdefault("retry_backoff_min", 0.05)
    return raftq.Producer(addrs=server.addrs, token=server.token, **kw)


def worker(server: Cluster, queue: str, **kw):  # type: ignore[no-untyped-def]
    """A worker of ``server``'s default tenant on ``queue``."""
    import raftq

    kw.setdefault("reconnect_backoff_min", 0.05)
    return raftq.Worker(addrs=server.addrs, token=server.token, queues=[queue], **kw)
