//! Proposing commands and reading state: the leader side of the queue. Every node has a proposer; on a follower
//! its writes fail with `NotLeader` (with the leader's address), which the API turns into forwarding.
//!
//! Concurrent enqueues and acks are coalesced into few Raft entries (group commit end to end): a coalescer
//! takes every request queued while earlier entries are in flight and proposes them as one command, with
//! one entry in flight per coalescer (`IN_FLIGHT_ENTRIES`). Claims go through the dispatcher (`dispatcher.rs`).

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

/// Entries in flight per coalescer (creates, acks): one. Requests that arrive while it commits go together in the
/// next entry (group commit). Eight in flight made ~4 times the entries at 14,000 tasks/s on three nodes and cost
/// throughput and latency under load; it saved ~0.5 ms at 1,000 tasks/s (docs/performance.md, "Entries are not
/// what a task costs").
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

/// What paces a coalescer (enqueues only): producer flow control and the state it reads.
type Paced = Option<(Arc<super::flow::Flow>, Arc<SmShared>)>;

/// Where a coalescer (enqueues only) leaves an entry with tasks a parked worker could take at once (the
/// dispatcher proposes it with their claims), and how it finds those tasks among its items.
type HandsOff<I> = Option<(Handoff, fn(&[I], TimeMs) -> Vec<Fresh>)>;

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
            key: t.concurrency.as_ref().map(|c| (c.key.clone(), c.limit)),
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
        let paced = Some((flow, shared.clone()));
        let p = Arc::new(Proposer { raft: raft.clone(), shared, cfg: cfg.clone(), enqueue_tx, ack_tx, admission });
        let max = cfg.max_items_per_entry;
        let timeout = Duration::from_millis(cfg.write_timeout_ms);
        let handoff: HandsOff<NewTask> = Some((handoff, fresh_tasks));
        tasks.spawn(coalesce(
            raft.clone(),
            shutdown.clone(),
            enqueue_rx,
            (paced, handoff),
            max,
            timeout,
            Command::Enqueue,
            |r| match r {
                Response::Enqueued(v) => Some(v),
                _ => None,
            },
        ));
        tasks.spawn(coalesce(raft, shutdown.clone(), ack_rx, (None, None), max, timeout, Command::Ack, |r| match r {
            Response::Acked(v) => Some(v),
            _ => None,
        }));
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

/// Two commands proposed together, as [`write`] proposes one: Raft appends them next to each other, `second`
/// right after `first`, in one append (one fsync, one replication round). The outcomes come back in order.
pub(crate) async fn write_pair(
    raft: &Raft,
    first: Command,
    second: Command,
    timeout: Duration,
) -> [Result<Response, ProposeError>; 2] {
    use futures::StreamExt;
    let cut_off = control::quorum_silence_limit(raft);
    if control::cut_off(raft) {
        return [Err(not_leader(None, None)), Err(not_leader(None, None))];
    }
    let now = wall_clock_ms();
    let reqs = [Request::new(now, rand::random(), first), Request::new(now, rand::random(), second)];
    let written = async {
        let results: Vec<_> = raft.client_write_many(reqs).await.map_err(RaftFailure::from)?.collect().await;
        Ok::<_, RaftFailure>(results)
    };
    let unknown =
        |why: &str| [Err(ProposeError::Unknown(why.to_string())), Err(ProposeError::Unknown(why.to_string()))];
    let written = tokio::select! {
        r = tokio::time::timeout(timeout, written) => r,
        why = control::write_stranded(raft, cut_off, STEPPED_DOWN_GRACE) => return unknown(&why),
    };
    let results = match written {
        Err(_) => return unknown("timed out waiting for the write to apply"),
        Ok(Err(f)) => return [Err(failure(f.clone())), Err(failure(f))],
        Ok(Ok(results)) => results,
    };
    let mut out = results.into_iter().map(|r| match r {
        Ok(Ok(resp)) => Ok(resp.response),
        Ok(Err(e)) => Err(failure(RaftFailure::from(e))),
        Err(fatal) => Err(failure(RaftFailure::from(fatal))),
    });
    let mut next = || out.next().unwrap_or_else(|| Err(ProposeError::Unknown("no outcome".into())));
    [next(), next()]
}

/// Drains queued requests into one command per entry, with up to `IN_FLIGHT_ENTRIES` entries in flight. With
/// `paced` (enqueues), each entry first waits for the room producer flow control gives (`leader::flow`); with
/// `handoff` (enqueues), an entry with fresh tasks goes through the dispatcher while Readys wait there.
#[allow(clippy::too_many_arguments)]
async fn coalesce<I: Send + 'static, T: Send + 'static>(
    raft: Raft,
    shutdown: tokio_util::sync::CancellationToken,
    mut rx: mpsc::UnboundedReceiver<Pending<I, T>>,
    (paced, handoff): (Paced, HandsOff<I>),
    max_items: usize,
    timeout: Duration,
    make: fn(Vec<I>) -> Command,
    take: fn(Response) -> Option<Vec<ItemResult<T>>>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_ENTRIES));
    let mut carry: Option<Pending<I, T>> = None;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            },
        };
        let mut room = usize::MAX;
        // Only a leader paces: a node that just lost leadership must not hold the enqueues it will forward.
        if let Some((flow, shared)) = paced.as_ref().filter(|_| super::limits::is_leader(&raft)) {
            match flow.take(shared, first.items.len(), first.since).await {
                Ok(r) => room = r,
                Err(()) => {
                    let waited_ms = first.since.elapsed().as_millis() as u64;
                    let retry_after_ms = (flow.max_wait().as_millis() as u64 / 4).max(50);
                    let _ = first.reply.send(Err(ProposeError::Overloaded { waited_ms, retry_after_ms }));
                    continue;
                }
            }
        }
        let limit = max_items.min(room);
        let mut batch = vec![first];
        let mut n = batch[0].items.len();
        while n < limit {
            match rx.try_recv() {
                Ok(p) if n + p.items.len() <= limit => {
                    n += p.items.len();
                    batch.push(p);
                }
                Ok(p) => {
                    carry = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        if let (Some((flow, _)), true) = (&paced, room != usize::MAX) {
            flow.give_back(room.saturating_sub(n));
        }
        let raft = raft.clone();
        let handoff = handoff.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut sizes = Vec::with_capacity(batch.len());
            let mut items = Vec::with_capacity(n);
            let mut replies = Vec::with_capacity(batch.len());
            for p in batch {
                sizes.push(p.items.len());
                items.extend(p.items);
                replies.push(p.reply);
            }
            // While workers wait on the dispatcher, it proposes the entry itself with their claims of its fresh
            // tasks right behind (`dispatcher::Handoff`).
            let fresh = handoff
                .as_ref()
                .filter(|(h, _)| h.wanted())
                .map(|(h, find)| (h, find(&items, wall_clock_ms())))
                .filter(|(_, f)| !f.is_empty());
            let written = match fresh {
                Some((h, fresh)) => h.write(make(items), fresh).await,
                None => write(&raft, make(items), timeout).await,
            };
            match written {
                Ok(resp) => match take(resp) {
                    Some(results) => {
                        let mut it = results.into_iter();
                        for (reply, size) in replies.into_iter().zip(sizes) {
                            let _ = reply.send(Ok(it.by_ref().take(size).collect()));
                        }
                    }
                    None => {
                        for reply in replies {
                            let _ = reply.send(Err(ProposeError::Storage("unexpected response".into())));
                        }
                    }
                },
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
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
