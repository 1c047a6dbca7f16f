//! `raftq bench`: load against a node or a cluster (or an embedded node), with the numbers that matter.
//!
//! - `--workload enqueue`: concurrent producers (unary Enqueue, or EnqueueBatch with `--batch`); reports
//!   acknowledged enqueues per second and, for an embedded node, log fsyncs and enqueues per fsync.
//! - `--workload cycle` (the default): producers on producer streams and workers on worker streams, every
//!   task enqueued, claimed and completed; reports full cycles per second and the p50/p90/p99 of
//!   enqueue->claim and enqueue->complete. Each payload carries its send time, so latencies are measured from
//!   the moment the producer sent the task.
//!
//! - `--workload fairness`: weighted fair dispatch (`bench_fairness.rs`): a key flooding a queue against a key
//!   enqueuing at a hundredth of its rate (also with slots held back from the flooding key), a 3:1 weighted run,
//!   and full cycles with keyed and unkeyed tasks.
//!
//! It speaks the wire protocol directly (no SDK), so that it measures the server and times every answer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use raftq::config::Config;
use raftq::node::{Listeners, Node};
use raftq_proto::v1 as pb;
use raftq_proto::v1::producer_stream_client::ProducerStreamClient;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use raftq_proto::v1::worker_stream_client::WorkerStreamClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// enqueue: producers only; cycle: enqueue, claim and complete; fairness: fair dispatch across keys.
    #[arg(long, value_enum, default_value_t = Workload::Cycle)]
    pub workload: Workload,
    /// Nodes to load (repeat, or comma-separated); clients are spread over them. None: an embedded node.
    #[arg(long = "addr", value_delimiter = ',')]
    pub addrs: Vec<String>,
    /// Bearer token for --addr (the embedded node's token is minted from its own secret). `--token` is the old
    /// spelling.
    #[arg(long = "auth-token", alias = "token", env = "RAFTQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Producers (streams for `cycle`, concurrent unary clients for `enqueue`).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Tasks per create (CreateBatch / EnqueueBatch); for `enqueue`, 0 uses unary Enqueue.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Creates a producer keeps in flight on its stream.
    #[arg(long, default_value_t = 4)]
    pub inflight: usize,
    /// Target enqueue rate (tasks/s over all producers); 0 = as fast as the server acknowledges.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Worker streams.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Slots per worker stream (Readys outstanding at once).
    #[arg(long, default_value_t = 4)]
    pub slots: usize,
    /// Tasks asked for per Ready.
    #[arg(long, default_value_t = 100)]
    pub worker_batch: u32,
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// A depth limit on the bench's queue (0: none): producers faster than the workers are refused with
    /// QUEUE_FULL and wait the server's retry hint before that create's slot is used again.
    #[arg(long, default_value_t = 0)]
    pub max_depth: u64,
    /// A running cap on the bench's queue (0: none).
    #[arg(long, default_value_t = 0)]
    pub max_running: u32,
    /// cycle: put each task under one of this many concurrency keys, round robin per producer, with a limit no
    /// key reaches (0: no keys). What keyed tasks and the fair pick across keys cost.
    #[arg(long, default_value_t = 0)]
    pub keys: usize,
    /// fairness: how long a worker slot works on each task (each slot takes one task at a time), which sets the
    /// workers' capacity to workers x slots x 1000 / work-ms tasks/s.
    #[arg(long, default_value_t = 20)]
    pub work_ms: u64,
    /// fairness: the varied flood run draws each task's work time uniformly from work-ms x (1 - this ..= 1 +
    /// this), 0 to 1.
    #[arg(long, default_value_t = 0.5)]
    pub work_jitter: f64,
    /// fairness: the flooding key's weight in the weighted run (the other key has 1).
    #[arg(long, default_value_t = 3)]
    pub weight: u32,
    /// fairness: in the reserved flood run, the flooding key's tasks carry a concurrency limit this many below
    /// the workers' slots, so that many slots stay free for other keys (1 or more).
    #[arg(long, default_value_t = 1)]
    pub reserve: usize,
    /// Data directory of the embedded node (default: a fresh temporary directory, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration of the embedded node.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = super::client::Output::Table)]
    pub output: super::client::Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Enqueue,
    Cycle,
    Fairness,
}

/// The bearer token every bench client sends (set once, before any client starts).
static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn token() -> String {
    TOKEN.get().cloned().unwrap_or_default()
}

pub(super) fn authorized<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = format!("Bearer {}", token()).parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

pub(super) async fn channel(addr: &str) -> Result<Channel> {
    let url = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    tonic::transport::Endpoint::from_shared(url.clone())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))
}

/// Latency samples in microseconds.
#[derive(Default)]
pub(super) struct Samples(Mutex<Vec<u32>>);

impl Samples {
    pub(super) fn add(&self, us: u64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(us.min(u32::MAX as u64) as u32);
    }
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub(super) fn percentiles(&self) -> Option<[f64; 3]> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1000.0;
        Some([at(0.50), at(0.90), at(0.99)])
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) enqueued: AtomicU64,
    pub(super) enqueue_errors: AtomicU64,
    /// Tasks of creates refused by an overload limit (QUEUE_FULL, RATE_LIMITED), tried again after the hint.
    pub(super) refused: AtomicU64,
    pub(super) claimed: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) to_claim: Samples,
    pub(super) to_complete: Samples,
    /// Per concurrency key ("" without one): its claims; kept only when asked for.
    pub(super) per_key: Option<Mutex<PerKey>>,
}

/// Claims per concurrency key.
pub(super) type PerKey = std::collections::HashMap<String, KeyClaims>;

/// One key's claims: enqueue->claim (their count is the key's claims), and each claim's send→enqueue stamp,
/// enqueue stamp→claim stamp and claim stamp→worker in µs (the node's stamps are ms).
#[derive(Default)]
pub(super) struct KeyClaims {
    pub(super) to_claim: Samples,
    pub(super) stages: Vec<[i64; 3]>,
}

impl Counters {
    /// Counters that also keep claims per key.
    pub(super) fn per_key() -> Counters {
        Counters { per_key: Some(Mutex::default()), ..Default::default() }
    }

    /// A claim of `t`, sent at `sent` and received at `now` (µs since the epoch).
    fn note_claim(&self, t: &pb::Task, sent: u64, now: u64) {
        self.to_claim.add(now.saturating_sub(sent));
        let Some(m) = &self.per_key else { return };
        let (c, u) = (t.created_at_ms * 1000, t.updated_at_ms * 1000);
        let stages = [c - sent as i64, u - c, now as i64 - u];
        let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
        // The key is copied only the first time it is seen: the unpaced runs note ~100,000 claims a second, in the
        // process of the embedded node they measure.
        let key = t.concurrency_key.as_str();
        if !g.contains_key(key) {
            g.insert(key.to_string(), KeyClaims::default());
        }
        if let Some(k) = g.get_mut(key) {
            k.to_claim.add(now.saturating_sub(sent));
            k.stages.push(stages);
        }
    }
}

/// The node the bench loads: given addresses, or an embedded one (with its data directory and whether to remove
/// it afterwards) and a token minted from its secret.
pub(super) struct Target {
    pub(super) addrs: Vec<String>,
    embedded: Option<(Node, PathBuf, bool)>,
}

impl Target {
    pub(super) async fn start(a: &BenchArgs) -> Result<Target> {
        let target = if a.addrs.is_empty() {
            let (node, dir) = start_embedded(a).await?;
            let addr = node.grpc_addr.to_string();
            Target { addrs: vec![addr], embedded: Some((node, dir, a.data_dir.is_none())) }
        } else {
            Target { addrs: a.addrs.clone(), embedded: None }
        };
        if let Some(t) = &a.token {
            let _ = TOKEN.set(t.clone());
        }
        Ok(target)
    }

    pub(super) async fn stop(self) {
        if let Some((node, dir, remove)) = self.embedded {
            node.stop().await;
            if remove {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

async fn start_embedded(a: &BenchArgs) -> Result<(Node, PathBuf)> {
    let dir = a
        .data_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("raftq-bench-{}", rand::random::<u64>())));
    let base = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    let cfg = Config {
        data_dir: dir.clone(),
        grpc_addr: "127.0.0.1:0".into(),
        raft_addr: "127.0.0.1:0".into(),
        http_addr: "127.0.0.1:0".into(),
        ..base
    };
    let node = Node::start(cfg.clone(), Listeners::bind(&cfg).await?, CancellationToken::new()).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while raftq::raft::metrics(&node.raft).current_leader != Some(cfg.node_id) {
        if Instant::now() > deadline {
            bail!("embedded node did not become leader");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if cfg.auth == raftq::config::AuthMode::Jwt && cfg.auth_keys_dir.is_none() && cfg.auth_hs256_secret_file.is_none() {
        let secret = raftq::auth::local_secret(&dir)?;
        let spec = raftq::auth::TokenSpec {
            subject: "raftq-bench",
            tenant: raftq::auth::DEFAULT_TENANT,
            scopes: &raftq::auth::Scope::ALL,
            queues: None,
            ttl_s: 24 * 3600,
            issuer: cfg.auth_issuer.as_deref(),
            audience: cfg.auth_audience.as_deref(),
        };
        let t = raftq::auth::issue(&secret, Some(raftq::auth::LOCAL_KID), &spec).map_err(|e| anyhow::anyhow!(e))?;
        let _ = TOKEN.set(t);
    }
    Ok((node, dir))
}

/// What one producer stream sends: batches of `batch` tasks to `queue`, `inflight` creates at once, paced to
/// `rate` tasks/s (0: as fast as acknowledged); each task under the next of `keys` in turn (none: unkeyed), with
/// concurrency limit `limit` (0: one no key reaches).
#[derive(Clone)]
pub(super) struct ProducerSpec {
    pub(super) queue: String,
    pub(super) batch: usize,
    pub(super) inflight: usize,
    pub(super) rate: u64,
    pub(super) payload_len: usize,
    pub(super) keys: Vec<String>,
    pub(super) limit: u32,
}

/// What one worker stream does: `slots` Readys outstanding for `count` tasks each of `queue`, each batch
/// completed after `work` (simulated processing; zero: at once).
#[derive(Clone)]
pub(super) struct WorkerSpec {
    pub(super) queue: String,
    pub(super) slots: usize,
    pub(super) count: u32,
    pub(super) work: Duration,
    /// Each batch's work time is drawn uniformly from `work` x (1 - jitter ..= 1 + jitter).
    pub(super) jitter: f64,
}

/// A concurrency limit no bench key reaches: keys here are fairness keys, not throttles.
pub(super) const UNLIMITED: u32 = 1_000_000;

pub async fn run(a: BenchArgs) -> Result<()> {
    if a.keys > 0 && a.workload != Workload::Cycle {
        bail!("--keys applies to --workload cycle only (the fairness workload sets its own keys)");
    }
    if a.workload == Workload::Fairness {
        return super::bench_fairness::run(a).await;
    }
    let target = Target::start(&a).await?;
    let (addrs, embedded) = (target.addrs.clone(), target.embedded.as_ref());
    let stats = Arc::new(Counters::default());
    let log0 = embedded
        .map(|(n, _, _)| (n.log_stats.fsyncs.load(Ordering::Relaxed), n.log_stats.entries.load(Ordering::Relaxed)));
    let stop = Arc::new(AtomicBool::new(false));
    let queue = format!("bench-{:08x}", rand::random::<u32>());
    if a.max_depth > 0 || a.max_running > 0 {
        set_limits(&addrs[0], &queue, a.max_running, a.max_depth).await?;
    }
    let mut jobs = tokio::task::JoinSet::new();
    let payload_len = a.payload_bytes.max(8);
    for p in 0..a.producers {
        let ch = channel(&addrs[p % addrs.len()]).await?;
        let (stats, stop, queue) = (stats.clone(), stop.clone(), queue.clone());
        let per_producer_rate = if a.rate == 0 { 0 } else { (a.rate / a.producers as u64).max(1) };
        if a.workload == Workload::Enqueue {
            jobs.spawn(unary_producer(ch, queue, a.batch, per_producer_rate, payload_len, stats, stop));
        } else {
            let keys: Vec<String> = (0..a.keys).map(|i| format!("key-{i}")).collect();
            let (batch, inflight, rate) = (a.batch.max(1), a.inflight.max(1), per_producer_rate);
            jobs.spawn(stream_producer(
                ch,
                ProducerSpec { queue, batch, inflight, rate, payload_len, keys, limit: 0 },
                stats,
                stop,
            ));
        }
    }
    if a.workload == Workload::Cycle {
        for w in 0..a.workers {
            let ch = channel(&addrs[w % addrs.len()]).await?;
            let (stats, stop, queue) = (stats.clone(), stop.clone(), queue.clone());
            let spec = WorkerSpec {
                queue,
                slots: a.slots.max(1),
                count: a.worker_batch.max(1),
                work: Duration::ZERO,
                jitter: 0.0,
            };
            jobs.spawn(stream_worker(ch, spec, w, stats, stop));
        }
    }
    let start = Instant::now();
    let mut last = (start, 0u64, 0u64);
    while start.elapsed() < a.duration {
        tokio::time::sleep(Duration::from_secs(1).min(a.duration.saturating_sub(start.elapsed()))).await;
        let (e, c) = (stats.enqueued.load(Ordering::Relaxed), stats.completed.load(Ordering::Relaxed));
        let dt = last.0.elapsed().as_secs_f64().max(1e-3);
        eprintln!(
            "[{:>5.1}s] enqueued {e} ({:.0}/s)  completed {c} ({:.0}/s)",
            start.elapsed().as_secs_f64(),
            (e - last.1) as f64 / dt,
            (c - last.2) as f64 / dt
        );
        last = (Instant::now(), e, c);
    }
    stop.store(true, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    // Stop all load, including parked Readys, without waiting for their hold time.
    jobs.abort_all();
    while jobs.join_next().await.is_some() {}

    let enqueued = stats.enqueued.load(Ordering::Relaxed);
    let completed = stats.completed.load(Ordering::Relaxed);
    let fsync = embedded.zip(log0).map(|((n, _, _), (f0, e0))| {
        (n.log_stats.fsyncs.load(Ordering::Relaxed) - f0, n.log_stats.entries.load(Ordering::Relaxed) - e0)
    });
    let report = serde_json::json!({
        "workload": if a.workload == Workload::Cycle { "cycle" } else { "enqueue" },
        "nodes": addrs,
        "seconds": secs,
        "producers": a.producers,
        "batch": a.batch,
        "workers": a.workers,
        "slots": a.slots,
        "worker_batch": a.worker_batch,
        "payload_bytes": payload_len,
        "target_rate": a.rate,
        "enqueued": enqueued,
        "enqueue_errors": stats.enqueue_errors.load(Ordering::Relaxed),
        "max_depth": a.max_depth,
        "max_running": a.max_running,
        "keys": a.keys,
        "refused": stats.refused.load(Ordering::Relaxed),
        "enqueued_per_s": enqueued as f64 / secs,
        "claimed": stats.claimed.load(Ordering::Relaxed),
        "completed": completed,
        "completed_per_s": completed as f64 / secs,
        "rejected_results": stats.rejected.load(Ordering::Relaxed),
        "enqueue_to_claim_ms": stats.to_claim.percentiles().map(|p| serde_json::json!({"p50": p[0], "p90": p[1], "p99": p[2]})),
        "enqueue_to_complete_ms": stats.to_complete.percentiles().map(|p| serde_json::json!({"p50": p[0], "p90": p[1], "p99": p[2]})),
        "log_fsyncs": fsync.map(|f| f.0),
        "raft_entries": fsync.map(|f| f.1),
        "enqueues_per_fsync": fsync.map(|f| enqueued as f64 / f.0.max(1) as f64),
    });
    if a.output == super::client::Output::Json {
        println!("{report}");
    } else {
        println!("workload            {}", report["workload"].as_str().unwrap_or(""));
        println!("nodes               {}", addrs.join(","));
        println!("seconds             {secs:.2}");
        println!("enqueued            {enqueued} ({:.0}/s)", enqueued as f64 / secs);
        println!("enqueue errors      {}", stats.enqueue_errors.load(Ordering::Relaxed));
        if a.keys > 0 {
            println!("concurrency keys    {}", a.keys);
        }
        if a.max_depth > 0 || a.max_running > 0 {
            println!("limits              max_depth {} max_running {}", a.max_depth, a.max_running);
            println!("refused (retried)   {}", stats.refused.load(Ordering::Relaxed));
        }
        if a.workload == Workload::Cycle {
            println!("completed           {completed} ({:.0}/s full cycles)", completed as f64 / secs);
            println!("rejected results    {}", stats.rejected.load(Ordering::Relaxed));
            for (name, s) in [("enqueue->claim", &stats.to_claim), ("enqueue->complete", &stats.to_complete)] {
                if let Some(p) = s.percentiles() {
                    println!("{name:<19} p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms", p[0], p[1], p[2]);
                }
            }
        }
        if let Some((f, e)) = fsync {
            println!("log fsyncs          {f}");
            println!("raft entries        {e}");
            println!("enqueues per fsync  {:.1}", enqueued as f64 / f.max(1) as f64);
        }
    }
    target.stop().await;
    Ok(())
}

/// Sets the bench queue's limits, waiting (up to 15 s) for a fresh cluster to run the version that has them.
async fn set_limits(addr: &str, queue: &str, max_running: u32, max_depth: u64) -> Result<()> {
    let mut jobs = raftq_proto::v1::jobs_client::JobsClient::new(channel(addr).await?);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let req = pb::QueueLimits { queue: queue.to_string(), max_running, max_depth };
        match jobs.set_queue_limits(authorized(req)).await {
            Ok(_) => return Ok(()),
            Err(s) if s.message().starts_with("FEATURE_NOT_ACTIVE") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => bail!("setting the bench queue's limits: {s}"),
        }
    }
}

fn payload(len: usize) -> bytes::Bytes {
    let mut p = vec![b'x'; len];
    p[..8].copy_from_slice(&now_us().to_be_bytes());
    p.into()
}

fn sent_at(p: &[u8]) -> u64 {
    p.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).unwrap_or(0)
}

/// Paces a producer to `rate` tasks/s (0: no pacing).
struct Pacer {
    start: Instant,
    sent: u64,
    rate: u64,
}

impl Pacer {
    async fn wait(&mut self, n: u64) {
        if self.rate > 0 {
            let due = self.start + Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        self.sent += n;
    }
}

pub(super) async fn stream_producer(ch: Channel, spec: ProducerSpec, stats: Arc<Counters>, stop: Arc<AtomicBool>) {
    let ProducerSpec { queue, batch, inflight, rate, payload_len, keys, limit } = spec;
    let limit = if limit == 0 { UNLIMITED } else { limit };
    let (tx, rx) = mpsc::channel(inflight + 1);
    let ev = |e| pb::ProducerEvent { event: Some(e) };
    let _ = tx.send(ev(pb::producer_event::Event::Hello(pb::Hello { token: token(), ..Default::default() }))).await;
    let Ok(resp) = ProducerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await else {
        stats.enqueue_errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut inbound = resp.into_inner();
    let permits = Arc::new(tokio::sync::Semaphore::new(inflight));
    let reader_permits = permits.clone();
    let reader_stats = stats.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(m)) = inbound.message().await {
            if let Some(pb::producer_server_event::Event::Ack(a)) = m.event {
                let ok =
                    a.results.iter().filter(|r| matches!(r.result, Some(pb::enqueue_result::Result::Ok(_)))).count();
                reader_stats.enqueued.fetch_add(ok as u64, Ordering::Relaxed);
                match &a.error {
                    // Refused whole by a limit: this create's slot waits the server's hint (flow control).
                    Some(e) if e.code == "QUEUE_FULL" || e.code == "RATE_LIMITED" => {
                        reader_stats.refused.fetch_add(batch as u64, Ordering::Relaxed);
                        let (permits, wait) = (reader_permits.clone(), Duration::from_millis(e.retry_after_ms.max(1)));
                        tokio::spawn(async move {
                            tokio::time::sleep(wait).await;
                            permits.add_permits(1);
                        });
                        continue;
                    }
                    Some(_) => _ = reader_stats.enqueue_errors.fetch_add(1, Ordering::Relaxed),
                    None => _ = reader_stats.enqueue_errors.fetch_add((a.results.len() - ok) as u64, Ordering::Relaxed),
                }
                reader_permits.add_permits(1);
            }
        }
    });
    let mut pacer = Pacer { start: Instant::now(), sent: 0, rate };
    let mut seq = 0u64;
    let mut next_key = keys.iter().cycle();
    while !stop.load(Ordering::Relaxed) {
        let Ok(p) = permits.acquire().await else { break };
        p.forget();
        pacer.wait(batch as u64).await;
        seq += 1;
        let task = |key: Option<&String>| pb::EnqueueRequest {
            queue: queue.clone(),
            payload: payload(payload_len),
            concurrency_key: key.cloned().unwrap_or_default(),
            concurrency_limit: if key.is_some() { limit } else { 0 },
            ..Default::default()
        };
        let tasks = (0..batch).map(|_| task(next_key.next())).collect();
        if tx.send(ev(pb::producer_event::Event::CreateBatch(pb::CreateBatch { seq, tasks }))).await.is_err() {
            break;
        }
    }
    drop(tx);
    reader.abort();
}

async fn unary_producer(
    ch: Channel,
    queue: String,
    batch: usize,
    rate: u64,
    payload_len: usize,
    stats: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let mut c = TaskServiceClient::new(ch);
    let mut pacer = Pacer { start: Instant::now(), sent: 0, rate };
    while !stop.load(Ordering::Relaxed) {
        let item = || pb::EnqueueRequest { queue: queue.clone(), payload: payload(payload_len), ..Default::default() };
        if batch == 0 {
            pacer.wait(1).await;
            match c.enqueue(authorized(item())).await {
                Ok(_) => stats.enqueued.fetch_add(1, Ordering::Relaxed),
                Err(_) => stats.enqueue_errors.fetch_add(1, Ordering::Relaxed),
            };
        } else {
            pacer.wait(batch as u64).await;
            match c
                .enqueue_batch(authorized(pb::EnqueueBatchRequest { items: (0..batch).map(|_| item()).collect() }))
                .await
            {
                Ok(r) => {
                    let ok = r
                        .get_ref()
                        .results
                        .iter()
                        .filter(|x| matches!(x.result, Some(pb::enqueue_result::Result::Ok(_))))
                        .count();
                    stats.enqueued.fetch_add(ok as u64, Ordering::Relaxed);
                    stats.enqueue_errors.fetch_add((batch - ok) as u64, Ordering::Relaxed);
                }
                Err(_) => {
                    stats.enqueue_errors.fetch_add(batch as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One worker stream with `slots` Readys outstanding; each batch is completed with one ResultBatch, after
/// `spec.work`.
pub(super) async fn stream_worker(
    ch: Channel,
    spec: WorkerSpec,
    n: usize,
    stats: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let WorkerSpec { queue, slots, count, work, jitter } = spec;
    let (tx, rx) = mpsc::channel(slots * 2 + 1);
    let ev = |e| pb::WorkerEvent { event: Some(e) };
    let hello = pb::Hello { token: token(), worker_id: format!("bench-{n}") };
    let _ = tx.send(ev(pb::worker_event::Event::Hello(hello))).await;
    let Ok(resp) = WorkerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await else { return };
    let mut inbound = resp.into_inner();
    let mut next_id = 0u64;
    let ready = |id: u64| {
        ev(pb::worker_event::Event::Ready(pb::Ready {
            request_id: id,
            queues: vec![queue.clone()],
            lease_ms: 60_000,
            count,
            ..Default::default()
        }))
    };
    for _ in 0..slots {
        next_id += 1;
        if tx.send(ready(next_id)).await.is_err() {
            return;
        }
    }
    // Per ResultBatch request: the send times of its tasks.
    let mut pending: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    while let Ok(Some(m)) = inbound.message().await {
        use pb::server_event::Event;
        match m.event {
            Some(Event::TaskBatch(b)) => {
                let now = now_us();
                stats.claimed.fetch_add(b.tasks.len() as u64, Ordering::Relaxed);
                if b.tasks.is_empty() {
                    if stop.load(Ordering::Relaxed) {
                        continue;
                    }
                    next_id += 1;
                    let _ = tx.send(ready(next_id)).await;
                    continue;
                }
                let mut sent = Vec::with_capacity(b.tasks.len());
                let results = b
                    .tasks
                    .into_iter()
                    .map(|t| {
                        let s = sent_at(&t.payload);
                        stats.note_claim(&t, s, now);
                        sent.push(s);
                        pb::Result {
                            request_id: 0,
                            task_id: t.id,
                            token: t.lease.map(|l| l.token).unwrap_or(0),
                            outcome: Some(pb::result::Outcome::Completed(pb::Complete::default())),
                        }
                    })
                    .collect();
                next_id += 1;
                pending.insert(next_id, sent);
                let done = ev(pb::worker_event::Event::ResultBatch(pb::ResultBatch { request_id: next_id, results }));
                // As the SDK's worker does: the slot's next Ready follows its results at once, not their acks.
                next_id += 1;
                let again = ready(next_id);
                if work.is_zero() {
                    if tx.send(done).await.is_err() || (!stop.load(Ordering::Relaxed) && tx.send(again).await.is_err())
                    {
                        return;
                    }
                } else {
                    let (tx, stop) = (tx.clone(), stop.clone());
                    let j = jitter.clamp(0.0, 1.0);
                    let work = work.mul_f64(1.0 - j + 2.0 * j * rand::random::<f64>());
                    tokio::spawn(async move {
                        tokio::time::sleep(work).await;
                        if tx.send(done).await.is_ok() && !stop.load(Ordering::Relaxed) {
                            let _ = tx.send(again).await;
                        }
                    });
                }
            }
            Some(Event::AckBatch(a)) => {
                let now = now_us();
                let sent = pending.remove(&a.request_id).unwrap_or_default();
                for (ack, s) in a.acks.iter().zip(sent) {
                    if ack.applied {
                        stats.completed.fetch_add(1, Ordering::Relaxed);
                        stats.to_complete.add(now.saturating_sub(s));
                    } else {
                        stats.rejected.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // A ResultBatch that failed already has its slot's next Ready out; a failed Ready is asked again.
            Some(Event::Error(e)) if pending.remove(&e.request_id).is_some() => {}
            Some(Event::Error(_)) if !stop.load(Ordering::Relaxed) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                next_id += 1;
                let _ = tx.send(ready(next_id)).await;
            }
            _ => {}
        }
    }
}
