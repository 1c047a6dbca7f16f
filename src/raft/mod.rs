//! openraft glue: the type configuration, the network client, the internal Raft gRPC service, small helpers.
//! Every openraft type the rest of raftq names goes through here. Leader-only work is in `crate::leader`.
//!
//! Imports `queue` (the log's payload types), `tls` and `auth` (the peer connection), never `storage`:
//! `storage` builds on these types, and the service and helpers take any state machine.

pub mod control;
pub mod errors;
pub mod network;
pub mod service;
pub mod types;
pub mod version;

use openraft::storage::RaftStateMachine;
use openraft::type_config::async_runtime::watch::WatchReceiver;

/// A copy of the node's current Raft metrics.
pub fn metrics<SM: RaftStateMachine<types::TypeConfig>>(
    raft: &openraft::Raft<types::TypeConfig, SM>,
) -> openraft::RaftMetrics<types::TypeConfig> {
    raft.metrics().borrow_watched().clone()
}
