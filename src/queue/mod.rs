//! The task state machine: commands, task records, lifecycle rules, leases and the claim order.
//!
//! Pure: no tokio, tonic, redb or clock. Storage (`crate::storage`) drives `ShardCore::apply` inside redb write
//! transactions; tests drive it over in-memory maps (`MemMachine`). The leader chooses claims with
//! `pick_ready`, then proposes them; apply re-checks each one.

pub mod shard;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};

pub mod capacity;
pub mod cron;

pub use shard::{
    ClaimOrder, Effects, EventCounts, KeyRecord, PartialResponse, QueueKey, ReadyKey, RecordKey, ShardCore,
    StateCounts, TaskStore, Throughput, THROUGHPUT_WINDOW_S,
};
pub use types::*;

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

/// A whole state machine in memory: the same shard logic over maps. For tests and the reference model.
#[derive(Debug)]
pub struct MemMachine {
    pub shards: Vec<ShardCore>,
    pub stores: Vec<MemStore>,
    pub last_index: u64,
}

#[derive(Debug, Default, Clone)]
pub struct MemStore {
    pub tasks: BTreeMap<TaskId, Task>,
    pub keys: BTreeMap<(String, String), KeyRecord>,
    pub outbox: BTreeMap<DeliveryId, WebhookDelivery>,
    pub records: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl TaskStore for MemStore {
    type Error = std::convert::Infallible;
    fn get(&mut self, id: &TaskId) -> Result<Option<Task>, Self::Error> {
        Ok(self.tasks.get(id).cloned())
    }
    fn put(&mut self, task: &Task) -> Result<(), Self::Error> {
        self.tasks.insert(task.id, task.clone());
        Ok(())
    }
    fn remove(&mut self, id: &TaskId) -> Result<(), Self::Error> {
        self.tasks.remove(id);
        Ok(())
    }
    fn get_key(&mut self, tenant: &str, key: &str) -> Result<Option<KeyRecord>, Self::Error> {
        Ok(self.keys.get(&(tenant.to_string(), key.to_string())).copied())
    }
    fn put_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) -> Result<(), Self::Error> {
        self.keys.insert((tenant.to_string(), key.to_string()), *rec);
        Ok(())
    }
    fn remove_key(&mut self, tenant: &str, key: &str) -> Result<(), Self::Error> {
        self.keys.remove(&(tenant.to_string(), key.to_string()));
        Ok(())
    }
    fn get_delivery(&mut self, id: &DeliveryId) -> Result<Option<WebhookDelivery>, Self::Error> {
        Ok(self.outbox.get(id).cloned())
    }
    fn put_delivery(&mut self, d: &WebhookDelivery) -> Result<(), Self::Error> {
        self.outbox.insert(d.id, d.clone());
        Ok(())
    }
    fn remove_delivery(&mut self, id: &DeliveryId) -> Result<(), Self::Error> {
        self.outbox.remove(id);
        Ok(())
    }
    fn put_record(&mut self, key: &[u8], value: &[u8]) -> Result<(), Self::Error> {
        self.records.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn remove_record(&mut self, key: &[u8]) -> Result<(), Self::Error> {
        self.records.remove(key);
        Ok(())
    }
}

impl MemMachine {
    pub fn new(shards: usize) -> Self {
        MemMachine {
            shards: (0..shards).map(|i| ShardCore::new(i, shards)).collect(),
            stores: vec![MemStore::default(); shards],
            last_index: 0,
        }
    }

    /// Applies the next log entry to every shard.
    pub fn apply(&mut self, req: &Request) -> (Response, Effects) {
        self.apply_at(self.last_index + 1, req)
    }

    /// Applies the entry at log index `index` (for replaying a real log, whose blank and membership entries
    /// take indexes too).
    pub fn apply_at(&mut self, index: u64, req: &Request) -> (Response, Effects) {
        self.last_index = index;
        let mut out = PartialResponse::for_command(&req.command);
        let mut fx = Effects::default();
        for (core, store) in self.shards.iter_mut().zip(self.stores.iter_mut()) {
            match core.apply(store, self.last_index, req, &mut out, &mut fx) {
                Ok(()) => {}
                Err(never) => match never {},
            }
        }
        (out.finish(), fx)
    }

    pub fn task(&self, id: &TaskId) -> Option<&Task> {
        self.stores[id.shard(self.shards.len())].tasks.get(id)
    }

    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.stores.iter().flat_map(|s| s.tasks.values())
    }

    pub fn now(&self) -> TimeMs {
        self.shards.iter().map(|s| s.now).max().unwrap_or(0)
    }

    /// Every pending webhook delivery, in id order.
    pub fn deliveries(&self) -> impl Iterator<Item = &WebhookDelivery> {
        self.stores.iter().flat_map(|s| s.outbox.values())
    }

    pub fn pick(&self, tenant: &str, queues: &[String], count: usize) -> Vec<TaskId> {
        pick_ready(&self.shards, tenant, queues, count, &HashSet::new())
    }

    /// Rebuilds every shard's indexes from its records, as a restart does.
    pub fn rebuilt(&self) -> MemMachine {
        let n = self.shards.len();
        let mut m = MemMachine::new(n);
        m.stores = self.stores.clone();
        m.last_index = self.last_index;
        for (i, core) in m.shards.iter_mut().enumerate() {
            core.now = self.shards[i].now;
            for (k, v) in &m.stores[i].records {
                if let Some(qk) = RecordKey::parse_paused(k) {
                    core.index_paused(qk);
                }
                if k.first() == Some(&RecordKey::SCHEDULE) {
                    core.index_schedule(bincode::deserialize(v).expect("a stored schedule"));
                }
            }
            for t in m.stores[i].tasks.values() {
                core.index_task(t);
            }
            for ((tenant, key), rec) in &m.stores[i].keys {
                core.index_key(tenant, key, rec);
            }
            for d in m.stores[i].outbox.values() {
                core.index_delivery(d);
            }
        }
        m
    }
}
