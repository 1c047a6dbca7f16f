//! Reads over the shard indexes: what the leader uses to choose claims, send webhooks, resolve dependencies and
//! fire schedules, and what the API reports (counts, dead letters, throughput). No read changes anything; apply
//! re-checks whatever the leader chose from them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use foldhash::HashMap;

use super::index::{IndexSizes, StateCounts, THROUGHPUT_WINDOW_S};
use super::shard::ShardCore;
use super::types::*;

/// Completions of one queue over the recent windows, in state-machine time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Throughput {
    pub completed_1m: u64,
    pub completed_5m: u64,
    pub completed_15m: u64,
    /// Summed run time (claim to completion) of the tasks completed in the last 15 minutes.
    pub run_ms_15m: u64,
}

impl ShardCore {
    // ---- claims ----------------------------------------------------------------------------------------------

    /// Tasks of this shard running under a tenant's concurrency key.
    pub fn running_with_key(&self, tenant: &str, key: &str) -> u32 {
        self.idx.running_keys.get(tenant).and_then(|keys| keys.get(key)).copied().unwrap_or(0)
    }

    /// The limit of a tenant's concurrency key at state-machine time `now`: the operator's override while it is
    /// in force, else the limit the task carries (`ck`). Apply's claim check and the leader's pick both ask here.
    pub fn key_limit(&self, tenant: &str, ck: &ConcurrencyKey, now: TimeMs) -> u32 {
        self.key_limit_of(tenant, &ck.key, ck.limit, now)
    }

    /// [`Self::key_limit`] of a task whose concurrency key is `key` with its own limit `own`.
    pub fn key_limit_of(&self, tenant: &str, key: &str, own: u32, now: TimeMs) -> u32 {
        match self.idx.key_limits.get(tenant).and_then(|keys| keys.get(key)) {
            Some(o) if o.in_force(now) => o.limit.max(1),
            _ => own.max(1),
        }
    }

    /// Every concurrency key override (every shard holds them all): tenant -> key -> override.
    pub fn key_limits(&self) -> &HashMap<String, HashMap<String, KeyLimit>> {
        &self.idx.key_limits
    }

    /// The pending tasks of a tenant's concurrency key in this shard: ready (in any queue) or delayed. Tasks held
    /// by dependencies are not counted (no claim can take them yet).
    pub fn pending_with_key(&self, tenant: &str, key: &str) -> u64 {
        let ready: usize = self
            .idx
            .by_key
            .iter()
            .filter(|(qk, _)| qk.tenant == tenant)
            .filter_map(|(_, keyed)| keyed.keys.get(key))
            .map(|(_, set)| set.len())
            .sum();
        let delayed = self
            .idx
            .delayed
            .values()
            .filter(|d| d.qk.tenant == tenant && d.key.as_ref().is_some_and(|ck| ck.key == key));
        (ready + delayed.count()) as u64
    }

    /// The weight of a fairness key of a queue (1 unless set).
    pub fn fairness_weight(&self, qk: &QueueKey, key: &str) -> u32 {
        self.idx.weights.get(qk).and_then(|m| m.get(key)).copied().unwrap_or(crate::queue::fair::DEFAULT_WEIGHT)
    }

    /// Every weight other than 1 of a tenant's queues: (queue, key, weight).
    pub fn fairness_weights<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = (&'a str, &'a str, u32)> + 'a {
        let queues = self.idx.weights.iter().filter(move |(qk, _)| qk.tenant == tenant);
        queues.flat_map(|(qk, m)| m.iter().map(move |(k, w)| (qk.queue.as_str(), k.as_str(), *w)))
    }

    /// The token buckets of a queue (every shard holds them all, identical).
    pub fn rates(&self, qk: &QueueKey) -> Option<&crate::queue::rate::QueueRates> {
        self.idx.rates.get(qk)
    }

    /// Every queue's token buckets.
    pub fn all_rates(&self) -> &HashMap<QueueKey, crate::queue::rate::QueueRates> {
        &self.idx.rates
    }

    /// Ready tasks of a queue in this shard per fairness key.
    pub fn ready_by_key(&self, qk: &QueueKey) -> impl Iterator<Item = (&str, usize)> + '_ {
        let keys = self.idx.by_key.get(qk).into_iter().flat_map(|k| k.keys.iter());
        keys.map(|(key, (_, set))| (key.as_str(), set.len()))
    }

    // ---- time ------------------------------------------------------------------------------------------------

    /// The earliest time at which something in this shard falls due (a lease, a delayed task, a retention, key or
    /// key-limit expiry, a task deadline), so the leader knows when a tick is worth proposing.
    pub fn next_due(&self) -> Option<TimeMs> {
        let idx = &self.idx;
        [
            idx.delayed.keys().next().map(|k| k.0),
            idx.leases.iter().next().map(|k| k.0),
            idx.retention.iter().next().map(|k| k.0),
            idx.keys.iter().next().map(|k| k.0),
            idx.deadlines.iter().next().map(|k| k.0),
            idx.key_limit_expiries.first().map(|k| k.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---- webhooks --------------------------------------------------------------------------------------------

    /// Webhook deliveries due at `now`, earliest first, skipping `skip` (attempts in flight).
    pub fn due_deliveries(&self, now: TimeMs, limit: usize, skip: &HashSet<DeliveryId>) -> Vec<(TimeMs, DeliveryId)> {
        let due = self.idx.webhooks.iter().take_while(|k| k.0 <= now);
        due.filter(|k| !skip.contains(&k.1)).take(limit).cloned().collect()
    }

    /// When the earliest webhook delivery of this shard is due.
    pub fn next_delivery_at(&self) -> Option<TimeMs> {
        self.idx.webhooks.first().map(|k| k.0)
    }

    /// Pending webhook deliveries in this shard.
    pub fn pending_deliveries(&self) -> usize {
        self.idx.webhooks.len()
    }

    // ---- dependencies, schedules, paused queues --------------------------------------------------------------

    /// Dependencies that tasks of this shard wait on, with the waiting tasks.
    pub fn waiters(&self) -> &BTreeMap<TaskId, BTreeSet<TaskId>> {
        &self.idx.waiters
    }

    pub fn schedules(&self) -> &BTreeMap<TaskId, Schedule> {
        &self.idx.schedules
    }

    pub fn is_paused(&self, qk: &dyn QueueRef) -> bool {
        !self.idx.paused.is_empty() && self.idx.paused.contains(qk)
    }

    pub fn paused(&self) -> impl Iterator<Item = &QueueKey> {
        self.idx.paused.iter()
    }

    /// Flow-control limits per queue (an empty queue name: the tenant's).
    pub fn limits(&self) -> &HashMap<QueueKey, Limits> {
        &self.idx.limits
    }

    // ---- reporting -------------------------------------------------------------------------------------------

    /// Dead-lettered tasks of one queue, oldest first.
    pub fn dead_letters(&self, qk: &QueueKey) -> Vec<(TimeMs, TaskId)> {
        self.idx.dead.get(qk).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    pub fn counts(&self) -> &HashMap<QueueKey, StateCounts> {
        &self.idx.counts
    }

    /// Completions of a queue in the 1, 5 and 15 minutes up to this shard's time.
    pub fn throughput(&self, qk: &QueueKey) -> Throughput {
        let mut out = Throughput::default();
        let now_s = self.now / 1000;
        for (sec, (n, run_ms)) in self.idx.done.get(qk).into_iter().flatten() {
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

    /// Counts of index entries, for consistency checks against the records.
    pub fn index_sizes(&self) -> IndexSizes {
        self.idx.sizes()
    }
}
