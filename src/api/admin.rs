//! The Admin service: node status, leadership transfer, membership changes, state digests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{ChangeMembers, ServerState};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::admin_server::Admin;
use tonic::{Request, Response, Status};

use super::error::{invalid, ApiError};
use super::forward::{forwarded, Forwarder, Route};
use super::grpc::caller_with;
use crate::auth::Scope;
use crate::raft::types::{NodeInfo, Raft};
use crate::storage::SmShared;

/// Longest a leadership transfer is waited for when the request gives no timeout.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

pub struct AdminApi {
    pub raft: Raft,
    pub shared: Arc<SmShared>,
    pub fwd: Arc<Forwarder>,
    pub node_id: u64,
}

type Res<T> = Result<Response<T>, Status>;

fn role(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "LEADER",
        ServerState::Follower => "FOLLOWER",
        ServerState::Candidate => "CANDIDATE",
        ServerState::Learner => "LEARNER",
        ServerState::Shutdown => "SHUTDOWN",
    }
}

fn members(m: &crate::raft::types::StoredMembership) -> Vec<pb::Member> {
    let voters: BTreeSet<u64> = m.membership().voter_ids().collect();
    m.membership()
        .nodes()
        .map(|(id, n)| pb::Member {
            node_id: *id,
            raft_addr: n.raft_addr.clone(),
            api_addr: n.api_addr.clone(),
            voter: voters.contains(id),
        })
        .collect()
}

fn raft_err(e: impl std::fmt::Display) -> ApiError {
    let msg = e.to_string();
    if msg.contains("forward") || msg.contains("Forward") {
        ApiError::NotLeader { leader_addr: None }
    } else {
        ApiError::Unavailable(msg)
    }
}

impl AdminApi {
    /// The leader's Admin client when this node does not lead.
    async fn leader(
        &self,
        req: &Request<impl Send>,
    ) -> Result<Option<AdminClient<tonic::transport::Channel>>, ApiError> {
        Ok(match self.fwd.route(req).await? {
            Route::Local => None,
            Route::Leader(ch) => Some(AdminClient::new(ch)),
        })
    }

    /// Removing a voter goes through a joint configuration that needs a majority of the old voters and of the
    /// new ones: with another voter down it may never commit, and the cluster would stop. Refused unless enough
    /// voters have answered the leader lately (twice the longest election timeout).
    fn check_removal_commits(
        &self,
        m: &openraft::RaftMetrics<crate::raft::types::TypeConfig>,
        voters: &BTreeSet<u64>,
        id: u64,
    ) -> Result<(), ApiError> {
        use openraft::Instant as _;
        let recent = Duration::from_millis(self.raft.config().election_timeout_max * 2);
        let heard = m.heartbeat.clone().unwrap_or_default();
        let live =
            |n: &u64| *n == self.node_id || heard.get(n).and_then(|t| t.as_ref()).is_some_and(|t| t.elapsed() < recent);
        let new: BTreeSet<u64> = voters.iter().copied().filter(|v| *v != id).collect();
        let (old_live, new_live) = (voters.iter().filter(|v| live(v)).count(), new.iter().filter(|v| live(v)).count());
        if old_live * 2 > voters.len() && new_live * 2 > new.len() {
            return Ok(());
        }
        let down: Vec<String> = voters.iter().filter(|v| !live(v)).map(|v| v.to_string()).collect();
        Err(ApiError::Precondition {
            reason: "MEMBERSHIP_UNSAFE",
            message: format!(
                "removing node {id} needs a majority of the remaining voters to answer, and node(s) {} do not:                  bring them back or remove them first (or force it)",
                down.join(", ")
            ),
        })
    }

    fn membership_response(&self) -> pb::MembershipResponse {
        let m = crate::raft::metrics(&self.raft);
        pb::MembershipResponse { members: members(&m.membership_config) }
    }
}

#[tonic::async_trait]
impl Admin for AdminApi {
    async fn status(&self, req: Request<pb::NodeStatusRequest>) -> Res<pb::NodeStatus> {
        caller_with(&req, Scope::Admin)?;
        let m = crate::raft::metrics(&self.raft);
        let last = m.last_log_index.unwrap_or(0);
        let replication_lag = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .filter(|(id, _)| **id != m.id)
                    .map(|(id, matched)| (*id, last.saturating_sub(matched.as_ref().map(|l| l.index).unwrap_or(0))))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(pb::NodeStatus {
            node_id: m.id,
            role: role(m.state).to_string(),
            term: m.current_term,
            leader_id: m.current_leader.unwrap_or(0),
            has_leader: m.current_leader.is_some(),
            last_log_index: last,
            applied_index: m.last_applied.as_ref().map(|l| l.index).unwrap_or(0),
            committed_index: m.local_committed.as_ref().map(|l| l.index).unwrap_or(0),
            replication_lag,
            members: members(&m.membership_config),
            snapshot_index: m.snapshot.as_ref().map(|l| l.index).unwrap_or(0),
            purged_index: m.purged.as_ref().map(|l| l.index).unwrap_or(0),
        }))
    }

    async fn transfer_leader(&self, req: Request<pb::TransferLeaderRequest>) -> Res<pb::TransferLeaderResponse> {
        caller_with(&req, Scope::Admin)?;
        if let Some(mut c) = self.leader(&req).await? {
            return c.transfer_leader(forwarded(req)).await;
        }
        let pb::TransferLeaderRequest { to, timeout_ms } = req.into_inner();
        let m = crate::raft::metrics(&self.raft);
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        let target = if to == 0 {
            voters.iter().copied().find(|v| *v != self.node_id).ok_or_else(|| invalid("there is no other voter"))?
        } else {
            to
        };
        if !voters.contains(&target) {
            return Err(invalid(format!("node {target} is not a voter")).into());
        }
        let start = Instant::now();
        if target == self.node_id {
            return Ok(Response::new(pb::TransferLeaderResponse { leader_id: target, took_ms: 0 }));
        }
        self.raft.trigger().transfer_leader(target).await.map_err(raft_err)?;
        let timeout = if timeout_ms == 0 { TRANSFER_TIMEOUT } else { Duration::from_millis(timeout_ms) };
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let m = crate::raft::metrics(&self.raft);
            if m.current_leader == Some(target) {
                break;
            }
            let changed = openraft::type_config::async_runtime::watch::WatchReceiver::changed(&mut metrics);
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let now = crate::raft::metrics(&self.raft).current_leader;
                return Err(ApiError::Unavailable(format!(
                    "node {target} did not take over within {timeout:?} (leader now: {now:?})"
                ))
                .into());
            }
        }
        Ok(Response::new(pb::TransferLeaderResponse { leader_id: target, took_ms: start.elapsed().as_millis() as u64 }))
    }

    async fn add_node(&self, req: Request<pb::AddNodeRequest>) -> Res<pb::MembershipResponse> {
        caller_with(&req, Scope::Admin)?;
        if let Some(mut c) = self.leader(&req).await? {
            return c.add_node(forwarded(req)).await;
        }
        let pb::AddNodeRequest { node_id, raft_addr, api_addr, learner_only } = req.into_inner();
        if node_id == 0 || raft_addr.is_empty() || api_addr.is_empty() {
            return Err(invalid("add-node needs a node id > 0, a raft address and an api address").into());
        }
        let node = NodeInfo { raft_addr, api_addr };
        // As a learner first: it catches up (by snapshot if the log was purged) before it counts for quorum.
        self.raft.add_learner(node_id, node, true).await.map_err(raft_err)?;
        if !learner_only {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node_id])), false)
                .await
                .map_err(raft_err)?;
        }
        Ok(Response::new(self.membership_response()))
    }

    async fn remove_node(&self, req: Request<pb::RemoveNodeRequest>) -> Res<pb::MembershipResponse> {
        caller_with(&req, Scope::Admin)?;
        if let Some(mut c) = self.leader(&req).await? {
            return c.remove_node(forwarded(req)).await;
        }
        let pb::RemoveNodeRequest { node_id: id, force } = req.into_inner();
        let m = crate::raft::metrics(&self.raft);
        let mem = m.membership_config.membership();
        if mem.get_node(&id).is_none() {
            return Err(ApiError::NotFound.into());
        }
        let voters: BTreeSet<u64> = mem.voter_ids().collect();
        if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(invalid("cannot remove the last voter").into());
            }
            if !force {
                self.check_removal_commits(&m, &voters, id)?;
            }
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                .await
                .map_err(raft_err)?;
        }
        let m = crate::raft::metrics(&self.raft);
        if m.membership_config.membership().get_node(&id).is_some() {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(raft_err)?;
        }
        Ok(Response::new(self.membership_response()))
    }

    async fn digest(&self, req: Request<pb::DigestRequest>) -> Res<pb::DigestResponse> {
        caller_with(&req, Scope::Admin)?;
        let shared = self.shared.clone();
        let (applied, digest, tasks) = tokio::task::spawn_blocking(move || shared.digest())
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok(Response::new(pb::DigestResponse { node_id: self.node_id, applied_index: applied, digest, tasks }))
    }
}

/// Waits until every listed node reports the same applied index and digest (tests and operators).
pub fn digests_agree(d: &BTreeMap<u64, pb::DigestResponse>) -> bool {
    let mut it = d.values();
    match it.next() {
        None => true,
        Some(first) => it.all(|x| x.applied_index == first.applied_index && x.digest == first.digest),
    }
}
