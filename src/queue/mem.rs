//! A whole state machine in memory: the same shard logic over maps. For tests, the crash test's replay and the
//! property test's comparison; the server runs the same `ShardCore` over redb (`storage`).

use std::collections::{BTreeMap, BTreeSet};

use super::apply::{ApplyContext, Effects};
use super::fair::{pick_ready, FairClock, Promised};
use super::shard::ShardCore;
use super::store::TaskStore;
use super::types::*;

#[derive(Debug)]
pub struct MemMachine {
    pub shards: Vec<ShardCore>,
    pub stores: Vec<MemStore>,
    pub last_index: u64,
}

/// One shard's records.
#[derive(Debug, Default, Clone)]
pub struct MemStore {
    pub tasks: BTreeMap<TaskId, Task>,
    pub keys: BTreeMap<(String, String), KeyRecord>,
    pub outbox: BTreeMap<DeliveryId, WebhookDelivery>,
    pub schedules: BTreeMap<TaskId, Schedule>,
    pub paused: BTreeSet<QueueKey>,
    pub limits: BTreeMap<QueueKey, Limits>,
    pub weights: BTreeMap<(QueueKey, String), u32>,
    pub rates: BTreeMap<(QueueKey, Option<String>), RateBucket>,
    pub key_limits: BTreeMap<(String, String), KeyLimit>,
    pub cluster_version: Option<u32>,
}

impl TaskStore for MemStore {
    type Error = std::convert::Infallible;
    fn get(&mut self, id: &TaskId) -> Result<Option<std::sync::Arc<Task>>, Self::Error> {
        Ok(self.tasks.get(id).map(|t| std::sync::Arc::new(t.clone())))
    }
    fn put(&mut self, task: std::sync::Arc<Task>) -> Result<(), Self::Error> {
        self.tasks.insert(task.id, std::sync::Arc::unwrap_or_clone(task));
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
    fn put_schedule(&mut self, s: &Schedule) -> Result<(), Self::Error> {
        self.schedules.insert(s.id, s.clone());
        Ok(())
    }
    fn remove_schedule(&mut self, id: &TaskId) -> Result<(), Self::Error> {
        self.schedules.remove(id);
        Ok(())
    }
    fn put_paused(&mut self, qk: &QueueKey) -> Result<(), Self::Error> {
        self.paused.insert(qk.clone());
        Ok(())
    }
    fn remove_paused(&mut self, qk: &QueueKey) -> Result<(), Self::Error> {
        self.paused.remove(qk);
        Ok(())
    }
    fn put_limits(&mut self, qk: &QueueKey, limits: &Limits) -> Result<(), Self::Error> {
        self.limits.insert(qk.clone(), *limits);
        Ok(())
    }
    fn remove_limits(&mut self, qk: &QueueKey) -> Result<(), Self::Error> {
        self.limits.remove(qk);
        Ok(())
    }
    fn put_weight(&mut self, qk: &QueueKey, key: &str, weight: u32) -> Result<(), Self::Error> {
        self.weights.insert((qk.clone(), key.to_string()), weight);
        Ok(())
    }
    fn remove_weight(&mut self, qk: &QueueKey, key: &str) -> Result<(), Self::Error> {
        self.weights.remove(&(qk.clone(), key.to_string()));
        Ok(())
    }
    fn put_rate(&mut self, qk: &QueueKey, key: Option<&str>, bucket: &RateBucket) -> Result<(), Self::Error> {
        self.rates.insert((qk.clone(), key.map(str::to_string)), *bucket);
        Ok(())
    }
    fn remove_rate(&mut self, qk: &QueueKey, key: Option<&str>) -> Result<(), Self::Error> {
        self.rates.remove(&(qk.clone(), key.map(str::to_string)));
        Ok(())
    }
    fn put_key_limit(&mut self, tenant: &str, key: &str, limit: &KeyLimit) -> Result<(), Self::Error> {
        self.key_limits.insert((tenant.to_string(), key.to_string()), *limit);
        Ok(())
    }
    fn remove_key_limit(&mut self, tenant: &str, key: &str) -> Result<(), Self::Error> {
        self.key_limits.remove(&(tenant.to_string(), key.to_string()));
        Ok(())
    }
    fn put_cluster_version(&mut self, version: u32) -> Result<(), Self::Error> {
        self.cluster_version = Some(version);
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
        let mut fx = Effects::default();
        let mut cx = ApplyContext::new(index, req, &mut fx);
        for (core, store) in self.shards.iter_mut().zip(self.stores.iter_mut()) {
            match core.apply(store, &mut cx, req) {
                Ok(()) => {}
                Err(never) => match never {},
            }
        }
        (cx.finish(), fx)
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

    /// The leader's pick with a fresh fairness clock (every active key at the same pass).
    pub fn pick(&self, tenant: &str, queues: &[String], count: usize) -> Vec<TaskId> {
        self.pick_with(&mut FairClock::default(), tenant, queues, count)
    }

    /// The leader's pick, charging `clock` as the leader's dispatcher does across picks.
    pub fn pick_with(&self, clock: &mut FairClock, tenant: &str, queues: &[String], count: usize) -> Vec<TaskId> {
        let picked = pick_ready(&self.shards, clock, tenant, queues, count, &Promised::default(), None);
        picked.into_iter().map(|p| p.id).collect()
    }

    /// Rebuilds every shard's indexes from its records, as a restart does.
    pub fn rebuilt(&self) -> MemMachine {
        let n = self.shards.len();
        let mut m = MemMachine::new(n);
        m.stores = self.stores.clone();
        m.last_index = self.last_index;
        for (i, core) in m.shards.iter_mut().enumerate() {
            let store = &m.stores[i];
            core.now = self.shards[i].now;
            if let Some(v) = store.cluster_version {
                core.index_cluster_version(v);
            }
            for qk in &store.paused {
                core.index_paused(qk.clone());
            }
            for (qk, l) in &store.limits {
                core.index_limits(qk.clone(), *l);
            }
            for ((qk, key), w) in &store.weights {
                core.index_weight(qk.clone(), key, *w);
            }
            for ((qk, key), b) in &store.rates {
                core.index_rate(qk.clone(), key.as_deref(), *b);
            }
            for ((tenant, key), l) in &store.key_limits {
                core.index_key_limit(tenant, key, *l);
            }
            for s in store.schedules.values() {
                core.index_schedule(s.clone());
            }
            for t in store.tasks.values() {
                core.index_task(t);
            }
            for ((tenant, key), rec) in &store.keys {
                core.index_key(tenant, key, rec);
            }
            for d in store.outbox.values() {
                core.index_delivery(d);
            }
        }
        m
    }
}
