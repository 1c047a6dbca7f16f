//! The task state machine: commands, task records, lifecycle rules, leases and the claim order.
//!
//! Pure: no tokio, tonic, redb or clock. Storage (`crate::storage`) drives `ShardCore::apply` inside redb write
//! transactions; tests drive it over in-memory maps (`MemMachine`). The leader chooses claims with `pick_ready`,
//! then proposes them; apply re-checks each one.
//!
//! - `types`: ids, task records, commands and responses (the log and record formats).
//! - `store`: `TaskStore`, the typed records of one shard as apply sees them.
//! - `shard`: `ShardCore`, one shard's time and indexes, and their rebuild from records.
//! - `index`: the derived in-memory indexes (no rules).
//! - `apply/`: what each command does to a shard, one file per command family (the table in `apply/mod.rs`).
//! - `fair`: the leader's claim choice, weighted fair across the fairness keys of a queue (`pick_ready`).
//! - `rate`: token buckets per queue and fairness key: their arithmetic and the leader's budget of tokens.
//! - `queries`: reads for the leader and the API (due deliveries, dead letters, counts, weights).
//! - `capacity`, `cron`: the capacity arithmetic and the cron parser (leader-side, never in apply).
//! - `mem`: the same machine over maps, for tests and log replays.

mod apply;
pub mod capacity;
pub mod cron;
pub mod fair;
mod index;
mod mem;
mod queries;
pub mod rate;
mod shard;
mod store;
pub mod types;

#[cfg(test)]
mod tests;

pub use apply::{ApplyContext, Effects, EventCounts, PartialResponse, RevokedLease};
pub use fair::{pick_ready, FairClock, Picked, Promised};
pub use index::{fairness_key, IndexSizes, ReadyKey, StateCounts, THROUGHPUT_WINDOW_S};
pub use mem::{MemMachine, MemStore};
pub use queries::Throughput;
pub use rate::{QueueRates, RateBudget, RateCounts};
pub use shard::ShardCore;
pub use store::TaskStore;
pub use types::*;
