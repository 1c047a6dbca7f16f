//! `ShardCore`: one shard's derived state, its time and its indexes, and the entry points that rebuild them.
//!
//! What a command does to a shard is in `apply/` (`ShardCore::apply`); what the leader reads from it is in
//! `queries.rs`; the indexes themselves are in `index.rs`.
//!
//! Every effect of a command on a shard depends only on that shard's records and the command itself (the
//! proposer decided ids, claims and jitter), so after a crash each shard can replay from its own `last_applied`
//! and arrive at the same state as every other replica. Apply never reads a clock: time is the command's
//! `time_ms`, and shard time never moves backwards.

use super::index::ShardIndex;
use super::types::*;

/// One shard's derived state. Rebuilt from the records at start and after a snapshot is installed: set `now`,
/// then feed every record to the `index_*` methods (paused queues, weights, key limits and schedules first).
#[derive(Debug, Default)]
pub struct ShardCore {
    pub shard_no: usize,
    pub shards: usize,
    /// State-machine time of this shard: the max `time_ms` of every entry applied.
    pub now: TimeMs,
    /// The cluster version in force (`SetClusterVersion`); every shard holds it, as a record and here.
    pub cluster_version: u32,
    pub(super) idx: ShardIndex,
}

impl ShardCore {
    pub fn new(shard_no: usize, shards: usize) -> Self {
        ShardCore { shard_no, shards, ..Default::default() }
    }

    /// Whether a task (or a record keyed by a task id) lives in this shard.
    pub(super) fn mine(&self, id: &TaskId) -> bool {
        id.shard(self.shards) == self.shard_no
    }

    // ---- rebuilding the indexes from stored records ----------------------------------------------------------

    pub fn index_task(&mut self, t: &Task) {
        self.idx.add_task(t, self.now);
    }

    pub fn index_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) {
        self.idx.add_key(tenant, key, rec);
    }

    pub fn index_delivery(&mut self, d: &WebhookDelivery) {
        self.idx.add_delivery(d);
    }

    pub fn index_schedule(&mut self, s: Schedule) {
        self.idx.schedules.insert(s.id, s);
    }

    pub fn index_paused(&mut self, qk: QueueKey) {
        self.idx.paused.insert(qk);
    }

    pub fn index_limits(&mut self, qk: QueueKey, limits: Limits) {
        self.idx.limits.insert(qk, limits);
    }

    pub fn index_weight(&mut self, qk: QueueKey, key: &str, weight: u32) {
        self.idx.set_weight(qk, key, weight);
    }

    pub fn index_rate(&mut self, qk: QueueKey, key: Option<&str>, bucket: RateBucket) {
        self.idx.rates.entry(qk).or_default().set(key, Some(bucket));
    }

    pub fn index_key_limit(&mut self, tenant: &str, key: &str, limit: KeyLimit) {
        self.idx.set_key_limit(tenant, key, Some(limit));
    }

    pub fn index_cluster_version(&mut self, version: u32) {
        self.cluster_version = self.cluster_version.max(version);
    }
}
