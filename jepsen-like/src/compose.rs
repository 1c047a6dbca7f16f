//! Container mode (`run --compose`) as a `Backend`: the repository's `docker-compose.yml` (three nodes,
//! authentication on) under a Compose project and host ports of its own, as `deploy/ci.sh` brings it up. Clients reach the nodes
//! through the published gRPC ports with a token minted inside node 1 (`raftq token issue`); faults are made
//! with Docker itself: `docker kill -s KILL` and `compose start`, `docker pause`/`unpause`, `docker network
//! disconnect`/`connect` on the project's network (which also cuts the node off from clients), leadership
//! transfers, `docker stop` and `compose start` one node at a time. The project is removed (`down -v`) at the end, on
//! failure, on panic (`Drop`) and when the harness is interrupted (`down_now`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::time::Instant;

use crate::backend::{Admins, Backend, Mechanism, NodeState};
use crate::nemesis::Fault;
use crate::ports::{self, PortLease};

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
/// How long `docker stop` waits after SIGTERM before SIGKILL (a node stops within about 6 s).
const STOP_GRACE_S: u64 = 30;
/// `compose up` attempts on new host ports when a port was taken (by a program that takes no leases).
const UP_ATTEMPTS: u32 = 3;

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
    /// The host ports published (gRPC and HTTP of each node), held until the run ends.
    leases: Vec<PortLease>,
    containers: Vec<String>,
    state: Vec<NodeState>,
    restarts: Vec<u64>,
    pub token: String,
    out: PathBuf,
    admins: Admins,
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
        let args = vec!["-p".into(), project.clone(), "-f".into(), opts.file.display().to_string()];
        let mut c = Compose {
            dc,
            args,
            env: Vec::new(),
            project,
            network: String::new(),
            ports: Vec::new(),
            leases: Vec::new(),
            containers: Vec::new(),
            state: vec![NodeState::Running; NODES as usize],
            restarts: vec![0; NODES as usize],
            token: String::new(),
            out: opts.out,
            admins: Admins::new(None),
            down: false,
        };
        let mut attempt = 1;
        loop {
            c.publish_on_new_ports(&opts.image)?;
            match c.dc_run(&["up", "-d"], Duration::from_secs(180)).await {
                Ok(_) => break,
                Err(e) if attempt < UP_ATTEMPTS && ports::address_in_use(&format!("{e:#}")) => {
                    eprintln!("raftq-jepsen: a host port was taken ({e:#}); compose up again on new ports");
                    let _ = c.dc_run(&["down", "-v", "--remove-orphans", "-t", "10"], Duration::from_secs(120)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e).context("compose up"),
            }
        }
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
        c.admins = Admins::new(Some(c.token.clone()));
        for n in 1..=NODES {
            c.admins.add(n, &format!("127.0.0.1:{}", c.port(n)))?;
            c.restarts[n as usize - 1] = c.restart_count(n).await.unwrap_or(0);
            if c.admins.status(n).await.is_none() {
                bail!("node {n} does not answer Status on 127.0.0.1:{} with the token", c.port(n));
            }
        }
        c.wait_leader(Duration::from_secs(60)).await.context("no leader after compose up")?;
        Ok(c)
    }

    /// Leases host ports for every node's gRPC and HTTP port and names them in the environment of `compose`.
    fn publish_on_new_ports(&mut self, image: &str) -> anyhow::Result<()> {
        self.leases = (0..2 * NODES).map(|_| ports::lease()).collect::<Result<_, _>>().context("leasing host ports")?;
        self.ports = (0..NODES as usize).map(|i| self.leases[2 * i].port()).collect();
        self.env = vec![("RAFTQ_IMAGE".to_string(), image.to_string())];
        for n in 1..=NODES as usize {
            self.env.push((format!("RAFTQ_NODE{n}_GRPC_PORT"), self.leases[2 * (n - 1)].port().to_string()));
            self.env.push((format!("RAFTQ_NODE{n}_HTTP_PORT"), self.leases[2 * (n - 1) + 1].port().to_string()));
        }
        *ACTIVE.lock().expect("compose lock") =
            Some(DownCmd { dc: self.dc.clone(), args: self.args.clone(), env: self.env.clone() });
        Ok(())
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

    fn set(&mut self, n: u64, s: NodeState) {
        self.state[n as usize - 1] = s;
    }

    fn get(&self, n: u64) -> NodeState {
        self.state[n as usize - 1]
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

    /// Disconnects node `n` from the project's network (`on`), or connects it again under its service name.
    async fn cut(&mut self, n: u64, on: bool) -> anyhow::Result<()> {
        let (c, net, alias) = (self.container(n).to_string(), self.network.clone(), format!("node{n}"));
        if on {
            self.docker(&["network", "disconnect", &net, &c]).await?;
            self.set(n, NodeState::Cut);
        } else {
            self.docker(&["network", "connect", "--alias", &alias, &net, &c]).await?;
            self.set(n, NodeState::Running);
        }
        Ok(())
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

impl Backend for Compose {
    fn faults(&self) -> &'static [Fault] {
        &FAULTS
    }

    fn mechanism(&self, m: Mechanism) -> &'static str {
        match m {
            Mechanism::Kill => "docker kill -s KILL",
            Mechanism::Pause => "docker pause",
            Mechanism::Resume => "docker unpause",
            Mechanism::Terminate => "docker stop",
            Mechanism::Partition => " (docker network disconnect; clients cut off too)",
        }
    }

    fn client_addrs(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    fn position(&self, n: u64) -> Option<usize> {
        (1..=NODES).contains(&n).then(|| n as usize - 1)
    }

    fn token(&self) -> Option<String> {
        Some(self.token.clone())
    }

    fn admins(&self) -> &Admins {
        &self.admins
    }

    fn node_ids(&self) -> Vec<u64> {
        (1..=NODES).collect()
    }

    fn state(&self, n: u64) -> NodeState {
        self.get(n)
    }

    async fn kill(&mut self, n: u64) -> anyhow::Result<()> {
        let c = self.container(n).to_string();
        self.docker(&["kill", "-s", "KILL", &c]).await?;
        self.set(n, NodeState::Down);
        Ok(())
    }

    /// `docker stop` (SIGTERM, SIGKILL after `STOP_GRACE_S`) and the container's exit code.
    async fn terminate(&mut self, n: u64) -> String {
        let c = self.container(n).to_string();
        if self.get(n) == NodeState::Paused {
            let _ = self.docker(&["unpause", &c]).await;
        }
        let grace = STOP_GRACE_S.to_string();
        let stopped =
            sh("docker", &strs(&["stop", "-t", &grace, &c]), &[], Duration::from_secs(STOP_GRACE_S + 60)).await;
        self.set(n, NodeState::Down);
        if let Err(e) = stopped {
            return format!("docker stop failed: {e:#}");
        }
        match self.docker(&["inspect", "-f", "{{.State.ExitCode}}", &c]).await {
            Ok(code) if code.trim() == "137" => format!("exit status: 137 (killed {STOP_GRACE_S} s after SIGTERM)"),
            Ok(code) => format!("exit status: {}", code.trim()),
            Err(e) => format!("exit status unknown: {e:#}"),
        }
    }

    async fn start(&mut self, n: u64) -> anyhow::Result<()> {
        self.dc_run(&["start", &format!("node{n}")], Duration::from_secs(120)).await?;
        self.set(n, NodeState::Running);
        self.restarts[n as usize - 1] = self.restart_count(n).await.unwrap_or(0);
        Ok(())
    }

    /// Waits until node `n` answers Status through its published port.
    async fn wait_serving(&mut self, n: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.admins.status(n).await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer on 127.0.0.1:{} within {limit:?}", self.port(n)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A container takes longer to come back than a process.
    async fn restart(&mut self, n: u64) -> Result<(), String> {
        self.start(n).await.map_err(|e| format!("{e:#}"))?;
        self.wait_serving(n, START_WAIT).await
    }

    async fn pause(&mut self, n: u64, on: bool) -> anyhow::Result<()> {
        let c = self.container(n).to_string();
        self.docker(&[if on { "pause" } else { "unpause" }, &c]).await?;
        self.set(n, if on { NodeState::Paused } else { NodeState::Running });
        Ok(())
    }

    /// Containers that stopped or were restarted by Docker without the harness doing it: (node, what).
    async fn reap(&mut self) -> Vec<(u64, String)> {
        let mut gone = Vec::new();
        for n in self.node_ids() {
            if self.get(n) == NodeState::Down {
                continue;
            }
            let status = self.container_status(n).await;
            let count = self.restart_count(n).await.unwrap_or(0);
            let before = self.restarts[n as usize - 1];
            if count > before {
                self.restarts[n as usize - 1] = count;
                gone.push((n, format!("Docker restarted it ({} time(s)); now {status}", count - before)));
            } else if status != "running" && status != "paused" {
                self.set(n, NodeState::Down);
                gone.push((n, status));
            }
        }
        gone
    }

    /// A container that did not come back is started again by heal (containers are never replaced).
    fn mark_broken(&mut self, _n: u64) {}

    /// The minority's containers leave the project's network.
    async fn partition(&mut self, minority: &[u64], _majority: &[u64]) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        for n in minority {
            if let Err(e) = self.cut(*n, true).await {
                failed.push(format!("node{n}: {e:#}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("docker network disconnect: {}", failed.join("; "))
        }
    }

    async fn heal_network(&mut self) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        for n in self.node_ids() {
            if self.get(n) == NodeState::Cut {
                if let Err(e) = self.cut(n, false).await {
                    failed.push(format!("node{n}: {e:#}"));
                }
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("docker network connect: {}", failed.join("; "))
        }
    }

    async fn shutdown(&mut self) {
        self.teardown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
