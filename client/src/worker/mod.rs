//! The worker: one `WorkerStream.Stream` per worker shared by `concurrency` slots, each looping Ready ->
//! tasks -> handler -> outcome -> checked ack (the next Ready goes out while the ack is awaited). A supervisor
//! keeps the stream open (reconnecting with backoff, following the leader); slots and their running handlers
//! outlive a lost stream, and outcomes are sent on the next one. Shutdown stops Readys, lets handlers finish
//! within the grace, abandons the rest.
//!
//! Invariants: every claimed task gets exactly one final outcome sent (the handler's, or Abandon), and every
//! answer to an outcome is checked: an applied outcome is counted and broadcast ([`Worker::applied`]), a
//! refusal is logged, counted and broadcast ([`Worker::rejections`]), never dropped.

mod outcome;
mod session;
mod stats;

use foldhash::HashMap;
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use raftq_proto::reason::Reason;
use raftq_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backoff::Backoff;
use crate::connection::{validate_target, Connector, DEFAULT_ADDR};
use crate::error::{Error, Result, NOT_LEADER};
use crate::task::{duration_ms, Signal, Task, TaskState};
pub(crate) use outcome::ack_action;
use outcome::{heartbeat_event, pair_acks, plan, ready_event, unit_event, verdict, Item, Unit, Verdict};
pub use outcome::{Applied, Outcome, Rejection};
use session::{Lost, Reply, Session};
pub use stats::{WorkerStats, WorkerSummary};

/// Rejections kept for slow subscribers of [`Worker::rejections`]; older ones are dropped for them (they see
/// `RecvError::Lagged`), the counter still counts them.
const REJECTIONS_CAPACITY: usize = 1024;
/// Applied outcomes kept for slow subscribers of [`Worker::applied`] (same rule): a few seconds of a busy
/// worker's completions.
const APPLIED_CAPACITY: usize = 4096;
/// After the shutdown grace, outcomes (including the abandons of cut-off handlers) get this long for their
/// answers before they are counted unconfirmed: one leader election plus a commit.
const ACK_DRAIN: Duration = Duration::from_secs(5);
/// Tasks that arrive for a Ready nobody waits for any more (its slot stopped at shutdown), queued to be
/// given back. Bounded: beyond it the lease expiry gives them back.
const ORPHAN_BUFFER: usize = 1024;
/// A stream retired at shutdown waits this long at most for its requests in flight to be answered.
const RETIRE_MAX: Duration = Duration::from_secs(2);
/// How often a retiring stream checks whether its last request was answered.
const RETIRE_POLL: Duration = Duration::from_millis(5);
/// Largest `concurrency`: each slot is a task holding up to `batch_size` leases.
const MAX_CONCURRENCY: usize = 4096;
/// Largest `batch_size`: the server's default `max_batch_items`.
const MAX_BATCH_SIZE: u32 = 1000;

/// [`Task::revocation`] after the shutdown grace ran out while the handler still ran.
const SHUTDOWN: &str = "SHUTDOWN";
/// [`Task::revocation`] after a lease extension was refused.
const LEASE_LOST_SIGNAL: &str = Reason::LeaseLost.as_str();

/// Gives the token to open a stream with (called on every open); `None` opens without one.
pub type TokenProvider = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// How a [`Worker`] runs. Build it with struct update syntax over `Default`:
///
/// ```
/// use std::time::Duration;
/// use raftq_client::WorkerConfig;
/// let cfg = WorkerConfig {
///     queues: vec!["emails".into()],
///     concurrency: 8,
///     lease: Duration::from_secs(60),
///     heartbeat: Some(Duration::from_secs(20)),
///     ..Default::default()
/// };
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Clone)]
pub struct WorkerConfig {
    /// Server addresses (`host:port` or `http://host:port`), tried in order.
    pub addrs: Vec<String>,
    /// Bearer token sent in Hello and with the stream request.
    pub token: Option<String>,
    /// Asked for a token each time a stream opens (the first and every reconnect), so a worker outlives its
    /// tokens: the server closes a stream when its token expires (`TOKEN_EXPIRED`) and the worker reopens it
    /// with the provider's next token. Takes precedence over `token`.
    pub token_provider: Option<TokenProvider>,
    /// The CA (PEM) servers are verified with; addresses without a scheme then use https.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// This worker's name in leases; 1-256 characters.
    pub worker_id: String,
    /// Queues to take tasks from (1 to 64).
    pub queues: Vec<String>,
    /// Slots: handlers running at once on the one stream.
    pub concurrency: usize,
    /// Lease asked for each delivery; a task not reported within it (and not extended) is redelivered.
    pub lease: Duration,
    /// Tasks asked for by one Ready. Above 1, a slot runs the batch's handlers one after another and sends
    /// their completed and failed outcomes in one `ResultBatch`.
    pub batch_size: u32,
    /// Extend the leases a slot holds this often while their handlers run (by `lease` each time); `None`
    /// never extends. A third of the lease leaves room for two lost extensions.
    pub heartbeat: Option<Duration>,
    /// On shutdown, how long running handlers may take to finish before their tasks are abandoned.
    pub shutdown_grace: Duration,
    /// First delay before reconnecting a lost stream; it doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    /// Longest delay between reconnects.
    pub reconnect_backoff_max: Duration,
    /// Longest wait for a connection to one address.
    pub connect_timeout: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let lease = Duration::from_secs(30);
        WorkerConfig {
            addrs: vec![DEFAULT_ADDR.into()],
            token: None,
            token_provider: None,
            tls_ca_pem: None,
            worker_id: format!("worker-{}-{:08x}", std::process::id(), rand::random::<u32>()),
            queues: Vec::new(),
            concurrency: 1,
            // The server's default lease.
            lease,
            batch_size: 1,
            heartbeat: Some(lease / 3),
            shutdown_grace: Duration::from_secs(30),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("addrs", &self.addrs)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_provider", &self.token_provider.as_ref().map(|_| "<fn>"))
            .field("worker_id", &self.worker_id)
            .field("queues", &self.queues)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("batch_size", &self.batch_size)
            .field("heartbeat", &self.heartbeat)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("reconnect_backoff_min", &self.reconnect_backoff_min)
            .field("reconnect_backoff_max", &self.reconnect_backoff_max)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The server's rule for queue names: a letter or digit first, then letters, digits, `.`, `_`, `:`, `-`.
fn valid_queue(q: &str) -> bool {
    q.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && q.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl WorkerConfig {
    /// Every violated rule, one line each.
    pub fn validate(&self) -> Result<()> {
        let mut e = Vec::new();
        validate_target(&self.addrs, self.token.as_deref(), self.tls_ca_pem.as_deref(), &mut e);
        if self.worker_id.is_empty() || self.worker_id.len() > 256 {
            e.push("worker_id must be 1 to 256 characters".into());
        }
        if self.queues.is_empty() || self.queues.len() > 64 {
            e.push("queues must name 1 to 64 queues".into());
        }
        for q in self.queues.iter().filter(|q| !valid_queue(q)) {
            e.push(format!(
                "queue name {q:?} must start with a letter or digit and hold only letters, digits, '.', '_', ':' and '-'"
            ));
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            e.push(format!("concurrency must be 1 to {MAX_CONCURRENCY}"));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            e.push(format!("batch_size must be 1 to {MAX_BATCH_SIZE}"));
        }
        if self.lease < Duration::from_millis(1) {
            e.push("lease must be at least 1 ms".into());
        }
        if let Some(h) = self.heartbeat {
            if h.is_zero() || h >= self.lease {
                e.push(format!(
                    "heartbeat ({h:?}) must be > 0 and shorter than the lease ({:?}); a third of it is a good value",
                    self.lease
                ));
            }
        }
        if self.reconnect_backoff_min.is_zero() || self.reconnect_backoff_min > self.reconnect_backoff_max {
            e.push("reconnect_backoff_min must be > 0 and <= reconnect_backoff_max".into());
        }
        if self.connect_timeout.is_zero() {
            e.push("connect_timeout must be > 0".into());
        }
        if e.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(e))
        }
    }
}

/// A long-lived worker. Create it with [`Worker::new`], then [`Worker::run`] it with a handler until a
/// shutdown token fires:
///
/// ```no_run
/// # async fn f() -> raftq_client::Result<()> {
/// use raftq_client::{CancellationToken, Outcome, Task, Worker, WorkerConfig};
/// let worker = Worker::new(WorkerConfig { queues: vec!["emails".into()], concurrency: 4, ..Default::default() })?;
/// let shutdown = CancellationToken::new();
/// let summary = worker
///     .run(|task: Task| async move { Outcome::Completed(task.payload) }, shutdown.clone())
///     .await?;
/// println!("{summary:?}");
/// # Ok(()) }
/// ```
pub struct Worker {
    cfg: Arc<WorkerConfig>,
    conn: Arc<Connector>,
    stats: Arc<WorkerStats>,
    rejections: broadcast::Sender<Rejection>,
    applied: broadcast::Sender<Applied>,
    running: AtomicBool,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("cfg", &self.cfg).field("stats", &self.stats.snapshot()).finish()
    }
}

/// Clears the running flag however `run` ends.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Worker {
    /// Checks the configuration; connects only when run.
    pub fn new(cfg: WorkerConfig) -> Result<Worker> {
        cfg.validate()?;
        let conn = Connector::new(&cfg.addrs, cfg.token.as_deref(), cfg.tls_ca_pem.as_deref(), cfg.connect_timeout)?;
        let (rejections, _) = broadcast::channel(REJECTIONS_CAPACITY);
        let (applied, _) = broadcast::channel(APPLIED_CAPACITY);
        Ok(Worker {
            cfg: Arc::new(cfg),
            conn: Arc::new(conn),
            stats: Arc::default(),
            rejections,
            applied,
            running: AtomicBool::new(false),
        })
    }

    /// The configuration this worker runs with.
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// The live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Every outcome the server refuses from now on (`LEASE_LOST` and the like), as it happens.
    pub fn rejections(&self) -> broadcast::Receiver<Rejection> {
        self.rejections.subscribe()
    }

    /// Every outcome the server applies from now on (completions, failures, nacks, abandons, exceptions), as
    /// its answer arrives: the per-task counterpart of the counters in [`Worker::stats`]. A subscriber more than
    /// 4,096 outcomes behind misses the oldest (`RecvError::Lagged`); the counters still count them.
    pub fn applied(&self) -> broadcast::Receiver<Applied> {
        self.applied.subscribe()
    }

    /// Runs the slots until `shutdown` fires, then shuts down gracefully: no more Readys, running handlers
    /// get `shutdown_grace` to finish, what still runs is abandoned, and the counters are returned.
    ///
    /// `handler` is called concurrently from the slots, once per delivered task. A panicking handler counts
    /// as `Outcome::Failed { retryable: true }`. Lost streams are reopened with backoff; a refusal that no
    /// retry can fix (a bad token, a queue name the server refuses) ends the run with that error after the
    /// same graceful shutdown. The summary counts everything since the worker was created.
    ///
    /// Dropping the returned future instead of firing `shutdown` stops everything at once: tasks in hand
    /// are redelivered when their leases run out.
    pub async fn run<H, F>(&self, handler: H, shutdown: CancellationToken) -> Result<WorkerSummary>
    where
        H: Fn(Task) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        if self.running.swap(true, Ordering::SeqCst) {
            return Err(Error::AlreadyRunning);
        }
        let _running = Running(&self.running);
        let (orphans, orphan_rx) = mpsc::channel(ORPHAN_BUFFER);
        let ctx = Arc::new(Ctx {
            cfg: self.cfg.clone(),
            conn: self.conn.clone(),
            stats: self.stats.clone(),
            rejections: self.rejections.clone(),
            applied: self.applied.clone(),
            next_id: AtomicU64::new(1),
            session: watch::Sender::new(None),
            stopping: CancellationToken::new(),
            grace_over: CancellationToken::new(),
            give_up: CancellationToken::new(),
            closing: CancellationToken::new(),
            fatal: Mutex::new(None),
            orphans,
            running: Mutex::default(),
        });
        let supervisor = AbortOnDropHandle::new(tokio::spawn(supervise(ctx.clone())));
        let janitor_stop = CancellationToken::new();
        let janitor = AbortOnDropHandle::new(tokio::spawn(janitor(ctx.clone(), orphan_rx, janitor_stop.clone())));
        let handler = Arc::new(handler);
        let mut slots = JoinSet::new();
        for n in 0..self.cfg.concurrency {
            slots.spawn(slot(ctx.clone(), handler.clone(), n));
        }
        tracing::info!(
            worker_id = %self.cfg.worker_id,
            queues = ?self.cfg.queues,
            concurrency = self.cfg.concurrency,
            "worker started"
        );

        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = ctx.stopping.cancelled() => {}
        }
        ctx.stopping.cancel();
        tracing::info!(worker_id = %self.cfg.worker_id, "worker stopping");
        let deadline = Instant::now() + self.cfg.shutdown_grace;
        let slots_done = async {
            while let Some(r) = slots.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %e, "a worker slot ended abnormally");
                }
            }
        };
        tokio::pin!(slots_done);
        if tokio::time::timeout_at(deadline, &mut slots_done).await.is_err() {
            ctx.grace_over.cancel();
            if tokio::time::timeout(ACK_DRAIN, &mut slots_done).await.is_err() {
                ctx.give_up.cancel();
                slots_done.await;
            }
        }
        janitor_stop.cancel();
        let mut janitor = janitor;
        if tokio::time::timeout(ACK_DRAIN, &mut janitor).await.is_err() {
            ctx.give_up.cancel();
            let _ = janitor.await;
        }
        ctx.closing.cancel();
        let _ = supervisor.await;
        let summary = self.stats.snapshot();
        tracing::info!(worker_id = %self.cfg.worker_id, ?summary, "worker stopped");
        let fatal = ctx.fatal.lock().expect("fatal lock poisoned").take();
        match fatal {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    }
}

/// What the supervisor, the reader, the slots and the janitor of one run share.
struct Ctx {
    cfg: Arc<WorkerConfig>,
    conn: Arc<Connector>,
    stats: Arc<WorkerStats>,
    rejections: broadcast::Sender<Rejection>,
    applied: broadcast::Sender<Applied>,
    /// Request ids, unique for the whole run so an answer from an old stream can never match a new request.
    next_id: AtomicU64,
    /// The open stream, `None` while reconnecting.
    session: watch::Sender<Option<Arc<Session>>>,
    /// Shutdown began (the caller's token, or an error no retry can fix): no more Readys.
    stopping: CancellationToken,
    /// The grace ran out: running handlers are dropped and their tasks abandoned.
    grace_over: CancellationToken,
    /// Outcomes still without an answer are counted unconfirmed.
    give_up: CancellationToken,
    /// Everything is done: the supervisor closes the stream.
    closing: CancellationToken,
    fatal: Mutex<Option<Error>>,
    orphans: mpsc::Sender<pb::Task>,
    /// The deliveries whose handlers run or wait in a slot, and the ends pushed before their batch was admitted.
    running: Mutex<Deliveries>,
}

/// Ends of deliveries kept for tasks not yet admitted, at most; older ones are forgotten.
const ENDED_EARLY_KEPT: usize = 1024;
/// How long such an end is kept: a claim's answer and the end of one of its deliveries are read moments apart, so
/// an older one was for a delivery this worker no longer holds (its outcome was already answered).
const ENDED_EARLY_FOR: Duration = Duration::from_secs(10);

/// What `Ctx::running` guards: one lock, so an end pushed while a batch is being admitted is seen by one of them.
#[derive(Default)]
struct Deliveries {
    /// task id -> (token, the handler's signal).
    held: HashMap<Arc<str>, (u64, Signal)>,
    /// Ends of deliveries this worker does not hold (yet): (when, task id, token, reason), oldest first. A claim's
    /// answer and the end of one of its deliveries can both be read before the slot takes the batch; admitting it
    /// looks here.
    ended_early: std::collections::VecDeque<(Instant, String, u64, String)>,
}

impl Deliveries {
    /// Forgets the ends kept longer than `ENDED_EARLY_FOR`.
    fn forget_old_ends(&mut self, now: Instant) {
        while self.ended_early.front().is_some_and(|e| now.duration_since(e.0) > ENDED_EARLY_FOR) {
            self.ended_early.pop_front();
        }
    }
}

impl Ctx {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The open stream, waiting for the supervisor to open one.
    async fn live_session(&self) -> Arc<Session> {
        let mut rx = self.session.subscribe();
        loop {
            let live = rx.borrow_and_update().as_ref().filter(|s| s.is_live()).cloned();
            if let Some(s) = live {
                return s;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`, so this cannot happen; wait for cancellation instead of spinning.
                std::future::pending::<()>().await;
            }
        }
    }

    fn current_session(&self) -> Option<Arc<Session>> {
        self.session.borrow().as_ref().filter(|s| s.is_live()).cloned()
    }

    /// Ends the run with `e` once shut down; `hard` when nothing can be delivered any more either.
    fn fail(&self, e: Error, hard: bool) {
        let mut f = self.fatal.lock().expect("fatal lock poisoned");
        if f.is_none() {
            *f = Some(e);
        }
        self.stopping.cancel();
        if hard {
            self.grace_over.cancel();
            self.give_up.cancel();
        }
    }

    /// Records the server's answer to one outcome.
    fn settle(&self, item: &Item, ack: &pb::TaskAck, maybe_applied: bool) {
        match verdict(ack) {
            Verdict::Applied => {
                let counter = match item.outcome {
                    Outcome::Completed(_) | Outcome::CompletedWith { .. } => &self.stats.completed,
                    Outcome::Failed { .. } => &self.stats.failed,
                    Outcome::Nack { .. } => &self.stats.nacked,
                    Outcome::Abandon => &self.stats.abandoned,
                    Outcome::Exception { .. } => &self.stats.exceptions,
                };
                WorkerStats::add(counter, 1);
                // Built only for subscribers; none is fine (the counter records it).
                if self.applied.receiver_count() > 0 {
                    let _ = self.applied.send(Applied {
                        task_id: item.task_id.clone(),
                        outcome: item.outcome.clone(),
                        state: TaskState::from_proto(ack.state),
                        at_ms: ack.at_ms,
                    });
                }
            }
            Verdict::Refused { reason, message } => self.reject(item, reason, message, maybe_applied),
        }
    }

    fn reject(&self, item: &Item, reason: String, message: String, maybe_applied: bool) {
        WorkerStats::add(&self.stats.rejected, 1);
        tracing::warn!(
            task_id = %item.task_id,
            reason = %reason,
            message = %message,
            maybe_applied,
            "the server refused a task outcome"
        );
        // No subscriber is fine: the counter and the log line still record it.
        let _ = self.rejections.send(Rejection {
            task_id: item.task_id.clone(),
            reason,
            message,
            outcome: item.outcome.clone(),
            maybe_applied,
        });
    }

    fn unconfirmed(&self, unit: &Unit) {
        let n = unit.items().len() as u64;
        WorkerStats::add(&self.stats.unconfirmed, n);
        for i in unit.items() {
            tracing::warn!(task_id = %i.task_id, "no answer to a task outcome before shutdown; it may or may not be applied");
        }
    }

    /// The server ended a delivery this worker holds (`LeaseRevoked`), or refused to extend it: tell its handler.
    fn revoke(&self, task_id: &str, token: u64, reason: &str) {
        let signal = {
            let mut d = self.running.lock().expect("running lock poisoned");
            match d.held.get(task_id) {
                Some((t, signal)) if *t == token => signal.clone(),
                Some(_) => return,
                None => {
                    let now = Instant::now();
                    d.forget_old_ends(now);
                    if d.ended_early.len() >= ENDED_EARLY_KEPT {
                        d.ended_early.pop_front();
                    }
                    d.ended_early.push_back((now, task_id.to_string(), token, reason.to_string()));
                    return;
                }
            }
        };
        if signal.fire(reason) {
            WorkerStats::add(&self.stats.revoked, 1);
            tracing::info!(task_id, token, reason, "the task's delivery ended; telling its handler");
        }
    }

    /// Sleeps `d` unless the run gives up first; false when it did.
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.give_up.cancelled() => false,
        }
    }
}

/// Errors on opening a stream that another try will not fix. An expired token is fixed by a token provider.
fn fatal_on_open(e: &Error, has_provider: bool) -> bool {
    match e {
        Error::Server { reason, .. } => match Reason::parse(reason) {
            Some(Reason::TokenExpired) => !has_provider,
            Some(r) => r.is_token() || matches!(r, Reason::InvalidArgument | Reason::ScopeRequired),
            // Framework statuses without a raftq reason, by their gRPC code name.
            None => matches!(reason.as_str(), "UNAUTHENTICATED" | "PERMISSION_DENIED" | "UNIMPLEMENTED"),
        },
        Error::Config(_) | Error::Protocol(_) => true,
        _ => false,
    }
}

/// Redirects to a named leader a worker follows in a row without pausing.
const MAX_QUICK_REDIRECTS: u32 = 3;

/// Keeps one stream open: opens it, publishes it to the slots, reads it until it ends, reopens it with
/// backoff (to the leader when one was named, else the next address).
async fn supervise(ctx: Arc<Ctx>) {
    let cfg = ctx.cfg.clone();
    let mut backoff = Backoff::new(cfg.reconnect_backoff_min, cfg.reconnect_backoff_max);
    // The next open replaces a lost stream (not the first one, nor one retired on purpose).
    let mut replaces_lost = false;
    // Redirects followed at once since a stream was last answered: a node that named the leader is not a failure, so
    // the leader is tried without the backoff's pause (a few times in a row, so two nodes that name each other
    // during a leader change are not called in a tight loop).
    let mut redirects = 0;
    loop {
        let token = match &cfg.token_provider {
            Some(p) => p().unwrap_or_default(),
            None => cfg.token.clone().unwrap_or_default(),
        };
        let opened = tokio::select! {
            r = Session::open(&ctx.conn, &token, &cfg.worker_id) => r,
            _ = ctx.closing.cancelled() => return,
        };
        match opened {
            Ok((session, inbound)) => {
                let session = Arc::new(session);
                if replaces_lost {
                    WorkerStats::add(&ctx.stats.reconnects, 1);
                }
                replaces_lost = false;
                tracing::info!(addr = %session.addr, worker_id = %cfg.worker_id, "worker stream open");
                let started = Instant::now();
                ctx.session.send_replace(Some(session.clone()));
                let end = read_events(&ctx, &session, inbound).await;
                if session.was_answered() {
                    redirects = 0;
                }
                session.close();
                ctx.session.send_replace(None);
                match end {
                    End::Stopped => return,
                    // Not a loss: open the next stream at once, without counting a reconnect.
                    End::Retired => {
                        tracing::debug!(addr = %session.addr, "worker stream retired at shutdown");
                        continue;
                    }
                    // Its node named the leader: go there now (the first time since a stream was answered).
                    End::Lost(_) if session.was_redirected() && redirects < MAX_QUICK_REDIRECTS => {
                        replaces_lost = true;
                        redirects += 1;
                        tracing::info!(addr = %session.addr, "worker stream moves to the leader");
                        continue;
                    }
                    End::Lost(why) => {
                        replaces_lost = true;
                        tracing::warn!(addr = %session.addr, reason = %why, "worker stream lost; reconnecting");
                        if session.was_answered() || started.elapsed() >= cfg.reconnect_backoff_max {
                            backoff.reset();
                        }
                    }
                }
            }
            Err(e) if fatal_on_open(&e, cfg.token_provider.is_some()) => {
                tracing::error!(error = %e, "the server refused the worker stream");
                ctx.fail(e, true);
                return;
            }
            Err(Error::NotLeader { leader: Some(leader) }) if redirects < MAX_QUICK_REDIRECTS => {
                redirects += 1;
                tracing::debug!(%leader, "the worker stream goes to the leader");
                continue;
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the worker stream"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = ctx.closing.cancelled() => return,
        }
    }
}

/// How a session's reading ended.
enum End {
    /// The worker is done.
    Stopped,
    /// Retired at shutdown so the server drops the Readys it holds for it.
    Retired,
    /// Lost, for this reason.
    Lost(String),
}

/// Routes the stream's events to the requests waiting for them until the stream ends.
///
/// When shutdown begins while Readys of this stream are outstanding, the stream is retired: it takes no new
/// requests, and closes once those in flight are answered. Closing is the only way to withdraw a Ready the
/// server holds; otherwise it could claim the very tasks this worker abandons while shutting down.
async fn read_events(ctx: &Ctx, session: &Session, mut inbound: tonic::Streaming<pb::ServerEvent>) -> End {
    use pb::server_event::Event;
    let mut stop_seen = false;
    let mut retire_by: Option<Instant> = None;
    loop {
        if let Some(by) = retire_by {
            if session.drain() || Instant::now() >= by {
                return End::Retired;
            }
        }
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = session.closed.cancelled() => return End::Lost("closed by the worker".into()),
            _ = ctx.closing.cancelled() => return End::Stopped,
            _ = ctx.stopping.cancelled(), if !stop_seen => {
                stop_seen = true;
                if session.readys_outstanding() > 0 {
                    session.drain();
                    retire_by = Some(Instant::now() + RETIRE_MAX);
                }
                continue;
            }
            _ = tokio::time::sleep(RETIRE_POLL), if retire_by.is_some() => continue,
        };
        let event = match msg {
            Ok(Some(pb::ServerEvent { event: Some(e) })) => e,
            Ok(Some(pb::ServerEvent { event: None })) => continue,
            Ok(None) => {
                ctx.conn.stream_broke(&session.addr, None);
                return End::Lost("the server ended the stream".into());
            }
            Err(status) => {
                let e = Error::from_status(status, false);
                ctx.conn.stream_broke(&session.addr, Some(&e));
                return End::Lost(e.to_string());
            }
        };
        let (id, reply) = match event {
            Event::HelloAck(_) => continue,
            Event::Revoked(r) => {
                ctx.revoke(&r.task_id, r.token, &r.reason);
                continue;
            }
            Event::TaskBatch(b) => (b.request_id, Reply::Batch(b.tasks)),
            Event::Ack(a) => (a.request_id, Reply::Ack(a)),
            Event::AckBatch(b) => (b.request_id, Reply::AckBatch(b.acks)),
            Event::Error(e) => (e.request_id, Reply::Error(e)),
        };
        match session.answer(id, reply) {
            Ok(()) => {}
            Err(Reply::Batch(tasks)) => {
                for t in tasks {
                    let id = t.id.clone();
                    if ctx.orphans.try_send(t).is_err() {
                        tracing::warn!(task_id = %id, "cannot give back a task nobody waits for; its lease will expire");
                    }
                }
            }
            Err(Reply::Error(e)) => {
                tracing::warn!(request_id = id, reason = %e.reason, message = %e.message, "worker stream error");
                if e.reason == NOT_LEADER {
                    session.not_leader(&ctx.conn, Some(e.leader_addr.as_str()).filter(|l| !l.is_empty()));
                }
            }
            Err(other) => tracing::debug!(request_id = id, reply = ?other, "an answer nobody waits for"),
        }
    }
}

/// One slot: claim, handle, report, until shutdown. The slot's next Ready goes out as soon as its handlers have
/// returned, while their outcomes wait for their acks: a slot is not idle for a commit round between two tasks.
/// One batch's outcomes are in flight at most while the next batch is claimed (its handlers start once both the
/// acks and the next tasks are in), so a slot never holds more than two batches.
async fn slot<H, F>(ctx: Arc<Ctx>, handler: Arc<H>, n: usize)
where
    H: Fn(Task) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    // A batch's tasks count as running from the moment its claim is answered, so that the end of a delivery
    // pushed while the slot still waits for its last acks reaches the task's signal.
    let claim_next = || async { claim(&ctx).await.map(|tasks| admit(&ctx, tasks)) };
    let mut next = claim_next().await;
    while let Some(batch) = next {
        // An empty batch: the server's hold ran out with nothing to do. Re-arm at once.
        if batch.tasks.is_empty() {
            next = claim_next().await;
            continue;
        }
        let (handled_tx, handled_rx) = tokio::sync::oneshot::channel();
        let report = process(&ctx, &*handler, batch, handled_tx);
        tokio::pin!(report);
        tokio::select! {
            biased;
            () = &mut report => next = claim_next().await,
            // The handlers are done and the outcomes on their way: claim the next batch while they are acked.
            _ = handled_rx => next = tokio::join!(report, claim_next()).1,
        }
    }
    tracing::debug!(slot = n, "worker slot stopped");
}

/// Sends a Ready and waits for its tasks; `None` once shutdown began.
async fn claim(ctx: &Ctx) -> Option<Vec<pb::Task>> {
    let cfg = &ctx.cfg;
    let lease_ms = duration_ms(cfg.lease);
    loop {
        let session = tokio::select! {
            biased;
            _ = ctx.stopping.cancelled() => return None,
            s = ctx.live_session() => s,
        };
        if ctx.stopping.is_cancelled() {
            return None;
        }
        let id = ctx.next_id();
        session.ready_sent();
        let Ok(mut rx) = session.send(id, ready_event(id, &cfg.queues, lease_ms, cfg.batch_size)).await else {
            session.ready_answered();
            continue;
        };
        let reply = tokio::select! {
            biased;
            r = &mut rx => r.map_err(|_| Lost::MaybeSent),
            _ = ctx.stopping.cancelled() => {
                // The Ready stays outstanding: tasks that still come for it are given back (orphans), and
                // the reader retires the stream so the server drops it.
                if session.forget(id) {
                    return None;
                }
                // The answer is already on its way: take it (its tasks are given back, shutdown began).
                rx.await.map_err(|_| Lost::MaybeSent)
            }
        };
        if reply.is_ok() {
            session.ready_answered();
        }
        match reply {
            Ok(Reply::Batch(tasks)) => {
                session.mark_answered();
                WorkerStats::add(&ctx.stats.claimed, tasks.len() as u64);
                return Some(tasks);
            }
            Ok(Reply::Error(e)) => {
                let err = Error::from_reason(&e.reason, &e.message, Some(&e.leader_addr));
                match &err {
                    Error::NotLeader { leader } => session.not_leader(&ctx.conn, leader.as_deref()),
                    // The node cannot serve claims now (or the claim's outcome is unknown): try another.
                    _ if err.is_retryable() || matches!(err, Error::UnknownOutcome { .. }) => {
                        tracing::warn!(error = %err, "a Ready failed; reconnecting");
                        session.fail(&ctx.conn);
                    }
                    _ => {
                        tracing::error!(error = %err, "the server refused this worker's Ready");
                        ctx.fail(err, false);
                        return None;
                    }
                }
            }
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected answer to a Ready; reconnecting");
                session.fail(&ctx.conn);
            }
            // The stream was lost: wait for the next one.
            Err(_) => {}
        }
    }
}

/// The leases a slot holds, for the heartbeat: task id -> (token, outcome on its way).
#[derive(Default)]
struct Held(Mutex<HashMap<Arc<str>, (u64, bool)>>);

impl Held {
    fn beats(&self) -> Vec<(Arc<str>, u64)> {
        self.0.lock().expect("held lock poisoned").iter().map(|(id, (token, _))| (id.clone(), *token)).collect()
    }

    fn delivering(&self) {
        for v in self.0.lock().expect("held lock poisoned").values_mut() {
            v.1 = true;
        }
    }

    /// Stops extending a lease the server refused to extend; says whether its outcome was on its way.
    fn refused(&self, id: &str) -> bool {
        self.0.lock().expect("held lock poisoned").remove(id).is_some_and(|(_, delivering)| delivering)
    }
}

/// A claimed batch whose tasks are registered as running (`Ctx::running`), with their ids and tokens.
struct Admitted {
    tasks: Vec<Task>,
    /// Each id is copied once; the maps share it.
    ids: Vec<(Arc<str>, u64)>,
}

/// Registers a claimed batch's tasks as running: from now on the end of a delivery reaches the task's signal.
fn admit(ctx: &Ctx, tasks: Vec<pb::Task>) -> Admitted {
    let tasks: Vec<Task> = tasks.into_iter().map(Task::from_proto).collect();
    let ids: Vec<(Arc<str>, u64)> = tasks.iter().map(|t| (Arc::from(t.id.as_str()), t.token())).collect();
    let mut d = ctx.running.lock().expect("running lock poisoned");
    d.held.extend(ids.iter().zip(&tasks).map(|((id, token), t)| (id.clone(), (*token, t.signal().clone()))));
    d.forget_old_ends(Instant::now());
    if !d.ended_early.is_empty() {
        let mut ended = Vec::new();
        d.ended_early.retain(|(_, id, token, reason)| {
            let mine = tasks.iter().find(|t| t.id == *id && t.token() == *token);
            if let Some(t) = mine {
                ended.push((t.signal().clone(), reason.clone()));
            }
            mine.is_none()
        });
        drop(d);
        for (signal, reason) in ended {
            if signal.fire(&reason) {
                WorkerStats::add(&ctx.stats.revoked, 1);
            }
        }
    }
    Admitted { tasks, ids }
}

/// Runs the handlers of one batch (one after another) while extending its leases, then reports the outcomes;
/// `handled` fires when the handlers have returned and the outcomes are about to be sent.
async fn process<H, F>(ctx: &Ctx, handler: &H, batch: Admitted, handled: tokio::sync::oneshot::Sender<()>)
where
    H: Fn(Task) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    let Admitted { tasks, ids } = batch;
    let held = Held(Mutex::new(ids.iter().map(|(id, token)| (id.clone(), (*token, false))).collect()));
    let beat = async {
        match ctx.cfg.heartbeat {
            Some(every) => heartbeat(ctx, &held, every).await,
            None => std::future::pending::<()>().await,
        }
    };
    let work = async {
        let mut items = Vec::with_capacity(tasks.len());
        for task in tasks {
            let (task_id, token) = (task.id.clone(), task.token());
            // Shutdown began, or the delivery already ended: tasks not yet started go back at once.
            let outcome = if ctx.stopping.is_cancelled() || task.signal().is_cancelled() {
                Outcome::Abandon
            } else {
                run_handler(ctx, handler, task, &task_id).await
            };
            items.push(Item { task_id, token, outcome });
        }
        held.delivering();
        let _ = handled.send(());
        let units = plan(items, ctx.cfg.batch_size > 1);
        futures::future::join_all(units.into_iter().map(|u| deliver(ctx, u))).await;
    };
    tokio::select! {
        _ = work => {}
        _ = beat => {}
    }
    let mut d = ctx.running.lock().expect("running lock poisoned");
    for (id, token) in ids {
        if d.held.get(&*id).is_some_and(|(t, _)| *t == token) {
            d.held.remove(&*id);
        }
    }
}

async fn run_handler<H, F>(ctx: &Ctx, handler: &H, task: Task, id: &str) -> Outcome
where
    H: Fn(Task) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    let signal = task.signal().clone();
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(task))) {
        Ok(f) => f,
        Err(p) => return panicked(id, p),
    };
    tokio::select! {
        // The handler first: one that finishes at its first poll never waits on the shared shutdown token.
        biased;
        r = AssertUnwindSafe(fut).catch_unwind() => r.unwrap_or_else(|p| panicked(id, p)),
        _ = ctx.grace_over.cancelled() => {
            tracing::warn!(task_id = %id, "shutdown grace ran out; abandoning the running task");
            signal.fire(SHUTDOWN);
            Outcome::Abandon
        }
    }
}

fn panicked(task_id: &str, p: Box<dyn Any + Send>) -> Outcome {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into());
    tracing::error!(task_id, panic = %msg, "task handler panicked");
    Outcome::Failed { error: format!("handler panicked: {msg}"), retryable: true }
}

/// Extends every held lease by `lease`, every `every`, until dropped.
async fn heartbeat(ctx: &Ctx, held: &Held, every: Duration) {
    let lease_ms = duration_ms(ctx.cfg.lease);
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // No stream now: skip this beat; the lease has two more before it runs out.
        let Some(session) = ctx.current_session() else { continue };
        let beats = held.beats();
        futures::future::join_all(beats.iter().map(|(task_id, token)| {
            let (session, task_id) = (session.clone(), &**task_id);
            async move {
                let id = ctx.next_id();
                match session.request(id, heartbeat_event(id, task_id, *token, lease_ms)).await {
                    Ok(Reply::Ack(a)) => match verdict(&a) {
                        Verdict::Applied => WorkerStats::add(&ctx.stats.lease_extensions, 1),
                        Verdict::Refused { reason, message } => {
                            if held.refused(task_id) {
                                tracing::debug!(task_id, reason, "lease extension refused after the outcome was sent");
                            } else {
                                tracing::warn!(
                                    task_id,
                                    reason,
                                    message,
                                    "lease extension refused; the task's outcome will likely be refused too"
                                );
                                ctx.revoke(task_id, *token, LEASE_LOST_SIGNAL);
                            }
                        }
                    },
                    Ok(Reply::Error(e)) if e.reason == NOT_LEADER => {
                        session.not_leader(&ctx.conn, Some(e.leader_addr.as_str()).filter(|l| !l.is_empty()))
                    }
                    Ok(other) => tracing::debug!(task_id, reply = ?other, "lease extension not answered with an ack"),
                    Err(_) => {}
                }
            }
        }))
        .await;
    }
}

/// Sends one request's outcomes until an answer comes: on the next stream after a lost one, to the leader
/// after NOT_LEADER. Resending is safe because every outcome carries its fencing token: the server applies
/// at most one. Gives up only when the run does.
/// Counts a failure on `session`; the second in a row drops the stream so the next one goes to another node.
fn move_on_after_two(session: &Session, conn: &Connector, failed: u32) -> u32 {
    if failed + 1 >= 2 {
        tracing::info!(addr = %session.addr, "results keep failing on this node; moving to another");
        session.fail(conn);
        return 0;
    }
    failed + 1
}

async fn deliver(ctx: &Ctx, unit: Unit) {
    let cfg = &ctx.cfg;
    let mut backoff = Backoff::new(cfg.reconnect_backoff_min, cfg.reconnect_backoff_max);
    let mut maybe_applied = false;
    // Failures in a row on one stream: a node cut off from the leader keeps failing, so after a second one the
    // stream is dropped and the next goes to another listed node.
    let mut failed_here = 0u32;
    loop {
        let session = tokio::select! {
            s = ctx.live_session() => s,
            _ = ctx.give_up.cancelled() => return ctx.unconfirmed(&unit),
        };
        let id = ctx.next_id();
        let reply = tokio::select! {
            r = session.request(id, unit_event(&unit, id)) => r,
            _ = ctx.give_up.cancelled() => return ctx.unconfirmed(&unit),
        };
        match (reply, &unit) {
            (Ok(Reply::Ack(a)), Unit::Single(item)) => {
                session.mark_answered();
                return ctx.settle(item, &a, maybe_applied);
            }
            (Ok(Reply::AckBatch(acks)), Unit::Batch(items)) => {
                session.mark_answered();
                match pair_acks(items, &acks) {
                    Some(pairs) => {
                        for (item, ack) in pairs {
                            ctx.settle(item, ack, maybe_applied);
                        }
                    }
                    None => {
                        tracing::warn!(results = items.len(), acks = acks.len(), "acks do not match their results");
                        ctx.unconfirmed(&unit);
                    }
                }
                return;
            }
            (Ok(Reply::Error(e)), _) => {
                let err = Error::from_reason(&e.reason, &e.message, Some(&e.leader_addr));
                match &err {
                    // Refused before proposing: nothing was applied.
                    Error::NotLeader { leader } => session.not_leader(&ctx.conn, leader.as_deref()),
                    Error::UnknownOutcome { .. } => {
                        maybe_applied = true;
                        failed_here = move_on_after_two(&session, &ctx.conn, failed_here);
                        if !ctx.pause(backoff.next_delay()).await {
                            return ctx.unconfirmed(&unit);
                        }
                    }
                    _ if err.is_retryable() => {
                        failed_here = move_on_after_two(&session, &ctx.conn, failed_here);
                        if !ctx.pause(backoff.next_delay()).await {
                            return ctx.unconfirmed(&unit);
                        }
                    }
                    _ => {
                        for item in unit.items() {
                            ctx.reject(item, e.reason.clone(), e.message.clone(), maybe_applied);
                        }
                        return;
                    }
                }
            }
            (Ok(other), _) => {
                tracing::warn!(reply = ?other, "unexpected answer to a task outcome");
                return ctx.unconfirmed(&unit);
            }
            (Err(Lost::NotSent), _) => {}
            (Err(Lost::MaybeSent), _) => maybe_applied = true,
        }
    }
}

/// Gives back tasks that arrived for a Ready nobody waited for any more.
async fn janitor(ctx: Arc<Ctx>, mut rx: mpsc::Receiver<pb::Task>, stop: CancellationToken) {
    loop {
        let t = tokio::select! {
            t = rx.recv() => t,
            _ = stop.cancelled() => break,
        };
        match t {
            Some(t) => give_back(&ctx, t).await,
            None => return,
        }
    }
    while let Ok(t) = rx.try_recv() {
        give_back(&ctx, t).await;
    }
}

async fn give_back(ctx: &Ctx, t: pb::Task) {
    WorkerStats::add(&ctx.stats.claimed, 1);
    let token = t.lease.as_ref().map_or(0, |l| l.token);
    tracing::info!(task_id = %t.id, "giving back a task that arrived after its slot stopped waiting");
    deliver(ctx, Unit::Single(Item { task_id: t.id, token, outcome: Outcome::Abandon })).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> WorkerConfig {
        WorkerConfig { queues: vec!["q".into()], ..Default::default() }
    }

    #[test]
    fn default_config_with_a_queue_is_valid() {
        valid().validate().expect("valid");
        assert_eq!(valid().heartbeat, Some(valid().lease / 3));
    }

    #[test]
    fn validate_reports_every_violation() {
        let cfg = WorkerConfig {
            addrs: vec!["https://x:1".into()],
            worker_id: String::new(),
            queues: vec!["ok".into(), "-bad".into(), "has space".into()],
            concurrency: 0,
            batch_size: 0,
            lease: Duration::from_secs(3),
            heartbeat: Some(Duration::from_secs(10)),
            reconnect_backoff_min: Duration::from_secs(10),
            reconnect_backoff_max: Duration::from_secs(1),
            connect_timeout: Duration::ZERO,
            ..valid()
        };
        match cfg.validate() {
            Err(Error::Config(e)) => assert_eq!(e.len(), 9, "{e:#?}"),
            other => panic!("expected config errors, got {other:?}"),
        }
    }

    #[test]
    fn queues_are_required_and_heartbeat_must_fit_in_the_lease() {
        let no_queue = WorkerConfig { queues: vec![], ..valid() };
        assert!(matches!(no_queue.validate(), Err(Error::Config(e)) if e.len() == 1));
        let equal = WorkerConfig { heartbeat: Some(valid().lease), ..valid() };
        assert!(equal.validate().is_err());
        let off = WorkerConfig { heartbeat: None, lease: Duration::from_millis(50), ..valid() };
        assert!(off.validate().is_ok());
    }

    #[test]
    fn worker_new_refuses_an_invalid_config() {
        assert!(matches!(Worker::new(WorkerConfig::default()), Err(Error::Config(_))));
    }

    #[test]
    fn debug_output_redacts_the_token() {
        let cfg = WorkerConfig { token: Some("secret".into()), ..valid() };
        assert!(!format!("{cfg:?}").contains("secret"));
    }

    #[test]
    fn only_errors_no_retry_can_fix_end_the_run() {
        assert!(fatal_on_open(&Error::from_reason("UNAUTHENTICATED", "", None), false));
        assert!(fatal_on_open(&Error::from_reason("UNIMPLEMENTED", "", None), false));
        assert!(fatal_on_open(&Error::from_reason("TOKEN_BAD_SIGNATURE", "", None), true));
        assert!(fatal_on_open(&Error::from_reason("SCOPE_REQUIRED", "", None), true));
        assert!(fatal_on_open(&Error::from_reason("TOKEN_EXPIRED", "", None), false));
        assert!(!fatal_on_open(&Error::from_reason("TOKEN_EXPIRED", "", None), true), "a provider has a new token");
        assert!(!fatal_on_open(&Error::from_reason("UNAVAILABLE", "", None), false));
        assert!(!fatal_on_open(&Error::from_reason("TOO_MANY_STREAMS", "", None), false));
        assert!(!fatal_on_open(&Error::NotLeader { leader: None }, false));
        assert!(!fatal_on_open(&Error::Transport { message: "refused".into(), source: None }, false));
    }

    #[test]
    fn held_leases_stop_beating_once_refused() {
        let held = Held(Mutex::new([("a".into(), (1, false)), ("b".into(), (2, false))].into_iter().collect()));
        assert!(!held.refused("a"), "a was not being delivered");
        held.delivering();
        assert!(held.refused("b"), "b's outcome was on its way");
        assert!(held.beats().is_empty());
    }

    #[tokio::test]
    async fn run_refuses_a_second_concurrent_run() {
        let w = Worker::new(WorkerConfig { addrs: vec!["127.0.0.1:1".into()], ..valid() }).expect("valid");
        let stop = CancellationToken::new();
        let first = w.run(|_t| async { Outcome::Abandon }, stop.clone());
        tokio::pin!(first);
        // Let the first run start (it keeps trying to connect to a closed port).
        tokio::select! {
            _ = &mut first => panic!("the first run ended early"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let second = w.run(|_t| async { Outcome::Abandon }, stop.clone()).await;
        assert!(matches!(second, Err(Error::AlreadyRunning)), "{second:?}");
        stop.cancel();
        let summary = first.await.expect("a clean shutdown");
        assert_eq!(summary.claimed, 0);
    }
}
