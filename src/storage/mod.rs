//! redb storage: table definitions, the Raft log store, the shard stores of the state machine, snapshots.
//!
//! Implements openraft's storage traits for `raft::types::TypeConfig` (this layer imports `raft::types`; `raft`
//! never imports `storage`); the rules of the queue itself live in `crate::queue`.

mod apply;
pub mod codec;
pub mod files;
mod flush;
pub mod log_store;
mod read_view;
pub mod shard;
mod snapshot;
pub mod state_machine;
pub mod tables;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use log_store::{LogReader, LogStore};
pub use snapshot::SnapshotBuilder;
pub use state_machine::{Shards, SmShared, StateMachine};

/// The Raft handle of a node: openraft over this storage's state machine.
pub type Raft = openraft::Raft<crate::raft::types::TypeConfig, StateMachine>;
