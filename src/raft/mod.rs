//! openraft glue: the type configuration, the network client, the internal Raft gRPC service.
//! Every openraft type the API uses is named here.

pub mod dispatcher;
pub mod network;
pub mod proposer;
pub mod resolver;
pub mod scheduler;
pub mod service;
pub mod types;
pub mod webhooks;

use openraft::type_config::async_runtime::watch::WatchReceiver;

/// A copy of the node's current Raft metrics.
pub fn metrics(raft: &types::Raft) -> openraft::RaftMetrics<types::TypeConfig> {
    raft.metrics().borrow_watched().clone()
}
