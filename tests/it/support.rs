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
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    TaskServiceClient::new(ch)
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

/// The stable reason a status carries.
pub fn reason(s: &tonic::Status) -> String {
    s.metadata().get("x-raftq-reason").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// A port no other test of this run has been given. Ports handed out are never handed out again, so a port a
/// killed node released cannot be taken by another test's cluster while clients of the first still dial it.
/// They come from below the kernel's ephemeral range (which starts at 32768), in a block chosen per process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ =
        NEXT.compare_exchange(0, 10_000 + (std::process::id() % 200) as u16 * 100, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let p = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(p < 32_000, "ran out of test ports");
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}
