//! raftq-jepsen: runs a cluster of real `raftq serve` processes, drives a workload through the SDK while
//! injecting faults, records every operation in a history, heals, drains, and checks the history.
//!
//! | module | owns |
//! |---|---|
//! | `backend` | the cluster under test as one trait; admin calls (status, leader, transfer, digests), waits |
//! | `cluster` | backend: node processes (configs, data dirs, signals, corruption, membership) |
//! | `compose` | backend: the repository's docker-compose cluster, Docker-made faults, its teardown |
//! | `ports` | ports leased for nodes and published ports, without the bind-and-release race |
//! | `relay` | fault-injecting TCP relays in front of every node's Raft and API ports (why: see there) |
//! | `workload` | producers and workers through `raftq-client`, recording each operation |
//! | `nemesis` | the faults and their schedule from the seed, on any backend; healing |
//! | `upgrade` | the upgrade scenario: a rolling upgrade from the previous release, in place of the faults |
//! | `history` | the event types and the JSON-lines history file |
//! | `checker` | the checkers (pure) and their tests on crafted histories |
//! | `report` | the JSON summary and the readable report |
//!
//! Exit status: 0 when every check passes, 1 on any violation, 2 when the harness itself failed (no cluster,
//! an unreadable history).

mod backend;
mod checker;
mod cluster;
mod compose;
mod history;
mod nemesis;
mod ports;
mod relay;
mod report;
mod upgrade;
mod workload;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use raftq_client::{CancellationToken, Producer, ProducerConfig, TaskState};
use raftq_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use crate::backend::{admin_client, Backend};
use crate::cluster::{Cluster, ClusterOptions, SERVER_SETTINGS};
use crate::compose::{Compose, ComposeOptions};
use crate::history::{Op, Phase, Recorder, ResultKind, RunRead};
use crate::nemesis::{Fault, Nemesis, Schedule};
use crate::upgrade::Upgrade;
use crate::workload::WorkloadConfig;

#[derive(Parser)]
#[command(name = "raftq-jepsen", about = "Fault injection, recorded histories and checkers for raftq")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a cluster under faults, record the history, heal, drain and check.
    Run(Box<RunArgs>),
    /// Check a recorded history file again.
    Check {
        #[arg(long)]
        history: PathBuf,
    },
}

/// What happens to the cluster while the workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Random faults among `--faults` for `--time-limit` seconds.
    Faults,
    /// A rolling upgrade from `--old-bin` to `--bin` (upgrade.rs), in place of the faults; `--faults` and
    /// `--time-limit` do not apply.
    Upgrade,
}

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Unique values into one queue, results completed or failed (workload.rs).
    Default,
    /// The same under a running cap (4), three concurrency keys (limits 3, 2, 2) weighted 3:1:1 and a rate
    /// limit on one key (`LimitsPlan::standard`); handlers hold tasks 20-250 ms. Also checks that no more ran
    /// than the cap or a key's limit (checker/limits.rs).
    Limits,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// The raftq binary (default: next to this binary, then target/release/raftq, then target/debug/raftq).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// What the run does to the cluster.
    #[arg(long, value_enum, default_value = "faults")]
    scenario: Scenario,
    /// What the clients do.
    #[arg(long, value_enum, default_value = "default")]
    workload: Workload,
    /// With `--workload limits`: set this running cap on the server instead of the one the history records
    /// and the checker holds the run to (4), to see the checker catch a cap that does not hold.
    #[arg(long)]
    limits_server_cap: Option<u32>,
    /// The previous release's raftq binary, which the nodes start on (`--scenario upgrade`).
    #[arg(long)]
    old_bin: Option<PathBuf>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Seconds of faults (the run adds start, heal, drain and checks).
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Seed of every random choice (the schedule, the targets, the workload); random when not given.
    #[arg(long)]
    seed: Option<u64>,
    /// Faults to draw from, comma-separated, or `all`; `none` runs the workload without faults.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    faults: Vec<String>,
    /// Output directory (history.jsonl, summary.json, report.txt, node data and logs).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    producers: u32,
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Enqueue requests per second per producer (a fifth of them are batches of 2-8).
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Lease asked for each delivery, ms.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Share of deliveries whose handler sleeps past the lease (their results must be refused), on the slow
    /// workers only.
    #[arg(long, default_value_t = 0.25)]
    slow: f64,
    /// How many of the workers are slow sometimes (the others answer at once, so the longest time without a
    /// delivery measures the cluster, not the handlers).
    #[arg(long, default_value_t = 1)]
    slow_workers: u32,
    /// Quiet time between faults, seconds (min,max).
    #[arg(long, value_delimiter = ',', default_value = "2,5")]
    quiet_s: Vec<u64>,
    /// How long a fault is held, seconds (min,max).
    #[arg(long, value_delimiter = ',', default_value = "3,10")]
    hold_s: Vec<u64>,
    /// Longest drain after heal, seconds.
    #[arg(long, default_value_t = 180)]
    drain_timeout: u64,
    /// Extra TOML for every node's config: its top-level keys replace the harness's own settings of the same
    /// name (e.g. the product's default election timers instead of the harness's slower ones).
    #[arg(long)]
    server_config: Option<PathBuf>,
    /// RAFTQ_LOG for the nodes.
    #[arg(long, default_value = "warn")]
    node_log: String,
    /// Keep the nodes' data directories after a passing run.
    #[arg(long)]
    keep_data: bool,
    /// Container mode: run the repository's docker-compose.yml (3 nodes, authentication on) under a project
    /// and host ports of its own instead of node processes; faults: kill, kill-leader, pause,
    /// partition-leader, partition-split, transfers, rolling-restart.
    #[arg(long)]
    compose: bool,
    /// The image of the compose nodes (RAFTQ_IMAGE), with --compose.
    #[arg(long, default_value = "raftq:latest")]
    image: String,
    /// The compose file, with --compose (default: the repository's docker-compose.yml).
    #[arg(long, requires = "compose")]
    compose_file: Option<PathBuf>,
}

fn parse_faults(names: &[String]) -> anyhow::Result<Vec<Fault>> {
    let mut out = Vec::new();
    for n in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match n {
            "all" => out.extend(Fault::ALL),
            "none" => {}
            _ => match Fault::ALL.iter().find(|f| f.name() == n) {
                Some(f) => out.push(*f),
                None => bail!(
                    "unknown fault {n:?}; known: {}",
                    Fault::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                ),
            },
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn workspace_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target")
}

fn find_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(b) = given {
        if !b.exists() {
            bail!("{} does not exist", b.display());
        }
        return Ok(b);
    }
    let mut candidates = Vec::new();
    if let Ok(me) = std::env::current_exe() {
        if let Some(dir) = me.parent() {
            candidates.push(dir.join("raftq"));
        }
    }
    candidates.push(workspace_target().join("release").join("raftq"));
    candidates.push(workspace_target().join("debug").join("raftq"));
    candidates
        .into_iter()
        .find(|p| p.exists())
        .context("no raftq binary: build it (cargo build --release -p raftq) or pass --bin")
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    // Interrupted: no node process may outlive the harness.
    tokio::spawn(async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        cluster::kill_all();
        compose::down_now();
        eprintln!("raftq-jepsen: interrupted; node processes killed");
        std::process::exit(2);
    });
    let code = match cli.cmd {
        Cmd::Check { history } => match history::read_history(&history) {
            Ok(events) => {
                let a = checker::check(&events);
                print!("{}", report::text(&report::Summary::offline(&history, a.clone())));
                if a.valid {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("raftq-jepsen: {e:#}");
                2
            }
        },
        Cmd::Run(args) => match run(*args).await {
            Ok(valid) => {
                if valid {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("raftq-jepsen: {e:#}");
                2
            }
        },
    };
    std::process::exit(code);
}

/// How long the workload runs on the previous release before the upgrade scenario's first step.
const UPGRADE_LOAD: Duration = Duration::from_secs(5);

/// Polls every position's node for the leader and records each change, and each node's binary and cluster
/// versions when they change.
async fn monitor(addrs: Vec<String>, token: Option<String>, rec: Arc<Recorder>, stop: CancellationToken) {
    let clients: Vec<_> = addrs
        .iter()
        .filter_map(|a| admin_client(a, token.as_deref(), Duration::from_millis(300), Duration::from_millis(800)).ok())
        .collect();
    let mut last: Option<(Option<u64>, u64)> = None;
    let mut versions: HashMap<u64, (u32, u32)> = HashMap::new();
    while !stop.is_cancelled() {
        let mut set = tokio::task::JoinSet::new();
        for c in &clients {
            let mut c = c.clone();
            set.spawn(async move { c.status(pb::NodeStatusRequest {}).await.ok().map(|r| r.into_inner()) });
        }
        let mut best: Option<(u64, u64)> = None;
        let mut max_term = 0;
        while let Some(r) = set.join_next().await {
            if let Ok(Some(s)) = r {
                if versions.insert(s.node_id, (s.version, s.cluster_version)) != Some((s.version, s.cluster_version)) {
                    rec.record(Op::ClusterVersion {
                        node: s.node_id,
                        version: s.version,
                        cluster_version: s.cluster_version,
                    });
                }
                max_term = max_term.max(s.term);
                if s.role == "LEADER" && best.is_none_or(|b| s.term > b.1) {
                    best = Some((s.node_id, s.term));
                }
            }
        }
        let now = match best {
            Some((l, t)) => (Some(l), t),
            None => (None, max_term),
        };
        if last != Some(now) {
            rec.record(Op::Leader { leader: now.0, term: now.1 });
            last = Some(now);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// This machine's wall clock, ms since the Unix epoch (the nodes stamp leases with it).
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn state_name(s: TaskState) -> &'static str {
    match s {
        TaskState::Pending => "pending",
        TaskState::InProgress => "in_progress",
        TaskState::Completed => "completed",
        TaskState::Failed => "failed",
        TaskState::Cancelled => "cancelled",
        TaskState::DeadLettered => "dead_lettered",
        _ => "unknown",
    }
}

/// (state, attempts, result) as read from the cluster.
type FinalRead = (String, u32, String);

/// Task ids the history knows: acknowledged enqueues and deliveries.
fn known_tasks(rec: &Recorder) -> HashSet<String> {
    rec.with_events(|evs| {
        let mut ids = HashSet::new();
        for e in evs {
            match &e.op {
                Op::Enqueue { phase: Phase::Ok, task_id: Some(id), .. } => {
                    ids.insert(id.clone());
                }
                Op::Deliver { task_id, .. } => {
                    ids.insert(task_id.clone());
                }
                _ => {}
            }
        }
        ids
    })
}

/// The last error a final read got (other than NOT_FOUND), for the drain's note.
static LAST_READ_ERROR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Runs `read` for each id, 32 at a time, until `deadline`; an id whose read gives nothing or does not finish in
/// time is left out.
async fn read_each<T, F, Fut>(ids: Vec<String>, deadline: Instant, read: F) -> Vec<(String, T)>
where
    T: Send + 'static,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<T>> + Send + 'static,
{
    let mut out = Vec::new();
    for chunk in ids.chunks(32) {
        if Instant::now() >= deadline {
            break;
        }
        let mut set = tokio::task::JoinSet::new();
        for id in chunk {
            let r = read(id.clone());
            let id = id.clone();
            set.spawn(async move { (id, tokio::time::timeout_at(deadline, r).await) });
        }
        while let Some(Ok((id, r))) = set.join_next().await {
            if let Ok(Some(v)) = r {
                out.push((id, v));
            }
        }
    }
    out
}

/// Reads each task's result (a linearizable read through the leader) until `deadline`; a task whose read fails or
/// does not finish in time is left out.
async fn read_finals(p: &Producer, ids: Vec<String>, deadline: Instant) -> HashMap<String, FinalRead> {
    let read = |id: String| {
        let p = p.clone();
        async move {
            match p.result(&id, Duration::ZERO).await {
                Ok(r) => {
                    Some((state_name(r.state).to_string(), r.attempts, String::from_utf8_lossy(&r.result).into_owned()))
                }
                Err(e) if e.reason() == Some("NOT_FOUND") => Some(("not_found".to_string(), 0, String::new())),
                Err(e) => {
                    *LAST_READ_ERROR.lock().expect("read error lock") = Some(e.to_string());
                    None
                }
            }
        }
    };
    read_each(ids, deadline, read).await.into_iter().collect()
}

/// Tasks with a retryable failure the worker sent but never learned the outcome of.
fn uncertain_retries(rec: &Recorder) -> Vec<String> {
    rec.with_events(|evs| {
        let mut last: HashMap<(&str, u64), Phase> = HashMap::new();
        for e in evs {
            if let Op::Result { task_id, token, outcome: ResultKind::FailRetryable, phase, .. } = &e.op {
                last.insert((task_id.as_str(), *token), *phase);
            }
        }
        let mut ids: Vec<String> = last
            .into_iter()
            .filter(|(_, p)| matches!(p, Phase::Info | Phase::Invoke))
            .map(|((id, _), _)| id.to_string())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    })
}

/// Reads each task's runs until `deadline`; a task whose read fails is left out.
async fn read_runs(p: &Producer, ids: Vec<String>, deadline: Instant) -> Vec<(String, Vec<RunRead>)> {
    let read = |id: String| {
        let p = p.clone();
        async move {
            let task = p.get(&id).await.ok()?;
            Some(
                task.runs
                    .iter()
                    .map(|r| RunRead { token: r.token, outcome: r.outcome.clone(), ended_at_ms: r.ended_at_ms })
                    .collect::<Vec<_>>(),
            )
        }
    };
    let mut out = read_each(ids, deadline, read).await;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn terminal(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled" | "dead_lettered")
}

/// Keeps the workers running until every known task is terminal and the server holds no task the history
/// has not seen, or until `limit`. Returns the terminal tasks read, and why it stopped.
async fn drain(
    rec: &Recorder,
    p: &Producer,
    c: &impl Backend,
    limit: Duration,
) -> (HashMap<String, FinalRead>, String) {
    let deadline = Instant::now() + limit;
    let mut done: HashMap<String, FinalRead> = HashMap::new();
    loop {
        let known = known_tasks(rec);
        let todo: Vec<String> = known.iter().filter(|id| !done.contains_key(*id)).cloned().collect();
        for (id, f) in read_finals(p, todo, deadline).await {
            if terminal(&f.0) {
                done.insert(id, f);
            }
        }
        let left = known.iter().filter(|id| !done.contains_key(*id)).count();
        let on_server = match tokio::time::timeout_at(deadline, c.digests()).await {
            Ok(d) => d.values().map(|d| d.tasks).max().unwrap_or(0),
            Err(_) => 0,
        };
        let unseen = on_server.saturating_sub(known.len() as u64);
        if left == 0 && unseen == 0 {
            return (done, format!("drained: {} tasks terminal", known.len()));
        }
        if Instant::now() >= deadline {
            return (
                done,
                format!(
                    "drain timed out after {limit:?}: {left} known tasks not terminal, {unseen} unseen on the server{}",
                    match LAST_READ_ERROR.lock().expect("read error lock").as_deref() {
                        Some(e) => format!(" (last read error: {e})"),
                        None => String::new(),
                    }
                ),
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let mut faults = parse_faults(&args.faults)?;
    let old_bin = match (args.scenario, &args.old_bin) {
        (Scenario::Upgrade, _) if args.compose => bail!("the upgrade scenario needs node processes (not --compose)"),
        (Scenario::Upgrade, None) => bail!("--scenario upgrade needs --old-bin (the previous release's raftq)"),
        (Scenario::Upgrade, Some(b)) if !b.exists() => bail!("{} does not exist", b.display()),
        (Scenario::Upgrade, Some(b)) => {
            if args.nodes != 3 {
                bail!("the upgrade scenario runs 3 nodes");
            }
            faults = vec![];
            Some(b.clone())
        }
        (Scenario::Faults, Some(_)) => bail!("--old-bin goes with --scenario upgrade"),
        (Scenario::Faults, None) => None,
    };
    if args.compose {
        let all = args.faults.iter().any(|f| f.trim() == "all");
        faults = compose::check_faults(&faults, all)?;
        if args.nodes != compose::NODES {
            bail!("--compose runs docker-compose.yml's {} nodes: --nodes must be {}", compose::NODES, compose::NODES);
        }
    }
    if args.workload == Workload::Limits && args.scenario == Scenario::Upgrade {
        bail!("--workload limits needs cluster version 2 from the start: not with --scenario upgrade");
    }
    if args.limits_server_cap.is_some() && args.workload != Workload::Limits {
        bail!("--limits-server-cap goes with --workload limits");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    if args.nodes < 3 {
        bail!("--nodes must be at least 3 (faults need a majority to survive)");
    }
    let (quiet, hold) = match (args.quiet_s.as_slice(), args.hold_s.as_slice()) {
        ([q0, q1], [h0, h1]) if q0 <= q1 && h0 <= h1 => ((q0 * 1000, q1 * 1000), (h0 * 1000, h1 * 1000)),
        _ => bail!("--quiet-s and --hold-s take MIN,MAX"),
    };
    let bin = if args.compose { None } else { Some(find_bin(args.bin.clone())?) };
    let out = match &args.out {
        Some(o) => o.clone(),
        None => {
            let secs =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            workspace_target().join("jepsen").join(format!("{secs}-{seed}"))
        }
    };
    std::fs::create_dir_all(&out)?;
    let fault_names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    let mut notes = Vec::new();
    let schedule = Schedule { quiet_ms: quiet, hold_ms: hold };
    if let Some(bin) = bin {
        let mut settings = match args.scenario {
            Scenario::Faults => SERVER_SETTINGS.to_string(),
            Scenario::Upgrade => upgrade::server_settings(SERVER_SETTINGS),
        };
        if let Some(extra) = &args.server_config {
            settings = with_overrides(&settings, &std::fs::read_to_string(extra)?);
        }
        match &old_bin {
            Some(old) => eprintln!(
                "raftq-jepsen: seed {seed}, {} nodes, upgrade from {} to {}, output {}",
                args.nodes,
                old.display(),
                bin.display(),
                out.display()
            ),
            None => eprintln!(
                "raftq-jepsen: seed {seed}, {} nodes, {} s of faults [{}], binary {}, output {}",
                args.nodes,
                args.time_limit,
                fault_names.join(","),
                bin.display(),
                out.display()
            ),
        }
        let rec = Arc::new(Recorder::create(&out.join("history.jsonl"))?);
        let started = Instant::now();
        let cluster = Cluster::start(ClusterOptions {
            bin: bin.clone(),
            old_bin,
            root: out.join("nodes"),
            nodes: args.nodes,
            settings,
            node_log: args.node_log.clone(),
        })
        .await?;
        let run = Run { args: &args, rec, started, seed, faults: &faults, schedule, notes, out: &out };
        exercise_and_stop(cluster, run).await
    } else {
        let file = args
            .compose_file
            .clone()
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("docker-compose.yml"));
        let file = file.canonicalize().with_context(|| format!("compose file {}", file.display()))?;
        eprintln!(
            "raftq-jepsen: seed {seed}, container mode ({}, image {}), {} s of faults [{}], output {}",
            file.display(),
            args.image,
            args.time_limit,
            fault_names.join(","),
            out.display()
        );
        let rec = Arc::new(Recorder::create(&out.join("history.jsonl"))?);
        let started = Instant::now();
        let c = Compose::up(ComposeOptions { image: args.image.clone(), file, out: out.clone() }).await?;
        let note = format!(
            "container mode: compose project {}, image {}, gRPC ports {:?}; node logs in compose.log",
            c.project, args.image, c.ports
        );
        eprintln!("[{:>7.1}s] {note}", rec.now() as f64 / 1000.0);
        notes.push(note);
        let run = Run { args: &args, rec, started, seed, faults: &faults, schedule, notes, out: &out };
        exercise_and_stop(c, run).await
    }
}

/// One run's settings and records, whatever the cluster.
struct Run<'a> {
    args: &'a RunArgs,
    rec: Arc<Recorder>,
    started: Instant,
    seed: u64,
    faults: &'a [Fault],
    schedule: Schedule,
    notes: Vec<String>,
    out: &'a Path,
}

/// `exercise`, then the cluster is stopped whatever happened: no node process and no compose project outlives
/// the run.
async fn exercise_and_stop(mut cluster: impl Backend, run: Run<'_>) -> anyhow::Result<bool> {
    let res = exercise(&mut cluster, run).await;
    cluster.shutdown().await;
    res
}

/// Workload, faults, heal, drain, final reads, convergence, checks and report.
async fn exercise(sut: &mut impl Backend, run: Run<'_>) -> anyhow::Result<bool> {
    let Run { args, rec, started, seed, faults, schedule, mut notes, out } = run;
    let mut fault_names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    if args.scenario == Scenario::Upgrade {
        fault_names = vec![upgrade::STEP];
    }
    let addrs = sut.client_addrs();
    let token = sut.token();
    let limits =
        (args.workload == Workload::Limits).then(|| Arc::new(workload::LimitsPlan::standard(args.limits_server_cap)));
    let wl = Arc::new(WorkloadConfig {
        queue: if limits.is_some() { "jepsen-limits".into() } else { "jepsen".into() },
        addrs: addrs.clone(),
        producers: args.producers,
        workers: args.workers,
        rate: args.rate,
        lease: Duration::from_millis(args.lease_ms),
        fail_retryable: 0.08,
        fail_final: 0.02,
        slow: args.slow,
        slow_workers: args.slow_workers,
        batch: 0.2,
        seed,
        token: token.clone(),
        limits,
    });
    workload::setup_limits(&wl, &rec).await?;

    let monitor_stop = CancellationToken::new();
    let monitor = tokio::spawn(monitor(addrs.clone(), token.clone(), rec.clone(), monitor_stop.clone()));
    let (producers_stop, workers_stop) = (CancellationToken::new(), CancellationToken::new());
    rec.record(Op::Mark { what: "workload_start".into() });
    rec.record(Op::Clock { wall_ms: wall_ms() });
    let mut producer_jobs = Vec::new();
    for p in 0..wl.producers {
        producer_jobs.push(tokio::spawn(workload::producer(p, wl.clone(), rec.clone(), producers_stop.clone())));
    }
    let mut worker_jobs = Vec::new();
    for w in 0..wl.workers {
        worker_jobs.push(tokio::spawn(workload::worker(w, wl.clone(), rec.clone(), workers_stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    rec.record(Op::Mark { what: "faults_start".into() });
    let until = Instant::now() + Duration::from_secs(args.time_limit);
    if args.scenario == Scenario::Upgrade {
        Upgrade::new(sut, rec.clone()).run(UPGRADE_LOAD).await;
    } else if faults.is_empty() {
        tokio::time::sleep_until(until).await;
    } else {
        Nemesis::new(sut, rec.clone(), StdRng::seed_from_u64(seed)).run(faults, until, &schedule).await;
    }
    rec.record(Op::Mark { what: "faults_end".into() });
    let fault_phase = (until - Duration::from_secs(args.time_limit)).elapsed();
    producers_stop.cancel();
    for j in producer_jobs {
        let _ = tokio::time::timeout(Duration::from_secs(40), j).await;
    }
    eprintln!("[{:>7.1}s] healing", rec.now() as f64 / 1000.0);
    // Healing draws nothing at random.
    let healed = Nemesis::new(sut, rec.clone(), StdRng::seed_from_u64(seed)).heal().await;
    rec.record(Op::Mark { what: "healed".into() });
    if let Err(e) = &healed {
        notes.push(format!("heal: {e:#}"));
        eprintln!("raftq-jepsen: heal: {e:#}");
    }

    let reader = Producer::connect(ProducerConfig {
        addrs: sut.reader_addrs().await,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        max_retries: 3,
        token: token.clone(),
        ..Default::default()
    })
    .await
    .context("connecting the final reader")?;
    eprintln!("[{:>7.1}s] draining", rec.now() as f64 / 1000.0);
    let (mut finals, drain_note) = drain(&rec, &reader, sut, Duration::from_secs(args.drain_timeout)).await;
    rec.record(Op::Mark { what: "drained".into() });
    eprintln!("[{:>7.1}s] {drain_note}", rec.now() as f64 / 1000.0);
    notes.push(drain_note);
    workers_stop.cancel();
    for j in worker_jobs {
        let _ = tokio::time::timeout(Duration::from_secs(30), j).await;
    }

    // Final states: tasks found terminal during the drain cannot change; read the rest again.
    let known = known_tasks(&rec);
    let again: Vec<String> = known.iter().filter(|id| !finals.contains_key(*id)).cloned().collect();
    finals.extend(read_finals(&reader, again, Instant::now() + Duration::from_secs(60)).await);
    let mut ids: Vec<&String> = known.iter().collect();
    ids.sort();
    for id in ids {
        if let Some((state, attempts, result)) = finals.get(id) {
            rec.record(Op::Final {
                task_id: id.clone(),
                state: state.clone(),
                attempts: *attempts,
                result: result.clone(),
            });
        }
    }

    // A retryable failure whose answer never came may have been applied; the server's runs say whether it was,
    // so the checker can tell a retry from a double lease.
    let uncertain = uncertain_retries(&rec);
    for (id, runs) in read_runs(&reader, uncertain, Instant::now() + Duration::from_secs(30)).await {
        rec.record(Op::Runs { task_id: id, runs });
    }

    // Convergence: every running member at the same applied index with the same digest.
    let deadline = Instant::now() + Duration::from_secs(30);
    let digests: BTreeMap<u64, pb::DigestResponse> = loop {
        let d = sut.digests().await;
        let ups = sut.up_ids().len();
        let mut it = d.values();
        let agree = it.next().is_some_and(|f| it.all(|x| x.applied_index == f.applied_index && x.digest == f.digest));
        if (agree && d.len() == ups) || Instant::now() >= deadline {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for d in digests.values() {
        rec.record(Op::Digest { node: d.node_id, applied_index: d.applied_index, digest: d.digest, tasks: d.tasks });
    }
    monitor_stop.cancel();
    let _ = monitor.await;
    rec.record(Op::Clock { wall_ms: wall_ms() });
    rec.record(Op::Mark { what: "done".into() });
    rec.flush()?;
    let external = sut.external_connections();
    sut.shutdown().await;

    let analysis = checker::check(&rec.events());
    let summary = report::Summary {
        seed,
        nodes: args.nodes,
        faults: fault_names.iter().map(|s| s.to_string()).collect(),
        time_limit_s: match args.scenario {
            Scenario::Faults => args.time_limit,
            Scenario::Upgrade => fault_phase.as_secs(),
        },
        duration_s: started.elapsed().as_secs_f64(),
        history: out.join("history.jsonl").display().to_string(),
        notes,
        external_relay_connections: external,
        analysis,
    };
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&summary)?)?;
    let text = report::text(&summary);
    std::fs::write(out.join("report.txt"), &text)?;
    print!("{text}");
    if summary.analysis.valid && !args.keep_data {
        sut.discard_data();
    }
    Ok(summary.analysis.valid)
}

/// `settings` (flat `key = value` lines) without the keys `extra` sets at its top level, then `extra`: a key given
/// there wins, where appending alone would repeat the key (which TOML refuses).
fn with_overrides(settings: &str, extra: &str) -> String {
    let key = |l: &str| {
        let k = l.split_once('=')?.0.trim();
        (!k.is_empty() && !k.starts_with('#') && !k.starts_with('[')).then(|| k.to_string())
    };
    let given: HashSet<String> =
        extra.lines().take_while(|l| !l.trim_start().starts_with('[')).filter_map(key).collect();
    let mut out: String =
        settings.lines().filter(|l| key(l).is_none_or(|k| !given.contains(&k))).map(|l| format!("{l}\n")).collect();
    out.push_str(extra);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod override_tests {
    use super::with_overrides;

    #[test]
    fn a_key_given_again_replaces_the_harness_setting_and_the_rest_stay() {
        let out = with_overrides("a = 1\nelection_timeout_max_ms = 1000\nb = 2\n", "election_timeout_max_ms = 400\n");
        let parsed: Vec<&str> = out.lines().collect();
        assert_eq!(parsed, vec!["a = 1", "b = 2", "election_timeout_max_ms = 400"]);
        // Keys under a table of the extra file are not top-level settings: nothing is taken out for them.
        let out = with_overrides("a = 1\n", "[tls]\na = 2");
        assert_eq!(out, "a = 1\n[tls]\na = 2\n");
    }
}
