//! openraft's errors, classified by type into what a caller of Raft needs to know: was anything done, and whom
//! to ask instead. The API layer maps [`RaftFailure`] to reasons; it never sees an openraft error (nor parses one
//! by its text).

use openraft::error::{ClientWriteError, Fatal, LinearizableReadError, RaftError};

use super::types::{NodeId, TypeConfig};

/// Why a Raft operation (a write, a membership change, a linearizable read, a trigger) did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftFailure {
    /// This node does not lead; nothing was done. The leader's id and public address when this node knows them.
    #[error("this node is not the leader")]
    NotLeader { leader_id: Option<NodeId>, leader_addr: Option<String> },
    /// The operation may or may not have happened: its entry was appended here, then dropped when this node
    /// adopted another leader's log, and it may still commit through that leader.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// A membership change refused before anything was written: another one is in progress, the leader has not
    /// committed an entry of its term yet, the change is not one Raft can make in one step...
    #[error("{0}")]
    MembershipUnsafe(String),
    /// No quorum confirmed this node's leadership: it cannot serve a linearizable read now.
    #[error("no quorum: {0}")]
    NoQuorum(String),
    /// Raft is shutting down (or has stopped): nothing new is done here.
    #[error("raft is shutting down")]
    ShuttingDown,
    /// Raft stopped on a storage error or a panic: this node cannot go on.
    #[error("raft stopped: {0}")]
    Fatal(String),
}

fn not_leader(f: openraft::error::ForwardToLeader<TypeConfig>) -> RaftFailure {
    RaftFailure::NotLeader { leader_id: f.leader_id, leader_addr: f.leader_node.map(|n| n.api_addr) }
}

impl From<Fatal<TypeConfig>> for RaftFailure {
    fn from(f: Fatal<TypeConfig>) -> Self {
        match f {
            Fatal::Stopped => RaftFailure::ShuttingDown,
            Fatal::Panicked => RaftFailure::Fatal("raft panicked".into()),
            Fatal::StorageError(e) => RaftFailure::Fatal(e.to_string()),
        }
    }
}

impl From<ClientWriteError<TypeConfig>> for RaftFailure {
    fn from(e: ClientWriteError<TypeConfig>) -> Self {
        match e {
            // Refused before its entry was appended.
            ClientWriteError::ForwardToLeader(f) => not_leader(f),
            ClientWriteError::LogEntryDiscarded(f) => RaftFailure::Unknown(format!(
                "the entry was dropped in a leader change and may still commit (leader now: {:?})",
                f.leader_id
            )),
            ClientWriteError::ChangeMembershipError(m) => RaftFailure::MembershipUnsafe(m.to_string()),
            // raftq attaches no preconditions; if one fails, nothing was written.
            ClientWriteError::PreconditionFailed(p) => RaftFailure::MembershipUnsafe(p.to_string()),
        }
    }
}

impl From<LinearizableReadError<TypeConfig>> for RaftFailure {
    fn from(e: LinearizableReadError<TypeConfig>) -> Self {
        match e {
            LinearizableReadError::ForwardToLeader(f) => not_leader(f),
            LinearizableReadError::QuorumNotEnough(q) => RaftFailure::NoQuorum(q.to_string()),
        }
    }
}

impl<E: Into<RaftFailure>> From<RaftError<TypeConfig, E>> for RaftFailure {
    fn from(e: RaftError<TypeConfig, E>) -> Self {
        match e {
            RaftError::APIError(e) => e.into(),
            RaftError::Fatal(f) => f.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::NodeInfo;

    #[test]
    fn forward_to_leader_is_not_leader_with_the_address_and_a_discarded_entry_is_unknown() {
        let node = NodeInfo { raft_addr: "r:1".into(), api_addr: "a:1".into() };
        let f = openraft::error::ForwardToLeader::<TypeConfig>::new(2, node);
        let e: RaftError<TypeConfig, ClientWriteError<TypeConfig>> =
            RaftError::APIError(ClientWriteError::ForwardToLeader(f.clone()));
        assert_eq!(
            RaftFailure::from(e),
            RaftFailure::NotLeader { leader_id: Some(2), leader_addr: Some("a:1".into()) }
        );
        let discarded = RaftFailure::from(ClientWriteError::<TypeConfig>::LogEntryDiscarded(f));
        assert!(matches!(discarded, RaftFailure::Unknown(_)), "{discarded:?}");
        let stopped: RaftError<TypeConfig, ClientWriteError<TypeConfig>> = RaftError::Fatal(Fatal::Stopped);
        assert_eq!(RaftFailure::from(stopped), RaftFailure::ShuttingDown);
        assert!(matches!(RaftFailure::from(Fatal::<TypeConfig>::Panicked), RaftFailure::Fatal(_)));
    }
}
