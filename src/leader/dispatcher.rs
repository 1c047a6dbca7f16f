//! The claim dispatcher: parks claim requests (stream Readys and unary claims) on the leader and serves them
//! when work becomes claimable, with no polling.
//!
//! One task owns every parked request. Whenever the state machine reports new claimable work (its `work`
//! counter moves), a request arrives, or a proposal finishes, it walks the parked requests in arrival order,
//! picks tasks for each from the replicated ready index (skipping tasks promised to claims still in flight),
//! and proposes one `Claim` entry for all of them: claims from many Readys and many streams share a Raft entry.
//! A request that gets nothing before its hold time ends is answered with no tasks, so its client re-arms.
//!
//! The picks are fair across the fairness keys of each queue (`queue::fair`): the dispatcher owns the passes
//! (`FairClock`), leader-local, and starts them over whenever leadership changes.
//!
//! **Hand-off.** A worker that waits here for an empty queue would otherwise get a new task only after two
//! commits: the enqueue's entry, then (once it is applied and the dispatcher sees the work) the claim's. So while
//! Readys are parked with room in the claim pipeline, the enqueue coalescer leaves an entry with tasks claimable
//! at once (`Fresh`: no delay, no concurrency key, no dependencies) to the dispatcher, which gives them to the
//! Readys parked for their queue and proposes the enqueue and the `Claim` together: Raft appends the claim right
//! behind the enqueue, in the same append (one fsync, one replication round), so both commit at once. Apply
//! re-checks every claim as always: a task the enqueue did not add (an idempotent duplicate, a refused or dropped
//! entry) is not found, and its Ready waits again. Only without running caps and rate limits (they are counted on
//! picks from the replicated state). With room in the pipeline every parked Ready has had every task it could
//! pick, so handing it the newest task passes over none that waited (tasks of enqueue entries still in flight
//! may be overtaken by a few milliseconds).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::flow::{BlockedClock, Flow};
use super::proposer::{not_leader, wall_clock_ms, write, write_many, ProposeError};
use super::Leadership;
use crate::queue::{
    ClaimItem, Command, FairClock, Picked, Promised, QueueKey, RateBudget, RateCounts, Response, Task, TaskId,
};
use crate::raft::control;
use crate::storage::{Raft, SmShared};

/// Claim entries in flight at once: while one is being committed the next one gathers new requests.
const MAX_IN_FLIGHT: usize = 4;

/// A claim's answer: the claimed tasks as stored (shared with the state machine's layer, not copied).
pub type Claimed = Result<Vec<Arc<Task>>, ProposeError>;

/// A task an enqueue entry about to commit adds, claimable at once (see "Hand-off" above).
#[derive(Debug, Clone)]
pub struct Fresh {
    pub id: TaskId,
    pub tenant: String,
    pub queue: String,
    pub priority: u8,
    /// Its concurrency (fairness) key and the limit it carries, if any: handed out only while the key has
    /// room for it and for the key's tasks in claims in flight (`keyed_with_room`).
    pub key: Option<(Arc<str>, u32)>,
}

/// A round the coalescer leaves to the dispatcher: the commands that go ahead of the enqueue (its acks), the
/// enqueue entry, its fresh tasks, and where the outcomes of `lead` and then the enqueue go.
struct Joint {
    lead: Vec<Command>,
    command: Command,
    fresh: Vec<Fresh>,
    reply: oneshot::Sender<Vec<Result<Response, ProposeError>>>,
}

/// The enqueue side of the hand-off: whether the dispatcher has Readys to hand fresh tasks to, and where to
/// send an entry that has some.
#[derive(Clone)]
pub struct Handoff {
    tx: mpsc::UnboundedSender<Joint>,
    /// Readys parked while the dispatcher could propose a claim at once (0 otherwise).
    open: Arc<AtomicUsize>,
}

/// The dispatcher's side of the hand-off.
pub struct HandoffRx {
    rx: mpsc::UnboundedReceiver<Joint>,
    open: Arc<AtomicUsize>,
}

/// The two ends of the hand-off between the enqueue coalescer and the dispatcher.
pub fn handoff() -> (Handoff, HandoffRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let open = Arc::new(AtomicUsize::new(0));
    (Handoff { tx, open: open.clone() }, HandoffRx { rx, open })
}

impl Handoff {
    /// Whether a Ready waits that fresh tasks could go to now.
    pub fn wanted(&self) -> bool {
        self.open.load(Relaxed) > 0
    }

    /// Has the dispatcher propose `lead` and an enqueue entry (`command`) with the claims of its `fresh` tasks
    /// for parked Readys right behind it (or without claims, if no Ready takes any), and returns the outcomes of
    /// `lead` and then of the enqueue.
    pub async fn write(
        &self,
        lead: Vec<Command>,
        command: Command,
        fresh: Vec<Fresh>,
    ) -> Vec<Result<Response, ProposeError>> {
        let n = lead.len() + 1;
        let (reply, rx) = oneshot::channel();
        let failed = |e: ProposeError| (0..n).map(|_| Err(e.clone())).collect();
        if self.tx.send(Joint { lead, command, fresh, reply }).is_err() {
            return failed(ProposeError::Fatal("shutting down".into()));
        }
        rx.await.unwrap_or_else(|_| failed(ProposeError::Unknown("proposal dropped".into())))
    }
}

pub struct ClaimRequest {
    /// Shared by the claim items made for this request.
    pub tenant: Arc<str>,
    pub worker_id: Arc<str>,
    pub queues: Vec<String>,
    pub count: usize,
    pub lease_ms: u64,
    pub deadline: Instant,
    pub reply: oneshot::Sender<Claimed>,
}

#[derive(Clone)]
pub struct Dispatcher {
    tx: mpsc::UnboundedSender<ClaimRequest>,
    seen: Arc<WorkersSeen>,
}

/// Workers that asked for work (a stream Ready or a unary claim) per tenant and queue, with when they last did:
/// the "active workers" of the capacity view. Leader-local and approximate by nature (a new leader starts
/// empty and fills within one Ready hold time).
#[derive(Default)]
pub struct WorkersSeen {
    /// Tenant, then queue, then worker: each level is looked up by `&str`, so a Ready from a worker seen before
    /// builds no key.
    inner: std::sync::Mutex<HashMap<String, HashMap<String, LastSeen>>>,
}

/// When each worker of one queue last asked for work.
type LastSeen = HashMap<String, Instant>;

/// Workers not heard from for this long are dropped from the table.
const WORKER_FORGET_AFTER: Duration = Duration::from_secs(600);

/// The entry of `key` in `m`, made by `new` (and its key allocated) only when missing.
fn slot<'a, V>(m: &'a mut HashMap<String, V>, key: &str, new: impl FnOnce() -> V) -> &'a mut V {
    if !m.contains_key(key) {
        m.insert(key.to_string(), new());
    }
    m.get_mut(key).expect("just made")
}

impl WorkersSeen {
    fn note(&self, tenant: &str, worker_id: &str, queues: &[String]) {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let queues_of = slot(&mut g, tenant, HashMap::new);
        for q in queues {
            let m = slot(queues_of, q, HashMap::new);
            *slot(m, worker_id, || now) = now;
            if m.len() > 64 {
                m.retain(|_, t| now.duration_since(*t) < WORKER_FORGET_AFTER);
            }
        }
    }

    /// Workers of a queue seen within `window`.
    pub fn active(&self, tenant: &str, queue: &str, window: Duration) -> u64 {
        let now = Instant::now();
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.get(tenant)
            .and_then(|qs| qs.get(queue))
            .map(|m| m.values().filter(|t| now.duration_since(**t) <= window).count() as u64)
            .unwrap_or(0)
    }
}

/// A claim entry's outcome, for the dispatcher's books (its requests were answered by the task that wrote it).
struct Done {
    /// Requests whose every pick lost a race with an entry applied meanwhile: they wait again, first in line.
    again: Vec<ClaimRequest>,
    ids: Vec<TaskId>,
    /// Tasks of capped queues in this claim, per queue (see `Dispatch::promised`).
    capped: HashMap<QueueKey, u64>,
    /// Tokens this claim takes (see `Dispatch::promised_tokens`).
    tokens: RateCounts,
    /// A hand-off's claim (fresh tasks, proposed behind their enqueue).
    handed_off: bool,
    /// Whether the entry committed (otherwise its outcome may be unknown).
    ok: bool,
}

impl Dispatcher {
    /// Starts the dispatcher for the node's life (until `leadership`'s shutdown): while this node does not lead,
    /// it answers every claim with `NotLeader`.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        raft: Raft,
        shared: Arc<SmShared>,
        leadership: Leadership,
        max_items: usize,
        write_timeout: Duration,
        flow: Arc<Flow>,
        handoff: HandoffRx,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Dispatcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let d = Dispatch {
            raft,
            shared,
            leadership,
            max_items,
            write_timeout,
            parked: VecDeque::new(),
            reserved: Promised::default(),
            promised: HashMap::new(),
            promised_tokens: RateCounts::default(),
            rate_wake: None,
            catching_up: false,
            unsettled: Vec::new(),
            in_flight: 0,
            fair: FairClock::default(),
            flow,
            open: handoff.open,
        };
        tasks.spawn(d.run(rx, handoff.rx));
        Dispatcher { tx, seen: Arc::default() }
    }

    /// Workers that asked for work recently (see `WorkersSeen`).
    pub fn workers_seen(&self) -> &WorkersSeen {
        &self.seen
    }

    /// Claims up to `count` tasks of `queues`, waiting up to `wait` for work when none is ready. An empty answer
    /// means nothing became claimable in time.
    pub async fn claim(
        &self,
        tenant: &str,
        worker_id: &Arc<str>,
        queues: &[String],
        count: usize,
        lease_ms: u64,
        wait: Duration,
    ) -> Claimed {
        let rx = self.submit(tenant, worker_id, queues, count, lease_ms, wait)?;
        rx.await.map_err(|_| ProposeError::Fatal("shutting down".into()))?
    }

    /// Parks a claim and returns where its answer will arrive. Dropping the receiver withdraws the claim.
    pub fn submit(
        &self,
        tenant: &str,
        worker_id: &Arc<str>,
        queues: &[String],
        count: usize,
        lease_ms: u64,
        wait: Duration,
    ) -> Result<oneshot::Receiver<Claimed>, ProposeError> {
        self.seen.note(tenant, worker_id, queues);
        let (reply, rx) = oneshot::channel();
        let req = ClaimRequest {
            tenant: tenant.into(),
            worker_id: worker_id.clone(),
            queues: queues.to_vec(),
            count,
            lease_ms,
            deadline: Instant::now() + wait,
            reply,
        };
        self.tx.send(req).map_err(|_| ProposeError::Fatal("shutting down".into()))?;
        Ok(rx)
    }
}

struct Dispatch {
    raft: Raft,
    shared: Arc<SmShared>,
    /// Whether this node leads, and the node's shutdown.
    leadership: Leadership,
    max_items: usize,
    write_timeout: Duration,
    parked: VecDeque<ClaimRequest>,
    /// Tasks in claim entries not yet answered (with the concurrency keys whose slots they hold).
    reserved: Promised,
    /// Tasks of capped queues (`leader::limits`) in claims in flight, per queue: they count against the cap
    /// until their claim is answered (by then apply counts them as running).
    promised: HashMap<QueueKey, u64>,
    /// Tokens of rate-limited buckets (`queue::rate`) taken by claims in flight: they count against the bucket
    /// until their claim is answered (by then apply has charged them).
    promised_tokens: RateCounts,
    /// When a bucket passed over for lack of tokens has its next one: look again then (parked claims are not
    /// woken by apply for a refill, which is no entry).
    rate_wake: Option<Instant>,
    /// Limits exist and this leader has not yet applied an entry of its term: assign again as apply moves.
    catching_up: bool,
    /// Promises of claim entries that failed with an unknown outcome, held until everything this node had
    /// appended by then is applied: (that last index, tasks per capped queue, tokens).
    unsettled: Vec<(u64, HashMap<QueueKey, u64>, RateCounts)>,
    /// Claim entries in flight, up to `MAX_IN_FLIGHT` (a hand-off's claim is not counted: it shares its
    /// enqueue's append, and the coalescer bounds those).
    in_flight: usize,
    /// The passes of the fair pick; leader-local, started over at each leadership change.
    fair: FairClock,
    /// Producer flow control: told how long Readys wait behind a full claim pipeline, and how many tasks are
    /// claimed.
    flow: Arc<Flow>,
    /// How many Readys fresh tasks could be handed to now (`Handoff::open`).
    open: Arc<AtomicUsize>,
}

impl Dispatch {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<ClaimRequest>,
        mut joint_rx: mpsc::UnboundedReceiver<Joint>,
    ) {
        let mut work = self.shared.work.subscribe();
        let mut applied = self.shared.applied.subscribe();
        let mut leading = self.leadership.clone();
        let shutdown = self.leadership.shutdown().clone();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let mut dirty = false;
        let mut blocked = BlockedClock::new(Instant::now());
        loop {
            // A node that stopped leading answers its parked Readys at once (`NotLeader`: their streams route
            // them to the new leader), not after the claim entries it still has in flight come back.
            if dirty && (self.in_flight < MAX_IN_FLIGHT || !self.leadership.is_leader()) {
                dirty = false;
                self.assign(&done_tx);
            }
            // Readys waiting while every claim entry allowed is in flight: workers the server keeps waiting.
            let full = self.in_flight >= MAX_IN_FLIGHT && !self.parked.is_empty();
            blocked.observe(&self.flow, Instant::now(), full);
            // With room in the claim pipeline, the parked Readys have had every task they could pick: a fresh
            // task given to one passes over none that was ready.
            let open = if self.in_flight < MAX_IN_FLIGHT && self.hand_off_allowed() { self.parked.len() } else { 0 };
            self.open.store(open, Relaxed);
            let next_deadline = self.parked.iter().map(|p| p.deadline).min();
            // A leader cut off from its quorum answers its parked Readys (`assign`) once that is so.
            let watch_quorum = !self.parked.is_empty() && self.leadership.is_leader() && !control::cut_off(&self.raft);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                req = rx.recv() => {
                    let Some(req) = req else { break };
                    self.parked.push_back(req);
                    while let Ok(req) = rx.try_recv() {
                        self.parked.push_back(req);
                    }
                    dirty = true;
                }
                changed = work.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    dirty = true;
                }
                changed = leading.changed() => {
                    if !changed {
                        break;
                    }
                    self.fair.reset();
                    dirty = true;
                }
                Some(joint) = joint_rx.recv() => self.hand_off(joint, &done_tx),
                Some(done) = done_rx.recv() => {
                    if !done.handed_off {
                        self.in_flight -= 1;
                    }
                    self.finish(done);
                    dirty = true;
                }
                _ = sleep_until(next_deadline) => self.expire(),
                _ = control::quorum_lost(&self.raft, control::quorum_silence_limit(&self.raft)), if watch_quorum => {
                    dirty = true;
                }
                _ = sleep_until(self.rate_wake) => {
                    self.rate_wake = None;
                    dirty = true;
                }
                changed = applied.changed(), if self.catching_up || !self.unsettled.is_empty() => {
                    if changed.is_err() {
                        break;
                    }
                    self.settle();
                    dirty = true;
                }
            }
        }
        // Shutting down: whoever still waits gets an empty answer.
        for p in self.parked.drain(..) {
            let _ = p.reply.send(Ok(vec![]));
        }
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let mut keep = VecDeque::with_capacity(self.parked.len());
        for p in self.parked.drain(..) {
            if p.deadline <= now {
                let _ = p.reply.send(Ok(vec![]));
            } else {
                keep.push_back(p);
            }
        }
        self.parked = keep;
    }

    fn assign(&mut self, done_tx: &mpsc::UnboundedSender<Done>) {
        self.rate_wake = None;
        self.parked.retain(|p| !p.reply.is_closed());
        if self.parked.is_empty() {
            return;
        }
        if !self.leadership.is_leader() {
            let m = crate::raft::metrics(&self.raft);
            let addr = m
                .current_leader
                .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.api_addr.clone()));
            for p in self.parked.drain(..) {
                let _ = p.reply.send(Err(not_leader(m.current_leader, addr.clone())));
            }
            return;
        }
        // Leading, but no quorum has answered for a while: the others have elected a leader this node cannot
        // hear of. No claim could commit here; `NOT_LEADER` naming no leader sends the workers elsewhere.
        if control::cut_off(&self.raft) {
            for p in self.parked.drain(..) {
                let _ = p.reply.send(Err(not_leader(None, None)));
            }
            return;
        }
        let mut items: Vec<ClaimItem> = Vec::new();
        let mut groups = Vec::new();
        let mut capped: HashMap<QueueKey, u64> = HashMap::new();
        // Limits and buckets are read only when some exist; a leader not caught up gives capped queues and
        // rate-limited keys nothing.
        let rated = self.shared.any_rates();
        let caught_up = (rated || self.shared.any_limits()).then(|| super::limits::caught_up(&self.raft));
        self.catching_up = caught_up == Some(false);
        let now_ms = if rated { wall_clock_ms() } else { 0 };
        let budget = rated.then(|| RateBudget::new(now_ms, caught_up != Some(false), &self.promised_tokens));
        let budget = budget.as_ref();
        let limited = self.shared.any_limits();
        // Requests found empty in this pass, by index (all below `i`, which only requests at `i` are removed
        // from): another request for the same (tenant, queues) is skipped.
        let mut empty: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < self.parked.len() && items.len() < self.max_items {
            let p = &self.parked[i];
            let same = |j: &usize| self.parked[*j].tenant == p.tenant && self.parked[*j].queues == p.queues;
            if empty.iter().any(same) {
                i += 1;
                continue;
            }
            let room = (self.max_items - items.len()).min(p.count);
            let ids = match caught_up.filter(|_| limited) {
                None => self.shared.pick_ready(&mut self.fair, &p.tenant, &p.queues, room, &self.reserved, budget),
                Some(caught_up) => pick_capped(
                    &self.shared,
                    &self.reserved,
                    &mut self.promised,
                    &mut self.fair,
                    p,
                    room,
                    caught_up,
                    &mut capped,
                    budget,
                ),
            };
            if ids.is_empty() {
                empty.push(i);
                i += 1;
                continue;
            }
            let req = self.parked.remove(i).expect("index in range");
            take(&mut self.reserved, req, ids, &mut items, &mut groups);
        }
        let tokens = match budget {
            None => RateCounts::default(),
            Some(b) => {
                let (tokens, throttled, wake_at) = b.finish();
                self.shared.metrics.throttled_claims.fetch_add(throttled as u64, std::sync::atomic::Ordering::Relaxed);
                self.rate_wake = wake_at.map(|at| Instant::now() + Duration::from_millis(at.saturating_sub(now_ms)));
                tokens
            }
        };
        if items.is_empty() {
            return;
        }
        self.promised_tokens.merge(&tokens);
        self.propose(items, groups, capped, tokens, None, done_tx);
    }

    /// Proposes one claim entry, right behind a hand-off's enqueue entry if one is given; the claim's answer
    /// comes back as a `Done`, the enqueue's to its coalescer.
    fn propose(
        &mut self,
        items: Vec<ClaimItem>,
        groups: Vec<(ClaimRequest, std::ops::Range<usize>)>,
        capped: HashMap<QueueKey, u64>,
        tokens: RateCounts,
        joint: Option<Joint>,
        done_tx: &mpsc::UnboundedSender<Done>,
    ) {
        let handed_off = joint.is_some();
        // A hand-off's claim shares its enqueue's append: it takes no place in the claim pipeline.
        if !handed_off {
            self.in_flight += 1;
        }
        let ids: Vec<TaskId> = items.iter().map(|c| c.task_id).collect();
        let raft = self.raft.clone();
        let timeout = self.write_timeout;
        let done_tx = done_tx.clone();
        let (flow, shared) = (self.flow.clone(), self.shared.clone());
        // A plain `Claim` unless a bucket is charged: clusters without rate limits never see a `RatedClaim`.
        let command = if tokens.is_empty() {
            Command::Claim(items)
        } else {
            Command::RatedClaim { items, charges: tokens.charges() }
        };
        tokio::spawn(async move {
            let result = match joint {
                None => write(&raft, command, timeout).await,
                Some(j) => {
                    let mut commands = j.lead;
                    commands.extend([j.command, command]);
                    let mut outcomes = write_many(&raft, commands, timeout).await;
                    let claimed = outcomes.pop().unwrap_or_else(|| Err(ProposeError::Unknown("no outcome".into())));
                    let _ = j.reply.send(outcomes);
                    claimed
                }
            };
            // The requests are answered here, one hop sooner than through the dispatcher's loop.
            let ok = result.is_ok();
            let again = answer(groups, result, handed_off, &flow, &shared);
            let _ = done_tx.send(Done { again, ids, capped, tokens, handed_off, ok });
        });
    }

    /// Whether fresh tasks may be handed to parked Readys: leading with a quorum, and no running cap or rate
    /// limit anywhere (those are counted on picks from the applied state).
    fn hand_off_allowed(&self) -> bool {
        !self.parked.is_empty()
            && !self.shared.any_limits()
            && !self.shared.any_rates()
            && self.leadership.is_leader()
            && !control::cut_off(&self.raft)
    }

    /// Proposes a hand-off's enqueue entry: with the claims of its fresh tasks for the Readys parked for their
    /// queues (`hand_out`) right behind it, or alone when no Ready takes any (see "Hand-off"). Tasks no Ready
    /// takes are picked as usual once the entry applies.
    fn hand_off(&mut self, mut joint: Joint, done_tx: &mpsc::UnboundedSender<Done>) {
        let given = if self.in_flight < MAX_IN_FLIGHT && self.hand_off_allowed() {
            self.parked.retain(|p| !p.reply.is_closed());
            let fresh = keyed_with_room(&self.shared, std::mem::take(&mut joint.fresh), &self.reserved);
            hand_out(&self.parked, fresh, &self.reserved, self.max_items)
        } else {
            vec![]
        };
        if given.is_empty() {
            let (raft, timeout) = (self.raft.clone(), self.write_timeout);
            tokio::spawn(async move {
                let mut commands = joint.lead;
                commands.push(joint.command);
                let _ = joint.reply.send(write_many(&raft, commands, timeout).await);
            });
            return;
        }
        let mut items: Vec<ClaimItem> = Vec::new();
        let mut groups = Vec::new();
        // Indexes ascend: each removal shifts the later ones down by one.
        for (removed, (i, ids)) in given.into_iter().enumerate() {
            let req = self.parked.remove(i - removed).expect("index in range");
            take(&mut self.reserved, req, ids, &mut items, &mut groups);
        }
        self.propose(items, groups, HashMap::new(), RateCounts::default(), Some(joint), done_tx);
    }

    /// Releases the promises of failed claims whose outcome is settled (see `finish`).
    fn settle(&mut self) {
        let applied = *self.shared.applied.borrow();
        let (settled, keep): (Vec<_>, Vec<_>) = self.unsettled.drain(..).partition(|(at, _, _)| *at <= applied);
        self.unsettled = keep;
        for (_, capped, tokens) in settled {
            release(&mut self.promised, &capped);
            self.promised_tokens.release(&tokens);
        }
    }

    fn finish(&mut self, done: Done) {
        for id in &done.ids {
            self.reserved.remove(id);
        }
        if done.ok {
            release(&mut self.promised, &done.capped);
            self.promised_tokens.release(&done.tokens);
        } else if !done.capped.is_empty() || !done.tokens.is_empty() {
            // The entry may still commit (a timeout, a leader change): its promises hold until everything this
            // node appended so far is applied, when it is either counted as running (and charged) or gone.
            let appended = crate::raft::metrics(&self.raft).last_log_index.unwrap_or(0);
            self.unsettled.push((appended, done.capped, done.tokens));
        }
        for req in done.again.into_iter().rev() {
            self.parked.push_front(req);
        }
    }
}

/// Answers the requests of a claim entry from its outcome, each with its share of the claimed tasks; returns
/// those whose every pick lost a race with an entry applied meanwhile and that may still wait (the dispatcher
/// parks them again, first in line).
fn answer(
    groups: Vec<(ClaimRequest, std::ops::Range<usize>)>,
    result: Result<Response, ProposeError>,
    handed_off: bool,
    flow: &Flow,
    shared: &SmShared,
) -> Vec<ClaimRequest> {
    let mut again = Vec::new();
    match result {
        Ok(Response::Claimed(results)) => {
            if crate::telemetry::task_spans_enabled() {
                for t in results.iter().flatten().filter(|t| t.traceparent.is_some()) {
                    crate::telemetry::task_span("claim", &t.id, t.traceparent.as_deref(), t.state.as_str());
                }
            }
            let claimed = results.iter().filter(|r| r.is_ok()).count();
            flow.claimed(claimed);
            if handed_off {
                shared.metrics.handed_off.fetch_add(claimed as u64, Relaxed);
            }
            // The groups cover the results in order: hand each its share without gathering them all first (a
            // whole entry's tasks in one vector cost a large allocation per entry).
            let now = Instant::now();
            let mut results = results.into_iter();
            for (req, range) in groups {
                let tasks: Vec<Arc<Task>> = results.by_ref().take(range.len()).filter_map(Result::ok).collect();
                if tasks.is_empty() && req.deadline > now {
                    again.push(req);
                } else if let Err(Ok(tasks)) = req.reply.send(Ok(tasks)) {
                    // The requester left after its tasks were claimed: their leases will expire and the tasks
                    // return; nothing else to do.
                    tracing::debug!(tasks = tasks.len(), "claimed tasks for a withdrawn request");
                }
            }
        }
        Ok(other) => {
            for (req, _) in groups {
                let _ = req.reply.send(Err(ProposeError::Storage(format!("unexpected response {other:?}"))));
            }
        }
        Err(e) => {
            for (req, _) in groups {
                let _ = req.reply.send(Err(e.clone()));
            }
        }
    }
    again
}

/// Adds a request's claims of `ids` to an entry being built, and reserves the tasks.
fn take(
    reserved: &mut Promised,
    req: ClaimRequest,
    picked: Vec<Picked>,
    items: &mut Vec<ClaimItem>,
    groups: &mut Vec<(ClaimRequest, std::ops::Range<usize>)>,
) {
    let start = items.len();
    for p in picked {
        let id = p.id;
        reserved.insert(&req.tenant, p);
        items.push(ClaimItem {
            task_id: id,
            tenant: req.tenant.clone(),
            worker_id: req.worker_id.clone(),
            lease_ms: req.lease_ms,
        });
    }
    groups.push((req, start..items.len()));
}

/// The fresh tasks a hand-off may claim: every one without a concurrency key, and those of a key whose free
/// slots in the applied state cover all of the entry's tasks of that key and the key's tasks promised to claims
/// in flight. A key with fewer slots left goes through the regular pick, which takes what room there is; apply
/// checks each claim against its key's limit in any case. Parked Readys mean their queues had nothing
/// claimable, so the tasks handed out are served at once, the keys taking turns (`hand_out`); what the Readys
/// cannot take is picked fairly once the entry applies.
fn keyed_with_room(shared: &SmShared, fresh: Vec<Fresh>, reserved: &Promised) -> Vec<Fresh> {
    if fresh.iter().all(|f| f.key.is_none()) {
        return fresh;
    }
    let mut per_key: HashMap<(&str, &str), u64> = HashMap::new();
    for f in &fresh {
        if let Some((key, _)) = &f.key {
            *per_key.entry((f.tenant.as_str(), key)).or_default() += 1;
        }
    }
    let keep: Vec<bool> = fresh
        .iter()
        .map(|f| match &f.key {
            None => true,
            Some((key, own)) => {
                let wanted = per_key.get(&(f.tenant.as_str(), &**key)).copied().unwrap_or(0);
                let promised = u64::from(reserved.of_key(&f.tenant, key));
                shared.key_room(f.id, &f.tenant, key, *own) >= wanted + promised
            }
        })
        .collect();
    fresh.into_iter().zip(keep).filter_map(|(f, keep)| keep.then_some(f)).collect()
}

/// Which parked Readys take which fresh tasks: Readys in arrival order, each up to its count (all together up to
/// `max_items`), from the fresh tasks of its tenant's queues, higher priority first and within a priority the
/// concurrency keys in turn, each key's tasks in the entry's order; tasks in `reserved` are passed over. Returns
/// the takers' indexes in `parked`, ascending, each with its tasks.
fn hand_out(
    parked: &VecDeque<ClaimRequest>,
    fresh: Vec<Fresh>,
    reserved: &Promised,
    max_items: usize,
) -> Vec<(usize, Vec<Picked>)> {
    // Within a priority the concurrency keys take turns: the first task of each key (in the entry's order), then
    // the second of each, and so on; each key's own tasks, and an entry without keys, keep the entry's order.
    // Without any key the turns are the entry's order, so a stable sort by priority alone gives the same lists.
    let turns: Vec<usize> = if fresh.iter().any(|f| f.key.is_some()) {
        let mut seen: HashMap<(&str, &str, Option<&str>, u8), usize> = HashMap::new();
        let mut turns = Vec::with_capacity(fresh.len());
        for f in &fresh {
            let n = seen.entry((&f.tenant, &f.queue, f.key.as_ref().map(|k| &*k.0), f.priority)).or_default();
            *n += 1;
            turns.push(*n);
        }
        turns
    } else {
        vec![0; fresh.len()]
    };
    let mut order: Vec<(usize, Fresh)> = turns.into_iter().zip(fresh).collect();
    order.sort_by_key(|(turn, f)| (std::cmp::Reverse(f.priority), *turn));
    // Per (tenant, queue): its fresh tasks, best first.
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut lists: Vec<VecDeque<(Picked, u8)>> = Vec::new();
    for f in order.iter().map(|(_, f)| f).filter(|f| !reserved.contains(&f.id)) {
        let at = *index.entry((f.tenant.as_str(), f.queue.as_str())).or_insert_with(|| {
            lists.push(VecDeque::new());
            lists.len() - 1
        });
        lists[at].push_back((Picked { id: f.id, key: f.key.as_ref().map(|k| k.0.clone()) }, f.priority));
    }
    let mut left: usize = lists.iter().map(VecDeque::len).sum();
    let mut given = Vec::new();
    let mut total = 0;
    for (i, p) in parked.iter().enumerate() {
        if total >= max_items || left == 0 {
            break;
        }
        let room = (max_items - total).min(p.count);
        let mine: Vec<usize> = p.queues.iter().filter_map(|q| index.get(&(&*p.tenant, q.as_str())).copied()).collect();
        let mut ids = Vec::new();
        while ids.len() < room {
            // The best front among the request's queues (the first named on a tie).
            let best = mine.iter().filter_map(|&l| Some((l, lists[l].front()?.1))).fold(
                None,
                |best: Option<(usize, u8)>, (l, pr)| match best {
                    Some((_, b)) if b >= pr => best,
                    _ => Some((l, pr)),
                },
            );
            let Some((l, _)) = best else { break };
            ids.push(lists[l].pop_front().expect("has a front").0);
            left -= 1;
        }
        if !ids.is_empty() {
            total += ids.len();
            given.push((i, ids));
        }
    }
    given
}

/// The pick for one request when limits exist: queues without a cap as usual; a capped queue gets at most
/// its room (`limits::claim_room`), counting what this pass and the claims in flight already took of it.
/// With a capped queue among several, the queues are served in the order the request names them.
#[allow(clippy::too_many_arguments)]
fn pick_capped(
    shared: &SmShared,
    reserved: &Promised,
    promised: &mut HashMap<QueueKey, u64>,
    fair: &mut FairClock,
    p: &ClaimRequest,
    room: usize,
    caught_up: bool,
    capped: &mut HashMap<QueueKey, u64>,
    budget: Option<&RateBudget<'_>>,
) -> Vec<Picked> {
    let rooms: Vec<Option<u64>> = p
        .queues
        .iter()
        .map(|q| {
            let qk = QueueKey::new(&p.tenant, q);
            let promised = promised.get(&qk).copied().unwrap_or(0);
            super::limits::claim_room(shared, caught_up, &p.tenant, q, promised)
        })
        .collect();
    if rooms.iter().all(Option::is_none) {
        return shared.pick_ready(fair, &p.tenant, &p.queues, room, reserved, budget);
    }
    let mut ids = Vec::new();
    for (q, r) in p.queues.iter().zip(rooms) {
        let want = (room - ids.len()).min(r.map_or(usize::MAX, |r| r as usize));
        if want == 0 {
            continue;
        }
        let got = shared.pick_ready(fair, &p.tenant, std::slice::from_ref(q), want, reserved, budget);
        if r.is_some() && !got.is_empty() {
            let qk = QueueKey::new(&p.tenant, q);
            *capped.entry(qk.clone()).or_default() += got.len() as u64;
            *promised.entry(qk).or_default() += got.len() as u64;
        }
        ids.extend(got);
        if ids.len() >= room {
            break;
        }
    }
    ids
}

fn release(promised: &mut HashMap<QueueKey, u64>, capped: &HashMap<QueueKey, u64>) {
    for (qk, n) in capped {
        if let Some(v) = promised.get_mut(qk) {
            *v = v.saturating_sub(*n);
            if *v == 0 {
                promised.remove(qk);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-out's takers with the ids of their tasks.
    fn ids(given: Vec<(usize, Vec<Picked>)>) -> Vec<(usize, Vec<TaskId>)> {
        given.into_iter().map(|(i, picked)| (i, picked.into_iter().map(|p| p.id).collect())).collect()
    }

    fn id(n: u64) -> TaskId {
        TaskId::new(1_000, 0, n)
    }

    fn fresh(n: u64, tenant: &str, queue: &str, priority: u8) -> Fresh {
        Fresh { id: id(n), tenant: tenant.into(), queue: queue.into(), priority, key: None }
    }

    fn ready(tenant: &str, queues: &[&str], count: usize) -> ClaimRequest {
        ClaimRequest {
            tenant: tenant.into(),
            worker_id: "w".into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            count,
            lease_ms: 1_000,
            deadline: Instant::now() + Duration::from_secs(10),
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn workers_seen_counts_each_worker_once_per_tenant_and_queue_within_the_window() {
        let seen = WorkersSeen::default();
        let qs = |q: &[&str]| q.iter().map(|q| q.to_string()).collect::<Vec<_>>();
        seen.note("t", "w1", &qs(&["a", "b"]));
        seen.note("t", "w1", &qs(&["a"]));
        seen.note("t", "w2", &qs(&["a"]));
        seen.note("u", "w3", &qs(&["a"]));
        let hour = Duration::from_secs(3600);
        assert_eq!(seen.active("t", "a", hour), 2, "w1 noted twice counts once");
        assert_eq!(seen.active("t", "b", hour), 1);
        assert_eq!(seen.active("u", "a", hour), 1, "tenants are apart");
        assert_eq!(seen.active("u", "b", hour), 0);
        assert_eq!(seen.active("v", "a", hour), 0);
        std::thread::sleep(Duration::from_millis(300));
        seen.note("t", "w2", &qs(&["a"]));
        assert_eq!(seen.active("t", "a", Duration::from_millis(150)), 1, "a new note renews only its worker");
    }

    #[test]
    fn fresh_tasks_go_to_readys_in_arrival_order_best_priority_first_within_tenant_and_queue() {
        let parked: VecDeque<ClaimRequest> =
            [ready("t", &["a"], 2), ready("u", &["a"], 5), ready("t", &["b", "a"], 5), ready("t", &["c"], 1)].into();
        let new = vec![
            fresh(1, "t", "a", 0),
            fresh(2, "t", "a", 5),
            fresh(3, "t", "b", 5),
            fresh(4, "t", "a", 5),
            fresh(5, "t", "b", 9),
            fresh(6, "u", "a", 0),
        ];
        let given = ids(hand_out(&parked, new, &Promised::default(), 100));
        // The first Ready: a's two priority-5 tasks in the entry's order. The other tenant's Ready: its own task.
        // The third: b's 9, then the 5s (b named first wins the tie), then a's 0. Queue c has nothing.
        assert_eq!(given, vec![(0, vec![id(2), id(4)]), (1, vec![id(6)]), (2, vec![id(5), id(3), id(1)])]);
    }

    #[test]
    fn a_hand_out_stops_at_max_items_and_passes_over_reserved_tasks() {
        let parked: VecDeque<ClaimRequest> = [ready("t", &["a"], 3), ready("t", &["a"], 3)].into();
        let new = (1..=6).map(|n| fresh(n, "t", "a", 0)).collect();
        let mut reserved = Promised::default();
        reserved.insert(&Arc::from("t"), Picked::plain(id(2)));
        let given = ids(hand_out(&parked, new, &reserved, 4));
        assert_eq!(given, vec![(0, vec![id(1), id(3), id(4)]), (1, vec![id(5)])]);
        // Nothing fresh for the Readys' queues: nobody takes anything.
        assert!(hand_out(&parked, vec![fresh(9, "t", "z", 0)], &Promised::default(), 4).is_empty());
    }

    #[test]
    fn within_a_priority_the_concurrency_keys_of_an_entry_take_turns() {
        let keyed = |n, key: &str, priority| Fresh { key: Some((key.into(), 10)), ..fresh(n, "t", "a", priority) };
        // Key x's three tasks come first in the entry, then y's, then one without a key, then z's 5.
        let new = vec![
            keyed(1, "x", 0),
            keyed(2, "x", 0),
            keyed(3, "x", 0),
            keyed(4, "y", 0),
            keyed(5, "y", 0),
            fresh(6, "t", "a", 0),
            keyed(7, "z", 5),
        ];
        let parked: VecDeque<ClaimRequest> = [ready("t", &["a"], 4), ready("t", &["a"], 2)].into();
        let given = hand_out(&parked, new, &Promised::default(), 100);
        // Each handed-out task carries its key, whose slot its claim holds until answered.
        let keys: Vec<Option<&str>> = given[0].1.iter().map(|p| p.key.as_deref()).collect();
        assert_eq!(keys, vec![Some("z"), Some("x"), Some("y"), None]);
        let given = ids(given);
        // The priority-5 task first; then the first task of x, of y and the unkeyed one; then the second of x and
        // of y. What the Readys cannot take (x's third) waits for the fair pick.
        assert_eq!(given, vec![(0, vec![id(7), id(1), id(4), id(6)]), (1, vec![id(2), id(5)])]);
    }
}
