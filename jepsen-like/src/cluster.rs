//! The cluster under test: real `raftq serve` processes, each with its own data directory, ports, config file
//! and log, behind the relays of `relay.rs`; and the admin calls the harness makes to them (status, leader,
//! transfer, membership, digests). Owns process life: start, kill -9, SIGTERM, SIGSTOP/SIGCONT, restart with
//! a skewed clock, corruption of a stopped node's files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::relay::{Net, Relay};

/// Server settings for fault runs: elections that stay quiet on a loaded 2-core machine yet fail over within
/// about a second; snapshots often enough that restarted and new nodes catch up by snapshot; short retry
/// backoff and write timeout so a run drains and reports unknown outcomes quickly.
pub const SERVER_SETTINGS: &str = "\
heartbeat_interval_ms = 100
election_timeout_min_ms = 500
election_timeout_max_ms = 1000
snapshot_every_entries = 2000
snapshot_keep_entries = 200
purge_batch_entries = 64
retry_base_ms = 200
retry_max_ms = 2000
lease_min_ms = 500
write_timeout_ms = 5000
";

/// Where Debian's libfaketime package puts the library.
pub const FAKETIME_LIBS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// A node waits this long for a clean exit after SIGTERM before it is killed.
const TERM_WAIT: Duration = Duration::from_secs(20);
/// A started node must serve its Status within this long, or it counts as refusing to start.
pub const START_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Running,
    Paused,
    /// Stopped by the harness (kill or SIGTERM); it will be started again.
    Down,
    /// Removed from the membership; its id is never used again.
    Removed,
    /// Refused to start (after corruption): it stays down until removed.
    Broken,
}

pub struct NodeProc {
    pub id: u64,
    /// The cluster position (client relay) this node holds.
    pub slot: usize,
    pub grpc: SocketAddr,
    pub raft: SocketAddr,
    pub relay_raft: SocketAddr,
    pub relay_api: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    pub join: bool,
    pub state: NodeState,
    /// A libfaketime offset (`+12s`) the node runs with now.
    pub skew: Option<String>,
    /// Its files were corrupted and it started anyway: it stays a member until the end, so the final
    /// convergence check compares its state with the others'.
    pub corrupted: bool,
    child: Option<Child>,
}

impl NodeProc {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    pub fn member(&self) -> bool {
        !matches!(self.state, NodeState::Removed)
    }

    pub fn up(&self) -> bool {
        matches!(self.state, NodeState::Running)
    }
}

pub struct ClusterOptions {
    pub bin: PathBuf,
    pub root: PathBuf,
    pub nodes: u64,
    /// TOML appended to every node's config.
    pub settings: String,
    /// RAFTQ_LOG of the nodes.
    pub node_log: String,
}

pub struct Cluster {
    pub net: Arc<Net>,
    pub nodes: Vec<NodeProc>,
    /// Cluster positions: the API and Raft ports a position's node binds. A node that replaces another (a
    /// new id) takes over its ports, so clients created at the start keep reaching the cluster.
    pub slots: Vec<(SocketAddr, SocketAddr)>,
    opts: ClusterOptions,
    pub faketime: Option<PathBuf>,
    next_id: u64,
    channels: Mutex<HashMap<u64, Channel>>,
}

/// Every node process alive, so an interrupted harness can kill them all (`kill_all`).
static CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn track(pid: Option<u32>, alive: bool) {
    if let Some(pid) = pid {
        let mut c = CHILDREN.lock().expect("children lock");
        if alive {
            c.insert(pid);
        } else {
            c.remove(&pid);
        }
    }
}

/// SIGKILLs every node process this harness started (on SIGINT or SIGTERM of the harness).
pub fn kill_all() {
    let pids: Vec<u32> = CHILDREN.lock().expect("children lock").iter().copied().collect();
    for pid in pids {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

fn toml_str(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

impl Cluster {
    /// Starts `opts.nodes` nodes listing each other (through their relays) as peers, and waits for a leader.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(&opts.root)?;
        let faketime = FAKETIME_LIBS.iter().map(PathBuf::from).find(|p| p.exists());
        let mut c = Cluster {
            net: Net::new(),
            nodes: Vec::new(),
            slots: Vec::new(),
            faketime,
            next_id: 1,
            channels: Mutex::new(HashMap::new()),
            opts,
        };
        for slot in 0..c.opts.nodes as usize {
            c.slots.push((free_addr()?, free_addr()?));
            c.new_node(slot, false).await?;
        }
        let peers: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("{{ id = {}, raft_addr = \"{}\", api_addr = \"{}\" }}", n.id, n.relay_raft, n.relay_api))
            .collect();
        let peers = format!("peers = [{}]\n", peers.join(", "));
        let ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
        for id in &ids {
            c.write_config(*id, &peers)?;
        }
        for id in &ids {
            c.spawn(*id)?;
        }
        for id in &ids {
            c.wait_serving(*id, START_WAIT).await.map_err(|e| anyhow!("node {id} did not start: {e}"))?;
        }
        c.wait_leader(Duration::from_secs(30)).await.context("no leader after start")?;
        Ok(c)
    }

    /// Allocates ports and relays for a new node id holding `slot`; writes no config yet.
    async fn new_node(&mut self, slot: usize, join: bool) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let (grpc, raft) = self.slots[slot];
        let relay_raft = Relay::start(self.net.clone(), id, raft).await?;
        let relay_api = Relay::start(self.net.clone(), id, grpc).await?;
        let dir = self.opts.root.join(format!("n{id}"));
        std::fs::create_dir_all(&dir)?;
        self.nodes.push(NodeProc {
            id,
            slot,
            grpc,
            raft,
            relay_raft: relay_raft.addr,
            relay_api: relay_api.addr,
            config: dir.join("node.toml"),
            log: dir.join("node.log"),
            dir,
            join,
            state: NodeState::Down,
            skew: None,
            corrupted: false,
            child: None,
        });
        Ok(id)
    }

    fn write_config(&self, id: u64, peers: &str) -> anyhow::Result<()> {
        let n = self.node(id);
        let text = format!(
            "node_id = {id}\ndata_dir = {}\ngrpc_addr = \"{}\"\nraft_addr = \"{}\"\nhttp_addr = \"{}\"\n\
             advertise_raft_addr = \"{}\"\nadvertise_grpc_addr = \"{}\"\n\
             # Clients are not authenticated here (the workload is the subject); peers are, on the Raft port.\n\
             auth = \"none\"\ncluster_secret = \"jepsen-cluster-secret-0123456789abcdef\"\n{}\n{peers}",
            toml_str(&n.data_dir()),
            n.grpc,
            n.raft,
            free_addr()?,
            n.relay_raft,
            n.relay_api,
            self.opts.settings,
        );
        std::fs::write(&n.config, text)?;
        Ok(())
    }

    pub fn node(&self, id: u64) -> &NodeProc {
        self.nodes.iter().find(|n| n.id == id).expect("known node id")
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProc {
        self.nodes.iter_mut().find(|n| n.id == id).expect("known node id")
    }

    /// Nodes in the membership (running or not).
    pub fn member_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.member()).map(|n| n.id).collect()
    }

    /// Members that run and are not paused.
    pub fn up_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.up()).map(|n| n.id).collect()
    }

    /// Starts the node's process (state Running); see `wait_serving` for whether it really started.
    pub fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let bin = self.opts.bin.clone();
        let node_log = self.opts.node_log.clone();
        let faketime = self.faketime.clone();
        let n = self.node_mut(id);
        if n.child.is_some() {
            bail!("node {id} already runs");
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&n.log)?;
        let mut cmd = Command::new(&bin);
        cmd.args(["serve", "--config"]).arg(&n.config);
        if n.join {
            cmd.arg("--join");
        }
        cmd.env("RAFTQ_LOG", node_log).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        if let Some(offset) = &n.skew {
            let lib = faketime.ok_or_else(|| anyhow!("libfaketime is not installed"))?;
            // Only the wall clock moves: raftq stamps entries with it; timers keep the real monotonic clock.
            cmd.env("LD_PRELOAD", lib).env("FAKETIME", offset).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd.spawn().with_context(|| format!("spawning {}", bin.display()))?;
        let pid = child.id();
        track(pid, true);
        n.child = Some(child);
        n.state = NodeState::Running;
        if let Some(pid) = pid {
            self.net.set_pid(pid, id);
        }
        Ok(())
    }

    /// Waits until the node answers Status; `Err` with its exit status and last log lines if it exits.
    pub async fn wait_serving(&mut self, id: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let exited = {
                let n = self.node_mut(id);
                match n.child.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(status))) => Some(status.to_string()),
                    Some(Ok(None)) => None,
                    Some(Err(e)) => Some(e.to_string()),
                    None => Some("not running".into()),
                }
            };
            if let Some(status) = exited {
                let tail = self.log_tail(id, 5);
                let n = self.node_mut(id);
                if let Some(pid) = n.pid() {
                    track(Some(pid), false);
                    self.net.forget_pid(pid);
                }
                let n = self.node_mut(id);
                n.child = None;
                n.state = NodeState::Down;
                return Err(format!("exited ({status}): {tail}"));
            }
            if self.status(id).await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Nodes that exited without the harness stopping them: (id, exit status). They are marked down, so heal
    /// starts them again.
    pub fn reap(&mut self) -> Vec<(u64, String)> {
        let mut gone = Vec::new();
        for n in self.nodes.iter_mut() {
            let status = match n.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => status.to_string(),
                Some(Err(e)) => e.to_string(),
                _ => continue,
            };
            if let Some(pid) = n.child.take().and_then(|c| c.id()) {
                track(Some(pid), false);
                self.net.forget_pid(pid);
            }
            if n.member() && n.state != NodeState::Broken {
                n.state = NodeState::Down;
            }
            gone.push((n.id, status));
        }
        gone
    }

    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.node(id).log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join(" | ")
    }

    pub async fn kill9(&mut self, id: u64) {
        let n = self.node_mut(id);
        if let Some(mut c) = n.child.take() {
            let pid = c.id();
            let _ = c.start_kill();
            let _ = c.wait().await;
            track(pid, false);
            if let Some(pid) = pid {
                self.net.forget_pid(pid);
            }
        }
        let n = self.node_mut(id);
        if n.member() && n.state != NodeState::Broken {
            n.state = NodeState::Down;
        }
    }

    /// SIGTERM (after SIGCONT when paused) and a wait for the exit; SIGKILL after `TERM_WAIT`. Returns how it
    /// ended.
    pub async fn terminate(&mut self, id: u64) -> String {
        if self.node(id).state == NodeState::Paused {
            self.signal(id, "CONT");
        }
        let Some(pid) = self.node(id).pid() else { return "not running".into() };
        self.signal_pid(pid, "TERM");
        let n = self.node_mut(id);
        let mut c = n.child.take().expect("a pid means a child");
        let ended = match tokio::time::timeout(TERM_WAIT, c.wait()).await {
            Ok(Ok(s)) => s.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                let _ = c.start_kill();
                let _ = c.wait().await;
                format!("no exit within {TERM_WAIT:?} of SIGTERM: killed")
            }
        };
        track(Some(pid), false);
        self.net.forget_pid(pid);
        let n = self.node_mut(id);
        if n.member() && n.state != NodeState::Broken {
            n.state = NodeState::Down;
        }
        ended
    }

    fn signal_pid(&self, pid: u32, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// SIGSTOP or SIGCONT.
    pub fn signal(&mut self, id: u64, sig: &str) {
        if let Some(pid) = self.node(id).pid() {
            self.signal_pid(pid, sig);
            let n = self.node_mut(id);
            n.state = if sig == "STOP" { NodeState::Paused } else { NodeState::Running };
        }
    }

    /// Starts a stopped member again and waits until it serves.
    pub async fn restart(&mut self, id: u64) -> Result<(), String> {
        self.spawn(id).map_err(|e| e.to_string())?;
        self.wait_serving(id, START_WAIT).await
    }

    fn channel(&self, id: u64) -> Channel {
        let mut m = self.channels.lock().expect("channels lock");
        m.entry(id)
            .or_insert_with(|| {
                Endpoint::from_shared(format!("http://{}", self.node(id).grpc))
                    .expect("a socket address is a valid url")
                    .connect_timeout(Duration::from_millis(500))
                    .timeout(Duration::from_secs(10))
                    .connect_lazy()
            })
            .clone()
    }

    pub fn admin(&self, id: u64) -> AdminClient<Channel> {
        AdminClient::new(self.channel(id))
    }

    /// The node's own status, or None when it does not answer within 1.5 s.
    pub async fn status(&self, id: u64) -> Option<pb::NodeStatus> {
        let mut a = self.admin(id);
        let call = a.status(pb::NodeStatusRequest {});
        tokio::time::timeout(Duration::from_millis(1500), call).await.ok()?.ok().map(|r| r.into_inner())
    }

    /// Statuses of every running member, asked at once.
    pub async fn statuses(&self) -> BTreeMap<u64, pb::NodeStatus> {
        let mut set = tokio::task::JoinSet::new();
        for id in self.up_ids() {
            let mut a = self.admin(id);
            set.spawn(async move {
                let call = a.status(pb::NodeStatusRequest {});
                (id, tokio::time::timeout(Duration::from_millis(1500), call).await.ok().and_then(|r| r.ok()))
            });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((id, Some(s))) = r {
                out.insert(id, s.into_inner());
            }
        }
        out
    }

    /// The leader with the highest term among the nodes that say they lead, and that term.
    pub async fn leader(&self) -> Option<(u64, u64)> {
        self.statuses().await.values().filter(|s| s.role == "LEADER").map(|s| (s.node_id, s.term)).max_by_key(|x| x.1)
    }

    pub async fn wait_leader(&self, limit: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((l, _)) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                bail!("no leader within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running member has applied what the leader has committed (a healed cluster).
    pub async fn wait_caught_up(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let st = self.statuses().await;
            let leader = st.values().filter(|s| s.role == "LEADER").max_by_key(|s| s.term);
            if let Some(l) = leader {
                let target = l.committed_index;
                let ups = self.up_ids();
                if ups.iter().all(|id| st.get(id).is_some_and(|s| s.applied_index >= target)) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let view: Vec<String> =
                    st.values().map(|s| format!("{}:{}@{}/{}", s.node_id, s.role, s.applied_index, s.term)).collect();
                bail!("the cluster did not catch up within {limit:?}: {}", view.join(" "));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks any running member (it forwards to the leader) for a transfer to `to`.
    pub async fn transfer(&self, via: u64, to: u64) -> Result<u64, String> {
        let mut a = self.admin(via);
        a.transfer_leader(pb::TransferLeaderRequest { to, timeout_ms: 5_000 })
            .await
            .map(|r| r.into_inner().took_ms)
            .map_err(|e| e.message().to_string())
    }

    pub async fn digests(&self) -> BTreeMap<u64, pb::DigestResponse> {
        let mut set = tokio::task::JoinSet::new();
        for id in self.up_ids() {
            let mut a = self.admin(id);
            set.spawn(async move {
                let call = a.digest(pb::DigestRequest {});
                (id, tokio::time::timeout(Duration::from_secs(10), call).await.ok().and_then(|r| r.ok()))
            });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((id, Some(d))) = r {
                out.insert(id, d.into_inner());
            }
        }
        out
    }

    /// Removes `id` from the membership (through any running member); its process is stopped by the caller.
    pub async fn remove_member(&mut self, via: u64, id: u64) -> Result<(), String> {
        let mut a = self.admin(via);
        let call = a.remove_node(pb::RemoveNodeRequest { node_id: id, force: false });
        match tokio::time::timeout(Duration::from_secs(20), call).await {
            Ok(Ok(_)) => {
                self.node_mut(id).state = NodeState::Removed;
                Ok(())
            }
            Ok(Err(e)) => Err(e.message().to_string()),
            Err(_) => Err("no answer within 20 s".into()),
        }
    }

    /// Starts a node under a new id (never used before) with an empty data directory, takes over `slot`'s
    /// client relay, and adds it to the membership (learner, catch-up, voter). Returns its id.
    pub async fn add_new_node(&mut self, via: u64, slot: usize) -> Result<u64, String> {
        let id = self.new_node(slot, true).await.map_err(|e| e.to_string())?;
        self.write_config(id, "").map_err(|e| e.to_string())?;
        self.spawn(id).map_err(|e| e.to_string())?;
        self.wait_serving(id, START_WAIT).await?;
        let (raft_addr, api_addr) = (self.node(id).relay_raft.to_string(), self.node(id).relay_api.to_string());
        let mut last = String::new();
        for _ in 0..5 {
            let mut a = self.admin(via);
            let req = pb::AddNodeRequest {
                node_id: id,
                raft_addr: raft_addr.clone(),
                api_addr: api_addr.clone(),
                learner_only: false,
            };
            match tokio::time::timeout(Duration::from_secs(60), a.add_node(req)).await {
                Ok(Ok(r)) if r.get_ref().members.iter().any(|m| m.node_id == id && m.voter) => return Ok(id),
                Ok(Ok(r)) => last = format!("not a voter yet: {:?}", r.into_inner().members),
                Ok(Err(e)) => last = e.message().to_string(),
                Err(_) => last = "no answer within 60 s".into(),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err(format!("node {id} was not added: {last}"))
    }

    pub fn mark_corrupted(&mut self, id: u64) {
        self.node_mut(id).corrupted = true;
    }

    pub fn mark_broken(&mut self, id: u64) {
        self.node_mut(id).state = NodeState::Broken;
    }

    pub fn set_skew(&mut self, id: u64, skew: Option<String>) {
        self.node_mut(id).skew = skew;
    }

    /// Flips bytes in one of a stopped node's redb files; says which file and where.
    pub fn corrupt(&self, id: u64, rng: &mut StdRng) -> anyhow::Result<String> {
        let data = self.node(id).data_dir();
        let mut files = vec![data.join("raft-log.redb")];
        if let Ok(rd) = std::fs::read_dir(data.join("sm")) {
            let mut sm: Vec<PathBuf> =
                rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "redb")).collect();
            sm.sort();
            files.extend(sm);
        }
        files.retain(|f| f.exists());
        if files.is_empty() {
            bail!("node {id} has no redb files");
        }
        let file = &files[rng.random_range(0..files.len())];
        let mut bytes = std::fs::read(file)?;
        if bytes.is_empty() {
            bail!("{} is empty", file.display());
        }
        // Half of the time the first pages (header, region and table roots), else anywhere in the file.
        let span = if rng.random_bool(0.5) { bytes.len().min(16 * 1024) } else { bytes.len() };
        let flips = rng.random_range(1..=32);
        let mut at = Vec::new();
        for _ in 0..flips {
            let i = rng.random_range(0..span);
            bytes[i] ^= rng.random_range(1..=255u8);
            at.push(i);
        }
        at.sort();
        std::fs::write(file, &bytes)?;
        Ok(format!(
            "{} ({} bytes): {} bytes flipped at {:?}",
            file.strip_prefix(&self.opts.root).unwrap_or(file).display(),
            bytes.len(),
            at.len(),
            at
        ))
    }

    /// Stops every process: SIGTERM, then SIGKILL.
    pub async fn shutdown(&mut self) {
        let ids: Vec<u64> = self.nodes.iter().filter(|n| n.child.is_some()).map(|n| n.id).collect();
        for id in ids {
            self.terminate(id).await;
        }
    }
}
