//! One shard's in-memory indexes, derived from its records: which tasks are ready, delayed, leased, ended,
//! dead-lettered or held, when each falls due, per-queue counts, running concurrency keys, the outbox by due time,
//! ready tasks per fairness key (for the leader's fair pick), and copies of the small shard records (paused
//! queues, fairness weights, rate buckets, concurrency key overrides, schedules).
//!
//! A keyed task whose key is full stays in the ready index: whether a key has a free slot is asked at pick and
//! at claim (`ShardCore::key_limit`), so a limit that changes (an override set, raised, lowered, removed or run
//! out) moves no task; it only wakes the dispatcher when slots may have come free (`Effects::ready`).
//!
//! Nothing here is stored: every replica rebuilds the same indexes from the records at start and after a snapshot
//! install (`ShardCore::index_*`). Apply keeps them in step with every record it writes (`add_task` after,
//! `remove_task` before a change). This file holds no rules: what a command does lives in `apply/`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet};

use serde::{Deserialize, Serialize};

use super::types::*;

/// Claim order within one queue: higher priority first, then FIFO by sequence.
pub type ReadyKey = (Reverse<u8>, u64, TaskId);

/// How far back completions are kept for throughput figures: the longest window reported (15 minutes).
pub const THROUGHPUT_WINDOW_S: u64 = 15 * 60;

/// The derived indexes of one shard.
#[derive(Debug, Default)]
pub struct ShardIndex {
    /// Pending tasks not yet visible, by visible time: what moving them to the ready index takes.
    pub(super) delayed: BTreeMap<(TimeMs, TaskId), Delayed>,
    /// Running tasks by lease deadline.
    pub(super) leases: BTreeSet<(TimeMs, TaskId)>,
    /// Ended tasks (completed, failed, cancelled) by retention deadline.
    pub(super) retention: BTreeSet<(TimeMs, TaskId)>,
    /// Dead-lettered tasks per queue, by when they died.
    pub(super) dead: HashMap<QueueKey, BTreeSet<(TimeMs, TaskId)>>,
    /// Idempotency keys by expiry: (expires_at, tenant, key). May hold a stale entry for a key replaced after
    /// expiry; `advance` skips it by comparing with the record.
    pub(super) keys: BTreeSet<(TimeMs, String, String)>,
    /// The debounce or singleton record naming each task of this shard that holds a key: (tenant, record key).
    /// Such a record lives exactly as long as its task holds the key (`apply/keyed.rs`).
    pub(super) key_holders: HashMap<TaskId, (String, String)>,
    pub(super) counts: HashMap<QueueKey, StateCounts>,
    /// Pending webhook deliveries of this shard's outbox, by when they are due.
    pub(super) webhooks: BTreeSet<(TimeMs, DeliveryId)>,
    /// Deadlines of tasks not yet ended (pending, running or dead-lettered).
    pub(super) deadlines: BTreeSet<(TimeMs, TaskId)>,
    /// Paused queues (every shard holds the whole set).
    pub(super) paused: HashSet<QueueKey>,
    /// Flow-control limits per queue, and per tenant under an empty queue name (every shard holds them all).
    pub(super) limits: HashMap<QueueKey, Limits>,
    /// Claimable pending tasks per queue, split by fairness key, each key's in claim order. A queue with
    /// ready tasks has an entry; the leader's pick (`queue::fair`) reads only this.
    pub(super) by_key: HashMap<QueueKey, KeyedReady>,
    /// Activation numbers handed out so far (see `KeyedReady::activated`); only grows within this index's life.
    pub(super) activations: u64,
    /// Fairness weights other than 1, per queue and key (every shard holds the whole set).
    pub(super) weights: HashMap<QueueKey, HashMap<String, u32>>,
    /// Token buckets per queue (the whole queue's and its keys'), configuration and level (every shard holds
    /// them all, identical: `queue::rate`).
    pub(super) rates: HashMap<QueueKey, super::rate::QueueRates>,
    /// Running tasks per tenant and concurrency key of this shard (nested, so a lookup by `&str` allocates
    /// nothing).
    pub(super) running_keys: HashMap<String, HashMap<String, u32>>,
    /// Operators' overrides of concurrency keys' limits, per tenant and key (every shard holds them all), and
    /// their expiries in time order, so the sweep of each entry finds the overrides that ran out.
    pub(super) key_limits: HashMap<String, HashMap<String, KeyLimit>>,
    pub(super) key_limit_expiries: BTreeSet<(TimeMs, String, String)>,
    /// Schedules stored in this shard.
    pub(super) schedules: BTreeMap<TaskId, Schedule>,
    /// Pending tasks held by dependencies, and for each dependency the held tasks of this shard waiting on it.
    pub(super) held: BTreeSet<TaskId>,
    pub(super) waiters: BTreeMap<TaskId, BTreeSet<TaskId>>,
    /// Completions per queue by second of `ended_at` over the last `THROUGHPUT_WINDOW_S`: (tasks, summed run ms).
    /// For the capacity view; derived from completed records, so a rebuild finds the same figures.
    pub(super) done: HashMap<QueueKey, BTreeMap<u64, (u64, u64)>>,
}

/// A delayed task's place in the ready index once it is visible: its queue, priority, sequence and concurrency
/// key. (A ready task's key is where it sits in `by_key`; no map of keys by task is kept.)
#[derive(Debug)]
pub struct Delayed {
    pub(super) qk: QueueKey,
    pub(super) priority: u8,
    pub(super) seq: u64,
    pub(super) key: Option<ConcurrencyKey>,
}

/// The ready tasks of one queue split by fairness key (the concurrency key; "" for tasks without one).
#[derive(Debug, Default)]
pub struct KeyedReady {
    /// Each active key (one with ready tasks): its activation number and its ready tasks in claim order, each
    /// with its own concurrency limit (0 under "", tasks without a key), so the pick checks a key's head against
    /// its limit without looking the task up.
    pub(super) keys: HashMap<String, (u64, BTreeMap<ReadyKey, u32>)>,
    /// The active keys by activation number: a key gets a new number each time it becomes active, so the
    /// leader finds the keys that became active since it last looked without walking them all.
    pub(super) activated: BTreeMap<u64, String>,
}

/// The fairness key of a task: its concurrency key, or "" (the implicit key of tasks without one).
pub fn fairness_key(ck: Option<&ConcurrencyKey>) -> &str {
    ck.map(|c| c.key.as_str()).unwrap_or("")
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
    pub(super) fn slot(&mut self, state: TaskState, delayed: bool) -> &mut u64 {
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

/// Sizes of a shard's indexes, for consistency checks against the records.
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

/// A queue's entry in a map keyed by queue, made (default) if it has none; the names are cloned only then.
fn of_queue<'m, V: Default>(map: &'m mut HashMap<QueueKey, V>, q: &dyn QueueRef) -> &'m mut V {
    if !map.contains_key(q) {
        map.insert(QueueKey::new(q.tenant(), q.queue()), V::default());
    }
    map.get_mut(q).expect("inserted above")
}

impl ShardIndex {
    /// Adds a task record to the indexes its state calls for, at shard time `now` (which decides delayed or ready).
    pub fn add_task(&mut self, t: &Task, now: TimeMs) {
        if t.state == TaskState::Pending && !t.waiting_on.is_empty() {
            // Held by dependencies: counted as delayed (pending, not claimable), in no other index.
            self.held.insert(t.id);
            for d in &t.waiting_on {
                self.waiters.entry(*d).or_default().insert(t.id);
            }
            if let Some(d) = t.deadline {
                self.deadlines.insert((d, t.id));
            }
            self.counts_of(t).delayed += 1;
            return;
        }
        let delayed = t.state == TaskState::Pending && t.visible_at > now;
        if let (Some(d), false) = (t.deadline, t.state.is_terminal()) {
            self.deadlines.insert((d, t.id));
        }
        if let (Some(ck), TaskState::InProgress) = (&t.concurrency, t.state) {
            // Allocate the names only when the tenant or key is new here (this runs for every claim).
            if !self.running_keys.contains_key(&t.tenant) {
                self.running_keys.insert(t.tenant.clone(), HashMap::new());
            }
            let keys = self.running_keys.get_mut(&t.tenant).expect("inserted above");
            match keys.get_mut(&ck.key) {
                Some(n) => *n += 1,
                None => {
                    keys.insert(ck.key.clone(), 1);
                }
            }
        }
        *self.counts_of(t).slot(t.state, delayed) += 1;
        match t.state {
            TaskState::Pending if delayed => {
                let entry =
                    Delayed { qk: QueueKey::of(t), priority: t.priority, seq: t.seq, key: t.concurrency.clone() };
                self.delayed.insert((t.visible_at, t.id), entry);
            }
            TaskState::Pending => {
                let key = fairness_key(t.concurrency.as_ref());
                let limit = t.concurrency.as_ref().map_or(0, |c| c.limit);
                self.ready_insert(t, key, (Reverse(t.priority), t.seq, t.id), limit);
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
                    self.note_done(t, end, run_ms, now);
                }
            }
            TaskState::DeadLettered => {
                self.dead.entry(QueueKey::of(t)).or_default().insert((t.dead_at.unwrap_or(0), t.id));
            }
        }
    }

    /// The counts of a task's queue.
    fn counts_of(&mut self, t: &Task) -> &mut StateCounts {
        of_queue(&mut self.counts, t)
    }

    /// Removes a task record (as it is before a change) from the indexes.
    pub fn remove_task(&mut self, t: &Task) {
        let qk: &dyn QueueRef = t;
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
            if let Some(c) = self.counts.get_mut(qk) {
                c.delayed = c.delayed.saturating_sub(1);
            }
            return;
        }
        let in_delayed = t.state == TaskState::Pending && self.delayed.remove(&(t.visible_at, t.id)).is_some();
        if let Some(d) = t.deadline {
            self.deadlines.remove(&(d, t.id));
        }
        if let (Some(ck), TaskState::InProgress) = (&t.concurrency, t.state) {
            if let Some(keys) = self.running_keys.get_mut(&t.tenant) {
                if let Some(n) = keys.get_mut(&ck.key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        keys.remove(&ck.key);
                    }
                }
                if keys.is_empty() {
                    self.running_keys.remove(&t.tenant);
                }
            }
        }
        if let Some(c) = self.counts.get_mut(qk) {
            let slot = c.slot(t.state, in_delayed);
            *slot = slot.saturating_sub(1);
        }
        match t.state {
            TaskState::Pending => {
                if !in_delayed {
                    let key = fairness_key(t.concurrency.as_ref());
                    self.ready_remove(qk, key, &(Reverse(t.priority), t.seq, t.id));
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
                if let Some(set) = self.dead.get_mut(qk) {
                    set.remove(&(t.dead_at.unwrap_or(0), t.id));
                    if set.is_empty() {
                        self.dead.remove(qk);
                    }
                }
            }
        }
    }

    /// Adds a ready task to its key's set in `by_key`, activating the key if it had none.
    pub(super) fn ready_insert(&mut self, qk: &dyn QueueRef, key: &str, rk: ReadyKey, limit: u32) {
        let keyed = of_queue(&mut self.by_key, qk);
        match keyed.keys.get_mut(key) {
            Some((_, set)) => {
                set.insert(rk, limit);
            }
            None => {
                self.activations += 1;
                keyed.activated.insert(self.activations, key.to_string());
                keyed.keys.insert(key.to_string(), (self.activations, BTreeMap::from([(rk, limit)])));
            }
        }
    }

    /// Removes a ready task from `by_key`; a key left without ready tasks is no longer active.
    fn ready_remove(&mut self, qk: &dyn QueueRef, key: &str, rk: &ReadyKey) {
        let Some(keyed) = self.by_key.get_mut(qk) else { return };
        if let Some((activation, set)) = keyed.keys.get_mut(key) {
            set.remove(rk);
            if set.is_empty() {
                keyed.activated.remove(activation);
                keyed.keys.remove(key);
            }
        }
        if keyed.keys.is_empty() {
            self.by_key.remove(qk);
        }
    }

    /// Records a key's weight (1, the default, is not kept).
    pub(super) fn set_weight(&mut self, qk: QueueKey, key: &str, weight: u32) {
        if weight == crate::queue::fair::DEFAULT_WEIGHT {
            if let Some(m) = self.weights.get_mut(&qk) {
                m.remove(key);
                if m.is_empty() {
                    self.weights.remove(&qk);
                }
            }
        } else {
            self.weights.entry(qk).or_default().insert(key.to_string(), weight);
        }
    }

    /// Records (or with `None` forgets) a concurrency key's override and its expiry; returns the one it replaced.
    pub(super) fn set_key_limit(&mut self, tenant: &str, key: &str, limit: Option<KeyLimit>) -> Option<KeyLimit> {
        let before = match limit {
            Some(l) => self.key_limits.entry(tenant.to_string()).or_default().insert(key.to_string(), l),
            None => {
                let keys = self.key_limits.get_mut(tenant);
                let before = keys.and_then(|m| m.remove(key));
                if self.key_limits.get(tenant).is_some_and(HashMap::is_empty) {
                    self.key_limits.remove(tenant);
                }
                before
            }
        };
        if let Some(at) = before.and_then(|b| b.expires_at) {
            self.key_limit_expiries.remove(&(at, tenant.to_string(), key.to_string()));
        }
        if let Some(at) = limit.and_then(|l| l.expires_at) {
            self.key_limit_expiries.insert((at, tenant.to_string(), key.to_string()));
        }
        before
    }

    /// Counts one completion in its queue's throughput buckets, dropping buckets older than the window.
    fn note_done(&mut self, t: &Task, ended_at: TimeMs, run_ms: u64, now: TimeMs) {
        let oldest = (now / 1000).saturating_sub(THROUGHPUT_WINDOW_S);
        let sec = ended_at / 1000;
        if sec < oldest {
            return;
        }
        let buckets = of_queue(&mut self.done, t);
        let b = buckets.entry(sec).or_default();
        b.0 += 1;
        b.1 += run_ms;
        while buckets.first_key_value().is_some_and(|(s, _)| *s < oldest) {
            buckets.pop_first();
        }
    }

    pub fn add_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) {
        self.keys.insert((rec.expires_at, tenant.to_string(), key.to_string()));
        if is_mode_record_key(key) {
            self.key_holders.insert(rec.task_id, (tenant.to_string(), key.to_string()));
        }
    }

    /// Drops the entries of a record removed (or replaced) ahead of its expiry: a debounce or singleton record.
    pub fn remove_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) {
        self.keys.remove(&(rec.expires_at, tenant.to_string(), key.to_string()));
        if self.key_holders.get(&rec.task_id).is_some_and(|(t, k)| t == tenant && k == key) {
            self.key_holders.remove(&rec.task_id);
        }
    }

    pub fn add_delivery(&mut self, d: &WebhookDelivery) {
        self.webhooks.insert((d.next_at, d.id));
    }

    pub fn remove_delivery(&mut self, d: &WebhookDelivery) {
        self.webhooks.remove(&(d.next_at, d.id));
    }

    pub fn sizes(&self) -> IndexSizes {
        IndexSizes {
            ready: self.by_key.values().flat_map(|k| k.keys.values()).map(|(_, set)| set.len()).sum(),
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
}
