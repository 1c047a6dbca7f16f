//! The cluster version gate (`raft::version`): while this node leads, it asks every member, voter or learner,
//! which cluster version its binary can apply, and once every one of them can apply a newer version than the
//! cluster runs, proposes `SetClusterVersion` with the lowest of them. A member that cannot be asked holds the
//! switch back: its binary is unknown. The switch is an entry of the log like any other, so every replica
//! changes version at the same index, and a new leader picks up where the last one stopped.

use std::sync::Arc;
use std::time::Duration;

use super::proposer::Proposer;
use crate::queue::Command;
use crate::raft::control;
use crate::raft::network::Network;
use crate::raft::version::SUPPORTED;

/// How often the leader asks the members while the cluster runs below what this binary supports.
const POLL: Duration = Duration::from_secs(1);

/// The gate for one term.
pub async fn lead(proposer: Arc<Proposer>, peers: Network) {
    loop {
        let active = proposer.shared.cluster_version();
        if active >= SUPPORTED {
            // Nothing newer to switch to from this binary; a newer leader raises it further.
            return;
        }
        match lowest_member_version(&proposer, &peers).await {
            Ok(lowest) if lowest > active => {
                let version = lowest.min(SUPPORTED);
                match proposer.write(Command::SetClusterVersion { version }).await {
                    Ok(_) => tracing::info!(from = active, to = version, "cluster version raised"),
                    Err(e) => tracing::warn!(error = %e, to = version, "cluster version not raised yet"),
                }
            }
            Ok(lowest) => tracing::debug!(active, lowest, "a member runs an older binary: cluster version kept"),
            Err(e) => tracing::debug!(error = %e, active, "a member's version is unknown: cluster version kept"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The lowest cluster version the members' binaries can apply (this node's own is `SUPPORTED`).
async fn lowest_member_version(proposer: &Proposer, peers: &Network) -> Result<u32, String> {
    let members = control::status(&proposer.raft).members;
    let asks =
        members.iter().filter(|m| m.node_id != peers.node_id).map(|m| peers.peer_version(m.node_id, &m.raft_addr));
    let answers = futures::future::join_all(asks).await;
    answers.into_iter().try_fold(SUPPORTED, |lowest, v| Ok(lowest.min(v?)))
}
