//! The workload, through the real SDK (`raftq-client`) against random nodes, recording every operation.
//!
//! - Producers enqueue unique values (`p<process>-<n>`, the task's payload), one at a time or in small
//!   batches, each with a random `max_attempts`. Definite refusals (`NOT_LEADER`, `UNAVAILABLE`, a connection
//!   that could not be made) are `fail`; a timeout, a broken connection or `UNKNOWN_OUTCOME` is `info`, never
//!   `fail`. After an unknown outcome a producer reconnects starting at another random node.
//! - Workers are SDK `Worker`s with one slot each, no lease extension, and a handler that records the
//!   delivery (id, value, fencing token, attempts, lease times), then mostly completes the task with its own
//!   token as the result, sometimes fails it (retryable or final); the last worker(s) sometimes sleep past
//!   the lease so that their result arrives with a stale token.
//!
//! The limits workload (`--workload limits`, `LimitsPlan`) sets a running cap, fairness weights and a rate limit on
//! its queue first, gives every task one of a few concurrency keys with a per-key limit, keeps a bounded backlog
//! per key (a producer enqueues for a key only while fewer than `backlog` of its tasks are outstanding, so every
//! key stays backlogged and the drain stays short), and its handlers hold each task for a short random time
//! (well under the lease) before they answer. `checker::limits` checks the limits on its history.
//!
//! Whether the server accepted a result is read from the SDK: with one slot, a worker sends the outcome of
//! one delivery and waits for its answer before it claims the next, so between two handler calls exactly
//! that outcome settles. The counters of `Worker::stats()` say whether it was applied (completed / failed
//! went up), `Worker::rejections()` names a refusal (with `maybe_applied` when an earlier send of it went
//! unanswered), and nothing at all means no answer came before the worker stopped. That is why the SDK is
//! enough here and the raw stream protocol is not needed.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use raftq_client::{
    CancellationToken, Error, NewTask, Outcome, Producer, ProducerConfig, RateScope, Rejection, Task, Worker,
    WorkerConfig, WorkerStats, WorkerSummary,
};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tokio::sync::broadcast;

use crate::history::{KeyLimits, Op, Phase, Recorder, ResultKind};

#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub queue: String,
    /// Node API addresses (host:port).
    pub addrs: Vec<String>,
    pub producers: u32,
    pub workers: u32,
    /// Enqueue requests per second per producer.
    pub rate: f64,
    pub lease: Duration,
    /// Shares of deliveries that fail retryably, fail for good, and sleep past their lease.
    pub fail_retryable: f64,
    pub fail_final: f64,
    pub slow: f64,
    /// Workers `workers - slow_workers ..` are the slow ones.
    pub slow_workers: u32,
    /// Share of enqueue requests that are batches (2-8 values).
    pub batch: f64,
    pub seed: u64,
    /// Bearer token for every client (container mode: the compose cluster authenticates); None without auth.
    pub token: Option<String>,
    /// The limits workload (`--workload limits`); None for the default one.
    pub limits: Option<Arc<LimitsPlan>>,
}

/// The limits workload: the queue's limits, its keys, how long handlers hold a task, and the backlog per key.
#[derive(Debug)]
pub struct LimitsPlan {
    /// The running cap recorded in the history and checked.
    pub max_running: u32,
    /// The running cap set on the server: `max_running`, unless a run deliberately sets another to see the
    /// checker catch it (`--limits-server-cap`).
    pub server_max_running: u32,
    pub keys: Vec<KeyLimits>,
    /// How long a handler holds a task before it answers, ms (min, max).
    pub hold_ms: (u64, u64),
    /// Outstanding tasks per key (acknowledged enqueues minus accepted terminal results) a producer lets build up.
    pub backlog: i64,
    /// Outstanding tasks per key, by position in `keys`.
    outstanding: Vec<AtomicI64>,
}

impl LimitsPlan {
    /// The plan of `--workload limits`: a cap of 4 over three keys weighted 3:1:1, with concurrency limits of 3,
    /// 2 and 2 (each key's weighted share of the cap, rounded up, so the weights show in the claims and the
    /// limits still bind now and then), the third limited to 2 claims a second (a burst of 2).
    pub fn standard(server_max_running: Option<u32>) -> LimitsPlan {
        let key = |key: &str, weight: u32, limit: u32, per_second: f64| KeyLimits {
            key: key.into(),
            limit,
            weight,
            per_second,
            burst: if per_second > 0.0 { 2 } else { 0 },
        };
        let keys = vec![key("ka", 3, 3, 0.0), key("kb", 1, 2, 0.0), key("kc", 1, 2, 2.0)];
        LimitsPlan {
            max_running: 4,
            server_max_running: server_max_running.unwrap_or(4),
            outstanding: keys.iter().map(|_| AtomicI64::new(0)).collect(),
            keys,
            hold_ms: (20, 250),
            backlog: 25,
        }
    }

    /// A key for the next task: a random one among those with fewer than `backlog` outstanding tasks.
    fn pick_key(&self, rng: &mut StdRng) -> Option<usize> {
        let open: Vec<usize> =
            (0..self.keys.len()).filter(|k| self.outstanding[*k].load(Ordering::Relaxed) < self.backlog).collect();
        open.choose(rng).copied()
    }

    fn key_index(&self, key: &str) -> Option<usize> {
        self.keys.iter().position(|k| k.key == key)
    }
}

/// Sets the limits workload's cap, weights and rate limits through the SDK (retrying for up to 60 s: the cluster
/// may not run version 2 yet, or have no leader), then records them (`Op::Limits`).
pub async fn setup_limits(cfg: &WorkloadConfig, rec: &Recorder) -> anyhow::Result<()> {
    let Some(plan) = &cfg.limits else { return Ok(()) };
    let p = Producer::connect(ProducerConfig {
        addrs: cfg.addrs.clone(),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        max_retries: 5,
        token: cfg.token.clone(),
        ..Default::default()
    })
    .await
    .context("connecting for the limits setup")?;
    let q = cfg.queue.as_str();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut r = p.set_queue_limits(q, Some(plan.server_max_running), None).await.map(|_| ());
        for k in &plan.keys {
            if r.is_ok() && k.weight != 1 {
                r = p.set_fairness_weight(q, &k.key, k.weight).await.map(|_| ());
            }
            if r.is_ok() && k.per_second > 0.0 {
                r = p.set_rate_limit(q, RateScope::Key(k.key.clone()), k.per_second, Some(k.burst)).await.map(|_| ());
            }
        }
        match r {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("[{:>7.1}s] limits setup: {e}; again", rec.now() as f64 / 1000.0);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("setting the limits workload's limits"),
        }
    }
    rec.record(Op::Limits { queue: cfg.queue.clone(), max_running: plan.max_running, keys: plan.keys.clone() });
    Ok(())
}

/// A producer's config: the addresses in a random order, short timeouts (a fault run wants answers, not
/// patience).
fn producer_config(addrs: &[String], token: Option<&str>, rng: &mut StdRng) -> ProducerConfig {
    let mut addrs = addrs.to_vec();
    addrs.shuffle(rng);
    ProducerConfig {
        addrs,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        max_retries: 5,
        retry_backoff_min: Duration::from_millis(50),
        retry_backoff_max: Duration::from_millis(500),
        token: token.map(str::to_string),
        ..Default::default()
    }
}

/// Whether a failed write certainly did not happen (`Fail`) or may have (`Info`).
pub fn classify(e: &Error) -> Phase {
    match e {
        Error::NotLeader { .. } | Error::Transport { .. } | Error::Config(_) | Error::Closed(_) => Phase::Fail,
        Error::Server { reason, .. }
            if matches!(
                reason.as_str(),
                "UNAVAILABLE" | "INVALID_ARGUMENT" | "RESOURCE_EXHAUSTED" | "UNAUTHENTICATED" | "PERMISSION_DENIED"
            ) =>
        {
            Phase::Fail
        }
        _ => Phase::Info,
    }
}

/// Enqueues until `stop`, then returns.
pub async fn producer(p: u32, cfg: Arc<WorkloadConfig>, rec: Arc<Recorder>, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ (0x5052_4f44u64 << 32) ^ p as u64);
    let mut n = 0u64;
    let mut client: Option<Producer> = None;
    let mut uses = 0u32;
    let pause = Duration::from_secs_f64(1.0 / cfg.rate.max(0.1));
    while !stop.is_cancelled() {
        // A fresh client (another random node first) now and then, and after an unknown outcome.
        if client.is_none() || uses >= 200 {
            uses = 0;
            match Producer::connect(producer_config(&cfg.addrs, cfg.token.as_deref(), &mut rng)).await {
                Ok(c) => client = Some(c),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let c = client.clone().expect("connected above");
        uses += 1;
        let k = if rng.random_bool(cfg.batch) { rng.random_range(2..=8) } else { 1 };
        let mut items: Vec<(String, u32, Option<usize>)> = Vec::new();
        for _ in 0..k {
            let key = match &cfg.limits {
                Some(plan) => match plan.pick_key(&mut rng) {
                    Some(key) => Some(key),
                    // Every key has its backlog: wait for the workers.
                    None => break,
                },
                None => None,
            };
            n += 1;
            items.push((format!("p{p}-{n}"), rng.random_range(2..=5u32), key));
        }
        if items.is_empty() {
            uses -= 1;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.cancelled() => {}
            }
            continue;
        }
        for (value, max_attempts, _) in &items {
            rec.record(Op::Enqueue {
                process: p,
                value: value.clone(),
                phase: Phase::Invoke,
                max_attempts: *max_attempts,
                task_id: None,
                error: None,
            });
        }
        let tasks: Vec<NewTask> = items
            .iter()
            .map(|(v, m, key)| {
                let t = NewTask::new(cfg.queue.clone(), v.clone()).max_attempts(*m);
                match (&cfg.limits, key) {
                    (Some(plan), Some(key)) => t.concurrency(plan.keys[*key].key.clone(), plan.keys[*key].limit),
                    _ => t,
                }
            })
            .collect();
        // The SDK's own timeout answers first; this one only guards against a hang.
        let guard = Duration::from_secs(30);
        let answers: Vec<Result<String, Error>> = if tasks.len() == 1 {
            let t = tasks.into_iter().next().expect("one task");
            match tokio::time::timeout(guard, c.enqueue(t)).await {
                Ok(r) => vec![r.map(|e| e.task_id)],
                Err(_) => vec![Err(Error::UnknownOutcome { message: "harness timeout".into() })],
            }
        } else {
            match tokio::time::timeout(guard, c.enqueue_batch(tasks)).await {
                Ok(Ok(per_item)) => per_item.into_iter().map(|r| r.map(|e| e.task_id)).collect(),
                Ok(Err(e)) => items.iter().map(|_| Err(copy_error(&e))).collect(),
                Err(_) => {
                    items.iter().map(|_| Err(Error::UnknownOutcome { message: "harness timeout".into() })).collect()
                }
            }
        };
        let mut unknown = false;
        for ((value, max_attempts, key), answer) in items.into_iter().zip(answers) {
            let (phase, task_id, error) = match answer {
                Ok(id) => {
                    if let (Some(plan), Some(key)) = (&cfg.limits, key) {
                        plan.outstanding[key].fetch_add(1, Ordering::Relaxed);
                    }
                    (Phase::Ok, Some(id), None)
                }
                Err(e) => (classify(&e), None, Some(e.to_string())),
            };
            unknown |= phase == Phase::Info;
            rec.record(Op::Enqueue { process: p, value, phase, max_attempts, task_id, error });
        }
        if unknown {
            client = None;
        }
        let jitter = rng.random_range(0.5..1.5);
        tokio::select! {
            _ = tokio::time::sleep(pause.mul_f64(jitter)) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// The same error for every item of a batch that failed as a whole.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::NotLeader { leader } => Error::NotLeader { leader: leader.clone() },
        Error::Transport { message, .. } => Error::Transport { message: message.clone(), source: None },
        Error::Server { reason, message } => Error::Server { reason: reason.clone(), message: message.clone() },
        Error::Closed(m) => Error::Closed(m.clone()),
        other => Error::UnknownOutcome { message: other.to_string() },
    }
}

/// The result of the last delivery, sent after the handler returned and not yet known to be settled.
struct Pending {
    task_id: String,
    token: u64,
    /// The task's concurrency key.
    key: String,
    kind: ResultKind,
    before: WorkerSummary,
}

/// What one SDK Worker's handler shares: the recorder, the worker's counters and rejections, the delivery
/// whose outcome is on its way.
struct Slot {
    worker: u32,
    cfg: Arc<WorkloadConfig>,
    rec: Arc<Recorder>,
    stats: Arc<WorkerStats>,
    rejections: Mutex<broadcast::Receiver<Rejection>>,
    pending: Mutex<Option<Pending>>,
    rng: Mutex<StdRng>,
    stop: CancellationToken,
}

impl Slot {
    /// Records how the pending outcome settled: called when the next delivery arrives (the slot claims only
    /// after its last outcome was answered) and when the worker stopped.
    fn settle(&self) {
        let Some(p) = self.pending.lock().expect("pending lock").take() else { return };
        let after = self.stats.snapshot();
        let mut refusal = None;
        {
            let mut rx = self.rejections.lock().expect("rejections lock");
            loop {
                match rx.try_recv() {
                    Ok(r) if r.task_id == p.task_id => refusal = Some(r),
                    Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
        }
        let applied = match p.kind {
            ResultKind::Complete => after.completed > p.before.completed,
            ResultKind::FailRetryable | ResultKind::FailFinal => after.failed > p.before.failed,
        };
        let (phase, reason) = if applied {
            if let Some(plan) = self.cfg.limits.as_ref().filter(|_| p.kind.terminal()) {
                if let Some(k) = plan.key_index(&p.key) {
                    plan.outstanding[k].fetch_sub(1, Ordering::Relaxed);
                }
            }
            (Phase::Ok, None)
        } else if let Some(r) = refusal {
            if r.maybe_applied {
                (Phase::Info, Some(format!("{} after an unanswered send", r.reason)))
            } else {
                (Phase::Fail, Some(r.reason))
            }
        } else if after.unconfirmed > p.before.unconfirmed {
            (Phase::Info, Some("unconfirmed at shutdown".into()))
        } else {
            (Phase::Info, Some("no answer seen".into()))
        };
        self.rec.record(Op::Result {
            worker: self.worker,
            task_id: p.task_id,
            token: p.token,
            outcome: p.kind,
            phase,
            reason,
        });
    }

    async fn handle(&self, task: Task) -> Outcome {
        self.settle();
        let token = task.token();
        let (claimed_at_ms, deadline_ms) = task.lease.as_ref().map_or((0, 0), |l| (l.claimed_at_ms, l.deadline_ms));
        self.rec.record(Op::Deliver {
            worker: self.worker,
            task_id: task.id.clone(),
            value: String::from_utf8_lossy(&task.payload).into_owned(),
            token,
            attempts: task.attempts,
            max_attempts: task.max_attempts,
            claimed_at_ms,
            deadline_ms,
            key: task.concurrency_key.clone(),
        });
        let (kind, slow, hold) = {
            let mut rng = self.rng.lock().expect("rng lock");
            let r: f64 = rng.random();
            let kind = if r < self.cfg.fail_final {
                ResultKind::FailFinal
            } else if r < self.cfg.fail_final + self.cfg.fail_retryable {
                ResultKind::FailRetryable
            } else {
                ResultKind::Complete
            };
            let slow_one = self.worker + self.cfg.slow_workers >= self.cfg.workers;
            let hold = self.cfg.limits.as_ref().map(|l| rng.random_range(l.hold_ms.0..=l.hold_ms.1));
            (kind, slow_one && rng.random_bool(self.cfg.slow), hold)
        };
        if slow {
            // Past the lease: the task is redelivered meanwhile and this result must be refused.
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.lease + Duration::from_millis(1000)) => {}
                _ = self.stop.cancelled() => {}
            }
        } else if let Some(ms) = hold {
            // The limits workload: the task runs a while, so running tasks pile up against the limits.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = self.stop.cancelled() => {}
            }
        }
        let outcome = match kind {
            ResultKind::Complete => Outcome::Completed(token.to_string().into()),
            ResultKind::FailRetryable => {
                Outcome::Failed { error: "injected retryable failure".into(), retryable: true }
            }
            ResultKind::FailFinal => Outcome::Failed { error: "injected final failure".into(), retryable: false },
        };
        *self.pending.lock().expect("pending lock") = Some(Pending {
            task_id: task.id.clone(),
            token,
            key: task.concurrency_key.clone(),
            kind,
            before: self.stats.snapshot(),
        });
        self.rec.record(Op::Result {
            worker: self.worker,
            task_id: task.id,
            token,
            outcome: kind,
            phase: Phase::Invoke,
            reason: None,
        });
        outcome
    }
}

/// Runs SDK workers for worker number `w` until `stop`; a worker whose run ends with an error is replaced.
pub async fn worker(w: u32, cfg: Arc<WorkloadConfig>, rec: Arc<Recorder>, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ (0x574f_524bu64 << 32) ^ w as u64);
    let mut generation = 0u32;
    while !stop.is_cancelled() {
        generation += 1;
        let mut addrs = cfg.addrs.clone();
        addrs.shuffle(&mut rng);
        let wc = WorkerConfig {
            addrs,
            worker_id: format!("w{w}-{generation}"),
            queues: vec![cfg.queue.clone()],
            concurrency: 1,
            lease: cfg.lease,
            batch_size: 1,
            heartbeat: None,
            shutdown_grace: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            token: cfg.token.clone(),
            ..Default::default()
        };
        let sdk = match Worker::new(wc) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("worker {w}: {e}");
                return;
            }
        };
        let slot = Arc::new(Slot {
            worker: w,
            cfg: cfg.clone(),
            rec: rec.clone(),
            stats: sdk.stats(),
            rejections: Mutex::new(sdk.rejections()),
            pending: Mutex::new(None),
            rng: Mutex::new(StdRng::seed_from_u64(rng.random())),
            stop: stop.clone(),
        });
        let h = slot.clone();
        let r = sdk
            .run(
                move |t: Task| {
                    let h = h.clone();
                    async move { h.handle(t).await }
                },
                stop.clone(),
            )
            .await;
        slot.settle();
        if let Err(e) = r {
            eprintln!("worker {w}: run ended: {e}; starting another");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_outcomes_are_never_failures() {
        assert_eq!(classify(&Error::UnknownOutcome { message: "t".into() }), Phase::Info);
        assert_eq!(classify(&Error::Protocol("x".into())), Phase::Info);
        let internal = Error::Server { reason: "INTERNAL".into(), message: String::new() };
        assert_eq!(classify(&internal), Phase::Info);
        assert_eq!(classify(&Error::NotLeader { leader: None }), Phase::Fail);
        let unavailable = Error::Server { reason: "UNAVAILABLE".into(), message: String::new() };
        assert_eq!(classify(&unavailable), Phase::Fail);
    }
}
