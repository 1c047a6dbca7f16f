//! Node processes as a `Backend`: real `raftq serve` processes, each with its own data directory, ports, config
//! file and log, behind the relays of `relay.rs`. Owns process life: start, kill -9, SIGTERM, SIGSTOP/SIGCONT,
//! restart with a skewed clock, corruption of a stopped node's files, membership changes.
//!
//! Ports: every port a node binds is leased (`ports.rs`) before its config names it and held for the whole run,
//! so nothing else on the machine is handed it; if something took it anyway, a node that fails to bind is
//! started again (same port), and a cluster whose start failed that way starts again on new ports.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use raftq_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::backend::{Admins, Backend, Mechanism, NodeState, START_WAIT};
use crate::nemesis::Fault;
use crate::ports::{self, PortLease};
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

/// A node waits this long for a clean exit after SIGTERM before it is killed (a node stops within about 6 s).
const TERM_WAIT: Duration = Duration::from_secs(20);
/// Longest `raftq data downgrade` of one node's files (it rewrites every redb file; seconds for a run's data).
const DOWNGRADE_WAIT: Duration = Duration::from_secs(120);
/// Pause before starting again a node whose port was taken.
const CLASH_RETRY: Duration = Duration::from_millis(500);
/// Starts of a whole cluster on new ports when a node's port was taken (by a program that takes no leases).
const START_ATTEMPTS: u32 = 3;

pub struct NodeProc {
    pub id: u64,
    /// The cluster position (client relay) this node holds.
    pub slot: usize,
    pub grpc: SocketAddr,
    pub raft: SocketAddr,
    pub http: SocketAddr,
    pub relay_raft: SocketAddr,
    pub relay_api: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Where the log stood when the process was last started: what it wrote since is its own.
    log_from: u64,
    pub join: bool,
    pub state: NodeState,
    /// A libfaketime offset (`+12s`) the node runs with now.
    pub skew: Option<String>,
    /// Its files were corrupted and it started anyway: it stays a member until the end, so the final
    /// convergence check compares its state with the others'.
    pub corrupted: bool,
    /// The binary this node runs from its next start, when not `ClusterOptions::bin` (the upgrade scenario:
    /// the previous release's).
    pub bin: Option<PathBuf>,
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
}

#[derive(Clone)]
pub struct ClusterOptions {
    /// The binary under test (the current build).
    pub bin: PathBuf,
    /// The previous release's binary: every node of the first start runs it (the upgrade scenario).
    pub old_bin: Option<PathBuf>,
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
    /// The leases of every port a node binds, held until the run ends.
    leases: Vec<PortLease>,
    opts: ClusterOptions,
    pub faketime: Option<PathBuf>,
    next_id: u64,
    admins: Admins,
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

fn toml_str(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

impl Cluster {
    /// Starts `opts.nodes` nodes listing each other (through their relays) as peers, and waits for a leader.
    /// A start that failed because a node's port was taken is made again on new ports.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        let mut attempt = 1;
        loop {
            let mut c = Cluster::new(opts.clone())?;
            match c.boot().await {
                Ok(()) => return Ok(c),
                Err(e) => {
                    c.shutdown().await;
                    let e = format!("{e:#}");
                    if attempt >= START_ATTEMPTS || !ports::address_in_use(&e) {
                        bail!(e);
                    }
                    eprintln!("raftq-jepsen: a node's port was taken ({e}); starting the cluster again on new ports");
                    std::fs::remove_dir_all(&opts.root).with_context(|| format!("clearing {}", opts.root.display()))?;
                    attempt += 1;
                }
            }
        }
    }

    fn new(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(&opts.root)?;
        Ok(Cluster {
            net: Net::new(),
            nodes: Vec::new(),
            slots: Vec::new(),
            leases: Vec::new(),
            faketime: FAKETIME_LIBS.iter().map(PathBuf::from).find(|p| p.exists()),
            next_id: 1,
            admins: Admins::new(None),
            opts,
        })
    }

    async fn boot(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.opts.nodes as usize {
            let (grpc, raft) = (self.lease()?, self.lease()?);
            self.slots.push((grpc, raft));
            self.new_node(slot, false).await?;
        }
        let peers: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{{ id = {}, raft_addr = \"{}\", api_addr = \"{}\" }}", n.id, n.relay_raft, n.relay_api))
            .collect();
        let peers = format!("peers = [{}]\n", peers.join(", "));
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.id).collect();
        for id in &ids {
            self.write_config(*id, &peers)?;
        }
        for id in &ids {
            self.spawn(*id)?;
        }
        for id in &ids {
            self.wait_serving(*id, START_WAIT).await.map_err(|e| anyhow!("node {id} did not start: {e}"))?;
        }
        self.wait_leader(Duration::from_secs(30)).await.context("no leader after start")?;
        Ok(())
    }

    /// A port held for this run.
    fn lease(&mut self) -> anyhow::Result<SocketAddr> {
        let l = ports::lease().context("leasing a port")?;
        let addr = l.addr();
        self.leases.push(l);
        Ok(addr)
    }

    /// Allocates ports and relays for a new node id holding `slot`; writes no config yet.
    async fn new_node(&mut self, slot: usize, join: bool) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let (grpc, raft) = self.slots[slot];
        let http = self.lease()?;
        // Relays bind port 0: the kernel's ephemeral range, where no leased port lies.
        let relay_raft = Relay::start(self.net.clone(), id, raft).await?;
        let relay_api = Relay::start(self.net.clone(), id, grpc).await?;
        let dir = self.opts.root.join(format!("n{id}"));
        std::fs::create_dir_all(&dir)?;
        self.admins.add(id, &grpc.to_string())?;
        self.nodes.push(NodeProc {
            id,
            slot,
            grpc,
            raft,
            http,
            relay_raft: relay_raft.addr,
            relay_api: relay_api.addr,
            config: dir.join("node.toml"),
            log: dir.join("node.log"),
            log_from: 0,
            dir,
            join,
            state: NodeState::Down,
            skew: None,
            corrupted: false,
            // Nodes added later (a replacement under a new id) run the current binary.
            bin: if join { None } else { self.opts.old_bin.clone() },
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
            n.http,
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

    /// Starts the node's process (state Running); see `wait_serving` for whether it really started.
    pub fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let node_log = self.opts.node_log.clone();
        let faketime = self.faketime.clone();
        let bin = self.binary(id).to_path_buf();
        let n = self.node_mut(id);
        if n.child.is_some() {
            bail!("node {id} already runs");
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&n.log)?;
        n.log_from = log.metadata()?.len();
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

    /// The binary node `id` runs from its next start.
    fn binary(&self, id: u64) -> &Path {
        self.node(id).bin.as_deref().unwrap_or(&self.opts.bin)
    }

    /// Waits until the node answers Status; `Err` with its exit status and last log lines if it exits.
    async fn wait_serving_once(&mut self, id: u64, deadline: Instant) -> Result<(), String> {
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
            if self.admins.status(id).await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err("no answer in time".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `lines` lines the node's current process wrote to its log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let n = self.node(id);
        let text = std::fs::read(&n.log).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(n.log_from as usize..).unwrap_or_default());
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join(" | ")
    }

    async fn kill9(&mut self, id: u64) {
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

    fn signal_pid(&self, pid: u32, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// SIGSTOP or SIGCONT.
    fn signal(&mut self, id: u64, sig: &str) {
        if let Some(pid) = self.node(id).pid() {
            self.signal_pid(pid, sig);
            let n = self.node_mut(id);
            n.state = if sig == "STOP" { NodeState::Paused } else { NodeState::Running };
        }
    }

    /// Flips bytes in one of a stopped node's redb files; says which file and where.
    fn corrupt_files(&self, id: u64, rng: &mut StdRng) -> anyhow::Result<String> {
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
}

impl Backend for Cluster {
    fn faults(&self) -> &'static [Fault] {
        &Fault::ALL
    }

    fn mechanism(&self, m: Mechanism) -> &'static str {
        match m {
            Mechanism::Kill => "kill -9",
            Mechanism::Pause => "SIGSTOP",
            Mechanism::Resume => "SIGCONT",
            Mechanism::Terminate => "SIGTERM",
            Mechanism::Partition => "",
        }
    }

    fn client_addrs(&self) -> Vec<String> {
        self.slots.iter().map(|(grpc, _)| grpc.to_string()).collect()
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.nodes.iter().find(|n| n.id == id).map(|n| n.slot)
    }

    fn token(&self) -> Option<String> {
        None
    }

    fn admins(&self) -> &Admins {
        &self.admins
    }

    fn node_ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    fn state(&self, id: u64) -> NodeState {
        self.node(id).state
    }

    fn skewed(&self, id: u64) -> bool {
        self.node(id).skew.is_some()
    }

    fn corrupted(&self, id: u64) -> bool {
        self.node(id).corrupted
    }

    async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill9(id).await;
        Ok(())
    }

    /// SIGTERM (after SIGCONT when paused) and a wait for the exit; SIGKILL after `TERM_WAIT`.
    async fn terminate(&mut self, id: u64) -> String {
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

    async fn start(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)
    }

    /// A node that exited because its port was taken meanwhile is started again (same port) until `limit`.
    async fn wait_serving(&mut self, id: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.wait_serving_once(id, deadline).await {
                Err(e) if ports::address_in_use(&e) && Instant::now() + CLASH_RETRY < deadline => {
                    eprintln!("raftq-jepsen: node {id} could not bind its port ({e}); starting it again");
                    tokio::time::sleep(CLASH_RETRY).await;
                    self.spawn(id).map_err(|e| e.to_string())?;
                }
                Err(e) if e == "no answer in time" => return Err(format!("no answer within {limit:?}")),
                r => return r,
            }
        }
    }

    async fn pause(&mut self, id: u64, on: bool) -> anyhow::Result<()> {
        self.signal(id, if on { "STOP" } else { "CONT" });
        Ok(())
    }

    async fn reap(&mut self) -> Vec<(u64, String)> {
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

    fn mark_broken(&mut self, id: u64) {
        self.node_mut(id).state = NodeState::Broken;
    }

    async fn partition(&mut self, minority: &[u64], majority: &[u64]) -> anyhow::Result<()> {
        self.net.update(|r| {
            for a in minority {
                for b in majority {
                    r.blocked.insert((*a, *b));
                    r.blocked.insert((*b, *a));
                }
            }
        });
        Ok(())
    }

    async fn heal_network(&mut self) -> anyhow::Result<()> {
        self.net.heal();
        Ok(())
    }

    fn relays(&self) -> Option<Arc<Net>> {
        Some(self.net.clone())
    }

    fn can_skew(&self) -> bool {
        self.faketime.is_some()
    }

    fn set_skew(&mut self, id: u64, skew: Option<String>) -> anyhow::Result<()> {
        self.node_mut(id).skew = skew;
        Ok(())
    }

    fn corrupt(&mut self, id: u64, rng: &mut StdRng) -> anyhow::Result<String> {
        self.corrupt_files(id, rng)
    }

    fn mark_corrupted(&mut self, id: u64) {
        self.node_mut(id).corrupted = true;
    }

    async fn remove_member(&mut self, via: u64, id: u64) -> Result<(), String> {
        let mut a = self.admins.get(via).ok_or_else(|| format!("no node {via}"))?;
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
    /// ports, and adds it to the membership (learner, catch-up, voter).
    async fn add_node(&mut self, via: u64, slot: usize) -> Result<u64, String> {
        let id = self.new_node(slot, true).await.map_err(|e| e.to_string())?;
        self.write_config(id, "").map_err(|e| e.to_string())?;
        self.restart(id).await?;
        let (raft_addr, api_addr) = (self.node(id).relay_raft.to_string(), self.node(id).relay_api.to_string());
        let mut last = String::new();
        for _ in 0..5 {
            let Some(mut a) = self.admins.get(via) else { return Err(format!("no node {via}")) };
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

    fn empty_positions(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|s| !self.nodes.iter().any(|n| n.slot == *s && n.member())).collect()
    }

    fn runs_old_binary(&self, id: u64) -> bool {
        self.opts.old_bin.as_deref().is_some_and(|old| self.binary(id) == old)
    }

    fn set_old_binary(&mut self, id: u64, old: bool) -> anyhow::Result<()> {
        let Some(old_bin) = self.opts.old_bin.clone() else { bail!("no previous binary (--old-bin)") };
        self.node_mut(id).bin = old.then_some(old_bin);
        Ok(())
    }

    /// `raftq data downgrade --data-dir <its data>` with the current binary, on the stopped node.
    async fn data_downgrade(&mut self, id: u64) -> Result<String, String> {
        if self.node(id).child.is_some() {
            return Err(format!("node {id} runs"));
        }
        let mut cmd = Command::new(&self.opts.bin);
        cmd.args(["data", "downgrade", "--data-dir"]).arg(self.node(id).data_dir()).stdin(Stdio::null());
        cmd.kill_on_drop(true);
        let out = match tokio::time::timeout(DOWNGRADE_WAIT, cmd.output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(format!("could not run {}: {e}", self.opts.bin.display())),
            Err(_) => return Err(format!("no exit within {DOWNGRADE_WAIT:?}")),
        };
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{}: {text}", out.status))
        }
    }

    fn external_connections(&self) -> u64 {
        self.net.external.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops every process: SIGTERM, then SIGKILL.
    async fn shutdown(&mut self) {
        let ids: Vec<u64> = self.nodes.iter().filter(|n| n.child.is_some()).map(|n| n.id).collect();
        for id in ids {
            self.terminate(id).await;
        }
    }

    fn discard_data(&self) {
        for n in &self.nodes {
            let _ = std::fs::remove_dir_all(n.data_dir());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raftq binary a workspace build left, if any.
    fn raftq_bin() -> Option<PathBuf> {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target");
        ["debug", "release"].iter().map(|p| target.join(p).join("raftq")).find(|p| p.exists())
    }

    /// Three node processes behind relays, in a fresh directory named after `name`, and the node that leads;
    /// `None` (with a note) when no raftq binary was built.
    async fn three_nodes(name: &str) -> Option<(Cluster, PathBuf, u64)> {
        let Some(bin) = raftq_bin() else {
            eprintln!("no raftq binary under target/: build it first (cargo build -p raftq)");
            return None;
        };
        let root = std::env::temp_dir().join(format!("raftq-jepsen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = ClusterOptions {
            bin,
            old_bin: None,
            root: root.clone(),
            nodes: 3,
            settings: String::new(),
            node_log: "warn".into(),
        };
        let c = Cluster::start(opts).await.expect("cluster");
        let ids = c.node_ids();
        let leader = crate::backend::leader_of(&c.admins().statuses(&ids).await).map(|s| s.node_id).expect("a leader");
        Some((c, root, leader))
    }

    /// A follower of `leader`, and the other nodes.
    fn a_follower(c: &Cluster, leader: u64) -> (u64, Vec<u64>) {
        let ids = c.node_ids();
        let cut = ids.iter().copied().find(|id| *id != leader).expect("a follower");
        (cut, ids.into_iter().filter(|id| *id != cut).collect())
    }

    /// An SDK worker of one slot on `queue` (named after it), trying `addrs` in order, that sends each task's
    /// payload to the receiver and completes it; cancel the token to stop it.
    fn payload_worker(
        addrs: Vec<String>,
        queue: &str,
    ) -> (tokio::task::JoinHandle<()>, tokio::sync::mpsc::UnboundedReceiver<String>, raftq_client::CancellationToken)
    {
        use raftq_client::{Outcome, Task, Worker, WorkerConfig};
        let worker = Worker::new(WorkerConfig {
            addrs,
            worker_id: format!("{queue}-worker"),
            queues: vec![queue.into()],
            concurrency: 1,
            batch_size: 1,
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .expect("worker");
        let (got_tx, got) = tokio::sync::mpsc::unbounded_channel::<String>();
        let stop = raftq_client::CancellationToken::new();
        let run_stop = stop.clone();
        let work = tokio::spawn(async move {
            let handler = move |t: Task| {
                let _ = got_tx.send(String::from_utf8_lossy(&t.payload).into_owned());
                async { Outcome::Completed(Default::default()) }
            };
            let _ = worker.run(handler, run_stop).await;
        });
        (work, got, stop)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_whose_port_was_taken_before_it_bound_it_is_started_again() {
        let Some(bin) = raftq_bin() else {
            // `cargo test --workspace` builds it (tests/it runs it).
            return eprintln!("no raftq binary under target/: build it first (cargo build -p raftq)");
        };
        let root = std::env::temp_dir().join(format!("raftq-jepsen-clash-{}", std::process::id()));
        let opts = ClusterOptions {
            bin,
            old_bin: None,
            root: root.clone(),
            nodes: 1,
            settings: String::new(),
            node_log: "warn".into(),
        };
        let mut c = Cluster::new(opts).expect("cluster");
        let (grpc, raft) = (c.lease().expect("lease"), c.lease().expect("lease"));
        c.slots.push((grpc, raft));
        let id = c.new_node(0, false).await.expect("node");
        let n = c.node(id);
        let peers = format!("peers = [{{ id = {id}, raft_addr = \"{}\", api_addr = \"{}\" }}]\n", n.raft, n.grpc);
        c.write_config(id, &peers).expect("config");
        // Another program binds the node's port in the moment before the node does, and lets it go soon after.
        let squatter = std::net::TcpListener::bind(grpc).expect("bind the node's port");
        c.spawn(id).expect("spawn");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            drop(squatter);
        });
        let served = c.wait_serving(id, Duration::from_secs(30)).await;
        let log = std::fs::read_to_string(&c.node(id).log).unwrap_or_default();
        c.shutdown().await;
        let _ = std::fs::remove_dir_all(&root);
        assert!(ports::address_in_use(&log), "the first start failed to bind: {log}");
        served.expect("started again once the port was free");
    }

    /// A leader that can still send to the others but no longer hears them (a one-way partition) must not hold
    /// the cluster: its heartbeats and retried appends would renew the followers' lease for as long as the fault
    /// lasts, so no one else would stand, and it cannot commit. With the product's default timers the others
    /// elect a leader of their own and take writes while the fault still holds, and a worker whose stream was on
    /// the old leader (which never hears of the new one) moves and gets the new work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_that_no_longer_hears_the_others_lets_them_elect_another() {
        use raftq_client::{NewTask, Producer, ProducerConfig};
        let Some((mut c, root, old)) = three_nodes("deaf").await else { return };
        let ids = c.node_ids();
        let others: Vec<u64> = ids.iter().copied().filter(|id| *id != old).collect();
        let producer = |addr: String| {
            Producer::connect(ProducerConfig {
                addrs: vec![addr],
                connect_timeout: Duration::from_secs(1),
                request_timeout: Duration::from_secs(3),
                max_retries: 0,
                ..Default::default()
            })
        };
        // Writes flow through the leader until the fault, and some are in flight when it starts.
        let p = producer(c.node(old).grpc.to_string()).await.expect("connect to the leader");
        let ready = Instant::now() + Duration::from_secs(20);
        while let Err(e) = p.enqueue(NewTask::new("deaf", "before")).await {
            assert!(Instant::now() < ready, "no write before the fault: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A worker on the leader (listed first; its stream follows the leader anyway).
        let mut addrs = vec![c.node(old).grpc.to_string()];
        addrs.extend(others.iter().map(|id| c.node(*id).grpc.to_string()));
        let (work, mut got, stop) = payload_worker(addrs, "deaf");
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(v) = got.recv().await {
                if v == "before" {
                    return;
                }
            }
        });
        seen.await.expect("the worker got the task enqueued before the fault");
        let writes = tokio::spawn(async move {
            for i in 0..50 {
                let _ = p.enqueue(NewTask::new("deaf", format!("during {i}"))).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.net.update(|r| {
            for o in &others {
                r.blocked.insert((*o, old));
            }
        });
        let cut = Instant::now();
        // Well inside the fault's hold (which lasts until the end of the test): without the leader stepping
        // back, the followers keep hearing it and never elect.
        let deadline = cut + Duration::from_secs(8);
        let new = loop {
            let statuses = c.admins().statuses(&others).await;
            if let Some(l) = crate::backend::leader_of(&statuses).filter(|l| l.node_id != old) {
                break l.node_id;
            }
            assert!(Instant::now() < deadline, "no other leader {:?} into the one-way partition", cut.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let elected = cut.elapsed();
        let p = producer(c.node(new).grpc.to_string()).await.expect("connect to the new leader");
        loop {
            match p.enqueue(NewTask::new("deaf", "after")).await {
                Ok(_) => break,
                Err(e) => assert!(Instant::now() < deadline, "no write taken by node {new} during the fault: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = cut.elapsed();
        let moved = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), async {
            while let Some(v) = got.recv().await {
                if v == "after" {
                    return;
                }
            }
        });
        moved.await.expect("the worker that was on the old leader got the task enqueued during the fault");
        eprintln!(
            "node {new} elected {elected:?}, took a write {took:?} and a worker had it {:?} into the fault",
            cut.elapsed()
        );
        stop.cancel();
        work.abort();
        writes.abort();
        c.net.heal();
        c.shutdown().await;
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A follower cut off from the others (both ways) still names the leader it last heard, and openraft's
    /// pre-vote keeps it from naming another; its clients can still reach it. A call it forwards to that leader
    /// can never be answered, and it never hears that leadership moved, so a worker whose stream is on it would
    /// wait for the partition to heal (a leader that could no longer send, deposed, was such a follower in a
    /// `partition-one-way` run: its workers got nothing for the 6.6 s the fault lasted). Once it has not heard
    /// from that leader for the cut-off limit (a second with the product's timers), it sends its clients on, as
    /// a cut-off leader does, and the worker gets the work from the leader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_cut_off_from_the_leader_sends_its_workers_on() {
        use raftq_client::{NewTask, Producer, ProducerConfig};
        let Some((mut c, root, leader)) = three_nodes("unheard").await else { return };
        let (cut, others) = a_follower(&c, leader);
        let p = Producer::connect(ProducerConfig {
            addrs: vec![c.node(leader).grpc.to_string()],
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(3),
            ..Default::default()
        })
        .await
        .expect("connect to the leader");
        let ready = Instant::now() + Duration::from_secs(20);
        while let Err(e) = p.enqueue(NewTask::new("unheard", "warm-up")).await {
            assert!(Instant::now() < ready, "no write before the fault: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.partition(&[cut], &others).await.expect("cut the follower off");
        let since = Instant::now();
        // A client that does not ask for redirects, on the follower: its claim is forwarded to the leader. It is
        // sent once the follower no longer counts the leader as live, before the silence reaches the limit, so
        // the forwarded call is in flight when it does.
        let raw = tokio::spawn(raw_claim(format!("http://{}", c.node(cut).grpc), "unheard-raw"));
        // Long enough that the follower no longer counts its leader as live (it heard it within three heartbeats),
        // so it would not redirect the worker there.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The worker knows the cut-off follower first.
        let mut addrs = vec![c.node(cut).grpc.to_string()];
        addrs.extend(others.iter().map(|id| c.node(*id).grpc.to_string()));
        let (work, mut got, stop) = payload_worker(addrs, "unheard");
        p.enqueue(NewTask::new("unheard", "during")).await.expect("the leader takes a write");
        let named = c.admins().statuses(&[cut]).await;
        let had = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(v) = got.recv().await {
                if v == "during" {
                    return;
                }
            }
        })
        .await;
        let had_at = since.elapsed();
        let (took, answer) = raw.await.expect("the raw client");
        stop.cancel();
        work.abort();
        c.net.heal();
        c.shutdown().await;
        let _ = std::fs::remove_dir_all(&root);
        had.unwrap_or_else(|_| {
            panic!("the worker that reached the cut-off follower first never got the task (its status: {named:?})")
        });
        eprintln!("the worker had the task {had_at:?} into the fault");
        // The forwarded claim is given up as an unknown outcome (its tasks, had the leader claimed any, would
        // come back when their leases expire), and the call answered with it at the routing deadline (5 s),
        // instead of waiting for the partition to heal.
        answered_unknown(took, answer);
    }

    type RawAnswer =
        Result<Result<tonic::Response<raftq_proto::v1::ClaimResponse>, tonic::Status>, tokio::time::error::Elapsed>;

    /// 0.3 s after it starts, a plain gRPC client (no redirects) asks `addr` for a task of `queue`, waiting up to
    /// 8 s there; how long the answer took from its send, and the answer, or a timeout after 12 s.
    async fn raw_claim(addr: String, queue: &str) -> (Duration, RawAnswer) {
        use raftq_proto::v1 as pb;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = Instant::now();
        let mut client = pb::task_service_client::TaskServiceClient::connect(addr).await.expect("connect");
        let claim = pb::ClaimRequest {
            worker_id: "raw".into(),
            queues: vec![queue.into()],
            count: 1,
            lease_ms: 30_000,
            wait_ms: 8_000,
        };
        let answer = tokio::time::timeout(Duration::from_secs(12), client.claim(claim)).await;
        (sent.elapsed(), answer)
    }

    /// Asserts that a [`raw_claim`] was answered, and `UNKNOWN_OUTCOME`: no leader could answer it, and the
    /// follower that forwarded it gave it up.
    fn answered_unknown(took: Duration, answer: RawAnswer) {
        let status = answer
            .unwrap_or_else(|_| panic!("the claim forwarded by the follower was not answered in {took:?}"))
            .expect_err("no leader can answer the claim");
        let reason = status.metadata().get("x-raftq-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(reason.as_deref(), Some("UNKNOWN_OUTCOME"), "{status:?}");
        eprintln!("the forwarded claim was answered {took:?} after it was sent: {}", status.message());
    }

    /// A follower that still hears its leader but can no longer send to it (a one-way cut) counts the leader as
    /// live, so it goes on forwarding; a call it forwarded can never be answered. The connection's pings go
    /// unanswered too, so the call in flight is given up within seconds (a claim is routed again, and answered
    /// `UNKNOWN_OUTCOME` at its routing deadline) instead of at the 20 s keepalive of before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_forwarded_by_a_follower_that_cannot_send_to_the_leader_is_given_up() {
        let Some((mut c, root, leader)) = three_nodes("mute").await else { return };
        let (cut, others) = a_follower(&c, leader);
        c.net.update(|r| {
            for o in &others {
                r.blocked.insert((cut, *o));
            }
        });
        let (took, answer) = raw_claim(format!("http://{}", c.node(cut).grpc), "mute-raw").await;
        c.net.heal();
        c.shutdown().await;
        let _ = std::fs::remove_dir_all(&root);
        answered_unknown(took, answer);
    }

    /// `GET path` on a node's HTTP port: the status code and the body.
    async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to the HTTP port");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        let code = out.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (code, body)
    }

    /// Waits up to `limit` for the node's `/readyz` to answer `code`; how long that took, and the body.
    async fn readyz_turns(c: &Cluster, id: u64, code: u16, limit: Duration) -> (Duration, String) {
        let since = Instant::now();
        loop {
            let (got, body) = http_get(c.node(id).http, "/readyz").await;
            if got == code {
                return (since.elapsed(), body);
            }
            assert!(since.elapsed() < limit, "node {id}'s /readyz still answers {got} after {limit:?}: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The gRPC health status of the whole server ("") on the node.
    async fn grpc_health(c: &Cluster, id: u64) -> i32 {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.node(id).grpc))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the gRPC port");
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
        let req = tonic_health::pb::HealthCheckRequest { service: String::new() };
        h.check(req).await.expect("health check").into_inner().status
    }

    /// Waits up to 2 s for the node's gRPC health to be `want` (the health loop follows readiness, looking again
    /// every 250 ms when nothing arrives).
    async fn grpc_health_turns(c: &Cluster, id: u64, want: tonic_health::pb::health_check_response::ServingStatus) {
        let since = Instant::now();
        loop {
            let got = grpc_health(c, id).await;
            if got == want as i32 {
                return;
            }
            assert!(since.elapsed() < Duration::from_secs(2), "node {id}'s gRPC health is {got}, not {want:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A node cut off from the cluster stops reporting itself ready, so a load balancer or Kubernetes sends
    /// clients elsewhere (before, a follower that heard nothing from its leader stayed ready for the whole
    /// partition, as did a leader no quorum answered): `/readyz` answers 503 with the reason, and gRPC health
    /// `NOT_SERVING`, once the silence reaches the cut-off limit (a second with the product's timers); both
    /// come back when the partition heals. The rest of the cluster stays ready.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_cut_off_from_the_cluster_is_not_ready() {
        use tonic_health::pb::health_check_response::ServingStatus;
        let Some((mut c, root, leader)) = three_nodes("readiness").await else { return };
        let (cut, others) = a_follower(&c, leader);
        for id in c.node_ids() {
            readyz_turns(&c, id, 200, Duration::from_secs(20)).await;
            grpc_health_turns(&c, id, ServingStatus::Serving).await;
        }

        // A follower that hears nothing from its leader.
        c.partition(&[cut], &others).await.expect("cut the follower off");
        let (took, body) = readyz_turns(&c, cut, 503, Duration::from_secs(10)).await;
        eprintln!("the cut-off follower was not ready {took:?} into the fault: {body}");
        assert!(body.contains("no word from the leader"), "the reason: {body}");
        grpc_health_turns(&c, cut, ServingStatus::NotServing).await;
        for id in &others {
            let (code, body) = http_get(c.node(*id).http, "/readyz").await;
            assert_eq!(code, 200, "node {id}, still in touch with a quorum: {body}");
        }
        c.net.heal();
        readyz_turns(&c, cut, 200, Duration::from_secs(10)).await;
        grpc_health_turns(&c, cut, ServingStatus::Serving).await;

        // A leader that no quorum answers (the others elect a leader of their own, whom it cannot hear).
        let rest: Vec<u64> = c.node_ids().into_iter().filter(|id| *id != leader).collect();
        c.partition(&[leader], &rest).await.expect("cut the leader off");
        let (took, body) = readyz_turns(&c, leader, 503, Duration::from_secs(10)).await;
        eprintln!("the cut-off leader was not ready {took:?} into the fault: {body}");
        assert!(
            body.contains("heard from no quorum") || body.contains("no word from the leader"),
            "the reason: {body}"
        );
        grpc_health_turns(&c, leader, ServingStatus::NotServing).await;
        c.net.heal();
        readyz_turns(&c, leader, 200, Duration::from_secs(10)).await;
        c.shutdown().await;
        let _ = std::fs::remove_dir_all(&root);
    }
}
