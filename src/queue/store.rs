//! The records of one shard, as apply sees them: the `TaskStore` trait. Typed: how records are encoded and keyed
//! is the implementation's business (`storage::shard` over redb, `MemStore` over maps).

use std::sync::Arc;

use super::types::*;

/// Record access for one shard, inside one write transaction.
pub trait TaskStore {
    type Error;

    // ---- tasks, by id -------------------------------------------------------------------------------------
    /// Shared, not copied: apply reads a task, builds its next state as a new value, and stores that (`put`
    /// moves it in), so a task is copied once per change, not once per read and once per write.
    fn get(&mut self, id: &TaskId) -> Result<Option<Arc<Task>>, Self::Error>;
    fn put(&mut self, task: Arc<Task>) -> Result<(), Self::Error>;
    fn remove(&mut self, id: &TaskId) -> Result<(), Self::Error>;
    /// Gives up the store's own reference to the task's record ahead of a `put` of its next state, so that the
    /// caller's reference (from `get`) may be the only one and the change made in place. Until that `put` the
    /// store's answer for the task is not its current state (it may be none, or an older one). A store whose `get`
    /// hands out copies has nothing to give up.
    fn release(&mut self, _id: &TaskId) -> Result<(), Self::Error> {
        Ok(())
    }

    // ---- idempotency keys, by (tenant, key) ---------------------------------------------------------------
    fn get_key(&mut self, tenant: &str, key: &str) -> Result<Option<KeyRecord>, Self::Error>;
    fn put_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) -> Result<(), Self::Error>;
    fn remove_key(&mut self, tenant: &str, key: &str) -> Result<(), Self::Error>;

    // ---- the webhook outbox, by delivery id ---------------------------------------------------------------
    fn get_delivery(&mut self, id: &DeliveryId) -> Result<Option<WebhookDelivery>, Self::Error>;
    fn put_delivery(&mut self, d: &WebhookDelivery) -> Result<(), Self::Error>;
    fn remove_delivery(&mut self, id: &DeliveryId) -> Result<(), Self::Error>;

    // ---- schedules, by id, in the shard of the id's placement ---------------------------------------------
    fn put_schedule(&mut self, s: &Schedule) -> Result<(), Self::Error>;
    fn remove_schedule(&mut self, id: &TaskId) -> Result<(), Self::Error>;

    // ---- paused queues: every shard holds the whole set ---------------------------------------------------
    fn put_paused(&mut self, qk: &QueueKey) -> Result<(), Self::Error>;
    fn remove_paused(&mut self, qk: &QueueKey) -> Result<(), Self::Error>;

    // ---- flow-control limits per queue (an empty queue name: the tenant's): every shard holds them all ----
    fn put_limits(&mut self, qk: &QueueKey, limits: &Limits) -> Result<(), Self::Error>;
    fn remove_limits(&mut self, qk: &QueueKey) -> Result<(), Self::Error>;

    // ---- fairness weights per (tenant, queue, key) other than 1: every shard holds the whole set ----------
    fn put_weight(&mut self, qk: &QueueKey, key: &str, weight: u32) -> Result<(), Self::Error>;
    fn remove_weight(&mut self, qk: &QueueKey, key: &str) -> Result<(), Self::Error>;

    // ---- token buckets per queue (`key: None`) and per fairness key: every shard holds them all ----------
    fn put_rate(&mut self, qk: &QueueKey, key: Option<&str>, bucket: &RateBucket) -> Result<(), Self::Error>;
    fn remove_rate(&mut self, qk: &QueueKey, key: Option<&str>) -> Result<(), Self::Error>;

    // ---- concurrency key overrides per (tenant, key): every shard holds them all ---------------------------
    fn put_key_limit(&mut self, tenant: &str, key: &str, limit: &KeyLimit) -> Result<(), Self::Error>;
    fn remove_key_limit(&mut self, tenant: &str, key: &str) -> Result<(), Self::Error>;

    // ---- the cluster version: every shard holds it ------------------------------------------------------
    fn put_cluster_version(&mut self, version: u32) -> Result<(), Self::Error>;
}
