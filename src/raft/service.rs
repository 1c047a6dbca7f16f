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
    /// Cancelled when the node stops (after a leader has handed its leadership over): ends the leaders'
    /// `AppendStream` calls, which would otherwise hold the server's drain open.
    pub stopping: tokio_util::sync::CancellationToken,
}

impl<SM: RaftStateMachine<TypeConfig, SnapshotData = tokio::fs::File>> RaftServer<SM> {
    fn check(&self, from: u64, to: u64) -> Result<(), Status> {
        check(self.node_id, from, to)
    }

    /// A request's openraft value, and the encoding its reply goes in (the request's).
    fn decode<T: serde::de::DeserializeOwned>(&self, m: &RaftMessage) -> Result<(T, Wire), Status> {
        decode(self.node_id, m)
    }

    fn reply<T: Serialize>(&self, wire: Wire, v: &T) -> Result<Response<RaftMessage>, Status> {
        encode(self.node_id, wire, v).map(Response::new)
    }
}

/// Refuses a message meant for another node id (a wrong address must not join two clusters).
fn check(me: NodeId, from: u64, to: u64) -> Result<(), Status> {
    if to != me {
        tracing::warn!(from, to, me, "refusing a raft message meant for another node");
        return Err(Status::failed_precondition(format!("WRONG_NODE: this is node {me}, not node {to}")));
    }
    Ok(())
}

/// A message's openraft value, after [`check`], and the encoding it came in.
fn decode<T: serde::de::DeserializeOwned>(me: NodeId, m: &RaftMessage) -> Result<(T, Wire), Status> {
    check(me, m.from, m.to)?;
    let wire = Wire::of(m.encoding).map_err(|e| Status::invalid_argument(format!("INVALID_ARGUMENT: {e}")))?;
    let v = wire.decode(&m.data).map_err(|e| Status::invalid_argument(format!("INVALID_ARGUMENT: {e}")))?;
    Ok((v, wire))
}

fn encode<T: Serialize>(me: NodeId, wire: Wire, v: &T) -> Result<RaftMessage, Status> {
    let data = wire.encode(v).map_err(|e| Status::internal(e.to_string()))?;
    Ok(RaftMessage { from: me, to: 0, data: data.into(), encoding: wire as u32 })
}

/// The answers of an [`RaftService::append_stream`] call.
pub type AppendAnswers = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftMessage, Status>> + Send>>;

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

    type AppendStreamStream = AppendAnswers;

    /// A leader's replication session: each request is handed to openraft as it arrives (which writes entries in
    /// log order) and answered in order once its entries are fsynced, so the leader need not wait for one answer
    /// before sending the next request. A message that does not decode, or is meant for another node, ends the
    /// stream with its error after the answers to the requests before it; so does the node stopping
    /// (`UNAVAILABLE`).
    async fn append_stream(&self, req: Request<Streaming<RaftMessage>>) -> Result<Response<AppendAnswers>, Status> {
        let (me, contact, stopping) = (self.node_id, self.contact.clone(), self.stopping.clone());
        // The encoding of the latest request: the answers go in it (every build that streams reads both).
        let wire = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(Wire::Fixed as u32));
        let refused = std::sync::Arc::new(std::sync::Mutex::new(None::<Status>));
        let (w, r) = (wire.clone(), refused.clone());
        let requests = futures::stream::unfold(Some(req.into_inner()), move |incoming| {
            let (w, r, contact, stopping) = (w.clone(), r.clone(), contact.clone(), stopping.clone());
            async move {
                let mut incoming = incoming?;
                let next = tokio::select! {
                    m = incoming.message() => m,
                    () = stopping.cancelled() => Err(Status::unavailable("UNAVAILABLE: the node is stopping")),
                };
                let failed = match next {
                    Ok(Some(m)) => match decode::<openraft::raft::AppendEntriesRequest<TypeConfig>>(me, &m) {
                        Ok((rpc, wire)) => {
                            contact.touch();
                            w.store(wire as u32, std::sync::atomic::Ordering::Relaxed);
                            return Some((rpc, Some(incoming)));
                        }
                        Err(s) => s,
                    },
                    Ok(None) => return None,
                    Err(s) => s,
                };
                *r.lock().unwrap_or_else(|p| p.into_inner()) = Some(failed);
                None
            }
        });
        let answers = self.raft.stream_append(requests).map(move |answer| {
            let wire = Wire::of(wire.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(Wire::Fixed);
            encode(me, wire, &answer)
        });
        let refusal = futures::stream::once(async move { refused.lock().unwrap_or_else(|p| p.into_inner()).take() })
            .filter_map(|s| async move { s.map(Err) });
        Ok(Response::new(Box::pin(answers.chain(refusal))))
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
