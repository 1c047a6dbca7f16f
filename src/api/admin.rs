//! The Admin service: node status, leadership transfer, membership changes, state digests, backups. Transfers,
//! membership changes and backups run on the leader (routed by `forward.rs`; a follower streams a backup from
//! the leader); status and digests answer for this node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::admin_server::Admin;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::error::{invalid, not_found, reply, ApiError};
use super::forward::{copy, forwarded, Forwarder, Kind, Plan};
use super::grpc::caller_with;
use crate::auth::Scope;
use crate::raft::control::{self, Member};
use crate::raft::types::NodeInfo;
use crate::storage::{Raft, SmShared};

/// A backup as it streams: chunks of the file, in order.
pub type ChunkStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// Bytes per backup chunk: large enough that per-message costs vanish, small enough to stay far below gRPC's
/// message limit; with [`BACKUP_CHUNKS_IN_FLIGHT`] this bounds a backup's memory on every node it passes.
const BACKUP_CHUNK_BYTES: usize = 1 << 20;
/// Chunks queued between the thread reading the shards and the stream: a slow reader stops the writer.
const BACKUP_CHUNKS_IN_FLIGHT: usize = 4;
/// How long a backup waits for this node to apply up to the leader's read index.
const BACKUP_READ_POINT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Cuts what the backup writer writes into chunks and hands them to the stream, waiting while it is full.
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Result<pb::BackupChunk, Status>>,
    buf: Vec<u8>,
    records: std::rc::Rc<std::cell::Cell<u64>>,
    applied_index: u64,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(BACKUP_CHUNK_BYTES));
        let chunk =
            pb::BackupChunk { data: data.into(), records: self.records.get(), applied_index: self.applied_index };
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the backup's reader went away"))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= BACKUP_CHUNK_BYTES {
            self.send()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

impl AdminApi {
    /// On the leader: waits for a linearizable point, takes read transactions at this node's applied point
    /// (at or after it), and streams the backup written from them by a blocking thread.
    async fn backup_local(&self) -> Result<ChunkStream, ApiError> {
        crate::leader::proposer::linearize(&self.raft, &self.shared, BACKUP_READ_POINT_TIMEOUT).await?;
        let shared = self.shared.clone();
        let source = tokio::task::spawn_blocking(move || shared.backup_source())
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(format!("cannot start a backup: {e}")))?;
        let applied_index = source.applied().map(|l| l.index).unwrap_or(0);
        let node_id = self.node_id;
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let (tx, rx) = tokio::sync::mpsc::channel(BACKUP_CHUNKS_IN_FLIGHT);
        tracing::info!(node_id, applied_index, "backup started");
        // Ends when the file is written or the stream's reader goes away (a send fails).
        tokio::task::spawn_blocking(move || {
            let records = std::rc::Rc::new(std::cell::Cell::new(0));
            let mut w = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(BACKUP_CHUNK_BYTES),
                records: records.clone(),
                applied_index,
            };
            let done = source.write(node_id, created_ms, &mut w, &mut |n| records.set(n)).and_then(|t| {
                std::io::Write::flush(&mut w)?;
                Ok(t)
            });
            match done {
                Ok(t) => tracing::info!(applied_index, records = t.records, bytes = t.body_len, "backup written"),
                Err(e) => {
                    tracing::warn!(error = %e, "backup failed");
                    let _ = tx.blocking_send(Err(Status::from(ApiError::Internal(format!("backup failed: {e}")))));
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
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

    /// A backup at a linearizable point, built on the leader; a follower passes the leader's stream on, chunk
    /// by chunk. Only opening the stream is routed: a stream that breaks ends with its error, and the caller
    /// takes the backup again.
    #[instrument(level = "debug", skip_all)]
    pub async fn backup(&self, req: Request<pb::BackupRequest>) -> Result<ChunkStream, ApiError> {
        caller_with(&req, Scope::Admin)?;
        let remote = |ch| {
            let r = forwarded(copy(&req));
            async move { AdminClient::new(ch).backup(r).await.map(|s| Box::pin(s.into_inner()) as ChunkStream) }
        };
        self.fwd.call(Plan::of(&req, Kind::Read), || self.backup_local(), remote).await
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

    type BackupStream = ChunkStream;

    async fn backup(&self, req: Request<pb::BackupRequest>) -> Res<ChunkStream> {
        reply(AdminApi::backup(self, req).await)
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
