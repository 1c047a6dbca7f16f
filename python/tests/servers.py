"""Real ``raftq serve`` processes for the tests and the benchmark: each node has its own temp data directory,
ephemeral ports on 127.0.0.1, a config file, and authentication on (an HS256 secret file; tokens minted with
``raftq token issue``). The server binary is ``$RAFTQ_BIN``, else the workspace's ``target/debug/raftq``.
"""

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import grpc

from raftq.v1 import admin_pb2, task_pb2


class NoBinary(Exception):
    """No raftq binary to run."""


REPO = Path(__file__).resolve().parents[2]
SECRET = b"python-sdk-tests-secret-0123456789abcdef"
# Quick elections without flapping on a loaded 2-core machine, fast retries (tests/it/procs.rs uses the same).
FAST = (
    "heartbeat_interval_ms = 100\nelection_timeout_min_ms = 500\nelection_timeout_max_ms = 1000\n"
    "retry_base_ms = 50\nretry_max_ms = 400\n"
)


def raftq_bin() -> Path:
    env = os.environ.get("RAFTQ_BIN")
    if env:
        return Path(env)
    for p in (REPO / "target" / "debug" / "raftq", REPO / "target" / "release" / "raftq"):
        if p.exists():
            return p
    raise NoBinary("no raftq binary: build it (cargo build) or set RAFTQ_BIN")


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now and that this run has not handed out before: the kernel can give a port
    just closed again at once, and two nodes of one cluster would then collide."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def mint(secret_file: Path, tenant: str = "default", scopes: str = "enqueue,work,read,admin", ttl: str = "1h") -> str:
    """A token from ``raftq token issue``, as an operator would mint it."""
    out = subprocess.run(
        [str(raftq_bin()), "token", "issue", "--secret-file", str(secret_file), "--tenant", tenant,
         "--scopes", scopes, "--ttl", ttl],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def channel(addr: str, ca: Optional[bytes]) -> grpc.Channel:
    """A channel to a node: TLS verified with ``ca`` when given."""
    if ca is None:
        return grpc.insecure_channel(addr)
    return grpc.secure_channel(addr, grpc.ssl_channel_credentials(ca))


class Node:
    #: The CA the node's certificate is verified with, when it serves TLS.
    ca: Optional[bytes] = None

    def __init__(self, root: Path, node_id: int, extra: str, ports: Optional[List[int]] = None) -> None:
        self.id = node_id
        g, r, h = ports or [free_port(), free_port(), free_port()]
        self.grpc, self.raft, self.http = f"127.0.0.1:{g}", f"127.0.0.1:{r}", f"127.0.0.1:{h}"
        self.dir = root / f"data{node_id}"
        self.config = root / f"node{node_id}.toml"
        self.log = root / f"node{node_id}.log"
        self.extra = extra
        self.proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]

    def write_config(self, peers: str = "") -> None:
        self.config.write_text(
            f"node_id = {self.id}\ndata_dir = {str(self.dir)!r}\ngrpc_addr = {self.grpc!r}\n"
            f"raft_addr = {self.raft!r}\nhttp_addr = {self.http!r}\nauth = \"jwt\"\n"
            f"{self.extra}\n{peers}\n"
        )

    def start(self) -> None:
        assert self.proc is None, f"node {self.id} already runs"
        env = dict(os.environ, RAFTQ_LOG=os.environ.get("RAFTQ_TEST_LOG", "error"))
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(raftq_bin()), "serve", "--config", str(self.config)], stdout=log, stderr=log, env=env
        )
        log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def terminate(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def status(self, token: str) -> Optional[admin_pb2.NodeStatus]:
        """The node's own view, or None when it does not answer."""
        with channel(self.grpc, self.ca) as ch:
            call = ch.unary_unary(
                "/raftq.v1.Admin/Status",
                request_serializer=admin_pb2.NodeStatusRequest.SerializeToString,
                response_deserializer=admin_pb2.NodeStatus.FromString,
            )
            try:
                return call(admin_pb2.NodeStatusRequest(), timeout=2, metadata=[("authorization", f"Bearer {token}")])
            except grpc.RpcError:
                return None

    def wait_ready(self, token: str, limit: float = 30) -> None:
        """Until the node serves reads (a read of an unknown task answers NOT_FOUND)."""
        deadline = time.monotonic() + limit
        while True:
            with channel(self.grpc, self.ca) as ch:
                call = ch.unary_unary(
                    "/raftq.v1.TaskService/GetTask",
                    request_serializer=task_pb2.GetTaskRequest.SerializeToString,
                    response_deserializer=task_pb2.Task.FromString,
                )
                try:
                    call(task_pb2.GetTaskRequest(id="0" * 32), timeout=2,
                         metadata=[("authorization", f"Bearer {token}")])
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.NOT_FOUND:
                        return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node {self.id} exited: {self.log.read_text()[-2000:]}")
            assert time.monotonic() < deadline, f"node {self.id} did not become ready"
            time.sleep(0.05)


class Cluster:
    """``n`` nodes listing each other as peers (node 1 initialises the cluster), sharing one token secret."""

    def __init__(self, n: int, extra: str = "", binary: Optional[Path] = None, ca: Optional[bytes] = None) -> None:
        """``ca``: the nodes serve TLS (``extra`` configures the certificate), verified with this CA."""
        if binary is not None:
            os.environ["RAFTQ_BIN"] = str(binary)
        self._dir = tempfile.TemporaryDirectory(prefix="raftq-py-")
        self.root = Path(self._dir.name)
        self.secret_file = self.root / "secret.hs256"
        self.secret_file.write_bytes(SECRET)
        self.secret_file.chmod(0o600)
        common = f"{FAST}auth_hs256_secret_file = {str(self.secret_file)!r}\n{extra}"
        self.nodes = [Node(self.root, i + 1, common) for i in range(n)]
        for x in self.nodes:
            x.ca = ca
        peers = ""
        if n > 1:
            entries = ", ".join(f"{{ id = {x.id}, raft_addr = {x.raft!r}, api_addr = {x.grpc!r} }}" for x in self.nodes)
            peers = f"peers = [{entries}]"
        for x in self.nodes:
            x.write_config(peers)
        self.token = mint(self.secret_file)

    def start(self) -> "Cluster":
        for x in self.nodes:
            x.start()
        for x in self.nodes:
            x.wait_ready(self.token)
        return self

    @property
    def addrs(self) -> List[str]:
        return [x.grpc for x in self.nodes]

    def node(self, node_id: int) -> Node:
        return next(x for x in self.nodes if x.id == node_id)

    def leader(self) -> Optional[int]:
        for x in self.nodes:
            if x.running:
                s = x.status(self.token)
                if s is not None and s.role == "LEADER":
                    return int(s.node_id)
        return None

    def wait_leader(self, limit: float = 30) -> int:
        deadline = time.monotonic() + limit
        while True:
            leader = self.leader()
            if leader is not None:
                return leader
            assert time.monotonic() < deadline, f"no leader within {limit}s"
            time.sleep(0.1)

    def mint(self, **kw: str) -> str:
        return mint(self.secret_file, **kw)

    def close(self) -> None:
        for x in self.nodes:
            x.kill9()
        self._dir.cleanup()
