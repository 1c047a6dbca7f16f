//! The openraft type configuration. Every openraft type the rest of raftq names goes through here.
//!
//! Storage implements openraft's storage traits for this configuration (`storage` imports this module, never
//! the other way round); the Raft handle over raftq's storage is `storage::Raft`.

use serde::{Deserialize, Serialize};

use crate::queue::{Request, Response};

pub type NodeId = u64;

/// What the cluster knows about a node: where peers reach its Raft service and where clients reach its API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub raft_addr: String,
    pub api_addr: String,
}

impl std::fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "raft={} api={}", self.raft_addr, self.api_addr)
    }
}

openraft::declare_raft_types!(
    /// raftq's Raft types: log payloads are queue commands, responses are queue responses.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = NodeInfo,
);

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, tokio::fs::File>;
