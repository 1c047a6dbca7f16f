//! Apply for one shard: the rules of the task lifecycle, and the in-memory indexes derived from the shard's
//! records.
//!
//! Every effect of a command on a shard depends only on that shard's records and the command itself (the
//! proposer decided ids, claims and jitter), so after a crash each shard can replay from its own `last_applied`
//! and arrive at the same state as every other replica. Apply never reads a clock: time is the command's
//! `time_ms`, and shard time never moves backwards.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::types::*;

/// Record access for one shard, inside one write transaction. Implemented over redb in `storage::shard` and
/// over maps in tests.
pub trait TaskStore {
    type Error;
    fn get(&mut self, id: &TaskId) -> Result<Option<Task>, Self::Error>;
    fn put(&mut self, task: &Task) -> Result<(), Self::Error>;
    fn remove(&mut self, id: &TaskId) -> Result<(), Self::Error>;
    fn get_key(&mut self, tenant: &str, key: &str) -> Result<Option<KeyRecord>, Self::Error>;
    fn put_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) -> Result<(), Self::Error>;
    fn remove_key(&mut self, tenant: &str, key: &str) -> Result<(), Self::Error>;
    fn get_delivery(&mut self, id: &DeliveryId) -> Result<Option<WebhookDelivery>, Self::Error>;
    fn put_delivery(&mut self, d: &WebhookDelivery) -> Result<(), Self::Error>;
    fn remove_delivery(&mut self, id: &DeliveryId) -> Result<(), Self::Error>;
    /// Small shard-level records other than tasks and keys (paused queues, ...), by a key whose first byte says
    /// what it is (see `RecordKey`).
    fn put_record(&mut self, key: &[u8], value: &[u8]) -> Result<(), Self::Error>;
    fn remove_record(&mut self, key: &[u8]) -> Result<(), Self::Error>;
}

/// Keys of the shard-level records (`TaskStore::put_record`). The first byte is the kind; it also says where a
/// snapshot puts the record: `PAUSED` records are held by every shard.
pub struct RecordKey;

impl RecordKey {
    pub const PAUSED: u8 = b'p';
    /// `s` + 16-byte schedule id: a schedule, in the shard of its id.
    pub const SCHEDULE: u8 = b's';

    pub fn schedule(id: &TaskId) -> Vec<u8> {
        let mut v = vec![Self::SCHEDULE];
        v.extend_from_slice(&id.0);
        v
    }

    /// `p tenant \0 queue`.
    pub fn paused(qk: &QueueKey) -> Vec<u8> {
        let mut v = vec![Self::PAUSED];
        v.extend_from_slice(qk.tenant.as_bytes());
        v.push(0);
        v.extend_from_slice(qk.queue.as_bytes());
        v
    }

    /// The one shard that holds a record, or `None` for records every shard holds.
    pub fn shard_of(key: &[u8], _shards: usize) -> Option<usize> {
        match key.first() {
            Some(&Self::SCHEDULE) if key.len() == 17 => {
                let id: [u8; 16] = key[1..17].try_into().expect("16 bytes");
                Some(TaskId(id).shard(_shards))
            }
            _ => None,
        }
    }

    pub fn parse_paused(key: &[u8]) -> Option<QueueKey> {
        let rest = key.strip_prefix(&[Self::PAUSED])?;
        let split = rest.iter().position(|b| *b == 0)?;
        Some(QueueKey {
            tenant: String::from_utf8_lossy(&rest[..split]).into_owned(),
            queue: String::from_utf8_lossy(&rest[split + 1..]).into_owned(),
        })
    }
}

/// An idempotency key: which task it created and until when it is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub task_id: TaskId,
    pub expires_at: TimeMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub tenant: String,
    pub queue: String,
}

impl QueueKey {
    pub fn of(task: &Task) -> Self {
        QueueKey { tenant: task.tenant.clone(), queue: task.queue.clone() }
    }
}

/// Claim order: higher priority first, then FIFO by sequence.
pub type ReadyKey = (Reverse<u8>, u64, TaskId);

/// The leader's claim order across queues and shards: priority, then the running tasks of the task's
/// concurrency key (least busy key first; 0 without a key), then FIFO.
pub type ClaimOrder = (Reverse<u8>, u32, u64, TaskId);

/// Side effects of applying entries that the node reacts to after commit (waking parked claims, answering
/// result waiters, webhooks). Derived, never stored.
#[derive(Debug, Default)]
pub struct Effects {
    pub ready: HashSet<QueueKey>,
    pub ended: Vec<TaskId>,
    pub counts: EventCounts,
    /// Per task, in state-machine ms: enqueue to first claim; claim to the end of a delivery; enqueue to the end.
    pub enqueue_to_claim_ms: Vec<u64>,
    pub claim_to_end_ms: Vec<u64>,
    pub enqueue_to_end_ms: Vec<u64>,
    /// Webhook deliveries added to an outbox (the leader's sender looks again).
    pub webhooks_added: u64,
}

/// What happened to tasks in the applied entries (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventCounts {
    pub enqueued: u64,
    pub claimed: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub lease_expired: u64,
}

/// Slots of a response being filled shard by shard; each item belongs to exactly one shard.
#[derive(Debug)]
pub enum PartialResponse {
    None,
    Enqueued(Vec<Option<ItemResult<Enqueued>>>),
    Claimed(Vec<Option<ItemResult<Box<Task>>>>),
    Acked(Vec<Option<ItemResult<AckOutcome>>>),
    Cancelled(Option<ItemResult<TaskState>>),
    Redriven(Vec<TaskId>),
    Purged(Vec<TaskId>),
    Ticked,
    WebhooksRecorded(u32),
    QueuePaused(bool),
    Resolved(u64),
    Schedule(Option<ItemResult<Option<Box<Schedule>>>>),
    Fired(bool),
}

impl PartialResponse {
    pub fn for_command(cmd: &Command) -> Self {
        match cmd {
            Command::Enqueue(v) => PartialResponse::Enqueued(vec![None; v.len()]),
            Command::Claim(v) => PartialResponse::Claimed(vec![None; v.len()]),
            Command::Ack(v) => PartialResponse::Acked(vec![None; v.len()]),
            Command::Cancel { .. } => PartialResponse::Cancelled(None),
            Command::Redrive { .. } => PartialResponse::Redriven(vec![]),
            Command::PurgeDeadLetters { .. } => PartialResponse::Purged(vec![]),
            Command::Tick => PartialResponse::Ticked,
            Command::WebhookOutcome(_) => PartialResponse::WebhooksRecorded(0),
            Command::SetQueuePaused { paused, .. } => PartialResponse::QueuePaused(*paused),
            Command::ResolveDependencies(_) => PartialResponse::Resolved(0),
            Command::CreateSchedule(_) | Command::UpdateSchedule { .. } => PartialResponse::Schedule(None),
            Command::FireSchedule { .. } => PartialResponse::Fired(false),
        }
    }

    /// The finished response. A slot no shard filled can only come from a shard that skipped the entry during
    /// crash recovery, where nobody waits for the answer; it reads as `NotFound`.
    pub fn finish(self) -> Response {
        fn fill<T>(v: Vec<Option<ItemResult<T>>>) -> Vec<ItemResult<T>> {
            v.into_iter().map(|s| s.unwrap_or(Err(Rejected::NotFound))).collect()
        }
        match self {
            PartialResponse::None => Response::None,
            PartialResponse::Enqueued(v) => Response::Enqueued(fill(v)),
            PartialResponse::Claimed(v) => Response::Claimed(fill(v)),
            PartialResponse::Acked(v) => Response::Acked(fill(v)),
            PartialResponse::Cancelled(v) => Response::Cancelled(v.unwrap_or(Err(Rejected::NotFound))),
            PartialResponse::Redriven(v) => Response::Redriven(v),
            PartialResponse::Purged(v) => Response::Purged(v),
            PartialResponse::Ticked => Response::Ticked,
            PartialResponse::WebhooksRecorded(n) => Response::WebhooksRecorded(n),
            PartialResponse::QueuePaused(p) => Response::QueuePaused(p),
            PartialResponse::Resolved(n) => Response::Resolved(n),
            PartialResponse::Schedule(v) => Response::Schedule(v.unwrap_or(Err(Rejected::NotFound))),
            PartialResponse::Fired(f) => Response::Fired(f),
        }
    }
}

/// One shard's derived state: its time and its indexes. Rebuilt from the records at start and after a snapshot
/// is installed (`index_task`, `index_key`).
#[derive(Debug, Default)]
pub struct ShardCore {
    pub shard_no: usize,
    pub shards: usize,
    /// State-machine time of this shard: the max `time_ms` of every entry applied.
    pub now: TimeMs,
    ready: HashMap<QueueKey, BTreeSet<ReadyKey>>,
    delayed: BTreeMap<(TimeMs, TaskId), (QueueKey, u8, u64)>,
    leases: BTreeSet<(TimeMs, TaskId)>,
    retention: BTreeSet<(TimeMs, TaskId)>,
    dead: HashMap<QueueKey, BTreeSet<(TimeMs, TaskId)>>,
    keys: BTreeSet<(TimeMs, String, String)>,
    counts: HashMap<QueueKey, StateCounts>,
    /// Pending webhook deliveries of this shard's outbox, by when they are due.
    webhooks: BTreeSet<(TimeMs, DeliveryId)>,
    /// The log index of the entry being applied (names the webhook deliveries it creates).
    log_index: u64,
    /// Deliveries created by the entry being applied, moved into its `Effects` at the end.
    webhooks_added: u64,
    /// Deadlines of tasks not yet ended (pending, running or dead-lettered).
    deadlines: BTreeSet<(TimeMs, TaskId)>,
    /// Paused queues (every shard holds the whole set).
    paused: HashSet<QueueKey>,
    /// Running tasks per (tenant, concurrency key) of this shard.
    running_keys: HashMap<(String, String), u32>,
    /// The concurrency key of each pending (ready or delayed) task that has one.
    pending_keys: HashMap<TaskId, ConcurrencyKey>,
    /// Schedules stored in this shard.
    schedules: BTreeMap<TaskId, Schedule>,
    /// Pending tasks held by dependencies, and for each dependency the held tasks of this shard waiting on it.
    held: BTreeSet<TaskId>,
    waiters: BTreeMap<TaskId, BTreeSet<TaskId>>,
    /// Queues whose keyed running task stopped running during the entry being applied (reported as ready work,
    /// so parked claims look again). Transient.
    freed: Vec<QueueKey>,
    /// Completions per queue by second of `ended_at` over the last `THROUGHPUT_WINDOW_S`: (tasks, summed run ms).
    /// For the capacity view; derived from completed records, so a rebuild finds the same figures.
    done: HashMap<QueueKey, BTreeMap<u64, (u64, u64)>>,
}

/// How far back completions are kept for throughput figures: the longest window reported (15 minutes).
pub const THROUGHPUT_WINDOW_S: u64 = 15 * 60;

/// Completions of one queue over the recent windows, in state-machine time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Throughput {
    pub completed_1m: u64,
    pub completed_5m: u64,
    pub completed_15m: u64,
    /// Summed run time (claim to completion) of the tasks completed in the last 15 minutes.
    pub run_ms_15m: u64,
}

/// Tasks per state in one queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    pub pending: u64,
    pub delayed: u64,
    pub in_progress: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub dead_lettered: u64,
}

impl StateCounts {
    fn slot(&mut self, state: TaskState, delayed: bool) -> &mut u64 {
        match state {
            TaskState::Pending if delayed => &mut self.delayed,
            TaskState::Pending => &mut self.pending,
            TaskState::InProgress => &mut self.in_progress,
            TaskState::Completed => &mut self.completed,
            TaskState::Failed => &mut self.failed,
            TaskState::Cancelled => &mut self.cancelled,
            TaskState::DeadLettered => &mut self.dead_lettered,
        }
    }
    pub fn add(&mut self, other: &StateCounts) {
        self.pending += other.pending;
        self.delayed += other.delayed;
        self.in_progress += other.in_progress;
        self.completed += other.completed;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.dead_lettered += other.dead_lettered;
    }
}

/// A deterministic mix of the proposer's seed with a task id, for per-task jitter.
fn jitter(seed: u64, id: &TaskId) -> u64 {
    let mut z = seed ^ u64::from_be_bytes(id.0[8..16].try_into().expect("8 bytes"));
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ShardCore {
    pub fn new(shard_no: usize, shards: usize) -> Self {
        ShardCore { shard_no, shards, ..Default::default() }
    }

    fn mine(&self, id: &TaskId) -> bool {
        id.shard(self.shards) == self.shard_no
    }

    // ---- indexes -------------------------------------------------------------------------------------------

    /// Adds a record to the indexes matching its state. Used by apply and by the rebuild at start.
    pub fn index_task(&mut self, t: &Task) {
        let qk = QueueKey::of(t);
        if t.state == TaskState::Pending && !t.waiting_on.is_empty() {
            // Held by dependencies: counted as delayed (pending, not claimable), in no other index.
            self.held.insert(t.id);
            for d in &t.waiting_on {
                self.waiters.entry(*d).or_default().insert(t.id);
            }
            if let Some(d) = t.deadline {
                self.deadlines.insert((d, t.id));
            }
            self.counts.entry(qk).or_default().delayed += 1;
            return;
        }
        let delayed = t.state == TaskState::Pending && t.visible_at > self.now;
        if let (Some(d), false) = (t.deadline, t.state.is_terminal()) {
            self.deadlines.insert((d, t.id));
        }
        if let Some(ck) = &t.concurrency {
            match t.state {
                TaskState::InProgress => *self.running_keys.entry((t.tenant.clone(), ck.key.clone())).or_default() += 1,
                TaskState::Pending => {
                    self.pending_keys.insert(t.id, ck.clone());
                }
                _ => {}
            }
        }
        *self.counts.entry(qk.clone()).or_default().slot(t.state, delayed) += 1;
        match t.state {
            TaskState::Pending if delayed => {
                self.delayed.insert((t.visible_at, t.id), (qk, t.priority, t.seq));
            }
            TaskState::Pending => {
                self.ready.entry(qk).or_default().insert((Reverse(t.priority), t.seq, t.id));
            }
            TaskState::InProgress => {
                if let Some(l) = &t.lease {
                    self.leases.insert((l.deadline, t.id));
                }
            }
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled => {
                if let Some(d) = t.retention_deadline() {
                    self.retention.insert((d, t.id));
                }
                if let (TaskState::Completed, Some(end)) = (t.state, t.ended_at) {
                    let run_ms = t.runs.last().map(|r| end.saturating_sub(r.started_at)).unwrap_or(0);
                    self.note_done(qk, end, run_ms);
                }
            }
            TaskState::DeadLettered => {
                self.dead.entry(qk).or_default().insert((t.dead_at.unwrap_or(0), t.id));
            }
        }
    }

    fn note_done(&mut self, qk: QueueKey, ended_at: TimeMs, run_ms: u64) {
        let oldest = (self.now / 1000).saturating_sub(THROUGHPUT_WINDOW_S);
        let sec = ended_at / 1000;
        if sec < oldest {
            return;
        }
        let buckets = self.done.entry(qk).or_default();
        let b = buckets.entry(sec).or_default();
        b.0 += 1;
        b.1 += run_ms;
        while buckets.first_key_value().is_some_and(|(s, _)| *s < oldest) {
            buckets.pop_first();
        }
    }

    /// Completions of a queue in the 1, 5 and 15 minutes up to this shard's time.
    pub fn throughput(&self, qk: &QueueKey) -> Throughput {
        let mut out = Throughput::default();
        let now_s = self.now / 1000;
        for (sec, (n, run_ms)) in self.done.get(qk).into_iter().flatten() {
            let age = now_s.saturating_sub(*sec);
            if age < 60 {
                out.completed_1m += n;
            }
            if age < 300 {
                out.completed_5m += n;
            }
            if age < THROUGHPUT_WINDOW_S {
                out.completed_15m += n;
                out.run_ms_15m += run_ms;
            }
        }
        out
    }

    pub fn index_schedule(&mut self, s: Schedule) {
        self.schedules.insert(s.id, s);
    }

    pub fn schedules(&self) -> &BTreeMap<TaskId, Schedule> {
        &self.schedules
    }

    pub fn index_paused(&mut self, qk: QueueKey) {
        self.paused.insert(qk);
    }

    pub fn is_paused(&self, qk: &QueueKey) -> bool {
        self.paused.contains(qk)
    }

    pub fn paused(&self) -> impl Iterator<Item = &QueueKey> {
        self.paused.iter()
    }

    /// Removes a record (as it is before a change) from the indexes.
    fn unindex_task(&mut self, t: &Task) {
        let qk = QueueKey::of(t);
        if t.state == TaskState::Pending && self.held.remove(&t.id) {
            for d in &t.waiting_on {
                if let Some(w) = self.waiters.get_mut(d) {
                    w.remove(&t.id);
                    if w.is_empty() {
                        self.waiters.remove(d);
                    }
                }
            }
            if let Some(d) = t.deadline {
                self.deadlines.remove(&(d, t.id));
            }
            if let Some(c) = self.counts.get_mut(&qk) {
                c.delayed = c.delayed.saturating_sub(1);
            }
            return;
        }
        let in_delayed = t.state == TaskState::Pending && self.delayed.remove(&(t.visible_at, t.id)).is_some();
        if let Some(d) = t.deadline {
            self.deadlines.remove(&(d, t.id));
        }
        if let Some(ck) = &t.concurrency {
            match t.state {
                TaskState::InProgress => {
                    let k = (t.tenant.clone(), ck.key.clone());
                    if let Some(n) = self.running_keys.get_mut(&k) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            self.running_keys.remove(&k);
                        }
                    }
                }
                TaskState::Pending => {
                    self.pending_keys.remove(&t.id);
                }
                _ => {}
            }
        }
        if let Some(c) = self.counts.get_mut(&qk) {
            let slot = c.slot(t.state, in_delayed);
            *slot = slot.saturating_sub(1);
        }
        match t.state {
            TaskState::Pending => {
                if !in_delayed {
                    if let Some(set) = self.ready.get_mut(&qk) {
                        set.remove(&(Reverse(t.priority), t.seq, t.id));
                        if set.is_empty() {
                            self.ready.remove(&qk);
                        }
                    }
                }
            }
            TaskState::InProgress => {
                if let Some(l) = &t.lease {
                    self.leases.remove(&(l.deadline, t.id));
                }
            }
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled => {
                if let Some(d) = t.retention_deadline() {
                    self.retention.remove(&(d, t.id));
                }
            }
            TaskState::DeadLettered => {
                if let Some(set) = self.dead.get_mut(&qk) {
                    set.remove(&(t.dead_at.unwrap_or(0), t.id));
                    if set.is_empty() {
                        self.dead.remove(&qk);
                    }
                }
            }
        }
    }

    pub fn index_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) {
        self.keys.insert((rec.expires_at, tenant.to_string(), key.to_string()));
    }

    pub fn index_delivery(&mut self, d: &WebhookDelivery) {
        self.webhooks.insert((d.next_at, d.id));
    }

    /// Writes a changed record and moves it between indexes. A task with a webhook URL that has just ended
    /// (or been dead-lettered) gets a delivery in this shard's outbox, in the same transaction.
    fn update<S: TaskStore>(&mut self, store: &mut S, before: &Task, after: &Task) -> Result<(), S::Error> {
        if before.state == TaskState::InProgress && after.state != TaskState::InProgress && before.concurrency.is_some()
        {
            // A slot of the key came free: tasks of the key in any queue may be claimable now.
            self.freed.push(QueueKey::of(before));
        }
        self.unindex_task(before);
        self.index_task(after);
        store.put(after)?;
        let ended = after.state.is_terminal() || after.state == TaskState::DeadLettered;
        if let (true, true, Some(url)) = (ended, before.state != after.state, &after.webhook_url) {
            let d = WebhookDelivery {
                id: DeliveryId { task_id: after.id, seq: self.log_index << 4 | state_code(after.state) },
                url: url.clone(),
                tenant: after.tenant.clone(),
                queue: after.queue.clone(),
                state: after.state,
                attempts: after.attempts,
                result: after.result.clone(),
                error: after.last_error.clone(),
                created_at: after.created_at,
                ended_at: self.now,
                traceparent: after.traceparent.clone(),
                tracestate: after.tracestate.clone(),
                tries: 0,
                next_at: self.now,
                last_error: None,
            };
            store.put_delivery(&d)?;
            self.index_delivery(&d);
            self.webhooks_added += 1;
        }
        Ok(())
    }

    // ---- reads (used by the leader to choose claims, and by the API) -----------------------------------------

    /// Up to `limit` ready tasks of one queue in claim order, skipping `skip`.
    pub fn ready_head(&self, qk: &QueueKey, limit: usize, skip: &HashSet<TaskId>) -> Vec<ReadyKey> {
        if self.paused.contains(qk) {
            return vec![];
        }
        match self.ready.get(qk) {
            None => vec![],
            Some(set) => set.iter().filter(|k| !skip.contains(&k.2)).take(limit).cloned().collect(),
        }
    }

    /// Webhook deliveries due at `now`, earliest first, skipping `skip` (attempts in flight).
    pub fn due_deliveries(&self, now: TimeMs, limit: usize, skip: &HashSet<DeliveryId>) -> Vec<(TimeMs, DeliveryId)> {
        self.webhooks.iter().take_while(|k| k.0 <= now).filter(|k| !skip.contains(&k.1)).take(limit).cloned().collect()
    }

    /// When the earliest webhook delivery of this shard is due.
    pub fn next_delivery_at(&self) -> Option<TimeMs> {
        self.webhooks.first().map(|k| k.0)
    }

    /// Pending webhook deliveries in this shard.
    pub fn pending_deliveries(&self) -> usize {
        self.webhooks.len()
    }

    /// Dependencies that tasks of this shard wait on, with the waiting tasks.
    pub fn waiters(&self) -> &BTreeMap<TaskId, BTreeSet<TaskId>> {
        &self.waiters
    }

    /// Tasks of this shard running under a tenant's concurrency key.
    pub fn running_with_key(&self, tenant: &str, key: &str) -> u32 {
        self.running_keys.get(&(tenant.to_string(), key.to_string())).copied().unwrap_or(0)
    }

    /// Claim candidates for the leader: this shard's ready tasks of `queues`, merged in claim order (priority,
    /// then FIFO), up to `limit`, skipping `skip` (tasks promised to claims in flight) and tasks whose concurrency
    /// key has no free slot (its running tasks, the in-flight promises and the candidates taken so far fill its
    /// limit). A blocked key is passed over, never waited for. Each candidate sorts by (priority, running tasks of
    /// its key (0 without a key), FIFO): at equal priority the least busy key goes first, so claims rotate
    /// across keys. A key's tasks all live in one shard, so its admission here is exact.
    pub fn claim_candidates(
        &self,
        tenant: &str,
        queues: &[String],
        limit: usize,
        skip: &HashSet<TaskId>,
    ) -> Vec<ClaimOrder> {
        // Keyed tasks promised to claims in flight: walk the smaller of the two sets (claims without keys, the
        // common case, cost nothing here).
        let mut taken: HashMap<&str, u32> = HashMap::new();
        if self.pending_keys.len() <= skip.len() {
            for (id, ck) in &self.pending_keys {
                if skip.contains(id) {
                    *taken.entry(ck.key.as_str()).or_default() += 1;
                }
            }
        } else {
            for id in skip {
                if let Some(ck) = self.pending_keys.get(id) {
                    *taken.entry(ck.key.as_str()).or_default() += 1;
                }
            }
        }
        let mut iters: Vec<_> = queues
            .iter()
            .map(|q| QueueKey { tenant: tenant.to_string(), queue: q.clone() })
            .filter(|qk| !self.paused.contains(qk))
            .filter_map(|qk| self.ready.get(&qk))
            .map(|set| set.iter().peekable())
            .collect();
        let mut out = Vec::new();
        while out.len() < limit {
            // The next ready task across the queues, in claim order.
            let mut best: Option<(usize, &ReadyKey)> = None;
            for (i, it) in iters.iter_mut().enumerate() {
                if let Some(k) = it.peek() {
                    if best.is_none_or(|(_, b)| *k < b) {
                        best = Some((i, *k));
                    }
                }
            }
            let Some((i, _)) = best else { break };
            let k = iters[i].next().expect("peeked");
            if skip.contains(&k.2) {
                continue;
            }
            let busy = match self.pending_keys.get(&k.2) {
                None => 0,
                Some(ck) => {
                    let running = self.running_with_key(tenant, &ck.key);
                    let t = taken.entry(ck.key.as_str()).or_default();
                    if running + *t >= ck.limit.max(1) {
                        continue;
                    }
                    *t += 1;
                    running
                }
            };
            out.push((k.0, busy, k.1, k.2));
        }
        out
    }

    /// Dead-lettered tasks of one queue, oldest first.
    pub fn dead_letters(&self, qk: &QueueKey) -> Vec<(TimeMs, TaskId)> {
        self.dead.get(qk).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    pub fn counts(&self) -> &HashMap<QueueKey, StateCounts> {
        &self.counts
    }

    /// The earliest time at which something in this shard falls due (a lease, a delayed task, a retention or key
    /// expiry), so the leader knows when a tick is worth proposing.
    pub fn next_due(&self) -> Option<TimeMs> {
        [
            self.delayed.keys().next().map(|k| k.0),
            self.leases.iter().next().map(|k| k.0),
            self.retention.iter().next().map(|k| k.0),
            self.keys.iter().next().map(|k| k.0),
            self.deadlines.iter().next().map(|k| k.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Counts of index entries, for consistency checks against the records.
    pub fn index_sizes(&self) -> IndexSizes {
        IndexSizes {
            ready: self.ready.values().map(|s| s.len()).sum(),
            delayed: self.delayed.len(),
            leases: self.leases.len(),
            retention: self.retention.len(),
            dead: self.dead.values().map(|s| s.len()).sum(),
            keys: self.keys.len(),
            webhooks: self.webhooks.len(),
            deadlines: self.deadlines.len(),
            held: self.held.len(),
        }
    }

    // ---- apply -----------------------------------------------------------------------------------------------

    /// Applies one log entry to this shard.
    pub fn apply<S: TaskStore>(
        &mut self,
        store: &mut S,
        log_index: u64,
        req: &Request,
        out: &mut PartialResponse,
        fx: &mut Effects,
    ) -> Result<(), S::Error> {
        self.log_index = log_index;
        self.advance(store, log_index, req.time_ms, req.seed, fx)?;
        let now = self.now;
        let base_seq = log_index.saturating_mul(MAX_ITEMS_PER_COMMAND);
        match (&req.command, out) {
            (Command::Enqueue(items), PartialResponse::Enqueued(slots)) => {
                for (pos, (item, slot)) in items.iter().zip(slots.iter_mut()).enumerate() {
                    if self.mine(&item.id) {
                        *slot = Some(self.enqueue(store, item, base_seq + pos as u64, fx)?);
                    }
                }
            }
            (Command::Claim(items), PartialResponse::Claimed(slots)) => {
                for (pos, (item, slot)) in items.iter().zip(slots.iter_mut()).enumerate() {
                    if self.mine(&item.task_id) {
                        *slot = Some(self.claim(store, item, base_seq + pos as u64, fx)?);
                    }
                }
            }
            (Command::Ack(items), PartialResponse::Acked(slots)) => {
                for (item, slot) in items.iter().zip(slots.iter_mut()) {
                    if self.mine(&item.task_id) {
                        *slot = Some(self.ack(store, item, base_seq, req.seed, fx)?);
                    }
                }
            }
            (Command::Cancel { tenant, task_id }, PartialResponse::Cancelled(slot)) => {
                if self.mine(task_id) {
                    *slot = Some(self.cancel(store, tenant, task_id, fx)?);
                }
            }
            (Command::Redrive { tenant, queue, select }, PartialResponse::Redriven(done)) => {
                let qk = QueueKey { tenant: tenant.clone(), queue: queue.clone() };
                for id in self.select_dead(&qk, select) {
                    let Some(before) = store.get(&id)? else {
                        continue;
                    };
                    let mut t = before.clone();
                    t.state = TaskState::Pending;
                    t.attempts = 0;
                    t.dead_at = None;
                    t.visible_at = now;
                    t.seq = base_seq;
                    t.updated_at = now;
                    self.update(store, &before, &t)?;
                    fx.ready.insert(qk.clone());
                    done.push(id);
                }
            }
            (Command::PurgeDeadLetters { tenant, queue, select }, PartialResponse::Purged(done)) => {
                let qk = QueueKey { tenant: tenant.clone(), queue: queue.clone() };
                for id in self.select_dead(&qk, select) {
                    let Some(t) = store.get(&id)? else { continue };
                    self.unindex_task(&t);
                    store.remove(&id)?;
                    done.push(id);
                }
            }
            (Command::Tick, PartialResponse::Ticked) => {}
            (Command::WebhookOutcome(reports), PartialResponse::WebhooksRecorded(n)) => {
                for r in reports {
                    if self.mine(&r.id.task_id) {
                        *n += self.record_webhook(store, r)? as u32;
                    }
                }
            }
            (Command::CreateSchedule(sch), PartialResponse::Schedule(slot)) => {
                if self.mine(&sch.id) {
                    *slot = Some(if self.schedules.contains_key(&sch.id) {
                        Err(Rejected::IdExists)
                    } else {
                        let mut sch = (**sch).clone();
                        sch.created_at = now;
                        store.put_record(&RecordKey::schedule(&sch.id), &schedule_bytes(&sch))?;
                        self.schedules.insert(sch.id, sch.clone());
                        Ok(Some(Box::new(sch)))
                    });
                }
            }
            (Command::UpdateSchedule { tenant, id, paused, delete }, PartialResponse::Schedule(slot)) => {
                if self.mine(id) {
                    *slot = Some(match self.schedules.get(id).filter(|s| s.tenant == *tenant).cloned() {
                        None => Err(Rejected::NotFound),
                        Some(_) if *delete => {
                            store.remove_record(&RecordKey::schedule(id))?;
                            self.schedules.remove(id);
                            Ok(None)
                        }
                        Some(mut sch) => {
                            sch.paused = *paused;
                            store.put_record(&RecordKey::schedule(id), &schedule_bytes(&sch))?;
                            self.schedules.insert(*id, sch.clone());
                            Ok(Some(Box::new(sch)))
                        }
                    });
                }
            }
            (Command::FireSchedule { id, occurrence, task }, PartialResponse::Fired(done)) => {
                if self.mine(id) {
                    *done = self.fire(store, id, *occurrence, task.as_deref(), base_seq, fx)?;
                }
            }
            (Command::ResolveDependencies(items), PartialResponse::Resolved(n)) => {
                for (pos, r) in items.iter().enumerate() {
                    if self.mine(&r.task_id) && self.resolve(store, r, base_seq + pos as u64, fx)? {
                        *n += 1;
                    }
                }
            }
            (Command::SetQueuePaused { tenant, queue, paused }, PartialResponse::QueuePaused(_)) => {
                let qk = QueueKey { tenant: tenant.clone(), queue: queue.clone() };
                if *paused {
                    store.put_record(&RecordKey::paused(&qk), &[])?;
                    self.paused.insert(qk);
                } else {
                    store.remove_record(&RecordKey::paused(&qk))?;
                    self.paused.remove(&qk);
                    // Resumed: its ready tasks are claimable again.
                    if self.ready.contains_key(&qk) {
                        fx.ready.insert(qk);
                    }
                }
            }
            (_, out) => unreachable!("response slots built for another command: {out:?}"),
        }
        fx.webhooks_added += std::mem::take(&mut self.webhooks_added);
        fx.ready.extend(self.freed.drain(..));
        Ok(())
    }

    /// Records one delivery attempt; a report about an attempt already recorded (or a delivery already gone)
    /// changes nothing.
    fn record_webhook<S: TaskStore>(&mut self, store: &mut S, r: &WebhookReport) -> Result<bool, S::Error> {
        let Some(before) = store.get_delivery(&r.id)? else {
            return Ok(false);
        };
        if before.tries != r.tries {
            return Ok(false);
        }
        self.webhooks.remove(&(before.next_at, before.id));
        match &r.outcome {
            WebhookOutcome::Delivered | WebhookOutcome::GaveUp { .. } => store.remove_delivery(&r.id)?,
            WebhookOutcome::Retry { at, error } => {
                let mut d = before;
                d.tries += 1;
                d.next_at = *at;
                d.last_error = Some(error.clone());
                store.put_delivery(&d)?;
                self.index_delivery(&d);
            }
        }
        Ok(true)
    }

    /// One occurrence of a schedule: exactly once, because an occurrence at or before the last one recorded (in
    /// the same shard, the same transaction) is ignored. The task lands in the schedule's shard.
    fn fire<S: TaskStore>(
        &mut self,
        store: &mut S,
        id: &TaskId,
        occurrence: TimeMs,
        task: Option<&NewTask>,
        seq: u64,
        fx: &mut Effects,
    ) -> Result<bool, S::Error> {
        let Some(mut sch) = self.schedules.get(id).cloned() else { return Ok(false) };
        if sch.paused || sch.last_occurrence.is_some_and(|last| occurrence <= last) {
            return Ok(false);
        }
        if let Some(n) = task {
            if !self.mine(&n.id) || store.get(&n.id)?.is_some() {
                return Ok(false);
            }
            let mut n = n.clone();
            n.tenant = sch.tenant.clone();
            if self.enqueue(store, &n, seq, fx)?.is_ok() {
                if let Some(mut t) = store.get(&n.id)? {
                    t.scheduled = Some((*id, occurrence));
                    store.put(&t)?;
                }
                sch.fired += 1;
            }
        }
        sch.last_occurrence = Some(occurrence);
        store.put_record(&RecordKey::schedule(id), &schedule_bytes(&sch))?;
        self.schedules.insert(*id, sch);
        Ok(true)
    }

    /// One dependency of a held task ended: under all-completed, anything but a completion cancels the task
    /// (it can no longer become ready); otherwise the dependency is crossed off, and with none left the task is
    /// pending like any other (FIFO from this entry). Returns whether the task changed.
    fn resolve<S: TaskStore>(
        &mut self,
        store: &mut S,
        r: &DependencyResolved,
        seq: u64,
        fx: &mut Effects,
    ) -> Result<bool, S::Error> {
        let now = self.now;
        let Some(before) = store.get(&r.task_id)? else { return Ok(false) };
        if before.state != TaskState::Pending || !before.waiting_on.contains(&r.dependency) {
            return Ok(false);
        }
        let mut t = before.clone();
        t.updated_at = now;
        t.waiting_on.retain(|d| *d != r.dependency);
        let met = r.outcome == Some(TaskState::Completed) || t.dependency_rule == DependencyRule::AllResolved;
        if !met {
            let outcome = r.outcome.map(|s| s.as_str()).unwrap_or("GONE");
            t.state = TaskState::Cancelled;
            t.last_error = Some(format!("dependency {} ended {outcome}", r.dependency));
            t.ended_at = Some(now);
            self.update(store, &before, &t)?;
            fx.ended.push(t.id);
            fx.counts.cancelled += 1;
            fx.enqueue_to_end_ms.push(now.saturating_sub(t.created_at));
        } else {
            if t.waiting_on.is_empty() {
                t.seq = seq;
            }
            self.update(store, &before, &t)?;
            self.note_pending(&t, fx);
        }
        Ok(true)
    }

    fn select_dead(&self, qk: &QueueKey, select: &DlqSelector) -> Vec<TaskId> {
        let Some(set) = self.dead.get(qk) else {
            return vec![];
        };
        match select {
            DlqSelector::All => set.iter().map(|k| k.1).collect(),
            DlqSelector::Ids(ids) => {
                let wanted: HashSet<&TaskId> = ids.iter().filter(|id| self.mine(id)).collect();
                set.iter().filter(|k| wanted.contains(&k.1)).map(|k| k.1).collect()
            }
        }
    }

    /// Moves time to `time_ms` (never backwards) and does everything that fell due: delayed tasks become ready,
    /// expired leases are retried or dead-lettered, ended tasks past retention and stale idempotency keys go.
    fn advance<S: TaskStore>(
        &mut self,
        store: &mut S,
        log_index: u64,
        time_ms: TimeMs,
        seed: u64,
        fx: &mut Effects,
    ) -> Result<(), S::Error> {
        self.now = self.now.max(time_ms);
        let now = self.now;
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), (qk, prio, seq)) = entry.remove_entry();
            if let Some(c) = self.counts.get_mut(&qk) {
                c.delayed = c.delayed.saturating_sub(1);
                c.pending += 1;
            }
            self.ready.entry(qk.clone()).or_default().insert((Reverse(prio), seq, id));
            fx.ready.insert(qk);
        }
        while let Some(&(deadline, id)) = self.leases.first() {
            if deadline > now {
                break;
            }
            let before = match store.get(&id)? {
                Some(t)
                    if t.state == TaskState::InProgress && t.lease.as_ref().map(|l| l.deadline) == Some(deadline) =>
                {
                    t
                }
                _ => {
                    self.leases.remove(&(deadline, id));
                    continue;
                }
            };
            let mut t = before.clone();
            let delay = t.retry.delay_ms(t.attempts, jitter(seed, &id));
            t.last_error = Some("lease expired".to_string());
            close_run(&mut t, now, RunOutcome::LeaseExpired, "");
            self.retry_or_dead(&mut t, now, delay, log_index.saturating_mul(MAX_ITEMS_PER_COMMAND));
            self.update(store, &before, &t)?;
            self.note_pending(&t, fx);
            fx.counts.lease_expired += 1;
            count_requeue(&t, fx);
        }
        while let Some(&(due, id)) = self.deadlines.first() {
            if due > now {
                break;
            }
            let before = match store.get(&id)? {
                Some(t) if !t.state.is_terminal() && t.deadline == Some(due) => t,
                _ => {
                    self.deadlines.remove(&(due, id));
                    continue;
                }
            };
            let mut t = before.clone();
            close_run(&mut t, now, RunOutcome::DeadlineExceeded, DEADLINE_EXCEEDED);
            t.state = TaskState::Failed;
            t.last_error = Some(DEADLINE_EXCEEDED.to_string());
            t.lease = None;
            t.dead_at = None;
            t.ended_at = Some(now);
            t.updated_at = now;
            self.update(store, &before, &t)?;
            fx.ended.push(id);
            fx.counts.failed += 1;
            fx.enqueue_to_end_ms.push(now.saturating_sub(t.created_at));
        }
        while let Some(&(due, id)) = self.retention.first() {
            if due > now {
                break;
            }
            self.retention.remove(&(due, id));
            if let Some(t) = store.get(&id)? {
                if let Some(c) = self.counts.get_mut(&QueueKey::of(&t)) {
                    let slot = c.slot(t.state, false);
                    *slot = slot.saturating_sub(1);
                }
                store.remove(&id)?;
            }
        }
        while let Some(first) = self.keys.first() {
            if first.0 > now {
                break;
            }
            let (expires_at, tenant, key) = self.keys.pop_first().expect("checked first");
            if let Some(rec) = store.get_key(&tenant, &key)? {
                if rec.expires_at == expires_at {
                    store.remove_key(&tenant, &key)?;
                }
            }
        }
        Ok(())
    }

    fn note_pending(&self, t: &Task, fx: &mut Effects) {
        if t.state == TaskState::Pending && t.visible_at <= self.now {
            fx.ready.insert(QueueKey::of(t));
        }
    }

    /// Back to pending after `delay` while attempts remain, else to the dead-letter queue.
    fn retry_or_dead(&self, t: &mut Task, now: TimeMs, delay: u64, seq: u64) {
        t.lease = None;
        t.updated_at = now;
        if t.attempts >= t.max_attempts {
            t.state = TaskState::DeadLettered;
            t.dead_at = Some(now);
        } else {
            t.state = TaskState::Pending;
            t.visible_at = now.saturating_add(delay);
            t.seq = seq;
        }
    }

    fn enqueue<S: TaskStore>(
        &mut self,
        store: &mut S,
        n: &NewTask,
        seq: u64,
        fx: &mut Effects,
    ) -> Result<ItemResult<Enqueued>, S::Error> {
        let now = self.now;
        if let Some(key) = &n.idempotency_record_key() {
            if let Some(rec) = store.get_key(&n.tenant, key)? {
                if rec.expires_at > now {
                    return Ok(Ok(Enqueued { task_id: rec.task_id, duplicate: true }));
                }
            }
        }
        if store.get(&n.id)?.is_some() {
            return Ok(Err(Rejected::IdExists));
        }
        let t = Task {
            id: n.id,
            tenant: n.tenant.clone(),
            queue: n.queue.clone(),
            payload: n.payload.clone(),
            priority: n.priority.min(9),
            state: TaskState::Pending,
            seq,
            created_at: now,
            updated_at: now,
            visible_at: n.visible_at,
            attempts: 0,
            max_attempts: n.max_attempts.max(1),
            idempotency_key: n.idempotency_key.clone(),
            webhook_url: n.webhook_url.clone(),
            traceparent: n.traceparent.clone(),
            tracestate: n.tracestate.clone(),
            retry: n.retry,
            retention_ms: n.retention_ms,
            lease: None,
            result: None,
            last_error: None,
            ended_at: None,
            dead_at: None,
            last_ack: None,
            runs: vec![],
            deadline: n.deadline,
            progress: None,
            concurrency: n.concurrency.clone(),
            follow_ups: vec![],
            parent: n.parent,
            depends_on: n.depends_on.clone(),
            dependency_rule: n.dependency_rule,
            waiting_on: n.depends_on.clone(),
            scheduled: None,
        };
        store.put(&t)?;
        self.index_task(&t);
        self.note_pending(&t, fx);
        fx.counts.enqueued += 1;
        if let Some(key) = &n.idempotency_record_key() {
            let rec = KeyRecord { task_id: n.id, expires_at: now.saturating_add(n.idempotency_window_ms) };
            // A key replaced after expiry leaves its old index entry behind; `advance` skips it by deadline.
            store.put_key(&n.tenant, key, &rec)?;
            self.index_key(&n.tenant, key, &rec);
        }
        Ok(Ok(Enqueued { task_id: n.id, duplicate: false }))
    }

    fn claim<S: TaskStore>(
        &mut self,
        store: &mut S,
        item: &ClaimItem,
        token: LeaseToken,
        fx: &mut Effects,
    ) -> Result<ItemResult<Box<Task>>, S::Error> {
        let now = self.now;
        let Some(before) = store.get(&item.task_id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if before.tenant != item.tenant {
            return Ok(Err(Rejected::NotFound));
        }
        let key_full = before
            .concurrency
            .as_ref()
            .is_some_and(|ck| self.running_with_key(&before.tenant, &ck.key) >= ck.limit.max(1));
        if before.state != TaskState::Pending
            || !before.waiting_on.is_empty()
            || before.visible_at > now
            || before.attempts >= before.max_attempts
            || self.paused.contains(&QueueKey::of(&before))
            || key_full
        {
            return Ok(Err(Rejected::NotClaimable));
        }
        let mut t = before.clone();
        t.state = TaskState::InProgress;
        t.attempts += 1;
        t.updated_at = now;
        t.lease = Some(Lease {
            worker_id: item.worker_id.clone(),
            token,
            claimed_at: now,
            deadline: now.saturating_add(item.lease_ms),
        });
        t.progress = None;
        if t.runs.len() >= MAX_RUNS_KEPT {
            t.runs.remove(0);
        }
        t.runs.push(Run {
            worker_id: item.worker_id.clone(),
            token,
            started_at: now,
            ended_at: None,
            outcome: None,
            reason: String::new(),
        });
        self.update(store, &before, &t)?;
        fx.counts.claimed += 1;
        if t.attempts == 1 {
            fx.enqueue_to_claim_ms.push(now.saturating_sub(t.created_at));
        }
        Ok(Ok(Box::new(t)))
    }

    fn ack<S: TaskStore>(
        &mut self,
        store: &mut S,
        item: &AckItem,
        seq: u64,
        seed: u64,
        fx: &mut Effects,
    ) -> Result<ItemResult<AckOutcome>, S::Error> {
        let now = self.now;
        let Some(before) = store.get(&item.task_id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if before.tenant != item.tenant {
            return Ok(Err(Rejected::NotFound));
        }
        let current =
            before.state == TaskState::InProgress && before.lease.as_ref().map(|l| l.token) == Some(item.token);
        if !current && before.last_ack == Some((item.token, item.action.kind())) {
            // The ack that ended this delivery, sent again: already applied, change nothing.
            return Ok(Ok(AckOutcome { state: before.state, at: now }));
        }
        if before.state != TaskState::InProgress {
            return Ok(Err(Rejected::NotInProgress));
        }
        if !current {
            return Ok(Err(Rejected::LeaseLost));
        }
        if let AckAction::CompleteWith { follow_ups, .. } = &item.action {
            // All or nothing: a follow-up that cannot be created (an id clash, or one the proposer placed in
            // another shard) refuses the whole completion.
            for n in follow_ups {
                if !self.mine(&n.id) || store.get(&n.id)?.is_some() {
                    return Ok(Err(Rejected::IdExists));
                }
            }
        }
        let mut t = before.clone();
        t.updated_at = now;
        let mut ended = false;
        match &item.action {
            AckAction::Complete { .. } | AckAction::CompleteWith { .. } => {
                close_run(&mut t, now, RunOutcome::Completed, "")
            }
            AckAction::Fail { error, retryable: false } => close_run(&mut t, now, RunOutcome::Failed, error),
            AckAction::Fail { error, .. } | AckAction::Nack { reason: error, .. } => {
                close_run(&mut t, now, RunOutcome::Retried, error)
            }
            AckAction::Abandon => close_run(&mut t, now, RunOutcome::Abandoned, ""),
            AckAction::Exception { reason, .. } => close_run(&mut t, now, RunOutcome::Exception, reason.as_str()),
            AckAction::Heartbeat { .. } | AckAction::Progress { .. } => {}
        }
        match &item.action {
            AckAction::Complete { result } => {
                t.state = TaskState::Completed;
                t.result = Some(result.clone());
                t.lease = None;
                t.ended_at = Some(now);
                ended = true;
            }
            AckAction::CompleteWith { result, follow_ups } => {
                t.state = TaskState::Completed;
                t.result = Some(result.clone());
                t.lease = None;
                t.ended_at = Some(now);
                t.follow_ups = follow_ups.iter().map(|n| n.id).collect();
                ended = true;
            }
            AckAction::Fail { error, retryable: false } => {
                t.state = TaskState::Failed;
                t.last_error = Some(error.clone());
                t.lease = None;
                t.ended_at = Some(now);
                ended = true;
            }
            AckAction::Fail { error, retryable: true } => {
                t.last_error = Some(error.clone());
                let delay = t.retry.delay_ms(t.attempts, jitter(seed, &t.id));
                self.retry_or_dead(&mut t, now, delay, seq);
            }
            AckAction::Nack { delay_ms, reason } => {
                t.last_error = Some(reason.clone());
                let delay = delay_ms.unwrap_or_else(|| t.retry.delay_ms(t.attempts, jitter(seed, &t.id)));
                self.retry_or_dead(&mut t, now, delay, seq);
            }
            AckAction::Abandon => {
                t.attempts = t.attempts.saturating_sub(1);
                self.retry_or_dead(&mut t, now, 0, seq);
            }
            AckAction::Heartbeat { extend_ms } => {
                if let Some(l) = t.lease.as_mut() {
                    l.deadline = now.saturating_add(*extend_ms).max(l.deadline);
                }
            }
            AckAction::Progress { extend_ms, percent, message } => {
                if let Some(l) = t.lease.as_mut() {
                    l.deadline = now.saturating_add(*extend_ms).max(l.deadline);
                }
                t.progress = Some(Progress { percent: (*percent).min(100), message: message.clone(), at: now });
            }
            AckAction::Exception { reason, message } => {
                t.last_error = Some(if message.is_empty() {
                    reason.as_str().to_string()
                } else {
                    format!("{}: {message}", reason.as_str())
                });
                match reason {
                    ExceptionReason::MalformedPayload => {
                        t.state = TaskState::Failed;
                        t.lease = None;
                        t.ended_at = Some(now);
                        ended = true;
                    }
                    ExceptionReason::WorkerShutdown => {
                        t.attempts = t.attempts.saturating_sub(1);
                        self.retry_or_dead(&mut t, now, 0, seq);
                    }
                    ExceptionReason::ResourceUnavailable | ExceptionReason::InternalError => {
                        let delay = t.retry.delay_ms(t.attempts, jitter(seed, &t.id));
                        self.retry_or_dead(&mut t, now, delay, seq);
                    }
                }
            }
        }
        if !item.action.is_heartbeat() {
            t.last_ack = Some((item.token, item.action.kind()));
            if let Some(l) = &before.lease {
                fx.claim_to_end_ms.push(now.saturating_sub(l.claimed_at));
            }
            match t.state {
                TaskState::Completed => fx.counts.completed += 1,
                TaskState::Failed => fx.counts.failed += 1,
                _ => count_requeue(&t, fx),
            }
            if t.state.is_terminal() {
                fx.enqueue_to_end_ms.push(now.saturating_sub(t.created_at));
            }
        }
        self.update(store, &before, &t)?;
        self.note_pending(&t, fx);
        if ended {
            fx.ended.push(t.id);
        }
        if let AckAction::CompleteWith { follow_ups, .. } = &item.action {
            for (j, n) in follow_ups.iter().enumerate() {
                // Checked above: each is created. FIFO among them follows their order.
                let created = self.enqueue(store, n, seq + 1 + j as u64, fx)?;
                debug_assert!(created.is_ok(), "follow-up {} refused: {created:?}", n.id);
            }
        }
        let at = match t.state {
            TaskState::InProgress => t.lease.as_ref().map(|l| l.deadline).unwrap_or(now),
            TaskState::Pending => t.visible_at,
            _ => now,
        };
        Ok(Ok(AckOutcome { state: t.state, at }))
    }

    fn cancel<S: TaskStore>(
        &mut self,
        store: &mut S,
        tenant: &str,
        id: &TaskId,
        fx: &mut Effects,
    ) -> Result<ItemResult<TaskState>, S::Error> {
        let Some(before) = store.get(id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if before.tenant != tenant {
            return Ok(Err(Rejected::NotFound));
        }
        if before.state.is_terminal() {
            return Ok(Err(Rejected::AlreadyEnded));
        }
        let mut t = before.clone();
        close_run(&mut t, self.now, RunOutcome::Cancelled, "");
        t.state = TaskState::Cancelled;
        t.lease = None;
        t.dead_at = None;
        t.ended_at = Some(self.now);
        t.updated_at = self.now;
        self.update(store, &before, &t)?;
        fx.ended.push(t.id);
        fx.counts.cancelled += 1;
        fx.enqueue_to_end_ms.push(self.now.saturating_sub(t.created_at));
        Ok(Ok(TaskState::Cancelled))
    }
}

/// A schedule record's bytes. bincode of plain data cannot fail.
fn schedule_bytes(s: &Schedule) -> Vec<u8> {
    bincode::serialize(s).expect("a schedule serialises")
}

/// Ends the open run of a task (the current delivery), if there is one.
fn close_run(t: &mut Task, now: TimeMs, outcome: RunOutcome, reason: &str) {
    let token = t.lease.as_ref().map(|l| l.token);
    if let Some(run) = t.runs.last_mut() {
        if run.outcome.is_none() && Some(run.token) == token {
            run.ended_at = Some(now);
            run.outcome = Some(outcome);
            run.reason = reason.chars().take(256).collect();
        }
    }
}

/// A delivery that did not end the task: retried later, or dead-lettered.
fn count_requeue(t: &Task, fx: &mut Effects) {
    match t.state {
        TaskState::DeadLettered => fx.counts.dead_lettered += 1,
        TaskState::Pending => fx.counts.retried += 1,
        _ => {}
    }
}

/// Sizes of a shard's indexes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IndexSizes {
    pub ready: usize,
    pub delayed: usize,
    pub leases: usize,
    pub retention: usize,
    pub dead: usize,
    pub keys: usize,
    pub webhooks: usize,
    pub deadlines: usize,
    /// Pending tasks held by dependencies.
    pub held: usize,
}

/// A small code per state, part of a webhook delivery's id.
fn state_code(s: TaskState) -> u64 {
    match s {
        TaskState::Pending => 0,
        TaskState::InProgress => 1,
        TaskState::Completed => 2,
        TaskState::Failed => 3,
        TaskState::Cancelled => 4,
        TaskState::DeadLettered => 5,
    }
}
