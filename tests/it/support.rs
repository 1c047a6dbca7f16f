//! Test harness: an in-process node on ephemeral ports, a gRPC client, and helpers for real processes.

use std::path::Path;
use std::time::{Duration, Instant};

use raftq::config::Config;
use raftq::node::{Listeners, Node};
use raftq_proto::v1 as pb;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub type Client = TaskServiceClient<Channel>;

/// A one-node cluster in this process. Stops on `stop()`; its data directory outlives it for restarts.
pub struct TestNode {
    pub node: Option<Node>,
    pub cfg: Config,
    _tmp: Option<tempfile::TempDir>,
}

pub fn test_config(dir: &Path) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        grpc_addr: "127.0.0.1:0".into(),
        raft_addr: "127.0.0.1:0".into(),
        http_addr: "127.0.0.1:0".into(),
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 200,
        election_timeout_max_ms: 400,
        // Tests of other behaviour run without authentication; tests/it/auth.rs turns it on.
        auth: raftq::config::AuthMode::None,
        ..Config::default()
    }
}

impl TestNode {
    pub async fn start() -> TestNode {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut Config)) -> TestNode {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut cfg = test_config(tmp.path());
        f(&mut cfg);
        let mut n = TestNode { node: None, cfg, _tmp: Some(tmp) };
        n.restart().await;
        n
    }

    /// Starts (again) on the same data directory.
    pub async fn restart(&mut self) {
        assert!(self.node.is_none(), "stop the node first");
        let listeners = Listeners::bind(&self.cfg).await.expect("bind");
        let node = Node::start(self.cfg.clone(), listeners, CancellationToken::new()).await.expect("start");
        wait_until(Duration::from_secs(10), || {
            raftq::raft::metrics(&node.raft).current_leader == Some(self.cfg.node_id)
        })
        .await;
        self.node = Some(node);
    }

    pub async fn stop(&mut self) {
        if let Some(n) = self.node.take() {
            n.stop().await;
        }
    }

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("running")
    }

    pub async fn client(&self) -> Client {
        connect(&self.node().grpc_addr.to_string()).await
    }
}

pub async fn connect(addr: &str) -> Client {
    TaskServiceClient::new(channel(addr).await)
}

/// A connected channel to a node's gRPC port.
pub async fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect")
}

pub async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "condition not reached within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn enq(queue: &str, payload: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest { queue: queue.into(), payload: payload.as_bytes().to_vec().into(), ..Default::default() }
}

/// Claims up to `count` ready tasks of `queue` without waiting, with a 30 s lease.
pub async fn claim_now(c: &mut Client, queue: &str, count: u32) -> Vec<pb::Task> {
    let req =
        pb::ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], count, lease_ms: 30_000, wait_ms: 0 };
    c.claim(req).await.expect("claim").into_inner().tasks
}

/// The stable reason a status carries.
pub fn reason(s: &tonic::Status) -> String {
    s.metadata().get("x-raftq-reason").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// The port allocator of the fault harness (std only): leases hold a lock file per port, so test processes,
/// harness runs and deploy/ci.sh on one machine never hand out the same port.
#[path = "../../jepsen-like/src/ports.rs"]
#[allow(dead_code)] // shared with jepsen-like, which uses all of it
mod ports;

/// A port no other process on this machine holds, and that no other test of this run has been given: leased
/// (below the kernel's ephemeral range, so no `bind(0)` of an in-process node and no outgoing connection takes
/// it; locked, so no concurrent test binary or harness run takes it) and kept for the whole test process, so a
/// port a killed node released cannot be taken by another test's cluster while clients of the first still
/// dial it.
pub fn free_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<ports::PortLease>> = std::sync::Mutex::new(Vec::new());
    let lease = ports::lease().expect("a free port to lease");
    let port = lease.port();
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(lease);
    port
}

/// An HS256 token signed with `secret` for tenant `tenant` with `scopes`, valid for 10 minutes.
pub fn hs256_token(secret: &str, tenant: &str, scopes: &[raftq::auth::Scope]) -> String {
    let spec = raftq::auth::TokenSpec {
        subject: "it",
        tenant,
        scopes,
        queues: None,
        ttl_s: 600,
        issuer: None,
        audience: None,
    };
    raftq::auth::issue(secret.as_bytes(), None, &spec).expect("token")
}
