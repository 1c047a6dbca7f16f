//! raftq: a Raft-replicated task queue.
//!
//! - `queue`: the task state machine (pure: commands, lifecycle rules, indexes, claim order).
//! - `storage`: redb log store and sharded state machine, snapshots; openraft's storage traits.
//! - `raft`: openraft type config, network and internal service.
pub mod queue;
pub mod raft;
pub mod storage;
