//! The read view of the state machine: what the API and the leader read between applies (tasks, listings,
//! counts, claim candidates, due webhook deliveries, dependency resolutions), from the shards' indexes, their
//! unflushed layers and their redb files (a record in a layer is newer than the file's). Reads take the shard
//! lock only to copy what they need; the digest and the index check first write every layer into the files.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::codec::io_err;
use super::format::{self, decode};
use super::shard;
use super::snapshot::Table;
use super::state_machine::{Shards, SmShared};
use super::tables::*;
use crate::queue::{self, DeliveryId, StateCounts, Task, TaskId, TimeMs, WebhookDelivery};

/// One key of one queue in the fairness view (`SmShared::fairness`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairnessRow {
    pub queue: String,
    pub key: String,
    pub weight: u32,
    pub ready: u64,
    pub running: u64,
    /// Whether the key has ready tasks and its token bucket, or its queue's, has no whole token at the time of
    /// the view (`queue::rate`): dispatch passes it over until one refills.
    pub throttled: bool,
}

/// One token bucket of a queue (`SmShared::rate_limits`): the whole queue's (`key: None`) or a key's.
#[derive(Debug, Clone, PartialEq)]
pub struct RateRow {
    pub queue: String,
    pub key: Option<String>,
    pub limit: queue::RateLimit,
    /// The level at the time of the view, in tokens (negative: a debt being paid back).
    pub tokens: f64,
    /// Ready tasks the bucket governs (the queue's, or the key's in the queue).
    pub ready: u64,
    /// Ready tasks and no whole token.
    pub throttled: bool,
}

/// One concurrency key override of a tenant (`SmShared::key_limits`), with the key's tasks now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLimitRow {
    pub key: String,
    pub limit: u32,
    /// Absolute state-machine time (ms) the override runs out at; `None`: until removed.
    pub expires_at: Option<TimeMs>,
    /// The key's running tasks (across the tenant's queues).
    pub running: u64,
    /// The key's pending tasks, ready or delayed (not those held by dependencies).
    pub pending: u64,
}

/// An override's row: the key's running and pending tasks summed over the shards.
fn key_limit_row(cores: &[queue::ShardCore], tenant: &str, key: &str, l: &queue::KeyLimit) -> KeyLimitRow {
    KeyLimitRow {
        key: key.to_string(),
        limit: l.limit,
        expires_at: l.expires_at,
        running: cores.iter().map(|c| u64::from(c.running_with_key(tenant, key))).sum(),
        pending: cores.iter().map(|c| c.pending_with_key(tenant, key)).sum(),
    }
}

/// How far before `created_from` a listing starts scanning ids (see `SmShared::list_tasks`).
const LIST_FLOOR_MARGIN_MS: u64 = 60_000;

impl SmShared {
    pub fn get_task(&self, id: &TaskId) -> io::Result<Option<Task>> {
        // What is not in a layer under the lock is in the file: a layer is dropped only once it is written.
        let found = self.read().task(id);
        match found {
            Lookup::Found(t) => Ok(t),
            Lookup::InFile(db) => shard::get_task(&db, id),
        }
    }

    fn get_delivery(&self, id: &DeliveryId) -> io::Result<Option<WebhookDelivery>> {
        let found = self.read().delivery(id);
        match found {
            Lookup::Found(d) => Ok(d),
            Lookup::InFile(db) => shard::get_delivery(&db, id),
        }
    }

    /// Free slots of a tenant's concurrency key in the applied state: its limit (an operator's override while in
    /// force, else `own`, the limit its task carries) less the tasks running under it, read in the shard that
    /// holds every task of the key (the one of `id`, a task of the key). The hand-off asks this before it claims a
    /// keyed task ahead of its enqueue's apply.
    pub fn key_room(&self, id: TaskId, tenant: &str, key: &str, own: u32) -> u64 {
        let g = self.read();
        let Some(core) = g.cores.get(id.shard(g.cores.len())) else { return 0 };
        u64::from(core.key_limit_of(tenant, key, own, core.now))
            .saturating_sub(u64::from(core.running_with_key(tenant, key)))
    }

    /// Claim choice for the leader, fair across the keys of each queue by the passes in `clock`, drawing on the
    /// token buckets through `budget` when any exist: see `queue::pick_ready`.
    pub fn pick_ready(
        &self,
        clock: &mut queue::FairClock,
        tenant: &str,
        queues: &[String],
        count: usize,
        skip: &queue::Promised,
        budget: Option<&queue::RateBudget<'_>>,
    ) -> Vec<queue::Picked> {
        queue::pick_ready(&self.read().cores, clock, tenant, queues, count, skip, budget)
    }

    /// Whether any token bucket exists: the dispatcher looks at none until one does.
    pub fn any_rates(&self) -> bool {
        self.rates_set.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The token buckets of a tenant's queue (every queue when `None`) at `now`, sorted by queue, then the whole
    /// queue's before its keys'.
    pub fn rate_limits(&self, tenant: &str, queue: Option<&str>, now: TimeMs) -> Vec<RateRow> {
        let g = self.read();
        let Some(first) = g.cores.first() else { return vec![] };
        let mut rows = Vec::new();
        for (qk, rates) in first.all_rates().iter().filter(|(qk, _)| qk.tenant == tenant) {
            if queue.is_some_and(|q| q != qk.queue) {
                continue;
            }
            let by_key: BTreeMap<&str, u64> =
                g.cores.iter().flat_map(|c| c.ready_by_key(qk)).fold(BTreeMap::new(), |mut m, (k, n)| {
                    *m.entry(k).or_default() += n as u64;
                    m
                });
            let buckets = rates.queue.iter().map(|b| (None, b)).chain(rates.keys.iter().map(|(k, b)| (Some(k), b)));
            for (key, b) in buckets {
                let ready = match key {
                    None => by_key.values().sum(),
                    Some(k) => by_key.get(k.as_str()).copied().unwrap_or(0),
                };
                rows.push(RateRow {
                    queue: qk.queue.clone(),
                    key: key.cloned(),
                    limit: b.limit,
                    tokens: b.level(now) as f64 / queue::rate::TOKEN as f64,
                    ready,
                    throttled: ready > 0 && b.tokens(now) == 0,
                });
            }
        }
        rows.sort_by(|a, b| (&a.queue, &a.key).cmp(&(&b.queue, &b.key)));
        rows
    }

    /// The concurrency key overrides of a tenant in force at `now` (one key, or every key when `None`), sorted by
    /// key, each with the key's running and pending tasks. An override past its expiry but not yet swept (no entry
    /// applied since) is not shown: it binds nothing any more.
    pub fn key_limits(&self, tenant: &str, key: Option<&str>, now: TimeMs) -> Vec<KeyLimitRow> {
        let g = self.read();
        let Some(first) = g.cores.first() else { return vec![] };
        let Some(keys) = first.key_limits().get(tenant) else { return vec![] };
        let mut rows: Vec<KeyLimitRow> = keys
            .iter()
            .filter(|(k, l)| key.is_none_or(|want| want == k.as_str()) && l.in_force(now))
            .map(|(k, l)| key_limit_row(&g.cores, tenant, k, l))
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }

    /// Every tenant's concurrency key overrides in force at `now` (the operators' view across tenants, for
    /// `/metrics`), as `key_limits` shows one tenant's; sorted by tenant, key.
    pub fn all_key_limits(&self, now: TimeMs) -> Vec<(String, KeyLimitRow)> {
        let g = self.read();
        let Some(first) = g.cores.first() else { return vec![] };
        let mut rows: Vec<(String, KeyLimitRow)> = first
            .key_limits()
            .iter()
            .flat_map(|(tenant, keys)| keys.iter().map(move |(k, l)| (tenant, k, l)))
            .filter(|(_, _, l)| l.in_force(now))
            .map(|(tenant, k, l)| (tenant.clone(), key_limit_row(&g.cores, tenant, k, l)))
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1.key).cmp(&(&b.0, &b.1.key)));
        rows
    }

    /// The fairness view of a tenant's queue (every queue when `None`): each key with a weight other than 1 or
    /// with ready tasks, its weight, its ready tasks in the queue and its running tasks (a concurrency key's
    /// running tasks count across the tenant's queues; "" never counts running tasks). Sorted by queue, key.
    /// `now` is the time the token buckets are read at (`FairnessRow::throttled`).
    pub fn fairness(&self, tenant: &str, queue: Option<&str>, now: TimeMs) -> Vec<FairnessRow> {
        let g = self.read();
        let mut rows: BTreeMap<(String, String), FairnessRow> = BTreeMap::new();
        let row = |q: &str, k: &str| FairnessRow {
            queue: q.to_string(),
            key: k.to_string(),
            weight: 1,
            ready: 0,
            running: 0,
            throttled: false,
        };
        if let Some(first) = g.cores.first() {
            for (q, k, w) in first.fairness_weights(tenant).filter(|(q, _, _)| queue.is_none_or(|x| x == *q)) {
                rows.entry((q.to_string(), k.to_string())).or_insert_with(|| row(q, k)).weight = w;
            }
        }
        let queues: Vec<String> = match queue {
            Some(q) => vec![q.to_string()],
            None => self.counts_of(&g, tenant),
        };
        for q in &queues {
            let qk = queue::QueueKey::new(tenant, q);
            for c in &g.cores {
                for (k, n) in c.ready_by_key(&qk) {
                    rows.entry((q.clone(), k.to_string())).or_insert_with(|| row(q, k)).ready += n as u64;
                }
            }
        }
        for r in rows.values_mut().filter(|r| !r.key.is_empty()) {
            r.running = g.cores.iter().map(|c| u64::from(c.running_with_key(tenant, &r.key))).sum();
        }
        if let Some(first) = g.cores.first().filter(|_| self.any_rates()) {
            for r in rows.values_mut().filter(|r| r.ready > 0) {
                let Some(rates) = first.rates(&queue::QueueKey::new(tenant, &r.queue)) else { continue };
                let empty = |key: Option<&str>| rates.get(key).is_some_and(|b| b.tokens(now) == 0);
                r.throttled = empty(None) || empty(Some(&r.key));
            }
        }
        rows.into_values().collect()
    }

    /// The queues of a tenant that have any task counted.
    fn counts_of(&self, g: &Shards, tenant: &str) -> Vec<String> {
        let mut v: Vec<String> = g
            .cores
            .iter()
            .flat_map(|c| c.counts().keys())
            .filter(|qk| qk.tenant == tenant)
            .map(|qk| qk.queue.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Dead-lettered tasks of a queue, oldest first, at most `limit`.
    pub fn dead_letters(&self, tenant: &str, queue: &str, limit: usize) -> io::Result<Vec<Task>> {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        let mut ids: Vec<(TimeMs, TaskId)> = self.read().cores.iter().flat_map(|c| c.dead_letters(&qk)).collect();
        ids.sort();
        let mut out = Vec::new();
        for (_, id) in ids.into_iter().take(limit) {
            if let Some(t) = self.get_task(&id)? {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Task counts per state for every queue of a tenant (all tenants when `None`).
    pub fn counts(&self, tenant: Option<&str>) -> Vec<(queue::QueueKey, StateCounts)> {
        let g = self.read();
        let mut all: std::collections::BTreeMap<queue::QueueKey, StateCounts> = Default::default();
        for c in &g.cores {
            for (qk, n) in c.counts() {
                if tenant.is_none_or(|t| t == qk.tenant) {
                    all.entry(qk.clone()).or_default().add(n);
                }
            }
        }
        all.into_iter().collect()
    }

    /// Webhook deliveries due at `now` (earliest first, at most `limit`), skipping those in flight.
    pub fn due_deliveries(
        &self,
        now: TimeMs,
        limit: usize,
        skip: &HashSet<DeliveryId>,
    ) -> io::Result<Vec<WebhookDelivery>> {
        let mut ids: Vec<(TimeMs, DeliveryId)> =
            self.read().cores.iter().flat_map(|c| c.due_deliveries(now, limit, skip)).collect();
        ids.sort();
        let mut out = Vec::new();
        for (_, id) in ids.into_iter().take(limit) {
            if let Some(d) = self.get_delivery(&id)? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Whether a queue is paused (every shard holds the flag; shard 0 answers).
    pub fn is_paused(&self, tenant: &str, queue: &str) -> bool {
        self.read().cores.first().is_some_and(|c| c.is_paused(&(tenant, queue)))
    }

    /// Every schedule (all tenants when `None`).
    pub fn schedules(&self, tenant: Option<&str>) -> Vec<queue::Schedule> {
        let g = self.read();
        g.cores
            .iter()
            .flat_map(|c| c.schedules().values())
            .filter(|s| tenant.is_none_or(|t| t == s.tenant))
            .cloned()
            .collect()
    }

    /// The limits of a queue, or with an empty `queue` of the tenant (every shard holds them; shard 0 answers).
    pub fn limits(&self, tenant: &str, queue: &str) -> Option<queue::Limits> {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        self.read().cores.first().and_then(|c| c.limits().get(&qk).copied())
    }

    /// Whether any tenant has a limit set: the leader's checks cost nothing until one does.
    pub fn any_limits(&self) -> bool {
        self.limits_set.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every limit of a tenant, by queue name (empty: the tenant's own), sorted.
    pub fn tenant_limits(&self, tenant: &str) -> Vec<(String, queue::Limits)> {
        let g = self.read();
        let mut v: Vec<(String, queue::Limits)> = g
            .cores
            .first()
            .map(|c| c.limits().iter().filter(|(qk, _)| qk.tenant == tenant).map(|(qk, l)| (qk.queue.clone(), *l)))
            .into_iter()
            .flatten()
            .collect();
        v.sort();
        v
    }

    /// Tasks ready to be claimed now (pending and not delayed), over every queue of every tenant.
    pub fn ready_total(&self) -> u64 {
        let g = self.read();
        g.cores.iter().map(|c| c.counts().values().map(|n| n.pending).sum::<u64>()).sum()
    }

    /// Task counts of one queue, or with an empty `queue` of all the tenant's queues, summed over the shards.
    pub fn queue_counts(&self, tenant: &str, queue: &str) -> StateCounts {
        let g = self.read();
        let mut sum = StateCounts::default();
        for c in &g.cores {
            if queue.is_empty() {
                c.counts().iter().filter(|(qk, _)| qk.tenant == tenant).for_each(|(_, n)| sum.add(n));
            } else {
                let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
                if let Some(n) = c.counts().get(&qk) {
                    sum.add(n);
                }
            }
        }
        sum
    }

    /// Paused queues of a tenant.
    pub fn paused_queues(&self, tenant: &str) -> Vec<String> {
        let g = self.read();
        let mut v: Vec<String> = g
            .cores
            .first()
            .map(|c| c.paused().filter(|qk| qk.tenant == tenant).map(|qk| qk.queue.clone()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Completions of a queue over the recent windows, summed over shards.
    pub fn throughput(&self, tenant: &str, queue: &str) -> queue::Throughput {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        let mut out = queue::Throughput::default();
        for c in &self.read().cores {
            let t = c.throughput(&qk);
            out.completed_1m += t.completed_1m;
            out.completed_5m += t.completed_5m;
            out.completed_15m += t.completed_15m;
            out.run_ms_15m += t.run_ms_15m;
        }
        out
    }

    /// Tasks of a tenant matching `filter`, in id order (ids start with their creation time), after `after`.
    /// Returns up to `limit` tasks and whether more may follow.
    pub fn list_tasks(
        &self,
        tenant: &str,
        filter: &queue::TaskFilter,
        after: Option<TaskId>,
        limit: usize,
    ) -> io::Result<(Vec<Task>, bool)> {
        // Ids begin with the leader's clock at enqueue: a lower time bound starts the scan there.
        // The margin covers a task whose shard clock ran ahead of the clock that stamped its id.
        let floor = filter.created_from.map(|t| TaskId::new(t.saturating_sub(LIST_FLOOR_MARGIN_MS), 0, 0));
        let start = match (after, floor) {
            (Some(a), Some(f)) => Some(a.max(f)),
            (a, f) => a.or(f),
        };
        let mut out: Vec<Task> = Vec::new();
        // Per shard: its unflushed changes from `start` on (the newest layer wins), copied under the lock, and
        // its file, read after; merged by id, a layer's record replacing (or removing) the file's.
        let shards: Vec<(Changes, Arc<Database>)> = {
            let g = self.read();
            (0..g.count()).map(|i| (g.layered_tasks(i, start), g.dbs[i].clone())).collect()
        };
        for (over, db) in shards {
            let txn = db.begin_read().map_err(io_err)?;
            let table = txn.open_table(TASKS).map_err(io_err)?;
            let iter = match &start {
                Some(s) => table.range::<&[u8]>(s.0.as_slice()..).map_err(io_err)?,
                None => table.iter().map_err(io_err)?,
            };
            let file = iter.map(|item| -> io::Result<(TaskId, Option<Task>)> {
                let (k, v) = item.map_err(io_err)?;
                let id = TaskId(k.value().try_into().map_err(io_err)?);
                Ok((id, Some(decode(v.value(), "task record")?)))
            });
            let mut taken = 0;
            for item in merge_by_id(file, over.into_iter()) {
                let (id, t) = item?;
                let Some(t) = t else { continue };
                if after == Some(id) {
                    continue;
                }
                if t.tenant == tenant && filter.matches(&t) {
                    out.push(t);
                    taken += 1;
                    if taken > limit {
                        break;
                    }
                }
            }
        }
        out.sort_by_key(|t| t.id);
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// For the leader's dependency resolver: every (waiting task, dependency) whose dependency has ended (or is
    /// gone), with the dependency's outcome, at most `limit`.
    pub fn dependency_resolutions(&self, limit: usize) -> io::Result<Vec<queue::DependencyResolved>> {
        let waiting: Vec<(TaskId, Vec<TaskId>)> = {
            let g = self.read();
            g.cores.iter().flat_map(|c| c.waiters().iter().map(|(d, w)| (*d, w.iter().copied().collect()))).collect()
        };
        let mut out = Vec::new();
        for (dep, tasks) in waiting {
            let outcome = match self.get_task(&dep)? {
                Some(t) if t.state.is_terminal() => Some(t.state),
                Some(_) => continue,
                None => None,
            };
            for task_id in tasks {
                out.push(queue::DependencyResolved { task_id, dependency: dep, outcome });
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// When the earliest pending webhook delivery is due, and how many are pending.
    pub fn webhook_backlog(&self) -> (Option<TimeMs>, usize) {
        let g = self.read();
        let next = g.cores.iter().filter_map(|c| c.next_delivery_at()).min();
        (next, g.cores.iter().map(|c| c.pending_deliveries()).sum())
    }

    pub fn next_due(&self) -> Option<TimeMs> {
        self.read().cores.iter().filter_map(|c| c.next_due()).min()
    }

    pub fn now(&self) -> TimeMs {
        self.read().now()
    }

    /// A digest of the applied state: (applied index, order-independent hash of every record, task count).
    /// Taken between two applies, so all shards are at the same point.
    pub fn digest(&self) -> io::Result<(u64, u64, u64)> {
        self.with_flushed(|g| Self::digest_files(g))
    }

    fn digest_files(g: &Shards) -> io::Result<(u64, u64, u64)> {
        let applied = g.applied().0.map(|l| l.index).unwrap_or(0);
        let (digest, tasks) = StateDigest::of_dbs(g.dbs.iter().map(|d| d.as_ref()), g.now())?;
        Ok((applied, digest, tasks))
    }

    /// Checks every shard's indexes against its records: a task is in exactly one index for its state.
    pub fn check_indexes(&self) -> io::Result<()> {
        self.with_flushed(|g| Self::check_files(g))
    }

    fn check_files(g: &Shards) -> io::Result<()> {
        for (i, (db, core)) in g.dbs.iter().zip(&g.cores).enumerate() {
            let fresh = shard::load_core(db, i, g.count(), core.now)?;
            if fresh.index_sizes() != core.index_sizes() {
                return Err(io::Error::other(format!(
                    "shard {i}: live indexes {:?} differ from records {:?}",
                    core.index_sizes(),
                    fresh.index_sizes()
                )));
            }
            if fresh.all_rates() != core.all_rates() {
                return Err(io::Error::other(format!("shard {i}: live token buckets differ from their records")));
            }
            if fresh.key_limits() != core.key_limits() {
                return Err(io::Error::other(format!("shard {i}: live key limit overrides differ from their records")));
            }
            let txn = db.begin_read().map_err(io_err)?;
            let n = txn.open_table(TASKS).map_err(io_err)?.len().map_err(io_err)? as usize;
            let s = core.index_sizes();
            if s.ready + s.delayed + s.leases + s.retention + s.dead + s.held != n {
                return Err(io::Error::other(format!("shard {i}: {n} records but indexes {s:?}")));
            }
            let w = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?.len().map_err(io_err)? as usize;
            if s.webhooks != w {
                return Err(io::Error::other(format!("shard {i}: {w} webhook deliveries but index {s:?}")));
            }
        }
        Ok(())
    }
}

/// Unflushed task changes by id (`None`: removed).
type Changes = BTreeMap<TaskId, Option<Task>>;

/// A record found in the unflushed layers (`Found`, possibly removed), or to be read from its shard's file.
enum Lookup<T> {
    Found(Option<T>),
    InFile(Arc<Database>),
}

impl Shards {
    fn task(&self, id: &TaskId) -> Lookup<Task> {
        let i = id.shard(self.count());
        match shard::in_layers(&self.dirty[i], &self.frozen[i], |l| l.tasks.get(id)) {
            Some(t) => Lookup::Found(t.as_deref().cloned()),
            None => Lookup::InFile(self.dbs[i].clone()),
        }
    }

    fn delivery(&self, id: &DeliveryId) -> Lookup<WebhookDelivery> {
        let i = id.task_id.shard(self.count());
        match shard::in_layers(&self.dirty[i], &self.frozen[i], |l| l.outbox.get(id)) {
            Some(d) => Lookup::Found(d.clone()),
            None => Lookup::InFile(self.dbs[i].clone()),
        }
    }

    /// Shard `i`'s unflushed task changes with ids from `start` on: the frozen layers, oldest first, then the
    /// newest over them.
    fn layered_tasks(&self, i: usize, start: Option<TaskId>) -> Changes {
        let mut over = BTreeMap::new();
        for l in self.frozen[i].iter().map(|l| &**l).chain([&self.dirty[i]]) {
            let from = |id: &TaskId| start.is_none_or(|s| *id >= s);
            over.extend(l.tasks.iter().filter(|(id, _)| from(id)).map(|(id, t)| (*id, t.as_deref().cloned())));
        }
        over
    }
}

/// Merges two id-ordered sequences of (id, record); on equal ids the second (newer) one wins.
fn merge_by_id<T>(
    older: impl Iterator<Item = io::Result<(TaskId, Option<T>)>>,
    newer: impl Iterator<Item = (TaskId, Option<T>)>,
) -> impl Iterator<Item = io::Result<(TaskId, Option<T>)>> {
    let mut older = older.peekable();
    let mut newer = newer.peekable();
    std::iter::from_fn(move || {
        let next_old = match older.peek() {
            Some(Ok((id, _))) => Some(*id),
            Some(Err(_)) => return older.next(),
            None => None,
        };
        match (next_old, newer.peek().map(|(id, _)| *id)) {
            (None, None) => None,
            (Some(o), Some(n)) if n <= o => {
                if n == o {
                    older.next();
                }
                newer.next().map(Ok)
            }
            (Some(_), _) => older.next(),
            (None, Some(_)) => newer.next().map(Ok),
        }
    })
}

/// The state digest: an order-independent sum of a hash of every record (its table, key and value), XOR the
/// state machine's time. Fed by the digest call above and by a backup's one pass (`backup.rs`), so a backup
/// carries the source's digest at its applied point.
pub struct StateDigest {
    sum: u64,
    tasks: u64,
    shards: usize,
}

impl StateDigest {
    pub(super) fn new(shards: usize) -> StateDigest {
        StateDigest { sum: 0, tasks: 0, shards }
    }

    /// A record of shard `shard`.
    pub(super) fn add(&mut self, table: Table, shard: usize, k: &[u8], v: &[u8]) {
        let kind: u8 = match table {
            Table::Tasks => 1,
            Table::Keys => 2,
            Table::Outbox => 3,
            Table::Records => 4,
        };
        // A record every shard holds counts once, so replicas with other shard counts agree.
        if table == Table::Records && shard != 0 && RecordKey::shard_of(k, self.shards).is_none() {
            return;
        }
        if table == Table::Tasks {
            self.tasks += 1;
        }
        // The state, not its encoding: a replica whose files are of another format hashes the same. A value that
        // does not decode (refused wherever it is read) is hashed as stored.
        let of = match table {
            Table::Tasks => format::Stored::Task,
            Table::Keys => format::Stored::Key,
            Table::Outbox => format::Stored::Delivery,
            Table::Records => format::Stored::Record(k),
        };
        let canonical = format::canonical(of, v);
        let v = canonical.as_deref().unwrap_or(v);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ kind as u64;
        for b in k.iter().chain([0xffu8].iter()).chain(v.iter()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.sum = self.sum.wrapping_add(h);
    }

    /// The digest of the records in `dbs` (every shard, in order) and the state's time `now`: (digest, tasks).
    pub(super) fn of_dbs<'a>(dbs: impl ExactSizeIterator<Item = &'a Database>, now: TimeMs) -> io::Result<(u64, u64)> {
        let mut digest = StateDigest::new(dbs.len());
        for (i, db) in dbs.enumerate() {
            let txn = db.begin_read().map_err(io_err)?;
            for (table, def) in [
                (Table::Tasks, TASKS),
                (Table::Keys, IDEMPOTENCY_KEYS),
                (Table::Outbox, WEBHOOK_OUTBOX),
                (Table::Records, SHARD_RECORDS),
            ] {
                for item in txn.open_table(def).map_err(io_err)?.iter().map_err(io_err)? {
                    let (k, v) = item.map_err(io_err)?;
                    digest.add(table, i, k.value(), v.value());
                }
            }
        }
        Ok(digest.finish(now))
    }

    /// (digest, task count) of a state whose time is `now`.
    pub(super) fn finish(&self, now: TimeMs) -> (u64, u64) {
        (self.sum ^ now, self.tasks)
    }
}
