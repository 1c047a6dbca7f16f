//! Proposing commands and reading state: the leader side of the queue. Every node has a proposer; on a follower
//! its writes fail with `NotLeader` (with the leader's address), which the API turns into forwarding.
//!
//! Concurrent enqueues and acks are coalesced into few Raft entries (group commit end to end): the coalescer
//! takes every request queued while the round ahead is in flight and proposes them as one round, with one round
//! in flight (`IN_FLIGHT_ENTRIES`): the acks as one `Ack` command and the enqueues as one `Enqueue` behind it, in
//! one append. Claims go through the dispatcher (`dispatcher.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::ReadPolicy;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::config::Config;
use crate::queue::*;
use crate::raft::control;
use crate::raft::errors::RaftFailure;
use crate::raft::types::NodeId;
use crate::storage::{Raft, SmShared};
use crate::telemetry;

pub use super::dispatcher::{Fresh, Handoff};

/// Rounds in flight: one. Requests that arrive while it commits go together in the next round (group commit).
/// Eight in flight made ~4 times the entries at 14,000 tasks/s on three nodes and cost throughput and latency under
/// load; it saved ~0.5 ms at 1,000 tasks/s (docs/performance.md, "Entries are not what a task costs"). Enqueues
/// and acks had a coalescer each, one entry in flight for each, until their rounds were joined ("One round for
/// enqueues and acks").
const IN_FLIGHT_ENTRIES: usize = 1;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader")]
    NotLeader { leader_id: Option<NodeId>, leader_addr: Option<String> },
    /// The write may or may not have been applied (timeout, or the entry was dropped in a leader change).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    #[error("raft stopped: {0}")]
    Fatal(String),
    #[error("storage error: {0}")]
    Storage(String),
    /// The command needs a newer cluster version (`raft::version`); nothing was proposed.
    #[error(
        "this request needs cluster version {required}; the cluster runs at version {active} until every node runs \
         a binary that supports it"
    )]
    FeatureNotActive { required: u32, active: u32 },
    /// An enqueue past a depth limit (`leader::limits`); nothing was proposed.
    #[error("queue full")]
    QueueFull(Box<super::limits::Full>),
    /// An enqueue held by producer flow control (`leader::flow`) for as long as it may wait; nothing was proposed.
    #[error(
        "the server is behind its workers: enqueues are let in as fast as tasks are claimed, and this one waited \
         {waited_ms} ms; retry in {retry_after_ms} ms"
    )]
    Overloaded { waited_ms: u64, retry_after_ms: u64 },
}

/// The gate on proposals: a command newer than the cluster version is refused (a replica of an older binary
/// could not apply it). `SetClusterVersion` is the gate's own, checked against every member by it.
pub fn check_version(command: &Command, active: u32) -> Result<(), ProposeError> {
    if matches!(command, Command::SetClusterVersion { .. }) {
        return Ok(());
    }
    check_required(command.required_version(), active)
}

fn check_required(required: u32, active: u32) -> Result<(), ProposeError> {
    if required > active {
        return Err(ProposeError::FeatureNotActive { required, active });
    }
    Ok(())
}

pub fn wall_clock_ms() -> TimeMs {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

type Reply<T> = oneshot::Sender<Result<Vec<ItemResult<T>>, ProposeError>>;

struct Pending<I, T> {
    items: Vec<I>,
    reply: Reply<T>,
    since: tokio::time::Instant,
}

/// The tasks of an enqueue that a worker could claim as soon as the entry applies: visible now, without
/// dependencies. The dispatcher may claim them for parked workers in an entry appended right behind the enqueue's
/// (`dispatcher::Handoff`); a task with a concurrency key only while its key has room (`keyed_with_room`).
fn fresh_tasks(items: &[NewTask], now: TimeMs) -> Vec<Fresh> {
    items
        .iter()
        .filter(|t| t.visible_at <= now && t.depends_on.is_empty())
        .map(|t| Fresh {
            id: t.id,
            tenant: t.tenant.clone(),
            queue: t.queue.clone(),
            priority: t.priority,
            key: t.concurrency.as_ref().map(|c| (Arc::from(c.key.as_str()), c.limit)),
        })
        .collect()
}

pub struct Proposer {
    pub raft: Raft,
    pub shared: Arc<SmShared>,
    pub cfg: Arc<Config>,
    enqueue_tx: mpsc::UnboundedSender<Pending<NewTask, Enqueued>>,
    ack_tx: mpsc::UnboundedSender<Pending<AckItem, AckOutcome>>,
    admission: Arc<super::limits::Admission>,
}

/// On the leader: waits until this node has applied everything committed before the call (a linearizable read
/// point, by read index) and returns the index it waited for. `NOT_LEADER` elsewhere.
pub async fn linearize(raft: &Raft, shared: &SmShared, timeout: Duration) -> Result<u64, ProposeError> {
    let read_id = raft.ensure_linearizable(ReadPolicy::ReadIndex).await.map_err(|e| match RaftFailure::from(e) {
        RaftFailure::NotLeader { leader_id, leader_addr } => not_leader(leader_id, leader_addr),
        f @ (RaftFailure::ShuttingDown | RaftFailure::Fatal(_)) => ProposeError::Fatal(f.to_string()),
        f => ProposeError::Unknown(f.to_string()),
    })?;
    let want = read_id.log_id().index;
    let mut applied = shared.applied.subscribe();
    let wait = applied.wait_for(|a| *a >= want);
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ProposeError::Unknown("timed out waiting to apply".into()))?
        .map_err(|_| ProposeError::Fatal("state machine closed".into()))?;
    Ok(want)
}

impl Proposer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        raft: Raft,
        shared: Arc<SmShared>,
        cfg: Arc<Config>,
        flow: Arc<super::flow::Flow>,
        handoff: Handoff,
        tasks: &tokio_util::task::TaskTracker,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        let (enqueue_tx, enqueue_rx) = mpsc::unbounded_channel();
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let admission = Arc::default();
        let p = Arc::new(Proposer { raft: raft.clone(), shared, cfg: cfg.clone(), enqueue_tx, ack_tx, admission });
        let max = cfg.max_items_per_entry;
        let timeout = Duration::from_millis(cfg.write_timeout_ms);
        tasks.spawn(coalesce(
            raft,
            shutdown.clone(),
            enqueue_rx,
            ack_rx,
            (flow, p.shared.clone()),
            handoff,
            max,
            timeout,
        ));
        p
    }

    /// The absolute state-machine time `ttl_ms` after now, for a command carrying an expiry: measured from the
    /// time this leader stamps on its entries (its clock, or the state-machine time if that is ahead, as time
    /// never goes back), so apply compares it with entry times alone.
    pub fn expiry_after(&self, ttl_ms: u64) -> TimeMs {
        wall_clock_ms().max(self.shared.now()).saturating_add(ttl_ms)
    }

    /// Proposes one command and waits for it to be applied.
    pub async fn write(&self, command: Command) -> Result<Response, ProposeError> {
        check_version(&command, self.shared.cluster_version())?;
        write(&self.raft, command, Duration::from_millis(self.cfg.write_timeout_ms)).await
    }

    /// Enqueues tasks. Items without a key mode go through the coalescer as `Enqueue`; a call with any debounce or
    /// singleton item is proposed alone as `EnqueueKeyed` (cluster version 3), refused before that version with
    /// nothing proposed.
    pub async fn enqueue(&self, items: Vec<KeyedTask>) -> Result<Vec<ItemResult<Enqueued>>, ProposeError> {
        let keyed = items.iter().any(|k| k.mode.is_some());
        if keyed {
            check_required(Command::EnqueueKeyed(vec![]).required_version(), self.shared.cluster_version())?;
        }
        let traced: Vec<(TaskId, String)> = if telemetry::task_spans_enabled() {
            items.iter().filter_map(|i| Some((i.task.id, i.task.traceparent.clone()?))).collect()
        } else {
            vec![]
        };
        // Boxed: the admission's read point is rare, and keeps this future (awaited deep in the API) small.
        let _admitted = if self.shared.any_limits() {
            let tasks: Vec<&NewTask> = items.iter().map(|k| &k.task).collect();
            Box::pin(self.admit(&tasks)).await?
        } else {
            None
        };
        let out = if keyed {
            let modes: Vec<Option<KeyMode>> = items.iter().map(|k| k.mode.clone()).collect();
            let out = match self.write(Command::EnqueueKeyed(items)).await? {
                Response::Enqueued(v) => v,
                other => return Err(ProposeError::Storage(format!("unexpected response {other:?}"))),
            };
            self.count_keyed(&modes, &out);
            out
        } else {
            let items = items.into_iter().map(|k| k.task).collect();
            let (reply, rx) = oneshot::channel();
            let since = tokio::time::Instant::now();
            self.enqueue_tx
                .send(Pending { items, reply, since })
                .map_err(|_| ProposeError::Fatal("shutting down".into()))?;
            rx.await.map_err(|_| ProposeError::Unknown("proposal dropped".into()))??
        };
        for (id, tp) in traced {
            if out.iter().any(|r| matches!(r, Ok(e) if e.task_id == id && !e.duplicate)) {
                telemetry::task_span("enqueue", &id, Some(&tp), TaskState::Pending.as_str());
            }
        }
        Ok(out)
    }

    /// Counts what debounce and singleton keys did to a keyed enqueue's items (metrics).
    fn count_keyed(&self, modes: &[Option<KeyMode>], out: &[ItemResult<Enqueued>]) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.shared.metrics;
        for (mode, r) in modes.iter().zip(out) {
            let counter = match (mode, r) {
                (Some(KeyMode::Debounce { .. }), Ok(Enqueued { duplicate: true, .. })) => &m.debounced,
                (Some(KeyMode::Singleton { .. }), Ok(Enqueued { duplicate: true, .. })) => &m.singleton_skipped,
                (Some(KeyMode::Singleton { .. }), Err(Rejected::SingletonActive(_))) => &m.singleton_refused,
                _ => continue,
            };
            counter.fetch_add(1, Relaxed);
        }
    }

    /// The depth limits (`leader::limits`): checked only on a leader (a follower's write fails with `NotLeader`
    /// and is forwarded), and only once it has applied its earlier terms.
    async fn admit(&self, items: &[&NewTask]) -> Result<Option<super::limits::Admitted>, ProposeError> {
        if !super::limits::is_leader(&self.raft) {
            return Ok(None);
        }
        if !super::limits::caught_up(&self.raft) {
            self.linearize().await?;
        }
        let hold = Duration::from_millis(self.cfg.depth_hold_ms);
        let admitted = self.admission.admit_or_hold(&self.raft, &self.shared, items, hold).await;
        if matches!(admitted, Err(ProposeError::QueueFull(_))) {
            self.shared.metrics.refused_full.fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        admitted
    }

    pub async fn ack(&self, items: Vec<AckItem>) -> Result<Vec<ItemResult<AckOutcome>>, ProposeError> {
        let traced: Vec<(TaskId, &'static str)> = if telemetry::task_spans_enabled() {
            items.iter().map(|i| (i.task_id, ack_op(&i.action))).collect()
        } else {
            vec![]
        };
        let (reply, rx) = oneshot::channel();
        let since = tokio::time::Instant::now();
        self.ack_tx.send(Pending { items, reply, since }).map_err(|_| ProposeError::Fatal("shutting down".into()))?;
        let out = rx.await.map_err(|_| ProposeError::Unknown("proposal dropped".into()))??;
        // The ack does not carry the trace context: the task does (read only when spans are on).
        for ((id, op), r) in traced.into_iter().zip(&out) {
            if let (Ok(o), Ok(Some(t))) = (r, self.shared.get_task(&id)) {
                telemetry::task_span(op, &id, t.traceparent.as_deref(), o.state.as_str());
            }
        }
        Ok(out)
    }

    /// Waits until this node has applied everything committed before the call (a linearizable read point).
    pub async fn linearize(&self) -> Result<(), ProposeError> {
        linearize(&self.raft, &self.shared, Duration::from_millis(self.cfg.write_timeout_ms)).await.map(|_| ())
    }

    /// Reads a task; `linearize` first waits for a linearizable read point (on the leader).
    pub async fn read_task(&self, id: &TaskId, linearize: bool) -> Result<Option<Task>, ProposeError> {
        if linearize {
            self.linearize().await?;
        }
        self.shared.get_task(id).map_err(|e| ProposeError::Storage(e.to_string()))
    }

    /// The task once it has ended, or as it is when `wait` runs out.
    pub async fn wait_result(
        &self,
        id: &TaskId,
        wait: Duration,
        linearize: bool,
    ) -> Result<Option<Task>, ProposeError> {
        let mut ended = self.shared.ended.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let task = self.read_task(id, linearize).await?;
            match &task {
                Some(t) if !t.state.is_terminal() => {}
                _ => return Ok(task),
            }
            loop {
                match tokio::time::timeout_at(deadline, ended.recv()).await {
                    Err(_) => return Ok(task),
                    Ok(Ok(done)) if done == *id => break,
                    Ok(Ok(_)) => continue,
                    // Missed some: read again.
                    Ok(Err(_)) => break,
                }
            }
        }
    }
}

fn ack_op(a: &AckAction) -> &'static str {
    match a {
        AckAction::Complete { .. } => "complete",
        AckAction::Fail { .. } => "fail",
        AckAction::Nack { .. } => "nack",
        AckAction::Abandon => "abandon",
        AckAction::Heartbeat { .. } => "heartbeat",
        AckAction::Exception { .. } => "exception",
        AckAction::Progress { .. } => "progress",
        AckAction::CompleteWith { .. } => "complete",
    }
}

pub(crate) fn not_leader(leader_id: Option<NodeId>, leader_addr: Option<String>) -> ProposeError {
    ProposeError::NotLeader { leader_id, leader_addr }
}

/// How long a write in flight on a leader that steps down may still be answered before it is called unknown.
const STEPPED_DOWN_GRACE: Duration = Duration::from_millis(250);

/// A leader that has not heard from a quorum for [`control::quorum_silence_limit`] (cut off by a partition, or
/// stalled) proposes nothing: it answers `NotLeader` without a leader, so a client moves on to another node at
/// once instead of waiting out the write timeout here. A write already in flight when that happens is answered
/// as of unknown outcome then (it may still commit, should the quorum come back while this node leads), and so is
/// one in flight when this node stops leading, if no answer comes soon after (a leader deposed while it could not
/// reach the others may never hear what became of its entries before the write timeout).
pub(crate) async fn write(raft: &Raft, command: Command, timeout: Duration) -> Result<Response, ProposeError> {
    let cut_off = control::quorum_silence_limit(raft);
    if control::cut_off(raft) {
        return Err(not_leader(None, None));
    }
    let req = Request::new(wall_clock_ms(), rand::random(), command);
    let written = tokio::select! {
        r = tokio::time::timeout(timeout, raft.client_write(req)) => r,
        why = control::write_stranded(raft, cut_off, STEPPED_DOWN_GRACE) => return Err(ProposeError::Unknown(why)),
    };
    match written {
        Err(_) => Err(ProposeError::Unknown("timed out waiting for the write to apply".into())),
        Ok(Ok(resp)) => Ok(resp.data),
        Ok(Err(e)) => Err(failure(RaftFailure::from(e))),
    }
}

fn failure(f: RaftFailure) -> ProposeError {
    match f {
        RaftFailure::NotLeader { leader_id, leader_addr } => not_leader(leader_id, leader_addr),
        // Anything else may have been appended before it failed (also when Raft stopped): unknown.
        f => ProposeError::Unknown(f.to_string()),
    }
}

/// Commands proposed together, as [`write`] proposes one: Raft appends them next to each other, in order, in one
/// append (one fsync, one replication round for all). The outcomes come back in the same order.
pub(crate) async fn write_many(
    raft: &Raft,
    commands: Vec<Command>,
    timeout: Duration,
) -> Vec<Result<Response, ProposeError>> {
    use futures::StreamExt;
    let n = commands.len();
    if n == 1 {
        let command = commands.into_iter().next().expect("one command");
        return vec![write(raft, command, timeout).await];
    }
    let cut_off = control::quorum_silence_limit(raft);
    if control::cut_off(raft) {
        return (0..n).map(|_| Err(not_leader(None, None))).collect();
    }
    let now = wall_clock_ms();
    let reqs: Vec<Request> = commands.into_iter().map(|c| Request::new(now, rand::random(), c)).collect();
    let written = async {
        let results: Vec<_> = raft.client_write_many(reqs).await.map_err(RaftFailure::from)?.collect().await;
        Ok::<_, RaftFailure>(results)
    };
    let unknown = |why: &str| (0..n).map(|_| Err(ProposeError::Unknown(why.to_string()))).collect();
    let written = tokio::select! {
        r = tokio::time::timeout(timeout, written) => r,
        why = control::write_stranded(raft, cut_off, STEPPED_DOWN_GRACE) => return unknown(&why),
    };
    let results = match written {
        Err(_) => return unknown("timed out waiting for the write to apply"),
        Ok(Err(f)) => return (0..n).map(|_| Err(failure(f.clone()))).collect(),
        Ok(Ok(results)) => results,
    };
    let mut out: Vec<Result<Response, ProposeError>> = results
        .into_iter()
        .map(|r| match r {
            Ok(Ok(resp)) => Ok(resp.response),
            Ok(Err(e)) => Err(failure(RaftFailure::from(e))),
            Err(fatal) => Err(failure(RaftFailure::from(fatal))),
        })
        .collect();
    out.resize_with(n, || Err(ProposeError::Unknown("no outcome".into())));
    out
}

/// Where each request of one kind in a round gets its share of the command's outcome.
struct Replies<T>(Vec<(Reply<T>, usize)>);

/// The items of a round's requests of one kind, for one command, and where their outcomes go.
fn split<I, T>(batch: Vec<Pending<I, T>>) -> (Vec<I>, Replies<T>) {
    let n = batch.iter().map(|p| p.items.len()).sum();
    let mut items = Vec::with_capacity(n);
    let mut replies = Vec::with_capacity(batch.len());
    for p in batch {
        replies.push((p.reply, p.items.len()));
        items.extend(p.items);
    }
    (items, Replies(replies))
}

impl<T> Replies<T> {
    /// Answers each request with its share of the command's outcome.
    fn answer(self, outcome: Result<Response, ProposeError>, take: fn(Response) -> Option<Vec<ItemResult<T>>>) {
        match outcome.map(take) {
            Ok(Some(results)) => {
                let mut it = results.into_iter();
                for (reply, size) in self.0 {
                    let _ = reply.send(Ok(it.by_ref().take(size).collect()));
                }
            }
            Ok(None) => {
                for (reply, _) in self.0 {
                    let _ = reply.send(Err(ProposeError::Storage("unexpected response".into())));
                }
            }
            Err(e) => {
                for (reply, _) in self.0 {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Takes queued requests after `first` while their items fit in `limit` (`n` counts the items taken); one that
/// does not fit is left in `carry`.
fn gather<I, T>(
    first: Pending<I, T>,
    rx: &mut mpsc::UnboundedReceiver<Pending<I, T>>,
    limit: usize,
    carry: &mut Option<Pending<I, T>>,
) -> (Vec<Pending<I, T>>, usize) {
    let mut n = first.items.len();
    let mut batch = vec![first];
    while n < limit {
        match rx.try_recv() {
            Ok(p) if n + p.items.len() <= limit => {
                n += p.items.len();
                batch.push(p);
            }
            Ok(p) => {
                *carry = Some(p);
                break;
            }
            Err(_) => break,
        }
    }
    (batch, n)
}

/// The coalescer of enqueues and acks: drains the requests queued while the entry ahead is in flight into one
/// round, with up to `IN_FLIGHT_ENTRIES` rounds in flight. A round's acks (one `Ack` command) and enqueues (one
/// `Enqueue`) are proposed together, the acks first, so they share one append, one fsync and one replication
/// round; an enqueue with fresh tasks goes through the dispatcher while Readys wait there, which appends their
/// claims right behind (`dispatcher::Handoff`). Enqueues first wait for the room producer flow control gives
/// (`leader::flow`, on a leader); acks never wait for it: while the enqueues wait, the acks go alone.
#[allow(clippy::too_many_arguments)]
async fn coalesce(
    raft: Raft,
    shutdown: tokio_util::sync::CancellationToken,
    mut creates_rx: mpsc::UnboundedReceiver<Pending<NewTask, Enqueued>>,
    mut acks_rx: mpsc::UnboundedReceiver<Pending<AckItem, AckOutcome>>,
    (flow, shared): (Arc<super::flow::Flow>, Arc<SmShared>),
    handoff: Handoff,
    max_items: usize,
    timeout: Duration,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_ENTRIES));
    let mut carry: Option<Pending<NewTask, Enqueued>> = None;
    let mut ack_carry: Option<Pending<AckItem, AckOutcome>> = None;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        if carry.is_none() && ack_carry.is_none() {
            tokio::select! {
                p = creates_rx.recv() => match p {
                    Some(p) => carry = Some(p),
                    None => return,
                },
                a = acks_rx.recv() => match a {
                    Some(a) => ack_carry = Some(a),
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            }
        }
        if carry.is_none() {
            carry = creates_rx.try_recv().ok();
        }
        if ack_carry.is_none() {
            ack_carry = acks_rx.try_recv().ok();
        }
        // Producer flow control, on a leader only (a node that just lost leadership must not hold the enqueues
        // it will forward). Without acks to propose, wait for room or for an ack; with acks, take what room
        // there is now.
        let mut room = usize::MAX;
        if let Some(first) = carry.as_ref().filter(|_| super::limits::is_leader(&raft)) {
            let take = flow.take(&shared, first.items.len(), first.since);
            let taken = if ack_carry.is_none() {
                tokio::select! {
                    r = take => Some(r),
                    a = acks_rx.recv() => match a {
                        Some(a) => {
                            ack_carry = Some(a);
                            None
                        }
                        None => return,
                    }
                }
            } else {
                futures::FutureExt::now_or_never(take)
            };
            room = match taken {
                Some(Ok(r)) => r,
                Some(Err(())) => {
                    let first = carry.take().expect("a head");
                    let waited_ms = first.since.elapsed().as_millis() as u64;
                    let retry_after_ms = (flow.max_wait().as_millis() as u64 / 4).max(50);
                    let _ = first.reply.send(Err(ProposeError::Overloaded { waited_ms, retry_after_ms }));
                    0
                }
                None => 0,
            };
        }
        let acks = match ack_carry.take() {
            Some(first) => gather(first, &mut acks_rx, max_items, &mut ack_carry).0,
            None => vec![],
        };
        let creates = match carry.take() {
            Some(first) if room > 0 => {
                let (batch, n) = gather(first, &mut creates_rx, max_items.min(room), &mut carry);
                if room != usize::MAX {
                    flow.give_back(room.saturating_sub(n));
                }
                batch
            }
            other => {
                carry = other;
                vec![]
            }
        };
        if acks.is_empty() && creates.is_empty() {
            continue;
        }
        let raft = raft.clone();
        let handoff = handoff.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let (mut lead, mut answers) = (Vec::with_capacity(1), (None, None));
            if !acks.is_empty() {
                let (items, replies) = split(acks);
                lead.push(Command::Ack(items));
                answers.0 = Some(replies);
            }
            let enqueue = (!creates.is_empty()).then(|| {
                let (items, replies) = split(creates);
                answers.1 = Some(replies);
                items
            });
            // While workers wait on the dispatcher, it proposes the round itself with their claims of the
            // enqueue's fresh tasks right behind (`dispatcher::Handoff`).
            let fresh = enqueue
                .as_ref()
                .filter(|_| handoff.wanted())
                .map(|items| fresh_tasks(items, wall_clock_ms()))
                .filter(|f| !f.is_empty());
            let mut outcomes = match (enqueue, fresh) {
                (Some(items), Some(fresh)) => handoff.write(lead, Command::Enqueue(items), fresh).await,
                (enqueue, _) => {
                    lead.extend(enqueue.map(Command::Enqueue));
                    write_many(&raft, lead, timeout).await
                }
            }
            .into_iter();
            let mut next = || outcomes.next().unwrap_or_else(|| Err(ProposeError::Unknown("no outcome".into())));
            if let Some(a) = answers.0 {
                a.answer(next(), |r| match r {
                    Response::Acked(v) => Some(v),
                    _ => None,
                });
            }
            if let Some(c) = answers.1 {
                c.answer(next(), |r| match r {
                    Response::Enqueued(v) => Some(v),
                    _ => None,
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_newer_than_the_cluster_version_is_refused_by_the_gate() {
        assert!(check_version(&Command::Tick, 0).is_ok(), "version-0 commands always pass");
        // The gate's own command is checked against every member by the gate, not here.
        assert!(check_version(&Command::SetClusterVersion { version: 1 }, 0).is_ok());
        assert!(check_required(1, 1).is_ok() && check_required(1, 2).is_ok());
        let msg = check_required(2, 1).expect_err("refused").to_string();
        assert!(msg.contains("needs cluster version 2") && msg.contains("runs at version 1"), "{msg}");
        // A concurrency key override is version 3: a version-2 replica could not decode it.
        let set = Command::SetKeyLimit { tenant: "t".into(), key: "k".into(), limit: None };
        assert!(check_version(&set, 2).is_err() && check_version(&set, 3).is_ok());
    }
}
