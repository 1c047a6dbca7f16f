//! `raftq bench-suite`: the benchmark suite behind the README's performance table.
//!
//! It starts its own nodes (this binary's `serve`, as separate processes on 127.0.0.1 ephemeral ports, with
//! their data under `--work-dir`), drives them through the Rust SDK (`raftq-client`: producer streams with one
//! task per create, and `Worker`s) as a user's program would, runs every scenario `--runs` times and prints
//! one markdown table: the median of the runs with their spread (min–max), the machine (cores, CPU model,
//! the latency of one small fsync on the work directory's disk) and the command that reproduces it.
//!
//! Scenarios (`--only` picks some):
//! - `enqueue-unary`, `enqueue-batch`: acknowledged enqueues per second on one node (64 concurrent unary
//!   `enqueue` calls; 8 concurrent batches of 100).
//! - `cycle-1`, `cycle-3`: full cycles per second (durable enqueue ack → claim → completion ack) on one and
//!   three nodes, with at most `--backlog-cap` tasks enqueued and not yet handled (producers wait for room).
//! - `cycle-keyed-1`: `cycle-1` with every task under one of 16 concurrency keys (limits that never bind): what
//!   keyed tasks and the fair pick across keys cost against `cycle-1`.
//! - `overload-1`, `overload-3`: the same without the cap (producers as fast as the server acknowledges):
//!   completions should stay at the capped peak while enqueues are slowed.
//! - `overload-capped-1`: `overload-1` with the queue's `max_depth` set to `--backlog-cap`: an enqueue past it
//!   waits on the leader for room (`depth_hold_ms`), holding its place in the SDK's producer stream, and is
//!   refused (`QUEUE_FULL`, whose retry hint the stream waits out) only if none comes, so producers are slowed
//!   and completions should stay at `cycle-1`'s peak.
//! - `latency-1`, `latency-3`: one node paced at half of `cycle-1`'s median, three at half of `cycle-3`'s;
//!   enqueue→claim p50 and p99.
//! - `failover-3`, `transfer-3`, `pause-3`: three nodes at half of the peak; the leader is killed (`kill -9`),
//!   its leadership transferred, or it is paused (`SIGSTOP`, for the rest of the run) mid-run; the longest gap
//!   between two claims around the fault. A paused leader keeps its connections open: clients and followers
//!   see no error, only silence, which is what a hung process or a lost network path looks like.
//! - `backlog-1`: one node with `--deep-backlog` pending tasks in the worked queue: full cycles per second
//!   and the node's resident memory per stored task.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use raftq_client::{NewTask, Outcome, Producer, ProducerConfig, Worker, WorkerConfig};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The nodes' log filter (`RAFTQ_LOG` syntax) when set; their logs are then kept after each run. Default `warn`,
/// logs removed with the run's data.
const NODE_LOG_ENV: &str = "RAFTQ_SUITE_NODE_LOG";
/// A file to write each run's claims to (send time and the three stages, one line per claim), for finding when
/// the slow ones happen; each run overwrites it.
const TRACE_ENV: &str = "RAFTQ_SUITE_TRACE";

#[derive(clap::Args)]
pub struct SuiteArgs {
    /// Length of one measured run (after a 2 s warm-up).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub duration: Duration,
    /// Runs per scenario; the table gives their median and spread.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Scenarios to run, comma separated (default: all of them).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where the nodes keep their data (a fresh directory per run is made in it and removed after).
    #[arg(long, default_value = "target/bench-suite")]
    pub work_dir: PathBuf,
    /// Also write the table (markdown) to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Tasks enqueued and not yet handled, at most, in the capped scenarios.
    #[arg(long, default_value_t = 10_000)]
    pub backlog_cap: usize,
    /// Pending tasks stored before `backlog-1` measures.
    #[arg(long, default_value_t = 1_000_000)]
    pub deep_backlog: u64,
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Producer streams (one task per create, pipelined).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Worker processes' streams (SDK `Worker`s) and the slots and batch size of each.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    #[arg(long, default_value_t = 8)]
    pub worker_slots: usize,
    #[arg(long, default_value_t = 64)]
    pub worker_batch: u32,
    /// The paced scenarios' rate in tasks/s (0: half of the peak the suite measured, `cycle-1`'s or `cycle-3`'s):
    /// a fixed load compares two builds' latencies at the same rate.
    #[arg(long, default_value_t = 0.0)]
    pub paced_rate: f64,
    /// The `raftq` binary the nodes run (default: this one), to measure another build with the same clients.
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
}

const ALL: &[&str] = &[
    "enqueue-unary",
    "enqueue-batch",
    "cycle-1",
    "cycle-keyed-1",
    "cycle-3",
    "overload-1",
    "overload-3",
    "overload-capped-1",
    "latency-1",
    "latency-3",
    "failover-3",
    "transfer-3",
    "pause-3",
    "backlog-1",
];

const WARMUP: Duration = Duration::from_secs(2);
/// `cycle-keyed-1`: the keys the tasks are spread over, and each key's concurrency limit (high enough never to
/// bind, so the run measures what the keys and the fair pick cost, not a limit).
const KEYED_CYCLE_KEYS: usize = 16;
const KEYED_CYCLE_LIMIT: u32 = 1_000_000;
const QUEUE: &str = "bench";

pub async fn run(a: SuiteArgs) -> Result<()> {
    for s in &a.only {
        if !ALL.contains(&s.as_str()) {
            bail!("unknown scenario {s:?}: {}", ALL.join(", "));
        }
    }
    let want = |s: &str| a.only.is_empty() || a.only.iter().any(|o| o == s);
    std::fs::create_dir_all(&a.work_dir).with_context(|| format!("creating {}", a.work_dir.display()))?;
    let mut machine = Machine::read(&a.work_dir)?;
    eprintln!("{}", machine.line());
    let mut rows: Vec<Row> = Vec::new();
    // The measured peaks (`cycle-1`'s and `cycle-3`'s medians) the paced scenarios run at half of.
    let mut peaks: [Option<f64>; 2] = [None, None];
    for scenario in ALL.iter().copied().filter(|s| want(s)) {
        let mut runs = Vec::new();
        for i in 0..a.runs {
            eprintln!("== {scenario} run {}/{}", i + 1, a.runs);
            let r = run_scenario(&a, scenario, peaks).await.with_context(|| format!("scenario {scenario}"))?;
            eprintln!("   {}", r.brief());
            runs.push(r);
        }
        let row = Row::of(scenario, &runs);
        match scenario {
            "cycle-1" => peaks[0] = Some(row.main.median),
            "cycle-3" => peaks[1] = Some(row.main.median),
            _ => {}
        }
        rows.push(row);
    }
    machine.speed_after = Some(core_speed());
    let table = render(&a, &machine, &rows);
    println!("{table}");
    if let Some(out) = &a.out {
        std::fs::write(out, &table).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// The machine the figures come from.
struct Machine {
    cores: usize,
    cpu: String,
    fsync_us: f64,
    /// One core's speed before the runs and after them ([`core_speed`]): this kind of virtual machine runs at
    /// different speeds for minutes at a time, so a table says how fast the machine was while it was taken.
    speed: f64,
    speed_after: Option<f64>,
}

/// One core's speed in millions of steps of a fixed integer loop per second (the best of five 100 ms spans): a
/// figure to compare tables taken at different times with, not a benchmark of anything raftq does.
fn core_speed() -> f64 {
    let mut best = 0.0f64;
    for _ in 0..5 {
        let (t, mut x, mut n) = (Instant::now(), 0x9e37_79b9_7f4a_7c15u64, 0u64);
        while t.elapsed() < Duration::from_millis(100) {
            for _ in 0..1_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            n += 1_000;
            std::hint::black_box(x);
        }
        best = best.max(n as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    best
}

impl Machine {
    fn read(dir: &Path) -> Result<Machine> {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.to_string()))
            .and_then(|l| l.split(':').nth(1).map(|s| s.trim().to_string()))
            .unwrap_or_else(|| "unknown".into());
        // One small write and fdatasync, as the log writer does per group commit: the median of 200.
        let path = dir.join("fsync-probe");
        let mut f = std::fs::File::create(&path)?;
        let mut lat = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            f.write_all(&[0u8; 4096])?;
            f.sync_data()?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        drop(f);
        let _ = std::fs::remove_file(&path);
        lat.sort_by(f64::total_cmp);
        Ok(Machine { cores, cpu, fsync_us: lat[lat.len() / 2], speed: core_speed(), speed_after: None })
    }

    fn line(&self) -> String {
        let after = self.speed_after.map(|s| format!(", {s:.0} after the runs")).unwrap_or_default();
        format!(
            "{} cores, {}, fsync of 4 KiB {:.0} µs (median of 200), one core's speed {:.0} M loop steps/s before the \
             runs{after}",
            self.cores, self.cpu, self.fsync_us, self.speed
        )
    }
}

/// One run's figures: a main figure (tasks/s, or ms for a gap) and the others named.
#[derive(Clone, Default)]
struct RunResult {
    main: f64,
    extra: BTreeMap<&'static str, f64>,
}

impl RunResult {
    fn brief(&self) -> String {
        let mut s = format!("{:.0}", self.main);
        for (k, v) in &self.extra {
            s.push_str(&format!("  {k} {v:.1}"));
        }
        s
    }
}

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(f64::total_cmp);
        let median = if v.is_empty() { 0.0 } else { v[v.len() / 2] };
        Stat { median, min: v.first().copied().unwrap_or(0.0), max: v.last().copied().unwrap_or(0.0) }
    }

    fn show(&self, unit: &str) -> String {
        let fmt = |x: f64| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") };
        format!("{} {unit} ({}–{})", fmt(self.median), fmt(self.min), fmt(self.max))
    }
}

struct Row {
    scenario: &'static str,
    main: Stat,
    extra: Vec<(&'static str, Stat)>,
}

impl Row {
    fn of(scenario: &'static str, runs: &[RunResult]) -> Row {
        let main = Stat::of(runs.iter().map(|r| r.main).collect());
        let keys: Vec<&'static str> = runs.first().map(|r| r.extra.keys().copied().collect()).unwrap_or_default();
        let extra = keys
            .into_iter()
            .map(|k| (k, Stat::of(runs.iter().filter_map(|r| r.extra.get(k).copied()).collect())))
            .collect();
        Row { scenario, main, extra }
    }
}

fn describe(s: &str, a: &SuiteArgs) -> (String, &'static str) {
    let d = match s {
        "enqueue-unary" => "1 node, 64 concurrent unary enqueues".to_string(),
        "enqueue-batch" => "1 node, 8 concurrent batches of 100".to_string(),
        "cycle-1" => format!("1 node, full cycle, at most {} in flight", a.backlog_cap),
        "cycle-keyed-1" => format!(
            "1 node, full cycle, at most {} in flight, every task under one of {KEYED_CYCLE_KEYS} concurrency keys",
            a.backlog_cap
        ),
        "cycle-3" => format!("3 nodes, full cycle, at most {} in flight", a.backlog_cap),
        "overload-1" => "1 node, full cycle, producers unpaced (no cap)".to_string(),
        "overload-3" => "3 nodes, full cycle, producers unpaced (no cap)".to_string(),
        "overload-capped-1" => {
            format!("1 node, full cycle, producers unpaced, the queue's max_depth {} (QUEUE_FULL)", a.backlog_cap)
        }
        "latency-1" | "latency-3" if a.paced_rate > 0.0 => {
            let nodes = if s.ends_with("-3") { "3 nodes" } else { "1 node" };
            format!("{nodes}, paced at {} tasks/s: enqueue→claim", a.paced_rate)
        }
        "latency-1" => "1 node, paced at half of cycle-1: enqueue→claim".to_string(),
        "latency-3" => "3 nodes, paced at half of cycle-3: enqueue→claim".to_string(),
        "failover-3" => "3 nodes at half of peak, leader kill -9: longest claim gap".to_string(),
        "transfer-3" => "3 nodes at half of peak, leadership transfer: longest claim gap".to_string(),
        "pause-3" => "3 nodes at half of peak, leader paused (SIGSTOP): longest claim gap".to_string(),
        "backlog-1" => format!("1 node, full cycle over {} pending tasks", a.deep_backlog),
        _ => s.to_string(),
    };
    let unit = match s {
        "latency-1" | "latency-3" => "ms p50",
        "failover-3" | "transfer-3" | "pause-3" => "ms",
        "enqueue-unary" | "enqueue-batch" => "enqueues/s",
        _ => "tasks/s",
    };
    (d, unit)
}

fn render(a: &SuiteArgs, m: &Machine, rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | what | median (min–max) | also |\n|---|---|---|---|\n");
    for r in rows {
        let (what, unit) = describe(r.scenario, a);
        let also: Vec<String> = r.extra.iter().map(|(k, st)| format!("{k} {}", st.show(""))).collect();
        s.push_str(&format!("| `{}` | {what} | {} | {} |\n", r.scenario, r.main.show(unit), also.join("; ")));
    }
    let mut only = if a.only.is_empty() { String::new() } else { format!(" --only {}", a.only.join(",")) };
    if let Some(b) = &a.server_bin {
        only.push_str(&format!(" --server-bin {}", b.display()));
    }
    if a.paced_rate > 0.0 {
        only.push_str(&format!(" --paced-rate {}", a.paced_rate));
    }
    if a.deep_backlog != 1_000_000 {
        only.push_str(&format!(" --deep-backlog {}", a.deep_backlog));
    }
    s.push_str(&format!(
        "\n{} runs of {} s each (after {} s of warm-up), 100-byte payloads unless said, release build; {}.\n\
         Producers: {} SDK producer streams, one task per create; workers: {} SDK workers × {} slots, batch {}.\n\
         Reproduce: `cargo build --release && target/release/raftq bench-suite --runs {} --duration {}s{only}`\n",
        a.runs,
        a.duration.as_secs(),
        WARMUP.as_secs(),
        m.line(),
        a.producers,
        a.workers,
        a.worker_slots,
        a.worker_batch,
        a.runs,
        a.duration.as_secs(),
    ));
    s
}

async fn run_scenario(a: &SuiteArgs, scenario: &str, peaks: [Option<f64>; 2]) -> Result<RunResult> {
    let nodes = if scenario.ends_with("-3") { 3 } else { 1 };
    let cluster = Cluster::start(&a.work_dir, a.server_bin.as_deref(), nodes).await?;
    let result = match scenario {
        "enqueue-unary" => enqueue_load(&cluster, a, 64, 1).await,
        "enqueue-batch" => enqueue_load(&cluster, a, 8, 100).await,
        "cycle-1" | "cycle-3" => cycle(&cluster, a, Pace::Capped, Fault::None).await,
        "cycle-keyed-1" => cycle_with(&cluster, a, Pace::Capped, Fault::None, KEYED_CYCLE_KEYS).await,
        "overload-1" | "overload-3" => cycle(&cluster, a, Pace::Unpaced, Fault::None).await,
        "overload-capped-1" => {
            set_depth_limit(&cluster, a.backlog_cap as u64).await?;
            cycle(&cluster, a, Pace::Unpaced, Fault::None).await
        }
        "latency-1" | "latency-3" | "failover-3" | "transfer-3" | "pause-3" => {
            let peak = peaks[usize::from(nodes == 3)];
            let rate = match peak {
                _ if a.paced_rate > 0.0 => a.paced_rate,
                Some(p) => p / 2.0,
                // Run on its own: find the peak first.
                None => cycle(&cluster, a, Pace::Capped, Fault::None).await?.main / 2.0,
            };
            let fault = match scenario {
                "failover-3" => Fault::KillLeader,
                "transfer-3" => Fault::Transfer,
                "pause-3" => Fault::PauseLeader,
                _ => Fault::None,
            };
            cycle(&cluster, a, Pace::Rate(rate.max(100.0)), fault).await
        }
        "backlog-1" => backlog(&cluster, a).await,
        _ => bail!("unknown scenario {scenario}"),
    };
    cluster.stop();
    result
}

/// Puts a depth limit on the bench queue (the server refuses past it; the SDK's stream waits and retries), once
/// the fresh cluster runs the version that has limits.
async fn set_depth_limit(c: &Cluster, max_depth: u64) -> Result<()> {
    let p = Producer::connect(c.producer_config(c.addrs())).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match p.set_queue_limits(QUEUE, None, Some(max_depth)).await {
            Ok(_) => return Ok(()),
            Err(e) if e.reason() == Some("FEATURE_NOT_ACTIVE") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

// ---- nodes ------------------------------------------------------------------------------------------------

struct Node {
    id: u64,
    grpc: String,
    child: Option<Child>,
}

struct Cluster {
    dir: PathBuf,
    nodes: Mutex<Vec<Node>>,
    token: String,
}

/// The kernel's clock ticks per second (`/proc/<pid>/stat` counts CPU time in them): 100 on every Linux this
/// runs on (`getconf CLK_TCK`).
const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// The CPU time a process has used, user and system (`/proc/PID/stat`; "self" for this one), in microseconds.
fn process_cpu_us(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, inside parentheses): utime is the 14th field of the
    // line, stime the 15th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * (1_000_000 / CLOCK_TICKS_PER_SECOND))
}

/// A port nothing listens on now and that this process has not handed out before: the kernel can give a port just
/// closed again at once, and two nodes of one run would then collide.
fn free_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if GIVEN.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return Ok(port);
        }
    }
}

impl Cluster {
    async fn start(work: &Path, bin: Option<&Path>, n: usize) -> Result<Cluster> {
        let dir = work.join(format!("run-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir)?;
        let secret_path = dir.join("secret.hs256");
        let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        std::fs::write(&secret_path, &secret)?;
        let ports: Vec<(u16, u16, u16)> =
            (0..n).map(|_| Ok((free_port()?, free_port()?, free_port()?))).collect::<Result<_>>()?;
        let peers: Vec<String> =
            ports.iter().enumerate().map(|(i, (g, r, _))| format!("{}=127.0.0.1:{r},127.0.0.1:{g}", i + 1)).collect();
        let exe = match bin {
            Some(b) => b.to_path_buf(),
            None => std::env::current_exe()?,
        };
        let mut nodes = Vec::new();
        for (i, (g, r, h)) in ports.iter().enumerate() {
            let id = i as u64 + 1;
            let log = std::fs::File::create(dir.join(format!("node{id}.log")))?;
            let mut cmd = Command::new(&exe);
            cmd.arg("serve")
                .arg("--node-id")
                .arg(id.to_string())
                .arg("--data-dir")
                .arg(dir.join(format!("node{id}")))
                .arg("--grpc-addr")
                .arg(format!("127.0.0.1:{g}"))
                .arg("--raft-addr")
                .arg(format!("127.0.0.1:{r}"))
                .arg("--http-addr")
                .arg(format!("127.0.0.1:{h}"))
                .arg("--auth-hs256-secret-file")
                .arg(&secret_path)
                .env("RAFTQ_LOG", std::env::var(NODE_LOG_ENV).unwrap_or_else(|_| "warn".into()))
                .stdout(Stdio::null())
                .stderr(log);
            if n > 1 {
                for p in &peers {
                    cmd.arg("--peer").arg(p);
                }
            }
            let child = cmd.spawn().context("starting a node")?;
            nodes.push(Node { id, grpc: format!("http://127.0.0.1:{g}"), child: Some(child) });
        }
        let spec = raftq::auth::TokenSpec {
            subject: "bench-suite",
            tenant: "default",
            scopes: &raftq::auth::Scope::ALL,
            queues: None,
            ttl_s: 24 * 3600,
            issuer: None,
            audience: None,
        };
        let token = raftq::auth::issue(secret.as_bytes(), None, &spec).map_err(anyhow::Error::msg)?;
        let c = Cluster { dir, nodes: Mutex::new(nodes), token };
        c.leader(Duration::from_secs(30)).await?;
        Ok(c)
    }

    fn addrs(&self) -> Vec<String> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|n| n.grpc.clone()).collect()
    }

    fn producer_config(&self, addrs: Vec<String>) -> ProducerConfig {
        ProducerConfig { addrs, token: Some(self.token.clone()), ..Default::default() }
    }

    /// The node that leads, once one does (asked of every node, so a dead one does not stop the answer).
    async fn leader(&self, within: Duration) -> Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            for addr in self.addrs() {
                let cfg = ProducerConfig {
                    follow_leader: false,
                    max_retries: 0,
                    connect_timeout: Duration::from_millis(500),
                    request_timeout: Duration::from_secs(2),
                    ..self.producer_config(vec![addr])
                };
                if let Ok(p) = Producer::connect(cfg).await {
                    if let Ok(s) = p.admin().status().await {
                        if s.role.eq_ignore_ascii_case("leader") {
                            return Ok(s.node_id);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("no leader within {within:?} (logs in {})", self.dir.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&self, id: u64) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Sends `sig` (a `kill -s` name: STOP, CONT) to node `id`.
    fn signal(&self, id: u64, sig: &str) -> Result<()> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pid) = nodes.iter().find(|n| n.id == id).and_then(|n| n.child.as_ref()).map(Child::id) else {
            bail!("node {id} is not running");
        };
        let status = Command::new("kill").args(["-s", sig, &pid.to_string()]).status().context("running kill")?;
        if !status.success() {
            bail!("kill -s {sig} {pid} failed: {status}");
        }
        Ok(())
    }

    /// CPU time (user + system, µs) the running nodes have used so far, together.
    fn cpu_us(&self) -> u64 {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.iter().filter_map(|n| n.child.as_ref()).filter_map(|c| process_cpu_us(&c.id().to_string())).sum()
    }

    fn rss_kib(&self, id: u64) -> Option<u64> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let pid = nodes.iter().find(|n| n.id == id)?.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
    }

    fn stop(&self) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        for n in nodes.iter_mut() {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // `stop` runs again on drop, after the directory is gone: the logs are kept once.
        if std::env::var_os(NODE_LOG_ENV).is_some() && self.dir.exists() {
            // Asked for logs: keep them next to the run's directory (`<dir>.logs/node<N>.log`).
            let keep = self.dir.with_extension("logs");
            let _ = std::fs::create_dir_all(&keep);
            for n in nodes.iter() {
                let name = format!("node{}.log", n.id);
                let _ = std::fs::copy(self.dir.join(&name), keep.join(&name));
            }
            eprintln!("bench-suite: node logs kept in {}", keep.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---- workloads --------------------------------------------------------------------------------------------

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn payload(size: usize) -> Vec<u8> {
    let mut p = vec![b'x'; size.max(8)];
    p[..8].copy_from_slice(&now_us().to_be_bytes());
    p
}

/// Acknowledged enqueues per second: `clients` loops of unary enqueue (`batch` 1) or batches.
async fn enqueue_load(c: &Cluster, a: &SuiteArgs, clients: usize, batch: usize) -> Result<RunResult> {
    let p = Producer::connect(c.producer_config(c.addrs())).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let mut js = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (p, acked, stop, size) = (p.clone(), acked.clone(), stop.clone(), a.payload_bytes);
        js.spawn(async move {
            while !stop.is_cancelled() {
                if batch <= 1 {
                    if p.enqueue(NewTask::new(QUEUE, payload(size))).await.is_ok() {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    let tasks = (0..batch).map(|_| NewTask::new(QUEUE, payload(size))).collect();
                    if let Ok(r) = p.enqueue_batch(tasks).await {
                        acked.fetch_add(r.iter().filter(|r| r.is_ok()).count() as u64, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    tokio::time::sleep(WARMUP).await;
    let (n0, t0) = (acked.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(a.duration).await;
    let (n1, dt) = (acked.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
    stop.cancel();
    while js.join_next().await.is_some() {}
    Ok(RunResult { main: (n1 - n0) as f64 / dt, extra: BTreeMap::new() })
}

#[derive(Clone, Copy)]
enum Pace {
    /// At most `backlog_cap` tasks enqueued and not yet handled.
    Capped,
    Unpaced,
    /// Tasks per second over all producers.
    Rate(f64),
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    KillLeader,
    Transfer,
    /// SIGSTOP until the run ends (the cluster's stop kills it, which works on a stopped process too).
    PauseLeader,
}

/// What the workers saw: claim latencies (µs from the producer's send) and claim times (ms since start).
#[derive(Default)]
struct Seen {
    latency_us: Mutex<Vec<u32>>,
    /// Per claim: send→enqueue stamp, enqueue stamp→claim stamp, claim stamp→worker (µs; the stamps are ms), and
    /// the send (µs since the epoch).
    stages_us: Mutex<Vec<[i64; 4]>>,
    claims_ms: Mutex<Vec<u32>>,
}

/// The full cycle through the SDK: producer streams (one task per create) and workers completing each task.
async fn cycle(c: &Cluster, a: &SuiteArgs, pace: Pace, fault: Fault) -> Result<RunResult> {
    cycle_with(c, a, pace, fault, 0).await
}

/// A full-cycle run whose tasks, when `keys` > 0, each carry one of `keys` concurrency keys (no limit that
/// binds), round robin per producer: the fair pick then rotates among the keys.
async fn cycle_with(c: &Cluster, a: &SuiteArgs, pace: Pace, fault: Fault, keys: usize) -> Result<RunResult> {
    let addrs = c.addrs();
    let stop = CancellationToken::new();
    let room = Arc::new(Semaphore::new(match pace {
        Pace::Capped => a.backlog_cap,
        _ => Semaphore::MAX_PERMITS,
    }));
    let capped = matches!(pace, Pace::Capped);
    let enqueued = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let start = Instant::now();

    // Workers first, spread over the nodes.
    let mut workers = Vec::new();
    let mut wjs = tokio::task::JoinSet::new();
    for i in 0..a.workers {
        let mut waddrs = addrs.clone();
        waddrs.rotate_left(i % addrs.len());
        let cfg = WorkerConfig {
            addrs: waddrs,
            token: Some(c.token.clone()),
            queues: vec![QUEUE.into()],
            concurrency: a.worker_slots,
            batch_size: a.worker_batch,
            shutdown_grace: Duration::from_secs(2),
            ..Default::default()
        };
        let w = Worker::new(cfg)?;
        workers.push(w.stats());
        let (room, seen, measuring, stop) = (room.clone(), seen.clone(), measuring.clone(), stop.clone());
        wjs.spawn(async move {
            let handler = move |t: raftq_client::Task| {
                let (room, seen, measuring) = (room.clone(), seen.clone(), measuring.clone());
                async move {
                    let now = now_us();
                    if measuring.load(Ordering::Relaxed) {
                        if let Some(b) = t.payload.get(..8) {
                            let sent = u64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                            let lat = now.saturating_sub(sent).min(u32::MAX as u64) as u32;
                            seen.latency_us.lock().unwrap_or_else(|p| p.into_inner()).push(lat);
                            let (c, u) = (t.created_at_ms * 1000, t.updated_at_ms * 1000);
                            let st = [c - sent as i64, u - c, now as i64 - u, sent as i64];
                            seen.stages_us.lock().unwrap_or_else(|p| p.into_inner()).push(st);
                        }
                    }
                    let at = start.elapsed().as_millis() as u32;
                    seen.claims_ms.lock().unwrap_or_else(|p| p.into_inner()).push(at);
                    if capped {
                        room.add_permits(1);
                    }
                    Outcome::Completed(Default::default())
                }
            };
            w.run(handler, stop).await
        });
    }

    // Producers, spread over the nodes.
    let mut pjs = tokio::task::JoinSet::new();
    for i in 0..a.producers {
        let mut paddrs = addrs.clone();
        paddrs.rotate_left(i % addrs.len());
        let p = Producer::connect(c.producer_config(paddrs)).await?;
        let (room, enqueued, stop, size) = (room.clone(), enqueued.clone(), stop.clone(), a.payload_bytes);
        let per_producer = match pace {
            Pace::Rate(r) => Some(r / a.producers as f64),
            _ => None,
        };
        pjs.spawn(async move {
            let Ok(s) = p.stream().await else { return };
            let mut acks = tokio::task::JoinSet::new();
            let began = Instant::now();
            let mut sent = 0u64;
            while !stop.is_cancelled() {
                if let Some(rate) = per_producer {
                    let due = began + Duration::from_secs_f64(sent as f64 / rate);
                    if due > Instant::now() {
                        tokio::select! {
                            _ = tokio::time::sleep_until(due.into()) => {}
                            _ = stop.cancelled() => break,
                        }
                    }
                } else if capped {
                    tokio::select! {
                        p = room.acquire() => match p { Ok(p) => p.forget(), Err(_) => break },
                        _ = stop.cancelled() => break,
                    }
                }
                let mut task = NewTask::new(QUEUE, payload(size));
                if keys > 0 {
                    task = task.concurrency(format!("k{}", sent as usize % keys), KEYED_CYCLE_LIMIT);
                }
                let pending = match s.create(task).await {
                    Ok(p) => p,
                    Err(_) => continue,
                };
                sent += 1;
                let enqueued = enqueued.clone();
                acks.spawn(async move {
                    if pending.await.is_ok() {
                        enqueued.fetch_add(1, Ordering::Relaxed);
                    }
                });
                while acks.try_join_next().is_some() {}
            }
            acks.abort_all();
        });
    }

    tokio::time::sleep(WARMUP).await;
    let completed = || workers.iter().map(|w| w.snapshot().completed).sum::<u64>();
    measuring.store(true, Ordering::Relaxed);
    let (c0, e0, t0, cpu0) = (completed(), enqueued.load(Ordering::Relaxed), Instant::now(), c.cpu_us());
    let driver0 = process_cpu_us("self");
    let mut fault_at_ms = None;
    if fault != Fault::None {
        tokio::time::sleep(a.duration / 2).await;
        let leader = c.leader(Duration::from_secs(10)).await?;
        fault_at_ms = Some(start.elapsed().as_millis() as u32);
        match fault {
            Fault::KillLeader => c.kill(leader),
            Fault::PauseLeader => c.signal(leader, "STOP")?,
            Fault::Transfer => {
                let p = Producer::connect(c.producer_config(c.addrs())).await?;
                p.admin().transfer_leader(None, Duration::from_secs(10)).await?;
            }
            Fault::None => {}
        }
        tokio::time::sleep(a.duration / 2).await;
        if fault == Fault::PauseLeader {
            // Resumed after the measured time: it rejoins as a follower, and what waited on it is answered.
            c.signal(leader, "CONT")?;
        }
    } else {
        tokio::time::sleep(a.duration).await;
    }
    let (c1, e1, dt, cpu1) = (completed(), enqueued.load(Ordering::Relaxed), t0.elapsed().as_secs_f64(), c.cpu_us());
    let driver1 = process_cpu_us("self");
    let end_ms = start.elapsed().as_millis() as u32;
    measuring.store(false, Ordering::Relaxed);
    stop.cancel();
    room.close();
    while pjs.join_next().await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while wjs.join_next().await.is_some() {} }).await;

    let mut r = RunResult { main: (c1 - c0) as f64 / dt, extra: BTreeMap::new() };
    r.extra.insert("enqueued/s", (e1 - e0) as f64 / dt);
    if fault == Fault::None && c1 > c0 {
        r.extra.insert("server CPU µs/task", cpu1.saturating_sub(cpu0) as f64 / (c1 - c0) as f64);
        // The suite's own process: the SDK's producers and workers (and the suite's bookkeeping), on the same cores.
        if let (Some(d0), Some(d1)) = (driver0, driver1) {
            r.extra.insert("driver CPU µs/task", d1.saturating_sub(d0) as f64 / (c1 - c0) as f64);
        }
    }
    let mut lat = std::mem::take(&mut *seen.latency_us.lock().unwrap_or_else(|p| p.into_inner()));
    lat.sort_unstable();
    if !lat.is_empty() {
        let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0;
        r.extra.insert("p50 ms", pct(0.50));
        r.extra.insert("p99 ms", pct(0.99));
    }
    let mut st = std::mem::take(&mut *seen.stages_us.lock().unwrap_or_else(|p| p.into_inner()));
    if !st.is_empty() {
        let mut line = String::from("stages (send→stamp, stamp→claim, claim→worker) p50/p90/p99 ms:");
        for i in 0..3 {
            st.sort_unstable_by_key(|x| x[i]);
            let q = |p: f64| st[((st.len() as f64 * p) as usize).min(st.len() - 1)][i] as f64 / 1000.0;
            line.push_str(&format!(" {:.2}/{:.2}/{:.2}", q(0.5), q(0.9), q(0.99)));
        }
        eprintln!("   {line}");
        if let Some(path) = std::env::var_os(TRACE_ENV) {
            // One line per claim in send order: send (µs since the epoch) and the three stages (µs).
            st.sort_unstable_by_key(|x| x[3]);
            let text: String = st.iter().map(|x| format!("{} {} {} {}\n", x[3], x[0], x[1], x[2])).collect();
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("bench-suite: cannot write {}: {e}", path.to_string_lossy());
            }
        }
    }
    if let Some(at) = fault_at_ms {
        let mut claims = std::mem::take(&mut *seen.claims_ms.lock().unwrap_or_else(|p| p.into_inner()));
        claims.sort_unstable();
        // The run's end counts as a claim: no claim at all after the fault is a gap to the end, not none. Claims
        // noted after it (workers stop a moment later) are not part of the run.
        claims.retain(|&c| c <= end_ms);
        claims.push(end_ms);
        // The longest time without a claim, from one second before the fault on.
        let from = at.saturating_sub(1000);
        let gap = claims.windows(2).filter(|w| w[1] >= from).map(|w| w[1] - w[0]).max().unwrap_or(0);
        if std::env::var_os(NODE_LOG_ENV).is_some() {
            let w = claims.windows(2).filter(|w| w[1] >= from).max_by_key(|w| w[1] - w[0]);
            let fault_wall = SystemTime::now() - Duration::from_millis(u64::from(end_ms - at));
            let since = |ms: u32| i64::from(ms) - i64::from(at);
            eprintln!(
                "bench-suite: fault at {:?} (unix), longest gap from {:?} to {:?} ms after it",
                fault_wall.duration_since(UNIX_EPOCH).unwrap_or_default(),
                w.map(|w| since(w[0])),
                w.map(|w| since(w[1]))
            );
        }
        r.extra.insert("completed/s", r.main);
        r.main = gap as f64;
    }
    if let Pace::Rate(_) = pace {
        if fault == Fault::None {
            // Latency runs report their p50 as the main figure.
            r.extra.insert("completed/s", r.main);
            r.main = r.extra.get("p50 ms").copied().unwrap_or(0.0);
        }
    }
    Ok(r)
}

/// Full cycles with a deep backlog: the queue holds `deep_backlog` pending tasks before the workers start.
async fn backlog(c: &Cluster, a: &SuiteArgs) -> Result<RunResult> {
    let rss0 = c.rss_kib(1).unwrap_or(0);
    let p = Producer::connect(c.producer_config(c.addrs())).await?;
    let filled = Arc::new(AtomicU64::new(0));
    let mut js = tokio::task::JoinSet::new();
    let per = a.deep_backlog / 8;
    for _ in 0..8 {
        let (p, filled, size) = (p.clone(), filled.clone(), a.payload_bytes);
        js.spawn(async move {
            let mut done = 0u64;
            while done < per {
                let n = (per - done).min(1000) as usize;
                let tasks = (0..n).map(|_| NewTask::new(QUEUE, payload(size))).collect();
                match p.enqueue_batch(tasks).await {
                    Ok(r) => {
                        let ok = r.iter().filter(|r| r.is_ok()).count() as u64;
                        done += ok;
                        filled.fetch_add(ok, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
    }
    while let Some(r) = js.join_next().await {
        r??;
    }
    let stored = filled.load(Ordering::Relaxed);
    // Let the node settle (flushes, compaction of what was written).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss1 = c.rss_kib(1).unwrap_or(0);
    let mut r = cycle(c, a, Pace::Capped, Fault::None).await?;
    r.extra.insert("bytes/task", rss1.saturating_sub(rss0) as f64 * 1024.0 / stored.max(1) as f64);
    Ok(r)
}
