//! redb storage: table definitions, the Raft log store, the shard stores of the state machine, snapshots.
//!
//! Implements openraft's storage traits; the rules of the queue itself live in `crate::queue`.

pub mod codec;
pub mod log_store;
pub mod shard;
pub mod state_machine;
pub mod tables;

#[cfg(test)]
mod tests;

pub use log_store::{LogReader, LogStore};
pub use state_machine::{SmShared, StateMachine};
