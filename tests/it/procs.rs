//! Real `raftq serve` processes: a node with its own data directory, ports and config file, which a test can
//! kill, pause, resume and restart; and a cluster of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use tonic::transport::Channel;

use crate::support::*;

pub struct ProcNode {
    pub id: u64,
    pub grpc: String,
    pub raft: String,
    pub http: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
}

/// `extra` is TOML appended to the node's config file (timeouts, snapshot policy, peers...).
pub fn write_config(dir: &Path, id: u64, grpc: &str, raft: &str, http: &str, extra: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let path = dir.join(format!("node{id}.toml"));
    // Without authentication unless `extra` configures it (tests/it/auth.rs does).
    let auth = if extra.lines().any(|l| l.trim_start().starts_with("auth ")) { "" } else { "auth = \"none\"\n" };
    let text = format!(
        "node_id = {id}\ndata_dir = {:?}\ngrpc_addr = {grpc:?}\nraft_addr = {raft:?}\nhttp_addr = {http:?}\n{auth}{extra}\n",
        dir.join(format!("data{id}")).display().to_string(),
    );
    std::fs::write(&path, text).expect("write config");
    path
}

impl ProcNode {
    pub fn new(root: &Path, id: u64, extra: &str) -> ProcNode {
        let (grpc, raft, http) = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let config = write_config(root, id, &grpc, &raft, &http, extra);
        ProcNode { id, grpc, raft, http, dir: root.join(format!("data{id}")), config, child: None }
    }

    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    pub fn start_with(&mut self, args: &[&str]) {
        self.start_with_env(args, &[]);
    }

    /// `start_with`, with `env` set in the process's environment.
    pub fn start_with_env(&mut self, args: &[&str], env: &[(&str, &str)]) {
        assert!(self.child.is_none(), "node {} already runs", self.id);
        let child = Command::new(env!("CARGO_BIN_EXE_raftq"))
            .args(["serve", "--config"])
            .arg(&self.config)
            .args(args)
            .env("RAFTQ_LOG", std::env::var("RAFTQ_TEST_LOG").unwrap_or_else(|_| "error".into()))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn raftq serve");
        self.child = Some(child);
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("SIGKILL");
            c.wait().expect("reap");
        }
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([&format!("-{sig}"), &pid]).status().expect("kill").success());
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        let pid = c.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "node exits cleanly on SIGTERM: {status:?}");
                return;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status once the process has ended (it then no longer runs), else None.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().expect("wait")?;
        self.child = None;
        Some(status)
    }

    /// SIGTERM, then waits up to `limit` for the exit: its status and how long it took (SIGKILL and a panic
    /// when the process outlives `limit`).
    pub async fn terminate_within(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let start = Instant::now();
        self.signal("TERM");
        loop {
            if let Some(s) = self.exited() {
                return (s, start.elapsed());
            }
            if start.elapsed() > limit {
                self.kill9();
                panic!("node {} still ran {limit:?} after SIGTERM", self.id);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.grpc).await
    }

    /// Waits until the node serves reads (a read of an unknown task answers NOT_FOUND).
    pub async fn ready(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(ch) =
                tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc)).expect("url").connect().await
            {
                let mut c = raftq_proto::v1::task_service_client::TaskServiceClient::new(ch);
                match c.get_task(pb::GetTaskRequest { id: "0".repeat(32) }).await {
                    Err(e) if reason(&e) == "NOT_FOUND" => return c,
                    _ => {}
                }
            }
            assert!(Instant::now() < deadline, "node {} did not become ready", self.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn admin(&self) -> Option<AdminClient<Channel>> {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(15))
            .connect()
            .await
            .ok()?;
        Some(AdminClient::new(ch))
    }

    /// One metric from the node's `/metrics` (a sample without labels), or None.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.http).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.ok()?;
        raw.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The node's status, or None when it does not answer within 2 s (down or paused).
    pub async fn status(&self) -> Option<pb::NodeStatus> {
        let call = async { self.admin().await?.status(pb::NodeStatusRequest {}).await.ok().map(|r| r.into_inner()) };
        tokio::time::timeout(Duration::from_secs(2), call).await.ok().flatten()
    }
}

impl Drop for ProcNode {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            // A paused node would not die from SIGTERM; SIGKILL works on stopped processes too.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct ProcCluster {
    pub nodes: Vec<ProcNode>,
    pub root: tempfile::TempDir,
}

/// Timeouts for tests: quick elections without flapping on a loaded 2-core machine.
pub const FAST: &str = "heartbeat_interval_ms = 100\nelection_timeout_min_ms = 500\nelection_timeout_max_ms = 1000\n";

impl ProcCluster {
    /// `n` nodes listing each other as peers; node 1 initialises the cluster.
    pub async fn start(n: u64, extra: &str) -> ProcCluster {
        let root = tempfile::tempdir().expect("dir");
        let ports: Vec<(String, String, String)> = (0..n)
            .map(|_| {
                (
                    format!("127.0.0.1:{}", free_port()),
                    format!("127.0.0.1:{}", free_port()),
                    format!("127.0.0.1:{}", free_port()),
                )
            })
            .collect();
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (g, r, _))| format!("{{ id = {}, raft_addr = {r:?}, api_addr = {g:?} }}", i + 1))
            .collect();
        let peers = format!("peers = [{}]\n", peers.join(", "));
        let mut nodes = Vec::new();
        for (i, (g, r, h)) in ports.into_iter().enumerate() {
            let id = i as u64 + 1;
            let config = write_config(root.path(), id, &g, &r, &h, &format!("{extra}\n{peers}"));
            nodes.push(ProcNode {
                id,
                grpc: g,
                raft: r,
                http: h,
                dir: root.path().join(format!("data{id}")),
                config,
                child: None,
            });
        }
        for node in nodes.iter_mut() {
            node.start();
        }
        let c = ProcCluster { nodes, root };
        c.wait_formed(Duration::from_secs(30)).await;
        c
    }

    /// Waits until every running node follows one leader and lists every node as a member: a leader alone is
    /// not enough, a follower may not yet have the membership the leader committed.
    pub async fn wait_formed(&self, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let mut leaders = std::collections::BTreeSet::new();
            let mut formed = true;
            for n in self.nodes.iter().filter(|n| n.running()) {
                match n.status().await {
                    Some(s) if s.has_leader && s.members.len() == self.nodes.len() => {
                        leaders.insert(s.leader_id);
                    }
                    _ => formed = false,
                }
            }
            if formed && leaders.len() == 1 {
                return leaders.into_iter().next().expect("one leader");
            }
            assert!(Instant::now() < deadline, "the cluster did not form within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn node(&mut self, id: u64) -> &mut ProcNode {
        self.nodes.iter_mut().find(|n| n.id == id).expect("node id")
    }

    /// The leader, as reported by a running node that has one.
    pub async fn leader(&self) -> Option<u64> {
        for n in self.nodes.iter().filter(|n| n.running()) {
            if let Some(s) = n.status().await {
                if s.role == "LEADER" {
                    return Some(s.node_id);
                }
            }
        }
        None
    }

    /// Waits until node `id` reports the cluster at `version` or later.
    pub async fn wait_cluster_version(&mut self, id: u64, version: u32, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.node(id).status().await.is_none_or(|s| s.cluster_version < version) {
            assert!(Instant::now() < deadline, "cluster version {version} never came");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_leader(&self, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader().await {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The leader the nodes other than `old` (a paused node, say) elected, waited for up to `limit`.
    pub async fn wait_leader_besides(&self, old: u64, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            for n in self.nodes.iter().filter(|n| n.id != old) {
                if n.status().await.is_some_and(|s| s.role == "LEADER") {
                    return n.id;
                }
            }
            assert!(Instant::now() < deadline, "no leader besides node {old} within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running node has applied the same index with the same state digest.
    pub async fn wait_digests_agree(&self, limit: Duration) -> BTreeMap<u64, pb::DigestResponse> {
        let deadline = Instant::now() + limit;
        loop {
            let mut all = BTreeMap::new();
            for n in self.nodes.iter().filter(|n| n.running()) {
                if let Some(mut a) = n.admin().await {
                    if let Ok(d) = a.digest(pb::DigestRequest {}).await {
                        all.insert(n.id, d.into_inner());
                    }
                }
            }
            let running = self.nodes.iter().filter(|n| n.running()).count();
            if all.len() == running && raftq::api::admin::digests_agree(&all) {
                return all;
            }
            assert!(Instant::now() < deadline, "digests do not agree within {limit:?}: {all:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
