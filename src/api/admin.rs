//! The Admin service: node status, leadership transfer, membership changes, state digests. Transfers and
//! membership changes run on the leader (routed by `forward.rs`); status and digests answer for this node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::admin_server::Admin;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::error::{invalid, not_found, reply, ApiError};
use super::forward::{Forwarder, Kind};
use super::grpc::caller_with;
use crate::auth::Scope;
use crate::raft::control::{self, Member};
use crate::raft::types::NodeInfo;
use crate::storage::{Raft, SmShared};

/// Longest a leadership transfer is waited for when the request gives no timeout.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest another member's status is waited for in a cluster view: an unreachable node must not hold the
/// answer about the reachable ones (the console polls it every few seconds).
const MEMBER_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

pub struct AdminApi {
    pub raft: Raft,
    pub shared: Arc<SmShared>,
    pub fwd: Arc<Forwarder>,
    pub node_id: u64,
    /// Asks a joining node which cluster version its binary applies.
    pub peers: crate::raft::network::Network,
}

type Res<T> = Result<Response<T>, Status>;

/// One member of the cluster view and what it answered about itself.
pub struct MemberStatus {
    pub member: pb::Member,
    pub status: Result<pb::NodeStatus, ApiError>,
}

fn members(m: &[Member]) -> Vec<pb::Member> {
    m.iter()
        .map(|m| pb::Member {
            node_id: m.node_id,
            raft_addr: m.raft_addr.clone(),
            api_addr: m.api_addr.clone(),
            voter: m.voter,
        })
        .collect()
}

impl AdminApi {
    fn membership_response(&self) -> pb::MembershipResponse {
        pb::MembershipResponse { members: members(&control::status(&self.raft).members) }
    }

    async fn transfer_local(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<pb::TransferLeaderResponse, ApiError> {
        let pb::TransferLeaderRequest { to, timeout_ms } = req.into_inner();
        let voters: Vec<u64> =
            control::status(&self.raft).members.iter().filter(|m| m.voter).map(|m| m.node_id).collect();
        let target = if to == 0 {
            voters.iter().copied().find(|v| *v != self.node_id).ok_or_else(|| invalid("there is no other voter"))?
        } else {
            to
        };
        if !voters.contains(&target) {
            return Err(invalid(format!("node {target} is not a voter")));
        }
        let start = Instant::now();
        if target == self.node_id {
            return Ok(pb::TransferLeaderResponse { leader_id: target, took_ms: 0 });
        }
        control::transfer_leader(&self.raft, target).await?;
        let timeout = if timeout_ms == 0 { TRANSFER_TIMEOUT } else { Duration::from_millis(timeout_ms) };
        control::wait_leader(&self.raft, target, timeout).await.map_err(|now| {
            ApiError::Unavailable(format!("node {target} did not take over within {timeout:?} (leader now: {now:?})"))
        })?;
        Ok(pb::TransferLeaderResponse { leader_id: target, took_ms: start.elapsed().as_millis() as u64 })
    }

    async fn add_node_local(&self, req: Request<pb::AddNodeRequest>) -> Result<pb::MembershipResponse, ApiError> {
        let pb::AddNodeRequest { node_id, raft_addr, api_addr, learner_only } = req.into_inner();
        if node_id == 0 || raft_addr.is_empty() || api_addr.is_empty() {
            return Err(invalid("add-node needs a node id > 0, a raft address and an api address"));
        }
        // After a cluster version switch, a node of an older binary could not apply the log: refused up front.
        let active = self.shared.cluster_version();
        if active > 0 {
            if let Ok(version) = self.peers.peer_version(node_id, &raft_addr).await {
                if version < active {
                    return Err(ApiError::MembershipUnsafe(format!(
                        "node {node_id} runs a binary of cluster version {version} and the cluster runs at version \
                         {active}: it could not apply the log; upgrade it first"
                    )));
                }
            }
        }
        control::add_node(&self.raft, node_id, NodeInfo { raft_addr, api_addr }, learner_only).await?;
        Ok(self.membership_response())
    }

    async fn remove_node_local(&self, req: Request<pb::RemoveNodeRequest>) -> Result<pb::MembershipResponse, ApiError> {
        let pb::RemoveNodeRequest { node_id: id, force } = req.into_inner();
        let now = control::status(&self.raft);
        let Some(member) = now.members.iter().find(|m| m.node_id == id) else { return Err(not_found("node")) };
        if member.voter && now.members.iter().filter(|m| m.voter).count() == 1 {
            return Err(invalid("cannot remove the last voter"));
        }
        control::remove_node(&self.raft, id, force).await?;
        Ok(self.membership_response())
    }
}

/// The Admin operations, as gRPC (below) and REST call them.
impl AdminApi {
    #[instrument(level = "debug", skip_all)]
    pub async fn status(&self, req: Request<pb::NodeStatusRequest>) -> Result<pb::NodeStatus, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let s = control::status(&self.raft);
        Ok(pb::NodeStatus {
            node_id: s.node_id,
            role: s.role.name().to_string(),
            term: s.term,
            leader_id: s.leader.unwrap_or(0),
            has_leader: s.leader.is_some(),
            last_log_index: s.last_log_index,
            // Raft's metrics learn of an apply after its callers were answered: the state machine's own index
            // is never behind what a client has already seen applied.
            applied_index: s.applied_index.max(*self.shared.applied.borrow()),
            committed_index: s.committed_index,
            replication_lag: s.replication.iter().map(|(id, m)| (*id, s.last_log_index.saturating_sub(*m))).collect(),
            members: members(&s.members),
            snapshot_index: s.snapshot_index,
            purged_index: s.purged_index,
            version: crate::raft::version::SUPPORTED,
            cluster_version: self.shared.cluster_version(),
        })
    }

    /// The leader changing is the transfer's success: routed as a transfer, never abandoned for it.
    #[instrument(level = "debug", skip_all, fields(to = req.get_ref().to))]
    pub async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<pb::TransferLeaderResponse, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let remote = |ch, r| async move { AdminClient::new(ch).transfer_leader(r).await };
        self.fwd.unary(req, Kind::Transfer, |r| self.transfer_local(r), remote).await
    }

    /// Every member with the status it reports itself, asked at its public address with the caller's token
    /// (this node answers for itself); a member that does not answer in time carries the error.
    #[instrument(level = "debug", skip_all)]
    pub async fn cluster(&self, req: Request<pb::NodeStatusRequest>) -> Result<Vec<MemberStatus>, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let md = req.metadata().clone();
        let own = self.status(req).await?;
        let asked = own.members.clone().into_iter().map(|m| {
            let (md, own) = (md.clone(), own.clone());
            async move {
                if m.node_id == self.node_id {
                    return MemberStatus { member: m, status: Ok(own) };
                }
                let status = async {
                    let ch = self.fwd.channel(&m.api_addr)?;
                    let r = Request::from_parts(md, Default::default(), pb::NodeStatusRequest {});
                    match tokio::time::timeout(MEMBER_STATUS_TIMEOUT, AdminClient::new(ch).status(r)).await {
                        Ok(Ok(s)) => Ok(s.into_inner()),
                        Ok(Err(s)) => Err(ApiError::from_status(&s)
                            .unwrap_or_else(|| ApiError::Unavailable(format!("unreachable: {}", s.message())))),
                        Err(_) => Err(ApiError::Unavailable(format!("no answer within {MEMBER_STATUS_TIMEOUT:?}"))),
                    }
                };
                let status = status.await;
                MemberStatus { member: m, status }
            }
        });
        Ok(futures::future::join_all(asked).await)
    }

    #[instrument(level = "debug", skip_all, fields(node_id = req.get_ref().node_id))]
    pub async fn add_node(&self, req: Request<pb::AddNodeRequest>) -> Result<pb::MembershipResponse, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let remote = |ch, r| async move { AdminClient::new(ch).add_node(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.add_node_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(node_id = req.get_ref().node_id))]
    pub async fn remove_node(&self, req: Request<pb::RemoveNodeRequest>) -> Result<pb::MembershipResponse, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let remote = |ch, r| async move { AdminClient::new(ch).remove_node(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.remove_node_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all)]
    pub async fn digest(&self, req: Request<pb::DigestRequest>) -> Result<pb::DigestResponse, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let shared = self.shared.clone();
        let (applied, digest, tasks) = tokio::task::spawn_blocking(move || shared.digest())
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok(pb::DigestResponse { node_id: self.node_id, applied_index: applied, digest, tasks })
    }
}

/// gRPC: each method is the operation of the same name above.
#[tonic::async_trait]
impl Admin for AdminApi {
    async fn status(&self, req: Request<pb::NodeStatusRequest>) -> Res<pb::NodeStatus> {
        reply(AdminApi::status(self, req).await)
    }

    async fn transfer_leader(&self, req: Request<pb::TransferLeaderRequest>) -> Res<pb::TransferLeaderResponse> {
        reply(AdminApi::transfer_leader(self, req).await)
    }

    async fn add_node(&self, req: Request<pb::AddNodeRequest>) -> Res<pb::MembershipResponse> {
        reply(AdminApi::add_node(self, req).await)
    }

    async fn remove_node(&self, req: Request<pb::RemoveNodeRequest>) -> Res<pb::MembershipResponse> {
        reply(AdminApi::remove_node(self, req).await)
    }

    async fn digest(&self, req: Request<pb::DigestRequest>) -> Res<pb::DigestResponse> {
        reply(AdminApi::digest(self, req).await)
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
