//! The internal Raft gRPC service: receives peers' openraft RPCs and hands them to the local Raft.

use std::path::PathBuf;

use futures::StreamExt;
use openraft::storage::RaftStateMachine;
use raftq_proto::v1::raft_service_server::RaftService;
use raftq_proto::v1::{RaftMessage, SnapshotChunk};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status, Streaming};

use super::network::Wire;
use super::types::{NodeId, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// Serves peers' Raft RPCs to the local Raft, whatever its state machine (snapshots arrive as files).
pub struct RaftServer<SM: RaftStateMachine<TypeConfig, SnapshotData = tokio::fs::File>> {
    pub raft: openraft::Raft<TypeConfig, SM>,
    pub node_id: NodeId,
    /// Where incoming snapshots are spooled before install.
    pub spool_dir: PathBuf,
    /// Touched by every AppendEntries: how recently a leader was heard from.
    pub contact: super::control::Contact,
}

impl<SM: RaftStateMachine<TypeConfig, SnapshotData = tokio::fs::File>> RaftServer<SM> {
    fn check(&self, from: u64, to: u64) -> Result<(), Status> {
        if to != self.node_id {
            tracing::warn!(from, to, me = self.node_id, "refusing a raft message meant for another node");
            return Err(Status::failed_precondition(format!(
                "WRONG_NODE: this is node {}, not node {to}",
                self.node_id
            )));
        }
        Ok(())
    }

    /// A request's openraft value, and the encoding its reply goes in (the request's).
    fn decode<T: serde::de::DeserializeOwned>(&self, m: &RaftMessage) -> Result<(T, Wire), Status> {
        self.check(m.from, m.to)?;
        let wire = Wire::of(m.encoding).map_err(|e| Status::invalid_argument(format!("INVALID_ARGUMENT: {e}")))?;
        let v = wire.decode(&m.data).map_err(|e| Status::invalid_argument(format!("INVALID_ARGUMENT: {e}")))?;
        Ok((v, wire))
    }

    fn reply<T: Serialize>(&self, wire: Wire, v: &T) -> Result<Response<RaftMessage>, Status> {
        let data = wire.encode(v).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(RaftMessage { from: self.node_id, to: 0, data: data.into(), encoding: wire as u32 }))
    }
}

#[tonic::async_trait]
impl<SM: RaftStateMachine<TypeConfig, SnapshotData = tokio::fs::File>> RaftService for RaftServer<SM> {
    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (rpc, wire) = self.decode(req.get_ref())?;
        self.reply(wire, &self.raft.vote(rpc).await)
    }

    async fn pre_vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (rpc, wire) = self.decode(req.get_ref())?;
        self.reply(wire, &self.raft.pre_vote(rpc).await)
    }

    async fn append_entries(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (rpc, wire) = self.decode(req.get_ref())?;
        self.contact.touch();
        self.reply(wire, &self.raft.append_entries(rpc).await)
    }

    async fn transfer_leader(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (rpc, wire) = self.decode(req.get_ref())?;
        self.reply(wire, &self.raft.handle_transfer_leader(rpc).await)
    }

    async fn version(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let m = req.get_ref();
        self.check(m.from, m.to)?;
        self.reply(Wire::Fixed, &super::version::SUPPORTED)
    }

    async fn install_snapshot(&self, req: Request<Streaming<SnapshotChunk>>) -> Result<Response<RaftMessage>, Status> {
        let mut stream = req.into_inner();
        let io = |e: std::io::Error| Status::internal(e.to_string());
        tokio::fs::create_dir_all(&self.spool_dir).await.map_err(io)?;
        let path = self.spool_dir.join(format!("incoming-{}.snap", rand::random::<u64>()));
        let mut file = tokio::fs::File::create(&path).await.map_err(io)?;
        let mut head: Option<(Vote, SnapshotMeta)> = None;
        let result = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                self.check(chunk.from, chunk.to)?;
                if head.is_none() {
                    head = Some(
                        bincode::deserialize(&chunk.meta)
                            .map_err(|e| Status::invalid_argument(format!("INVALID_ARGUMENT: {e}")))?,
                    );
                }
                file.write_all(&chunk.data).await.map_err(io)?;
            }
            file.flush().await.map_err(io)?;
            let (vote, meta) = head.ok_or_else(|| Status::invalid_argument("INVALID_ARGUMENT: empty snapshot"))?;
            let f = tokio::fs::File::open(&path).await.map_err(io)?;
            Ok::<_, Status>(self.raft.install_full_snapshot(vote, Snapshot { meta, snapshot: f }).await)
        }
        .await;
        let _ = tokio::fs::remove_file(&path).await;
        self.reply(Wire::Fixed, &result?)
    }
}
