"""Bad input and refused credentials come back as exceptions carrying the server's reason code."""

import pytest

import raftq
from raftq import NewTask, Producer, Worker


def test_bad_input_raises_the_servers_reason(server, queue):
    with Producer(addrs=server.addrs, token=server.token) as p:
        with pytest.raises(raftq.InvalidArgumentError) as e:
            p.enqueue(queue, b"x", priority=12)
        assert e.value.reason == "INVALID_ARGUMENT" and not e.value.retryable
        assert "priority" in e.value.message and e.value.code == "INVALID_ARGUMENT"
        with pytest.raises(raftq.InvalidArgumentError, match="queue name"):
            p.enqueue("has space", b"x")
        with pytest.raises(raftq.InvalidArgumentError, match="32 hex"):
            p.get("not-an-id")
        with pytest.raises(raftq.InvalidArgumentError):
            p.enqueue(queue, b"x" * (2 * 1024 * 1024))  # over max_payload_bytes
        with pytest.raises(raftq.NotFoundError) as nf:
            p.get("0" * 32)
        assert nf.value.reason == "NOT_FOUND"
        with pytest.raises(raftq.InvalidArgumentError):
            p.create_schedule("bad", NewTask(queue), cron="not a cron")
        with pytest.raises(ValueError):
            p.redrive(queue)  # neither ids nor all


def test_missing_wrong_and_insufficient_tokens_are_refused_with_their_reason(server, queue):
    with Producer(addrs=server.addrs) as p:
        with pytest.raises(raftq.AuthenticationError) as e:
            p.enqueue(queue, b"x")
        assert e.value.reason == "TOKEN_MISSING"
    with Producer(addrs=server.addrs, token="not.a.jwt") as p:
        with pytest.raises(raftq.AuthenticationError) as e:
            p.enqueue(queue, b"x")
        assert e.value.reason == "TOKEN_INVALID"
    with Producer(addrs=server.addrs, token=server.mint(scopes="enqueue")) as p:
        p.enqueue(queue, b"x")
        with pytest.raises(raftq.PermissionDeniedError) as e:
            p.get("0" * 32)
        assert e.value.reason == "SCOPE_REQUIRED"
    with Producer(addrs=server.addrs, token=mint_queue(server, "only.*")) as p:
        with pytest.raises(raftq.PermissionDeniedError) as e:
            p.enqueue(queue, b"x")
        assert e.value.reason == "QUEUE_NOT_ALLOWED"
        p.enqueue("only.mine", b"x")


def mint_queue(server, pattern: str) -> str:  # type: ignore[no-untyped-def]
    import subprocess

    from conftest import raftq_bin

    return subprocess.run(
        [str(raftq_bin()), "token", "issue", "--secret-file", str(server.secret_file), "--queue", pattern],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def test_a_worker_whose_stream_the_server_refuses_ends_its_run_with_that_reason(server, queue):
    w = Worker(addrs=server.addrs, token=server.mint(scopes="read"), queues=[queue])
    with pytest.raises(raftq.PermissionDeniedError) as e:
        w.run(lambda t: b"", install_signal_handlers=False)
    assert e.value.reason == "SCOPE_REQUIRED"
    w = Worker(addrs=server.addrs, token="garbage", queues=[queue])
    with pytest.raises(raftq.AuthenticationError):
        w.run(lambda t: b"", install_signal_handlers=False)


def test_a_ready_the_server_refuses_ends_the_run(server):
    # A lease below the server's minimum (1 s) passes the SDK's check and is refused by the server.
    w = Worker(addrs=server.addrs, token=server.token, queues=["q"], lease=0.2, heartbeat=0)
    with pytest.raises(raftq.InvalidArgumentError, match="lease"):
        w.run(lambda t: b"", install_signal_handlers=False)


def test_nothing_listening_is_a_retryable_transport_error():
    with Producer(addrs=["127.0.0.1:1"], connect_timeout=0.3, max_retries=1, retry_backoff_min=0.01) as p:
        with pytest.raises(raftq.TransportError) as e:
            p.enqueue("q", b"x")
        assert e.value.retryable and e.value.reason is None


def test_invalid_configuration_lists_every_problem():
    with pytest.raises(raftq.ConfigError) as e:
        Worker(addrs=["ftp://x:1", ""], queues=["ok", "-bad"], concurrency=0, batch_size=0, lease=3, heartbeat=10,
               worker_id="")
    assert len(e.value.problems) == 7, e.value.problems
    with pytest.raises(raftq.ConfigError) as e:
        Producer(addrs=[], connect_timeout=0, retry_backoff_min=5, retry_backoff_max=1)
    assert len(e.value.problems) == 3, e.value.problems
    with pytest.raises(raftq.ConfigError):
        Worker(queues="emails")  # a string, not a list
    assert "secret" not in repr(raftq.WorkerConfig(queues=["q"], token="secret"))


def test_tls_with_the_servers_ca_and_a_plain_client_refused(queue):
    from pathlib import Path

    from conftest import Running
    from servers import Cluster

    keys = Path(__file__).resolve().parents[2] / "tests" / "it" / "keys"
    ca = (keys / "tls-ca.pem").read_bytes()
    extra = f"tls_cert_file = {str(keys / 'tls-node.pem')!r}\ntls_key_file = {str(keys / 'tls-node.key')!r}\n"
    c = Cluster(1, extra=extra, ca=ca).start()
    try:
        port = c.nodes[0].grpc.rsplit(":", 1)[1]
        addrs = [f"localhost:{port}"]  # bare host:port with a CA: TLS
        with Producer(addrs=addrs, token=c.token, tls_ca_pem=ca) as p:
            e = p.enqueue(queue, b"over tls")
            with Running(Worker(addrs=addrs, token=c.token, tls_ca_pem=ca, queues=[queue]), lambda t: t.payload):
                assert p.result(e.task_id, wait=20).result == b"over tls"
        with Producer(addrs=[f"http://localhost:{port}"], token=c.token, connect_timeout=1, max_retries=0) as plain:
            with pytest.raises(raftq.TransportError):
                plain.get(e.task_id)
        with pytest.raises(raftq.ConfigError):
            Producer(addrs=addrs, tls_ca_pem=b"not a certificate")
    finally:
        c.close()
