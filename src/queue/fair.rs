//! Weighted fair dispatch: which ready tasks the leader claims next, serving the fairness keys of a queue in
//! proportion to their weights. Leader-side reads only; apply never looks at any of this (a claim's re-check is
//! about claimability, and fairness is the leader's choice).
//!
//! A queue's tasks are grouped by fairness key: the task's concurrency key, or "" for tasks without one (one
//! implicit key). Each active key (one with ready tasks) has a *pass*; a pick serves the key with the smallest
//! pass (ties by key), takes that key's best ready task (priority, then FIFO, across shards) and adds the key's
//! *stride*, `STRIDE_ONE / weight`, to its pass (stride scheduling). A key that becomes active starts at the
//! queue's virtual time, the smallest pass of its active keys (or its own pass, if that is larger), so an idle
//! key banks no credit and a newly active key is served at once but gets no burst. A key whose concurrency limit
//! is full (its tasks' limit, or an operator's override in force at the shard's time: `ShardCore::key_limit`,
//! which apply's claim check reads too) is passed over for this pick without being charged, and so is a key (or
//! a whole queue) whose token bucket is empty (`queue::rate`).
//!
//! Priority and fairness: fairness across keys first, then priority and FIFO within a key. A request for several
//! queues takes, at each step, the best head (priority, then FIFO) among the queues' fair heads.
//!
//! The passes (`FairClock`) live on the leader and are not replicated: a new leader starts every key at the same
//! pass, so fairness resumes at once after a failover with no history carried. The weights are replicated
//! (`Command::SetFairnessWeight`, a record every shard holds). Cost per task picked: O(log n) in the active keys
//! of the queue plus the keys passed over (blocked by their limit, or with every ready task promised to a claim
//! in flight), never in the number of tasks.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};

use super::index::{KeyedReady, ReadyKey};
use super::rate::{QueueRates, RateBudget};
use super::shard::ShardCore;
use super::types::*;

/// A key's weight when none was set.
pub const DEFAULT_WEIGHT: u32 = 1;
/// The largest weight: with strides of `STRIDE_ONE / weight` it keeps the rounding error under one millionth.
pub const MAX_WEIGHT: u32 = 1_000;
/// The pass a key of weight 1 advances per task served. Large so that `STRIDE_ONE / weight` rounds by less than
/// a millionth; a u64 pass lasts 1.8e10 picks of weight 1 before it could overflow (it saturates).
pub const STRIDE_ONE: u64 = 1_000_000_000;

/// The leader's fairness state: per queue, the pass of each active key. Leader-local (see the module doc).
#[derive(Debug, Default)]
pub struct FairClock {
    queues: HashMap<QueueKey, QueueClock>,
}

#[derive(Debug, Default)]
struct QueueClock {
    pass: HashMap<Arc<str>, u64>,
    /// (pass, key) of every key believed active; a key found inactive is dropped when met.
    order: BTreeSet<(u64, Arc<str>)>,
    /// The queue's virtual time: the smallest pass of its active keys when last looked at. Never decreases.
    vtime: u64,
    /// Per shard: the highest activation number absorbed (`KeyedReady::activated`), and the shard's activation
    /// counter then (a counter that went back means the shard's index was rebuilt: look at every key again).
    seen: Vec<(u64, u64)>,
}

/// What one key can give a pick.
enum KeyHead {
    /// No ready task in any shard: the key is no longer active.
    Inactive,
    /// Ready tasks, each promised to a claim in flight or already taken by this pick.
    Exhausted,
    /// Its concurrency limit is full.
    Blocked,
    /// Its token bucket is empty (`queue::rate`).
    Throttled,
    Ready(ReadyKey),
}

/// Tasks promised to claims in flight. The leader's dispatcher reserves each task it puts in a claim entry
/// until that entry's answer comes back: every pick passes over them, and a keyed one holds a slot of its
/// concurrency key (counted with the key's running tasks) until then. Once the claim applies, the task is also
/// running until the answer reaches the dispatcher: a slot counted twice for that moment, never one too few.
#[derive(Debug, Default)]
pub struct Promised {
    /// Each reserved task, with its tenant and concurrency key if it has one.
    ids: IdMap<Option<(Arc<str>, Arc<str>)>>,
    /// Reserved tasks per tenant and concurrency key.
    per_key: HashMap<Arc<str>, HashMap<Arc<str>, u32>>,
}

impl Promised {
    /// Reserves a task picked for `tenant` (a second reservation of the same task changes nothing).
    pub fn insert(&mut self, tenant: &Arc<str>, picked: Picked) {
        if self.ids.contains_key(&picked.id) {
            return;
        }
        if let Some(key) = &picked.key {
            *self.per_key.entry(tenant.clone()).or_default().entry(key.clone()).or_default() += 1;
        }
        self.ids.insert(picked.id, picked.key.map(|k| (tenant.clone(), k)));
    }

    /// Releases a task's reservation, if it has one.
    pub fn remove(&mut self, id: &TaskId) {
        let Some(Some((tenant, key))) = self.ids.remove(id) else { return };
        let Some(keys) = self.per_key.get_mut(&tenant) else { return };
        if let Some(n) = keys.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                keys.remove(&key);
            }
        }
        if keys.is_empty() {
            self.per_key.remove(&tenant);
        }
    }

    pub fn contains(&self, id: &TaskId) -> bool {
        self.ids.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Reserved tasks of a tenant's concurrency key.
    pub fn of_key(&self, tenant: &str, key: &str) -> u32 {
        self.per_key.get(tenant).and_then(|k| k.get(key)).copied().unwrap_or(0)
    }
}

/// A task a pick chose, with its concurrency key if it has one (whose slot its promise holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    pub id: TaskId,
    pub key: Option<Arc<str>>,
}

impl Picked {
    /// A task without a concurrency key.
    pub fn plain(id: TaskId) -> Picked {
        Picked { id, key: None }
    }
}

impl FairClock {
    /// Forgets every pass (a new term: fairness starts over).
    pub fn reset(&mut self) {
        self.queues.clear();
    }

    /// The pass of a key of a queue, if it is tracked (for tests and the fairness view).
    pub fn pass(&self, qk: &QueueKey, key: &str) -> Option<u64> {
        self.queues.get(qk).and_then(|q| q.pass.get(key).copied())
    }
}

/// Chooses up to `count` ready tasks across `queues` of `tenant`: fair across the keys of each queue (weights,
/// passes in `clock`), priority and FIFO within a key, skipping tasks promised to in-flight claims (`skip`) and
/// keys at their concurrency limit. Charges the chosen keys in `clock`.
///
/// With a token `budget` (`queue::rate`), a queue whose own bucket, or a key whose bucket, has no token left is
/// passed over (uncharged, as a key at its concurrency limit is), and each task picked takes its tokens from the
/// budget. `None`: no bucket is looked at (no rate limit exists).
pub fn pick_ready(
    shards: &[ShardCore],
    clock: &mut FairClock,
    tenant: &str,
    queues: &[String],
    count: usize,
    skip: &Promised,
    budget: Option<&RateBudget<'_>>,
) -> Vec<Picked> {
    let mut qks: Vec<QueueKey> = Vec::new();
    for q in queues {
        let qk = QueueKey::new(tenant, q);
        if !qks.contains(&qk) && !shards.iter().any(|s| s.is_paused(&qk)) {
            qks.push(qk);
        }
    }
    // The plain merge of a queue without fairness keys knows no buckets: a rate-limited queue takes the fair pick.
    let limited = |qk: &QueueKey| budget.is_some() && shards.first().is_some_and(|s| s.rates(qk).is_some());
    if let [qk] = qks.as_slice() {
        if !limited(qk) {
            if let Some(out) = pick_unkeyed(shards, qk, count, skip) {
                // A key alone has nobody to be fair to: the queue's passes start afresh when a second key comes.
                clock.queues.remove(qk);
                return out;
            }
        }
    }
    // Every shard holds every bucket: the first answers. Nothing is looked up (or allocated) without a budget.
    let rates: Vec<Option<&QueueRates>> = match (budget, shards.first()) {
        (Some(_), Some(s)) => qks.iter().map(|qk| s.rates(qk)).collect(),
        _ => Vec::new(),
    };
    // The queues' clocks are taken out of the map for the pick (no lookup per task) and put back after.
    let mut clocks: Vec<QueueClock> = qks.iter().map(|qk| clock.queues.remove(qk).unwrap_or_default()).collect();
    for (qk, q) in qks.iter().zip(&mut clocks) {
        q.absorb(shards, qk);
    }
    let mut pick = Pick::new(shards, tenant, skip, &qks);
    pick.budget = budget;
    pick.rates = &rates;
    let mut out = Vec::new();
    while out.len() < count {
        let mut best: Option<(ReadyKey, usize, Arc<str>)> = None;
        for (i, q) in clocks.iter_mut().enumerate() {
            if let (Some(b), Some(r)) = (budget, pick.rates_of(i)) {
                if !b.allows(Some(r), &qks[i], None) {
                    continue;
                }
            }
            if let Some((rk, key)) = q.head(&pick, i) {
                if best.as_ref().is_none_or(|b| rk < b.0) {
                    best = Some((rk, i, key));
                }
            }
        }
        let Some((rk, i, key)) = best else { break };
        pick.take(i, &key, rk);
        if let Some(b) = budget {
            b.take(pick.rates_of(i), &qks[i], &key);
        }
        clocks[i].charge(&key, weight(shards, &qks[i], &key));
        out.push(Picked { id: rk.2, key: (!key.is_empty()).then_some(key) });
    }
    drop(pick);
    // A queue with no active key keeps no state: its next pick starts it afresh, as it would anyway.
    for (qk, q) in qks.into_iter().zip(clocks) {
        if !q.order.is_empty() {
            clock.queues.insert(qk, q);
        }
    }
    out
}

/// The pick of a queue whose ready tasks all lack a fairness key (the common case), or `None` if any has one:
/// the best `count` tasks across shards in claim order (priority, then FIFO), skipping `skip`. Same result as
/// the fair pick with one key, without its per-task bookkeeping.
fn pick_unkeyed(shards: &[ShardCore], qk: &QueueKey, count: usize, skip: &Promised) -> Option<Vec<Picked>> {
    let mut heads = Vec::new();
    for shard in shards {
        let Some(keyed) = shard.idx.by_key.get(qk) else { continue };
        if keyed.keys.len() != 1 {
            return None;
        }
        let (_, set) = keyed.keys.get("")?;
        heads.push(set.keys().filter(|rk| !skip.contains(&rk.2)).peekable());
    }
    let mut out = Vec::new();
    while out.len() < count {
        let mut best: Option<(usize, ReadyKey)> = None;
        for (i, h) in heads.iter_mut().enumerate() {
            if let Some(rk) = h.peek() {
                if best.is_none_or(|(_, b)| **rk < b) {
                    best = Some((i, **rk));
                }
            }
        }
        let Some((i, rk)) = best else { break };
        heads[i].next();
        out.push(Picked::plain(rk.2));
    }
    Some(out)
}

/// A key's weight in a queue (every shard holds the weights; the first answers).
pub fn weight(shards: &[ShardCore], qk: &QueueKey, key: &str) -> u32 {
    shards.first().map_or(DEFAULT_WEIGHT, |s| s.fairness_weight(qk, key))
}

impl QueueClock {
    /// Starts the keys that became active since the last look at the queue's virtual time.
    fn absorb(&mut self, shards: &[ShardCore], qk: &QueueKey) {
        self.seen.resize(shards.len(), (0, 0));
        self.advance_vtime(shards, qk);
        for (s, shard) in shards.iter().enumerate() {
            let counter = shard.idx.activations;
            let (last, was) = self.seen[s];
            let from = if counter < was { 0 } else { last };
            let mut newest = from;
            if let Some(keyed) = shard.idx.by_key.get(qk) {
                for (n, key) in keyed.activated.range((Bound::Excluded(from), Bound::Unbounded)) {
                    newest = *n;
                    let start = self.pass.get(key.as_str()).map_or(self.vtime, |p| (*p).max(self.vtime));
                    self.set_pass(key, start);
                }
            }
            self.seen[s] = (newest, counter);
        }
    }

    /// Drops inactive keys from the front and moves the virtual time up to the smallest remaining pass.
    fn advance_vtime(&mut self, shards: &[ShardCore], qk: &QueueKey) {
        while let Some((p, key)) = self.order.first().cloned() {
            if is_active(shards, qk, &key) {
                self.vtime = self.vtime.max(p);
                return;
            }
            self.order.pop_first();
            self.pass.remove(&*key);
        }
    }

    /// The next task of the pick's queue `qi`: the first key in pass order that can give one, and its best task.
    /// Keys passed over (at their concurrency limit, or with every ready task promised) are lifted to the served
    /// key's pass: like an idle key, a key that cannot be served banks no credit (and does not hold the virtual
    /// time back).
    fn head(&mut self, pick: &Pick<'_>, qi: usize) -> Option<(ReadyKey, Arc<str>)> {
        let mut inactive = Vec::new();
        let mut passed = Vec::new();
        let mut found = None;
        for (p, key) in &self.order {
            match pick.next_of(qi, key) {
                KeyHead::Inactive => inactive.push(key.clone()),
                KeyHead::Exhausted | KeyHead::Blocked | KeyHead::Throttled => passed.push(key.clone()),
                KeyHead::Ready(rk) => {
                    found = Some((rk, key.clone(), *p));
                    break;
                }
            }
        }
        for key in inactive {
            if let Some(p) = self.pass.remove(&*key) {
                self.order.remove(&(p, key));
            }
        }
        let (rk, key, p) = found?;
        for k in passed {
            self.set_pass(&k, p);
        }
        Some((rk, key))
    }

    fn charge(&mut self, key: &str, weight: u32) {
        let stride = STRIDE_ONE / u64::from(weight.clamp(DEFAULT_WEIGHT, MAX_WEIGHT));
        let p = self.pass.get(key).copied().unwrap_or(self.vtime);
        self.set_pass(key, p.saturating_add(stride));
    }

    /// Moves a key to `pass` (the key's name is allocated once, when the key is first tracked).
    fn set_pass(&mut self, key: &str, pass: u64) {
        let name = match self.pass.get_key_value(key) {
            Some((_, &old)) if old == pass => return,
            Some((name, &old)) => {
                let name = name.clone();
                self.order.remove(&(old, name.clone()));
                name
            }
            None => Arc::from(key),
        };
        self.order.insert((pass, name.clone()));
        self.pass.insert(name, pass);
    }
}

/// Whether a key of a queue has ready tasks in any shard.
fn is_active(shards: &[ShardCore], qk: &QueueKey, key: &str) -> bool {
    shards.iter().any(|s| s.idx.by_key.get(qk).is_some_and(|k| k.keys.contains_key(key)))
}

/// One pick's transients: the shards' ready tasks of each queue of the request (looked up once), the tasks
/// promised to claims in flight (passed over; the keyed ones counted per concurrency key, which spans the
/// tenant's queues), those taken by this pick, and where each (queue, key) got to.
struct Pick<'a> {
    shards: &'a [ShardCore],
    tenant: &'a str,
    skip: &'a Promised,
    /// Per queue of the request (by position): (shard, its ready tasks of the queue) for each shard holding any.
    queues: Vec<Vec<(usize, &'a KeyedReady)>>,
    qks: &'a [QueueKey],
    taken: HashMap<Arc<str>, u32>,
    cursor: Vec<HashMap<Arc<str>, ReadyKey>>,
    /// The token budget of the pass and the buckets of each queue (by position; empty without a budget).
    budget: Option<&'a RateBudget<'a>>,
    rates: &'a [Option<&'a QueueRates>],
}

impl<'a> Pick<'a> {
    fn new(shards: &'a [ShardCore], tenant: &'a str, skip: &'a Promised, qks: &'a [QueueKey]) -> Self {
        let queues: Vec<Vec<(usize, &KeyedReady)>> = qks
            .iter()
            .map(|qk| shards.iter().enumerate().filter_map(|(s, sh)| sh.idx.by_key.get(qk).map(|k| (s, k))).collect())
            .collect();
        let cursor = vec![HashMap::new(); qks.len()];
        Pick { shards, tenant, skip, queues, qks, taken: HashMap::new(), cursor, budget: None, rates: &[] }
    }

    /// The token buckets of the pick's queue `qi`, if it has any and the pick has a budget.
    fn rates_of(&self, qi: usize) -> Option<&'a QueueRates> {
        self.rates.get(qi).copied().flatten()
    }

    /// The best task a key can give now: its first ready task (priority, FIFO, across shards) after those this
    /// pick took and not promised elsewhere, if its concurrency key has a free slot.
    fn next_of(&self, qi: usize, key: &str) -> KeyHead {
        let after = self.cursor[qi].get(key);
        let mut active = false;
        let mut best: Option<(ReadyKey, u32, usize)> = None;
        for &(s, keyed) in &self.queues[qi] {
            let Some((_, set)) = keyed.keys.get(key) else { continue };
            active = true;
            let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
            let next = set.range((lower, Bound::Unbounded)).find(|(rk, _)| !self.skip.contains(&rk.2));
            if let Some((rk, limit)) = next {
                if best.is_none_or(|b| *rk < b.0) {
                    best = Some((*rk, *limit, s));
                }
            }
            if !key.is_empty() {
                // Every task of a concurrency key lives in one shard: no other shard has any.
                break;
            }
        }
        match best {
            None if active => KeyHead::Exhausted,
            None => KeyHead::Inactive,
            // A key's tasks are its concurrency key's ("" has none): the head's own limit came with it.
            Some((_, limit, s))
                if !key.is_empty() && {
                    let shard = &self.shards[s];
                    self.full(s, key, shard.key_limit_of(self.tenant, key, limit, shard.now))
                } =>
            {
                KeyHead::Blocked
            }
            Some(_) if self.budget.is_some_and(|b| !b.allows(self.rates_of(qi), &self.qks[qi], Some(key))) => {
                KeyHead::Throttled
            }
            Some((rk, _, _)) => KeyHead::Ready(rk),
        }
    }

    /// Whether a concurrency key's slots are all in use: running (in shard `s`, where every task of the key
    /// lives), promised to claims in flight, taken by this pick.
    fn full(&self, s: usize, key: &str, limit: u32) -> bool {
        let running = self.shards[s].running_with_key(self.tenant, key);
        let taken = self.taken.get(key).copied().unwrap_or(0);
        running.saturating_add(taken).saturating_add(self.skip.of_key(self.tenant, key)) >= limit
    }

    fn take(&mut self, qi: usize, key: &Arc<str>, rk: ReadyKey) {
        if !key.is_empty() {
            *self.taken.entry(key.clone()).or_default() += 1;
        }
        self.cursor[qi].insert(key.clone(), rk);
    }
}
