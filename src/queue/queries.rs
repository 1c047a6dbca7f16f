//! Reads over the shard indexes: what the leader uses to choose claims, send webhooks, resolve dependencies and
//! fire schedules, and what the API reports (counts, dead letters, throughput). No read changes anything; apply
//! re-checks whatever the leader chose from them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::index::{IndexSizes, ReadyKey, StateCounts, THROUGHPUT_WINDOW_S};
use super::shard::ShardCore;
use super::types::*;

/// The leader's claim order across queues and shards: priority, then the running tasks of the task's
/// concurrency key (least busy key first; 0 without a key), then FIFO.
pub type ClaimOrder = (std::cmp::Reverse<u8>, u32, u64, TaskId);

/// Completions of one queue over the recent windows, in state-machine time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Throughput {
    pub completed_1m: u64,
    pub completed_5m: u64,
    pub completed_15m: u64,
    /// Summed run time (claim to completion) of the tasks completed in the last 15 minutes.
    pub run_ms_15m: u64,
}

/// Chooses up to `count` ready tasks across `queues` of `tenant` in claim order (priority, then the least busy
/// concurrency key, then FIFO), skipping tasks already promised to an in-flight claim and tasks whose concurrency
/// key is at its limit (see `ShardCore::claim_candidates`).
pub fn pick_ready<'a>(
    shards: impl IntoIterator<Item = &'a ShardCore>,
    tenant: &str,
    queues: &[String],
    count: usize,
    skip: &HashSet<TaskId>,
) -> Vec<TaskId> {
    let mut heads: Vec<ClaimOrder> = Vec::new();
    for shard in shards {
        heads.extend(shard.claim_candidates(tenant, queues, count, skip));
    }
    heads.sort();
    heads.dedup_by_key(|k| k.3);
    heads.into_iter().take(count).map(|k| k.3).collect()
}

impl ShardCore {
    // ---- claims ----------------------------------------------------------------------------------------------

    /// Tasks of this shard running under a tenant's concurrency key.
    pub fn running_with_key(&self, tenant: &str, key: &str) -> u32 {
        self.idx.running_keys.get(&(tenant.to_string(), key.to_string())).copied().unwrap_or(0)
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
        let pending_keys = &self.idx.pending_keys;
        // Keyed tasks promised to claims in flight: walk the smaller of the two sets (claims without keys, the
        // common case, cost nothing here).
        let mut taken: HashMap<&str, u32> = HashMap::new();
        if pending_keys.len() <= skip.len() {
            for (id, ck) in pending_keys {
                if skip.contains(id) {
                    *taken.entry(ck.key.as_str()).or_default() += 1;
                }
            }
        } else {
            for id in skip {
                if let Some(ck) = pending_keys.get(id) {
                    *taken.entry(ck.key.as_str()).or_default() += 1;
                }
            }
        }
        let mut iters: Vec<_> = queues
            .iter()
            .map(|q| QueueKey { tenant: tenant.to_string(), queue: q.clone() })
            .filter(|qk| !self.idx.paused.contains(qk))
            .filter_map(|qk| self.idx.ready.get(&qk))
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
            let busy = match pending_keys.get(&k.2) {
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

    // ---- time ------------------------------------------------------------------------------------------------

    /// The earliest time at which something in this shard falls due (a lease, a delayed task, a retention or key
    /// expiry, a task deadline), so the leader knows when a tick is worth proposing.
    pub fn next_due(&self) -> Option<TimeMs> {
        let idx = &self.idx;
        [
            idx.delayed.keys().next().map(|k| k.0),
            idx.leases.iter().next().map(|k| k.0),
            idx.retention.iter().next().map(|k| k.0),
            idx.keys.iter().next().map(|k| k.0),
            idx.deadlines.iter().next().map(|k| k.0),
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

    pub fn is_paused(&self, qk: &QueueKey) -> bool {
        self.idx.paused.contains(qk)
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
