//! Container mode (`run --compose`): the repository's `docker-compose.yml` (three nodes, authentication on)
//! under a Compose project and host ports of its own, as `deploy/ci.sh` brings it up. Clients reach the nodes
//! through the published gRPC ports with a token minted inside node 1 (`raftq token issue`); faults are made
//! with Docker itself: `docker kill -s KILL` and `compose start`, `docker pause`/`unpause`, `docker network
//! disconnect`/`connect` on the project's network (which also cuts the node off from clients), leadership
//! transfers, `compose restart` one node at a time. The project is removed (`down -v`) at the end, on
//! failure, on panic (`Drop`) and when the harness is interrupted (`down_now`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::history::{FaultPhase, Op, Recorder};
use crate::nemesis::{Fault, Schedule, EXITED, REFUSED_TO_START};

/// The faults that make sense for containers.
pub const FAULTS: [Fault; 7] = [
    Fault::Kill,
    Fault::KillLeader,
    Fault::Pause,
    Fault::PartitionLeader,
    Fault::PartitionSplit,
    Fault::Transfers,
    Fault::RollingRestart,
];

/// The nodes of `docker-compose.yml` (services node1..node3).
pub const NODES: u64 = 3;
/// How long a (re)started container may take to serve again.
const START_WAIT: Duration = Duration::from_secs(60);

/// Refuses the faults container mode cannot make; `all` means all of `FAULTS`.
pub fn check_faults(faults: &[Fault], asked_all: bool) -> anyhow::Result<Vec<Fault>> {
    if asked_all {
        return Ok(FAULTS.to_vec());
    }
    let bad: Vec<&str> = faults.iter().filter(|f| !FAULTS.contains(f)).map(|f| f.name()).collect();
    if !bad.is_empty() {
        bail!(
            "fault(s) {} not available with --compose (containers of docker-compose.yml: no relays, no \
             per-node config or files); --compose supports: {}",
            bad.join(", "),
            FAULTS.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(faults.to_vec())
}

/// Adds `authorization: Bearer <token>` to every call (nothing when there is no token).
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Bearer {
        Bearer(token.and_then(|t| AsciiMetadataValue::try_from(format!("Bearer {t}")).ok()))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// An admin client for `addr` (host:port) with an optional token.
pub fn admin_client(addr: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<Admin> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .timeout(timeout)
        .connect_lazy();
    Ok(AdminClient::with_interceptor(ch, Bearer::new(token)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CState {
    Running,
    Paused,
    /// Killed; `compose start` brings it back.
    Down,
    /// Disconnected from the project's network.
    Cut,
}

/// Enough to run `compose down -v` from the signal handler.
#[derive(Clone)]
struct DownCmd {
    dc: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

static ACTIVE: Mutex<Option<DownCmd>> = Mutex::new(None);

fn run_down(d: &DownCmd) {
    let mut cmd = std::process::Command::new(&d.dc[0]);
    cmd.args(&d.dc[1..]).args(&d.args).args(["down", "-v", "--remove-orphans", "-t", "10"]);
    cmd.envs(d.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let _ = cmd.status();
}

/// Removes the running project, if any (the harness was interrupted).
pub fn down_now() {
    let d = ACTIVE.lock().expect("compose lock").take();
    if let Some(d) = d {
        eprintln!("raftq-jepsen: removing compose project (down -v)");
        run_down(&d);
    }
}

pub struct ComposeOptions {
    pub image: String,
    pub file: PathBuf,
    pub out: PathBuf,
}

pub struct Compose {
    dc: Vec<String>,
    /// `-p <project> -f <file>`.
    args: Vec<String>,
    env: Vec<(String, String)>,
    pub project: String,
    network: String,
    /// Host gRPC port of node `i + 1`.
    pub ports: Vec<u16>,
    containers: Vec<String>,
    pub state: Vec<CState>,
    restarts: Vec<u64>,
    pub token: String,
    out: PathBuf,
    channels: Mutex<HashMap<u64, Admin>>,
    down: bool,
}

/// The Compose command: v2's `docker compose`, else v1's `docker-compose` (as deploy/compose-lib.sh).
fn compose_detect() -> anyhow::Result<Vec<String>> {
    let v2 = std::process::Command::new("docker")
        .args(["compose", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if v2 {
        return Ok(vec!["docker".into(), "compose".into()]);
    }
    let v1 = std::process::Command::new("docker-compose")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if v1 {
        return Ok(vec!["docker-compose".into()]);
    }
    bail!("no Docker Compose (neither `docker compose` nor docker-compose)")
}

/// Host ports below the kernel's ephemeral range that nothing listens on (like deploy/ci.sh).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<u16>().ok()))
        .unwrap_or(32768)
        .max(11000);
    let mut rng = rand::rng();
    let mut out: Vec<u16> = Vec::new();
    for _ in 0..1000 {
        if out.len() == n {
            return Ok(out);
        }
        let p = rng.random_range(10000..low);
        if !out.contains(&p) && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            out.push(p);
        }
    }
    bail!("no {n} free host ports")
}

/// Runs a command; its stdout on success, else an error with its output.
async fn sh(program: &str, args: &[String], env: &[(String, String)], limit: Duration) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .with_context(|| format!("{program} {} took over {limit:?}", args.join(" ")))?
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}: {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn strs(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

impl Compose {
    /// `compose up -d` under a new project with free host ports; waits until every container is healthy and
    /// serves with the token minted in node 1, and a leader is known.
    pub async fn up(opts: ComposeOptions) -> anyhow::Result<Compose> {
        let dc = compose_detect()?;
        if !opts.file.exists() {
            bail!("{} does not exist", opts.file.display());
        }
        // Not pulled: an image missing here would be looked for on Docker Hub.
        if sh("docker", &strs(&["image", "inspect", &opts.image]), &[], Duration::from_secs(30)).await.is_err() {
            bail!("no image {} here: build it (deploy/docker/build.sh {}) or pass --image", opts.image, opts.image);
        }
        let project = format!("raftq-jepsen-{}", std::process::id());
        let ports = free_ports(2 * NODES as usize)?;
        let mut env = vec![("RAFTQ_IMAGE".to_string(), opts.image.clone())];
        for n in 1..=NODES as usize {
            env.push((format!("RAFTQ_NODE{n}_GRPC_PORT"), ports[2 * (n - 1)].to_string()));
            env.push((format!("RAFTQ_NODE{n}_HTTP_PORT"), ports[2 * (n - 1) + 1].to_string()));
        }
        let args = vec!["-p".into(), project.clone(), "-f".into(), opts.file.display().to_string()];
        *ACTIVE.lock().expect("compose lock") = Some(DownCmd { dc: dc.clone(), args: args.clone(), env: env.clone() });
        let mut c = Compose {
            dc,
            args,
            env,
            project,
            network: String::new(),
            ports: (0..NODES as usize).map(|i| ports[2 * i]).collect(),
            containers: Vec::new(),
            state: vec![CState::Running; NODES as usize],
            restarts: vec![0; NODES as usize],
            token: String::new(),
            out: opts.out,
            channels: Mutex::new(HashMap::new()),
            down: false,
        };
        c.dc_run(&["up", "-d"], Duration::from_secs(180)).await.context("compose up")?;
        for n in 1..=NODES {
            let id = c.dc_run(&["ps", "-q", &format!("node{n}")], Duration::from_secs(30)).await?;
            let id = id.trim().to_string();
            if id.is_empty() {
                bail!("compose ps: no container for node{n}");
            }
            c.containers.push(id);
        }
        let nets = sh(
            "docker",
            &strs(&["inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", &c.containers[0]]),
            &[],
            Duration::from_secs(30),
        )
        .await?;
        c.network = nets
            .split_whitespace()
            .find(|n| n.ends_with("_raftq"))
            .context("the containers are on no `*_raftq` network")?
            .to_string();
        // Healthy: raftq-probe /readyz answers 200 (the node knows a leader, has applied what it committed).
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let mut healthy = 0;
            for id in &c.containers {
                let h = sh(
                    "docker",
                    &strs(&["inspect", "-f", "{{.State.Health.Status}}", id]),
                    &[],
                    Duration::from_secs(30),
                )
                .await
                .unwrap_or_default();
                if h.trim() == "healthy" {
                    healthy += 1;
                }
            }
            if healthy == c.containers.len() {
                break;
            }
            if Instant::now() >= deadline {
                bail!("the containers were not all healthy within 180 s");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let token = c
            .dc_run(
                &[
                    "exec",
                    "-T",
                    "node1",
                    "raftq",
                    "token",
                    "issue",
                    "--secret-file",
                    "/secrets/cluster.hs256",
                    "--scopes",
                    "enqueue,work,read,admin",
                    "--ttl",
                    "12h",
                ],
                Duration::from_secs(60),
            )
            .await
            .context("raftq token issue in node1")?;
        c.token = token.trim().to_string();
        if c.token.is_empty() {
            bail!("raftq token issue printed nothing");
        }
        for n in 1..=NODES {
            c.restarts[n as usize - 1] = c.restart_count(n).await.unwrap_or(0);
            if c.status(n).await.is_none() {
                bail!("node {n} does not answer Status on 127.0.0.1:{} with the token", c.port(n));
            }
        }
        c.wait_leader(Duration::from_secs(60)).await.context("no leader after compose up")?;
        Ok(c)
    }

    async fn dc_run(&self, a: &[&str], limit: Duration) -> anyhow::Result<String> {
        let mut args = self.dc[1..].to_vec();
        args.extend(self.args.iter().cloned());
        args.extend(a.iter().map(|s| s.to_string()));
        sh(&self.dc[0], &args, &self.env, limit).await
    }

    fn port(&self, n: u64) -> u16 {
        self.ports[n as usize - 1]
    }

    fn container(&self, n: u64) -> &str {
        &self.containers[n as usize - 1]
    }

    pub fn addrs(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    pub fn ids(&self) -> Vec<u64> {
        (1..=NODES).collect()
    }

    pub fn up_ids(&self) -> Vec<u64> {
        self.ids().into_iter().filter(|n| self.state[*n as usize - 1] == CState::Running).collect()
    }

    fn set(&mut self, n: u64, s: CState) {
        self.state[n as usize - 1] = s;
    }

    fn get(&self, n: u64) -> CState {
        self.state[n as usize - 1]
    }

    fn admin(&self, n: u64) -> Admin {
        let mut m = self.channels.lock().expect("channels lock");
        m.entry(n)
            .or_insert_with(|| {
                admin_client(&format!("127.0.0.1:{}", self.port(n)), Some(&self.token), Duration::from_secs(10))
                    .expect("a host:port is a valid url")
            })
            .clone()
    }

    pub async fn status(&self, n: u64) -> Option<pb::NodeStatus> {
        let mut a = self.admin(n);
        let call = a.status(pb::NodeStatusRequest {});
        tokio::time::timeout(Duration::from_millis(1500), call).await.ok()?.ok().map(|r| r.into_inner())
    }

    pub async fn statuses(&self) -> BTreeMap<u64, pb::NodeStatus> {
        let mut set = tokio::task::JoinSet::new();
        for n in self.up_ids() {
            let mut a = self.admin(n);
            set.spawn(async move {
                let call = a.status(pb::NodeStatusRequest {});
                (n, tokio::time::timeout(Duration::from_millis(1500), call).await.ok().and_then(|r| r.ok()))
            });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((n, Some(s))) = r {
                out.insert(n, s.into_inner());
            }
        }
        out
    }

    pub async fn leader(&self) -> Option<u64> {
        self.statuses().await.values().filter(|s| s.role == "LEADER").max_by_key(|s| s.term).map(|s| s.node_id)
    }

    pub async fn wait_leader(&self, limit: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                bail!("no leader within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every running node has applied what the leader has committed.
    pub async fn wait_caught_up(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let st = self.statuses().await;
            if let Some(l) = st.values().filter(|s| s.role == "LEADER").max_by_key(|s| s.term) {
                let target = l.committed_index;
                if self.up_ids().iter().all(|n| st.get(n).is_some_and(|s| s.applied_index >= target)) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let view: Vec<String> =
                    st.values().map(|s| format!("{}:{}@{}/{}", s.node_id, s.role, s.applied_index, s.term)).collect();
                bail!("the cluster did not catch up within {limit:?}: {}", view.join(" "));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Waits until node `n` answers Status through its published port.
    async fn wait_serving(&self, n: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.status(n).await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer on 127.0.0.1:{} within {limit:?}", self.port(n)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub async fn transfer(&self, via: u64, to: u64) -> Result<u64, String> {
        let mut a = self.admin(via);
        a.transfer_leader(pb::TransferLeaderRequest { to, timeout_ms: 5_000 })
            .await
            .map(|r| r.into_inner().took_ms)
            .map_err(|e| e.message().to_string())
    }

    pub async fn digests(&self) -> BTreeMap<u64, pb::DigestResponse> {
        let mut set = tokio::task::JoinSet::new();
        for n in self.up_ids() {
            let mut a = self.admin(n);
            set.spawn(async move {
                let call = a.digest(pb::DigestRequest {});
                (n, tokio::time::timeout(Duration::from_secs(10), call).await.ok().and_then(|r| r.ok()))
            });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((n, Some(d))) = r {
                out.insert(n, d.into_inner());
            }
        }
        out
    }

    async fn docker(&self, a: &[&str]) -> anyhow::Result<String> {
        sh("docker", &strs(a), &[], Duration::from_secs(60)).await
    }

    async fn restart_count(&self, n: u64) -> anyhow::Result<u64> {
        let s = self.docker(&["inspect", "-f", "{{.RestartCount}}", self.container(n)]).await?;
        Ok(s.trim().parse().unwrap_or(0))
    }

    async fn container_status(&self, n: u64) -> String {
        self.docker(&["inspect", "-f", "{{.State.Status}}", self.container(n)])
            .await
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    pub async fn kill(&mut self, n: u64) -> anyhow::Result<()> {
        let c = self.container(n).to_string();
        self.docker(&["kill", "-s", "KILL", &c]).await?;
        self.set(n, CState::Down);
        Ok(())
    }

    pub async fn start(&mut self, n: u64) -> Result<(), String> {
        self.dc_run(&["start", &format!("node{n}")], Duration::from_secs(120)).await.map_err(|e| format!("{e:#}"))?;
        self.set(n, CState::Running);
        self.restarts[n as usize - 1] = self.restart_count(n).await.unwrap_or(0);
        self.wait_serving(n, START_WAIT).await
    }

    pub async fn pause(&mut self, n: u64, on: bool) -> anyhow::Result<()> {
        let c = self.container(n).to_string();
        self.docker(&[if on { "pause" } else { "unpause" }, &c]).await?;
        self.set(n, if on { CState::Paused } else { CState::Running });
        Ok(())
    }

    /// Disconnects node `n` from the project's network (`on`), or connects it again under its service name.
    pub async fn cut(&mut self, n: u64, on: bool) -> anyhow::Result<()> {
        let (c, net, alias) = (self.container(n).to_string(), self.network.clone(), format!("node{n}"));
        if on {
            self.docker(&["network", "disconnect", &net, &c]).await?;
            self.set(n, CState::Cut);
        } else {
            self.docker(&["network", "connect", "--alias", &alias, &net, &c]).await?;
            self.set(n, CState::Running);
        }
        Ok(())
    }

    /// `compose restart nodeN` (SIGTERM, then start) and a wait until it serves.
    pub async fn restart(&mut self, n: u64) -> Result<(), String> {
        self.dc_run(&["restart", "-t", "30", &format!("node{n}")], Duration::from_secs(120))
            .await
            .map_err(|e| format!("{e:#}"))?;
        self.set(n, CState::Running);
        self.restarts[n as usize - 1] = self.restart_count(n).await.unwrap_or(0);
        self.wait_serving(n, START_WAIT).await
    }

    /// Containers that stopped or were restarted by Docker without the harness doing it: (node, what).
    pub async fn reap(&mut self) -> Vec<(u64, String)> {
        let mut gone = Vec::new();
        for n in self.ids() {
            if self.get(n) == CState::Down {
                continue;
            }
            let status = self.container_status(n).await;
            let count = self.restart_count(n).await.unwrap_or(0);
            let before = self.restarts[n as usize - 1];
            if count > before {
                self.restarts[n as usize - 1] = count;
                gone.push((n, format!("Docker restarted it ({} time(s)); now {status}", count - before)));
            } else if status != "running" && status != "paused" {
                self.set(n, CState::Down);
                gone.push((n, status));
            }
        }
        gone
    }

    /// `compose logs` into the output directory, then `down -v`. Idempotent.
    pub async fn teardown(&mut self) {
        if self.down {
            return;
        }
        self.down = true;
        if let Ok(logs) = self.dc_run(&["logs", "--no-color", "--timestamps"], Duration::from_secs(60)).await {
            let _ = std::fs::write(self.out.join("compose.log"), logs);
        }
        eprintln!("raftq-jepsen: compose down -v (project {})", self.project);
        let t = Instant::now();
        if let Err(e) = self.dc_run(&["down", "-v", "--remove-orphans", "-t", "10"], Duration::from_secs(120)).await {
            eprintln!("raftq-jepsen: compose down: {e:#}");
            // Retried from the guard below.
            self.down = false;
            return;
        }
        *ACTIVE.lock().expect("compose lock") = None;
        eprintln!("raftq-jepsen: compose down took {:.1} s", t.elapsed().as_secs_f64());
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if !self.down {
            run_down(&DownCmd { dc: self.dc.clone(), args: self.args.clone(), env: self.env.clone() });
            *ACTIVE.lock().expect("compose lock") = None;
        }
    }
}

/// The faults of container mode, on the same schedule as the process mode's `Nemesis`.
pub struct ComposeNemesis<'a> {
    pub c: &'a mut Compose,
    rec: Arc<Recorder>,
    rng: StdRng,
}

impl<'a> ComposeNemesis<'a> {
    pub fn new(c: &'a mut Compose, rec: Arc<Recorder>, rng: StdRng) -> ComposeNemesis<'a> {
        ComposeNemesis { c, rec, rng }
    }

    fn event(&self, fault: Fault, phase: FaultPhase, detail: impl Into<String>) {
        self.event_on(fault, phase, detail, None);
    }

    fn event_on(&self, fault: Fault, phase: FaultPhase, detail: impl Into<String>, node: Option<u64>) {
        let detail = detail.into();
        eprintln!(
            "[{:>7.1}s] {:<18} {:<5} {detail}",
            self.rec.now() as f64 / 1000.0,
            fault.name(),
            match phase {
                FaultPhase::Start => "start",
                FaultPhase::Stop => "stop",
                FaultPhase::Note => "note",
            }
        );
        self.rec.record(Op::Nemesis { fault: fault.name().into(), phase, detail, node });
    }

    fn between(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(if hi > lo { self.rng.random_range(lo..=hi) } else { lo })
    }

    pub async fn run(&mut self, faults: &[Fault], until: Instant, s: &Schedule) {
        while Instant::now() < until {
            let quiet = self.between(s.quiet_ms);
            tokio::time::sleep_until((Instant::now() + quiet).min(until)).await;
            if Instant::now() >= until {
                break;
            }
            let f = *faults.choose(&mut self.rng).expect("at least one fault");
            let hold = self.between(s.hold_ms);
            self.reap(f).await;
            self.step(f, hold).await;
            self.reap(f).await;
            if self.c.wait_leader(Duration::from_secs(15)).await.is_err() {
                self.event(f, FaultPhase::Note, "no leader 15 s after the fault stopped");
            }
        }
    }

    async fn reap(&mut self, f: Fault) {
        for (n, what) in self.c.reap().await {
            self.event_on(f, FaultPhase::Note, format!("node {n} {EXITED} ({what})"), Some(n));
        }
    }

    async fn pick(&mut self, leader_share: f64) -> Option<u64> {
        let ups = self.c.up_ids();
        if self.rng.random_bool(leader_share) {
            if let Some(l) = self.c.leader().await {
                return Some(l);
            }
        }
        ups.choose(&mut self.rng).copied()
    }

    async fn start(&mut self, f: Fault, n: u64) {
        if let Err(e) = self.c.start(n).await {
            self.event_on(f, FaultPhase::Note, format!("node {n} {REFUSED_TO_START}: {e}"), Some(n));
        }
    }

    fn failed(&self, f: Fault, what: &str, e: anyhow::Error) {
        self.event(f, FaultPhase::Note, format!("{what} failed: {e:#}"));
    }

    pub async fn step(&mut self, f: Fault, hold: Duration) {
        match f {
            Fault::Kill | Fault::KillLeader => {
                let share = if f == Fault::KillLeader { 1.0 } else { 0.0 };
                let Some(n) = self.pick(share).await else { return };
                self.event(f, FaultPhase::Start, format!("docker kill -s KILL node{n}"));
                if let Err(e) = self.c.kill(n).await {
                    return self.failed(f, "docker kill", e);
                }
                tokio::time::sleep(hold).await;
                self.start(f, n).await;
                self.event(f, FaultPhase::Stop, format!("compose start node{n}: node {n} restarted"));
            }
            Fault::Pause => {
                let Some(n) = self.pick(0.5).await else { return };
                self.event(f, FaultPhase::Start, format!("docker pause node{n}"));
                if let Err(e) = self.c.pause(n, true).await {
                    return self.failed(f, "docker pause", e);
                }
                tokio::time::sleep(hold).await;
                if let Err(e) = self.c.pause(n, false).await {
                    self.failed(f, "docker unpause", e);
                }
                self.event(f, FaultPhase::Stop, format!("docker unpause node{n}"));
            }
            Fault::PartitionLeader | Fault::PartitionSplit => {
                let minority: Vec<u64> = if f == Fault::PartitionLeader {
                    let Some(l) = self.c.leader().await else { return };
                    vec![l]
                } else {
                    let mut ids = self.c.up_ids();
                    ids.shuffle(&mut self.rng);
                    let k = self.rng.random_range(1..=((NODES as usize - 1) / 2).max(1));
                    ids.into_iter().take(k).collect()
                };
                let majority: Vec<u64> = self.c.ids().into_iter().filter(|n| !minority.contains(n)).collect();
                self.event(
                    f,
                    FaultPhase::Start,
                    format!("split {minority:?} | {majority:?} (docker network disconnect; clients cut off too)"),
                );
                let mut cut = Vec::new();
                for n in &minority {
                    match self.c.cut(*n, true).await {
                        Ok(()) => cut.push(*n),
                        Err(e) => self.failed(f, "docker network disconnect", e),
                    }
                }
                tokio::time::sleep(hold).await;
                for n in cut {
                    if let Err(e) = self.c.cut(n, false).await {
                        self.failed(f, "docker network connect", e);
                    }
                }
                self.event(f, FaultPhase::Stop, "healed (docker network connect)");
            }
            Fault::Transfers => {
                let k = self.rng.random_range(3..=8);
                self.event(f, FaultPhase::Start, format!("{k} leadership transfers"));
                let mut done = Vec::new();
                for _ in 0..k {
                    let leader = self.c.leader().await;
                    let ups = self.c.up_ids();
                    let targets: Vec<u64> = ups.iter().copied().filter(|x| Some(*x) != leader).collect();
                    let (Some(to), Some(via)) =
                        (targets.choose(&mut self.rng).copied(), ups.choose(&mut self.rng).copied())
                    else {
                        break;
                    };
                    match self.c.transfer(via, to).await {
                        Ok(ms) => done.push(format!("{to}:{ms}ms")),
                        Err(e) => done.push(format!("{to}:failed ({e})")),
                    }
                    let pause = self.between((100, 600));
                    tokio::time::sleep(pause).await;
                }
                self.event(f, FaultPhase::Stop, format!("transfers {}", done.join(", ")));
            }
            Fault::RollingRestart => {
                let ids = self.c.ids();
                self.event(f, FaultPhase::Start, format!("compose restart {ids:?} in turn"));
                for n in ids {
                    if let Err(e) = self.c.restart(n).await {
                        self.event_on(f, FaultPhase::Note, format!("node {n} {REFUSED_TO_START}: {e}"), Some(n));
                    }
                    if let Err(e) = self.c.wait_caught_up(Duration::from_secs(30)).await {
                        self.event(f, FaultPhase::Note, e.to_string());
                    }
                }
                self.event(f, FaultPhase::Stop, "every node restarted");
            }
            other => self.event(other, FaultPhase::Note, "skipped: not available with --compose"),
        }
    }

    /// Unpauses, reconnects and starts every node; waits for a leader and for every node to catch up.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        let f = Fault::Kill; // notes only
        self.reap(f).await;
        for n in self.c.ids() {
            let r = match self.c.get(n) {
                CState::Running => Ok(()),
                CState::Paused => self.c.pause(n, false).await,
                CState::Cut => self.c.cut(n, false).await,
                CState::Down => {
                    self.start(f, n).await;
                    Ok(())
                }
            };
            if let Err(e) = r {
                self.event(f, FaultPhase::Note, format!("heal: node {n}: {e:#}"));
            }
        }
        self.c.wait_leader(Duration::from_secs(30)).await?;
        self.c.wait_caught_up(Duration::from_secs(60)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn compose_mode_refuses_faults_it_cannot_make() {
        let e = check_faults(&[Fault::Kill, Fault::Corrupt, Fault::Delay], false).unwrap_err().to_string();
        assert!(e.contains("corrupt, delay") && e.contains("--compose supports: kill, kill-leader"), "{e}");
        assert_eq!(
            check_faults(&[Fault::Pause, Fault::Transfers], false).unwrap(),
            vec![Fault::Pause, Fault::Transfers]
        );
        assert_eq!(check_faults(&Fault::ALL, true).unwrap(), FAULTS.to_vec());
    }

    #[test]
    fn bearer_adds_the_token_only_when_there_is_one() {
        let r = Bearer::new(Some("abc")).call(tonic::Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer abc"));
        let r = Bearer::new(None).call(tonic::Request::new(())).unwrap();
        assert!(r.metadata().get("authorization").is_none());
    }
}
