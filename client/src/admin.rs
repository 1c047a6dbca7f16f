//! Cluster operations over the `Admin` service (they need a token with the `admin` scope): a node's status,
//! every member's, leadership transfer, membership changes, replica digests. [`Admin`] shares its
//! [`Producer`]'s connection and retry rules; per-node calls open a connection to each member.

use std::collections::HashMap;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use tonic::transport::Channel;

use crate::connection::Connector;
use crate::error::{Error, Result};
use crate::producer::{Kind, Producer};
use crate::task::duration_ms;

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// Its node id.
    pub node_id: u64,
    /// The address peers reach its Raft port at.
    pub raft_addr: String,
    /// The address clients reach its public gRPC port at.
    pub api_addr: String,
    /// A voter (else a learner).
    pub voter: bool,
}

impl Member {
    fn from_proto(m: pb::Member) -> Member {
        let pb::Member { node_id, raft_addr, api_addr, voter } = m;
        Member { node_id, raft_addr, api_addr, voter }
    }
}

/// One node's own view of the cluster (see [`Admin::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's id.
    pub node_id: u64,
    /// `LEADER`, `FOLLOWER`, `CANDIDATE`, `LEARNER` or `SHUTDOWN`.
    pub role: String,
    /// Its current term.
    pub term: u64,
    /// The leader it knows, if any.
    pub leader_id: Option<u64>,
    /// The last index in its log.
    pub last_log_index: u64,
    /// The last index applied to its state.
    pub applied_index: u64,
    /// The last index it knows committed.
    pub committed_index: u64,
    /// On the leader: how many entries each follower is behind.
    pub replication_lag: HashMap<u64, u64>,
    /// The members it knows.
    pub members: Vec<Member>,
    /// The last index in its latest snapshot.
    pub snapshot_index: u64,
    /// The last index purged from its log.
    pub purged_index: u64,
    /// The newest cluster version its binary can apply (0: a build from before cluster versions).
    pub version: u32,
    /// The cluster version in force, as it has applied it.
    pub cluster_version: u32,
}

impl NodeStatus {
    fn from_proto(s: pb::NodeStatus) -> NodeStatus {
        let pb::NodeStatus {
            node_id,
            role,
            term,
            leader_id,
            has_leader,
            last_log_index,
            applied_index,
            committed_index,
            replication_lag,
            members,
            snapshot_index,
            purged_index,
            version,
            cluster_version,
        } = s;
        NodeStatus {
            node_id,
            role,
            term,
            leader_id: has_leader.then_some(leader_id),
            last_log_index,
            applied_index,
            committed_index,
            replication_lag,
            members: members.into_iter().map(Member::from_proto).collect(),
            snapshot_index,
            purged_index,
            version,
            cluster_version,
        }
    }
}

/// A member with its own status, or why it could not be asked (see [`Admin::cluster_status`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct MemberStatus {
    /// The member, as the node first asked knows it.
    pub member: Member,
    /// Its status, asked from it directly.
    pub status: Result<NodeStatus>,
}

/// A digest of a node's applied state (see [`Admin::digests`]): replicas at the same applied index must have
/// the same digest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Digest {
    /// The node's id.
    pub node_id: u64,
    /// The index the digest is at.
    pub applied_index: u64,
    /// The digest of the state.
    pub digest: u64,
    /// Tasks in the state.
    pub tasks: u64,
}

impl Digest {
    fn from_proto(d: pb::DigestResponse) -> Digest {
        let pb::DigestResponse { node_id, applied_index, digest, tasks } = d;
        Digest { node_id, applied_index, digest, tasks }
    }
}

/// A finished leadership transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transfer {
    /// The node that leads now.
    pub leader_id: u64,
    /// How long the transfer took.
    pub took: Duration,
}

fn admin(ch: Channel) -> AdminClient<Channel> {
    AdminClient::new(ch)
}

/// One piece of a backup file (see [`Admin::backup`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackupChunk {
    /// The file's next bytes.
    pub data: bytes::Bytes,
    /// Records written so far.
    pub records: u64,
    /// The applied index the backup is taken at.
    pub applied_index: u64,
}

/// A backup as it streams from the server.
#[derive(Debug)]
pub struct BackupStream {
    inner: tonic::Streaming<pb::BackupChunk>,
}

impl BackupStream {
    /// The next chunk; `None` once the server has sent the whole file.
    pub async fn next(&mut self) -> Result<Option<BackupChunk>> {
        match self.inner.message().await {
            Ok(Some(pb::BackupChunk { data, records, applied_index })) => {
                Ok(Some(BackupChunk { data, records, applied_index }))
            }
            Ok(None) => Ok(None),
            Err(s) => Err(Error::from_status(s, false)),
        }
    }
}

/// Cluster operations; from [`Producer::admin`].
#[derive(Debug, Clone)]
pub struct Admin {
    producer: Producer,
}

impl Producer {
    /// Cluster operations on this producer's connection (the token needs the `admin` scope).
    pub fn admin(&self) -> Admin {
        Admin { producer: Producer { inner: self.inner.clone(), stale: false } }
    }
}

impl Admin {
    /// The status of the node this client is connected to (the first reachable address, or the leader
    /// after a redirect).
    pub async fn status(&self) -> Result<NodeStatus> {
        let s = self
            .producer
            .call_on(Kind::Read, Duration::ZERO, admin, |mut c, conn| {
                let req = conn.request(pb::NodeStatusRequest {});
                async move { c.status(req).await }
            })
            .await?;
        Ok(NodeStatus::from_proto(s))
    }

    /// Every member the connected node knows, each with the status it reports itself (asked at its
    /// `api_addr`, all at once); a member that cannot be reached carries the error.
    pub async fn cluster_status(&self) -> Result<Vec<MemberStatus>> {
        let members = self.status().await?.members;
        let asked = members.iter().map(|m| async move {
            let s = self
                .on_node(&m.api_addr, |mut c, conn| {
                    let req = conn.request(pb::NodeStatusRequest {});
                    async move { c.status(req).await }
                })
                .await;
            s.map(NodeStatus::from_proto)
        });
        let statuses = futures::future::join_all(asked).await;
        Ok(members.into_iter().zip(statuses).map(|(member, status)| MemberStatus { member, status }).collect())
    }

    /// Each member's digest of its applied state, asked at its `api_addr` (all at once); a member that cannot
    /// be reached carries the error.
    pub async fn digests(&self) -> Result<Vec<(Member, Result<Digest>)>> {
        let members = self.status().await?.members;
        let asked = members.iter().map(|m| async move {
            let d = self
                .on_node(&m.api_addr, |mut c, conn| {
                    let req = conn.request(pb::DigestRequest {});
                    async move { c.digest(req).await }
                })
                .await;
            d.map(Digest::from_proto)
        });
        let digests = futures::future::join_all(asked).await;
        Ok(members.into_iter().zip(digests).collect())
    }

    /// Moves the leadership to node `to` (`None`: any other voter) and returns once it leads, or fails after
    /// `timeout` (zero: the server's default).
    pub async fn transfer_leader(&self, to: Option<u64>, timeout: Duration) -> Result<Transfer> {
        let req = pb::TransferLeaderRequest { to: to.unwrap_or(0), timeout_ms: duration_ms(timeout) };
        let r = self
            .producer
            .call_on(Kind::Write, timeout, admin, |mut c, conn| {
                let req = conn.request(req);
                async move { c.transfer_leader(req).await }
            })
            .await?;
        Ok(Transfer { leader_id: r.leader_id, took: Duration::from_millis(r.took_ms) })
    }

    /// Adds a node: it joins as a learner, catches up, then becomes a voter (unless `learner_only`). Returns
    /// the members after the change.
    pub async fn add_node(
        &self,
        node_id: u64,
        raft_addr: &str,
        api_addr: &str,
        learner_only: bool,
    ) -> Result<Vec<Member>> {
        let req = pb::AddNodeRequest {
            node_id,
            raft_addr: raft_addr.to_string(),
            api_addr: api_addr.to_string(),
            learner_only,
        };
        let r = self
            .producer
            .call_on(Kind::Write, Duration::ZERO, admin, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.add_node(req).await }
            })
            .await?;
        Ok(r.members.into_iter().map(Member::from_proto).collect())
    }

    /// Removes a node. Refused (`MEMBERSHIP_UNSAFE`) while too few other voters answer the leader for the
    /// change to be sure to commit, unless `force`. Returns the members after the change.
    pub async fn remove_node(&self, node_id: u64, force: bool) -> Result<Vec<Member>> {
        let req = pb::RemoveNodeRequest { node_id, force };
        let r = self
            .producer
            .call_on(Kind::Write, Duration::ZERO, admin, |mut c, conn| {
                let req = conn.request(req);
                async move { c.remove_node(req).await }
            })
            .await?;
        Ok(r.members.into_iter().map(Member::from_proto).collect())
    }

    /// A backup of the cluster's state at a linearizable point, as the backup file's chunks in order (any
    /// node serves it; a follower streams it from the leader). Only opening the stream is retried: a stream
    /// that breaks ends with its error, and the backup is taken again.
    pub async fn backup(&self) -> Result<BackupStream> {
        let s = self
            .producer
            .call_on(Kind::Read, Duration::ZERO, admin, |mut c, conn| {
                let req = conn.request(pb::BackupRequest {});
                async move { c.backup(req).await }
            })
            .await?;
        Ok(BackupStream { inner: s })
    }

    /// One call to the node at `addr` itself (no leader following, no retry), with this client's token and
    /// CA, within the request timeout.
    async fn on_node<T, F, Fut>(&self, addr: &str, f: F) -> Result<T>
    where
        F: FnOnce(AdminClient<Channel>, &Connector) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let cfg = &self.producer.inner.cfg;
        let conn =
            Connector::new(&[addr.to_string()], cfg.token.as_deref(), cfg.tls_ca_pem.as_deref(), cfg.connect_timeout)?
                .with_provider(cfg.token_provider.clone());
        let (_, ch) = conn.channel().await?;
        match tokio::time::timeout(cfg.request_timeout, f(AdminClient::new(ch), &conn)).await {
            Ok(r) => r.map(tonic::Response::into_inner).map_err(|s| Error::from_status(s, false)),
            Err(_) => Err(Error::Transport {
                message: format!("no answer from {addr} within {:?}", cfg.request_timeout),
                source: None,
            }),
        }
    }
}
