//! The Raft network client: openraft's RPCs to a peer over the internal gRPC service.
//!
//! Messages are bincode-encoded openraft types inside `RaftMessage.data`. Every request names the node id it is
//! meant for, and the peer refuses a message for another id, so a wrong address cannot join two clusters.
//! Connection failures are `Unreachable`, so openraft backs off instead of spinning. An append that runs out of
//! time is a `Timeout`, which openraft retries at once (see [`append_err`]).
//!
//! Replication to a follower is pipelined: each of openraft's replication sessions is one `AppendStream` call, on
//! which requests go out as openraft makes them and answers come back in order, each once the follower has
//! fsynced its entries (see [`PeerClient::open_stream`]). Heartbeats, probes and peers of builds from before the
//! call go one request at a time.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RPCTypes, RaftNetworkV2};
use raftq_proto::v1::raft_service_client::RaftServiceClient;
use raftq_proto::v1::{RaftMessage, SnapshotChunk};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tonic::transport::{Channel, Endpoint};

use super::types::{NodeId, NodeInfo, Snapshot, TypeConfig, Vote};

/// Largest gRPC message between peers: append batches can be large.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Snapshot chunk size: large enough to keep a transfer fast, small enough to bound memory per transfer.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

#[derive(Clone)]
pub struct Network {
    pub node_id: NodeId,
    /// The cluster credential every call to a peer carries (see `auth::cluster_credential`).
    pub credential: Option<Arc<str>>,
    /// TLS to peers, when the node speaks it.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// The shortest time an append may take before it is given up (see [`append_timeout`]).
    pub append_timeout: Duration,
    /// Holds a cut-off leader's appends (see [`QuorumGate`]).
    pub gate: QuorumGate,
    /// Requests go in [`Wire::Varint`] once set: the cluster runs [`VARINT_CLUSTER_VERSION`] (see [`follow_wire`]).
    pub varint: Arc<AtomicBool>,
}

/// The cluster version from which every member reads Raft messages in [`Wire::Varint`].
pub const VARINT_CLUSTER_VERSION: u32 = 5;

/// How a Raft message's bytes are encoded (`RaftMessage.encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// bincode with fixed-width integers: what every build sends and reads (0, the field's default).
    Fixed = 0,
    /// bincode with variable-length integers (as the stored records of format v2): 10–25 % fewer bytes for an
    /// append, less to encode, send and decode (docs/performance.md, "Smaller records").
    Varint = 1,
}

impl Wire {
    /// The encoding a message says it is in; an unknown one is refused by number.
    pub fn of(encoding: u32) -> Result<Wire, String> {
        match encoding {
            0 => Ok(Wire::Fixed),
            1 => Ok(Wire::Varint),
            n => Err(format!("raft message encoding {n} is newer than this binary reads (0 or 1)")),
        }
    }

    pub fn encode<T: Serialize>(self, v: &T) -> Result<Vec<u8>, bincode::Error> {
        use bincode::Options;
        match self {
            Wire::Fixed => bincode::serialize(v),
            Wire::Varint => crate::storage::format::varint().serialize(v),
        }
    }

    pub fn decode<T: DeserializeOwned>(self, b: &[u8]) -> Result<T, bincode::Error> {
        use bincode::Options;
        match self {
            Wire::Fixed => bincode::deserialize(b),
            Wire::Varint => crate::storage::format::varint().deserialize(b),
        }
    }
}

/// Sets `varint` once the state machine behind `shared` has applied [`VARINT_CLUSTER_VERSION`] (versions never
/// go down), checking every half second off the request path; ends then, or when the node's state machine is
/// gone. A node whose cluster version is raised sends in the new encoding within half a second; until then it
/// sends what every member reads.
pub async fn follow_wire(shared: std::sync::Weak<crate::storage::SmShared>, varint: Arc<AtomicBool>) {
    loop {
        match shared.upgrade() {
            Some(s) if s.cluster_version() >= VARINT_CLUSTER_VERSION => {
                varint.store(true, Ordering::Relaxed);
                return;
            }
            Some(_) => {}
            None => return,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

type Metrics = openraft::type_config::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>>;

/// CheckQuorum for appends. A leader that no quorum has acknowledged for a lease (the longest election timeout)
/// has its heartbeats held by openraft in alternate phases (`quorum_loss_probe_interval`, see
/// `Config::openraft`), but not its appends: a leader cut off one way (it still sends, it no longer hears the
/// others) with entries in flight would send them again after every timeout, and each would renew the followers'
/// lease, so they would never elect another leader and writes would stop for as long as the fault lasts. The gate
/// holds appends in phases of the same length, starting one lease later ([`GATE_LEASES`]): in a held phase an
/// append is not sent (it fails as unreachable, and openraft backs off and tries again), in a probe phase it is
/// sent, and an answer from a quorum opens the gate at once. Both hold at once for a phase less a lease, longer
/// than any election timeout, so the followers of a leader cut off one way elect another. Starting later lets a
/// short stall of both followers pass: the leader's appends, sent again as each times out, reach them as soon as
/// they are back, where a gate held from the first lease left them in silence and they elected a new leader
/// (docs/performance.md, "A late append is retried, not backed off"). A leader of one voter, a follower and a node
/// not yet started are never held.
#[derive(Clone)]
pub struct QuorumGate {
    metrics: Arc<OnceLock<Metrics>>,
    lease: Duration,
    phase: Duration,
}

/// The gate's lease, in leases of openraft's CheckQuorum (the longest election timeout).
const GATE_LEASES: u64 = 2;

impl QuorumGate {
    pub fn new(cfg: &crate::config::Config) -> QuorumGate {
        QuorumGate {
            metrics: Arc::default(),
            lease: Duration::from_millis(cfg.election_timeout_max_ms * GATE_LEASES),
            phase: Duration::from_millis(cfg.quorum_loss_probe_interval_ms()),
        }
    }

    /// Starts gating, with the node's Raft metrics (they name the leader and when a quorum last acknowledged it).
    pub fn attach(&self, metrics: Metrics) {
        let _ = self.metrics.set(metrics);
    }

    /// Whether an append from this node is held now.
    pub fn holds(&self) -> bool {
        use openraft::async_runtime::watch::WatchReceiver;
        let Some(rx) = self.metrics.get() else { return false };
        match super::control::hold(&rx.borrow_watched()) {
            super::control::Hold::QuorumSilent(silence) => held_phase(silence, self.lease, self.phase),
            super::control::Hold::NotLeading | super::control::Hold::Unchecked => false,
        }
    }
}

/// Whether `silence` since a quorum last acknowledged the leader falls in a held phase: past the lease, the
/// phases alternate held, sent, held..., each `phase` long.
fn held_phase(silence: Duration, lease: Duration, phase: Duration) -> bool {
    match silence.checked_sub(lease) {
        Some(past) => (past.as_millis() / phase.as_millis().max(1)).is_multiple_of(2),
        None => false,
    }
}

/// How long an append may take: openraft offers its heartbeat interval as the deadline, which a loaded machine's
/// round trip plus a follower's fsync can exceed now and then, and each miss stalls that follower's replication
/// and backs it off. An append waits at least the minimum election timeout instead: longer than any healthy
/// round trip, shorter than the silence after which a follower stands for election. Votes keep openraft's.
pub fn append_timeout(cfg: &crate::config::Config) -> Duration {
    Duration::from_millis(cfg.election_timeout_min_ms)
}

pub struct PeerClient {
    from: NodeId,
    append_timeout: Duration,
    gate: QuorumGate,
    credential: Option<Arc<str>>,
    target: NodeId,
    client: Option<RaftServiceClient<Channel>>,
    addr: String,
    varint: Arc<AtomicBool>,
    /// Whether replication sessions go over [`PeerClient::open_stream`]; cleared when the peer's build does not
    /// serve it (it answered `UNIMPLEMENTED`), and then it gets one request at a time.
    streams: bool,
}

/// Peers connect quickly or not at all: a stopped container's address does not refuse connections, and a leader
/// waiting seconds on it would let a restarting node's election timer fire first.
fn channel(addr: &str, tls: Option<&crate::tls::Tls>) -> Result<Channel, String> {
    let mut ep = Endpoint::from_shared(crate::tls::url(addr, tls.is_some())).map_err(|e| e.to_string())?;
    if let Some(t) = tls {
        ep = ep.tls_config(t.client()).map_err(|e| e.to_string())?;
    }
    Ok(ep
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .connect_lazy())
}

impl Network {
    /// The cluster version peer `target` at `raft_addr` can apply (`version.rs`): 0 for a build from before
    /// cluster versions (it does not serve the call), an error when the peer cannot be asked.
    pub async fn peer_version(&self, target: NodeId, raft_addr: &str) -> Result<u32, String> {
        let ch = channel(raft_addr, self.tls.as_deref())?;
        let peer = PeerClient {
            from: self.node_id,
            append_timeout: self.append_timeout,
            gate: self.gate.clone(),
            credential: self.credential.clone(),
            target,
            client: None,
            addr: raft_addr.to_string(),
            varint: self.varint.clone(),
            streams: true,
        };
        let mut req = tonic::Request::new(RaftMessage { from: self.node_id, to: target, ..Default::default() });
        req.set_timeout(Duration::from_secs(2));
        peer.sign(&mut req);
        match RaftServiceClient::new(ch).version(req).await {
            Ok(r) => {
                let r = r.into_inner();
                let wire = Wire::of(r.encoding).map_err(|e| format!("node {target}: {e}"))?;
                wire.decode(&r.data).map_err(|e| format!("node {target}: {e}"))
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => Ok(0),
            Err(s) => Err(format!("node {target}: {}", s.message())),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        let client = channel(&node.raft_addr, self.tls.as_deref()).ok().map(|c| {
            RaftServiceClient::new(c)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        });
        PeerClient {
            from: self.node_id,
            append_timeout: self.append_timeout,
            gate: self.gate.clone(),
            credential: self.credential.clone(),
            target,
            client,
            addr: node.raft_addr.clone(),
            varint: self.varint.clone(),
            streams: true,
        }
    }
}

fn status_err(s: tonic::Status) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&s))
}

/// Whether a call failed because its deadline passed (on this side, or on the peer's, which read it from
/// `grpc-timeout`), not because the peer could not be reached.
fn timed_out(s: &tonic::Status) -> bool {
    if s.code() == tonic::Code::DeadlineExceeded {
        return true;
    }
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// An append's failure as openraft should weigh it. One that ran out of time is a `Timeout`: the peer answered
/// the connection but not in time (a follower busy for a moment on a loaded machine), so openraft sends again at
/// once, and backs off only after a run of them. As `Unreachable` it turned on openraft's backoff at the first
/// miss, and the follower's replication stopped for 200 ms, then 400 ms at the next: with both followers missing
/// one deadline together, no entry committed for half a second. A peer that refuses or drops the connection is
/// still `Unreachable` and backed off.
fn append_err(s: tonic::Status, from: NodeId, target: NodeId, timeout: Duration) -> RPCError<TypeConfig> {
    if timed_out(&s) {
        RPCError::Timeout(Timeout { action: RPCTypes::AppendEntries, id: from, target, timeout })
    } else {
        status_err(s)
    }
}

impl PeerClient {
    fn client(&self) -> Result<RaftServiceClient<Channel>, RPCError<TypeConfig>> {
        self.client
            .clone()
            .ok_or_else(|| RPCError::Unreachable(Unreachable::from_string(format!("bad address {}", self.addr))))
    }

    /// An openraft request as a gRPC request to this peer, with openraft's deadline.
    fn request<T: Serialize>(
        &self,
        rpc: &T,
        option: &RPCOption,
    ) -> Result<tonic::Request<RaftMessage>, RPCError<TypeConfig>> {
        let msg =
            message(self.from, self.target, &self.varint, rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut req = tonic::Request::new(msg);
        req.set_timeout(option.hard_ttl());
        self.sign(&mut req);
        Ok(req)
    }

    /// Adds the cluster credential, so the peer's Raft port accepts the call.
    fn sign<T>(&self, req: &mut tonic::Request<T>) {
        if let Some(v) = self.credential.as_deref().and_then(|c| c.parse().ok()) {
            req.metadata_mut().insert(crate::auth::CLUSTER_AUTH_HEADER, v);
        }
    }

    /// Decodes a reply: the remote `Result`, whose error (the peer is shutting down) reads as unreachable.
    fn reply<T: DeserializeOwned, E: DeserializeOwned + std::fmt::Display>(
        msg: RaftMessage,
    ) -> Result<T, RPCError<TypeConfig>> {
        let wire = Wire::of(msg.encoding).map_err(|e| {
            RPCError::Network(NetworkError::new(&std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
        })?;
        let decoded = wire.decode::<Result<T, E>>(&msg.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match decoded {
            Ok(v) => Ok(v),
            Err(e) => Err(RPCError::Unreachable(Unreachable::from_string(e))),
        }
    }
}

/// An openraft value as a message from `from` to `to`, in the encoding the cluster reads now.
fn message<T: Serialize>(from: NodeId, to: NodeId, varint: &AtomicBool, v: &T) -> Result<RaftMessage, bincode::Error> {
    let wire = if varint.load(Ordering::Relaxed) { Wire::Varint } else { Wire::Fixed };
    Ok(RaftMessage { from, to, data: wire.encode(v)?.into(), encoding: wire as u32 })
}

type Request = AppendEntriesRequest<TypeConfig>;
type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// One replication session on an `AppendStream` call, shared by the request side (which the transport polls on a
/// task of its own) and the answers (which openraft reads).
struct Session {
    /// openraft's requests. Dropped as soon as the session ends on either side: openraft's request stream reads
    /// the replication state every session of this follower shares, and holds its lock while it waits for the
    /// next entries, so a request side that outlived its session would take the next session's requests, or
    /// keep it from starting.
    input: Option<BoxStream<'static, Request>>,
    /// When each request not yet answered went to the transport, oldest first.
    sent: std::collections::VecDeque<std::time::Instant>,
    /// Why the request side stopped early (the quorum gate held a request), answered as unreachable.
    failure: Option<String>,
    /// The transport's task, waiting for the next request: woken when the session ends, so that it sends the
    /// stream's end (the follower then ends its side) instead of keeping an idle HTTP/2 stream open for good.
    waker: Option<std::task::Waker>,
}

type Shared = Arc<std::sync::Mutex<Session>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ends a session's request side when dropped (with the answers, or with a call that never started).
struct EndSession(Shared);

impl Drop for EndSession {
    fn drop(&mut self) {
        let (input, waker) = {
            let mut s = lock(&self.0);
            (s.input.take(), s.waker.take())
        };
        drop(input);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The request side of a session: openraft's requests as messages, as openraft makes them.
struct Requests {
    session: Shared,
    from: NodeId,
    to: NodeId,
    varint: Arc<AtomicBool>,
    gate: QuorumGate,
    /// Wakes the answers when a request goes out to a session with none unanswered (its answer's deadline
    /// starts) or the request side stops early.
    wake: Arc<tokio::sync::Notify>,
}

impl futures::Stream for Requests {
    type Item = RaftMessage;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<RaftMessage>> {
        use std::task::Poll;
        let mut s = lock(&self.session);
        let Some(input) = s.input.as_mut() else { return Poll::Ready(None) };
        let rpc = match input.as_mut().poll_next(cx) {
            Poll::Pending => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Poll::Ready(None) => {
                s.input = None;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(rpc)) => rpc,
        };
        let failure = if self.gate.holds() {
            "no quorum has acknowledged this leader for a lease: appends are held (CheckQuorum)".to_string()
        } else {
            match message(self.from, self.to, &self.varint, &rpc) {
                Ok(m) => {
                    if s.sent.is_empty() {
                        self.wake.notify_one();
                    }
                    s.sent.push_back(std::time::Instant::now());
                    return Poll::Ready(Some(m));
                }
                Err(e) => format!("encoding an append: {e}"),
            }
        };
        s.input = None;
        s.failure = Some(failure);
        self.wake.notify_one();
        Poll::Ready(None)
    }
}

/// The answer side of a session: the follower's answers in order; ends after the first error or refusal.
struct Answers {
    answers: tonic::Streaming<RaftMessage>,
    session: Shared,
    wake: Arc<tokio::sync::Notify>,
    from: NodeId,
    target: NodeId,
    timeout: Duration,
    _end: EndSession,
}

impl Answers {
    /// The next answer, and whether the session goes on after it.
    async fn next(&mut self) -> Option<(Answer, bool)> {
        let Answers { answers, session, wake, from, target, timeout, .. } = self;
        let (from, target, timeout) = (*from, *target, *timeout);
        let message = answers.message();
        tokio::pin!(message);
        loop {
            // The oldest request unanswered sets the deadline; an idle session has none, until a request goes
            // out and wakes this loop.
            let oldest = lock(session).sent.front().copied();
            let late = async {
                match oldest {
                    Some(at) => tokio::time::sleep_until((at + timeout).into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // An answer already here is taken before its deadline is looked at: a leader busy elsewhere may
                // come back for it late, and it was not.
                biased;
                m = &mut message => return Self::answer(session, m, from, target, timeout),
                () = late => {
                    let t = Timeout { action: RPCTypes::AppendEntries, id: from, target, timeout };
                    return Some((Err(RPCError::Timeout(t)), false));
                }
                () = wake.notified() => {
                    if let Some(f) = lock(session).failure.clone() {
                        return Some((unreachable(f), false));
                    }
                }
            }
        }
    }

    /// What a message of the follower's (or the call's end) answers.
    fn answer(
        session: &Shared,
        m: Result<Option<RaftMessage>, tonic::Status>,
        from: NodeId,
        target: NodeId,
        timeout: Duration,
    ) -> Option<(Answer, bool)> {
        let msg = match m {
            Ok(Some(msg)) => msg,
            Ok(None) => {
                let s = lock(session);
                return match (&s.failure, s.sent.len()) {
                    (Some(f), _) => Some((unreachable(f.clone()), false)),
                    (None, 0) => None,
                    (None, n) => {
                        Some((unreachable(format!("the append stream ended with {n} requests unanswered")), false))
                    }
                };
            }
            Err(s) => return Some((Err(append_err(s, from, target, timeout)), false)),
        };
        lock(session).sent.pop_front();
        match PeerClient::reply::<StreamAppendResult<TypeConfig>, Fatal>(msg) {
            Ok(r) => {
                let more = r.is_ok();
                Some((Ok(r), more))
            }
            Err(e) => Some((Err(e), false)),
        }
    }
}

fn unreachable<T>(why: String) -> Result<T, RPCError<TypeConfig>> {
    Err(RPCError::Unreachable(Unreachable::from_string(why)))
}

impl PeerClient {
    /// Opens an `AppendStream` call for one replication session (see [`RaftNetworkV2::stream_append`] below).
    /// The call's setup has the append timeout, and so has each answer, counted from when its request went out;
    /// the call itself has no deadline (it lasts the session). A peer that does not serve the call is sent one
    /// request at a time from the next session on.
    async fn open_stream(
        &mut self,
        input: BoxStream<'static, Request>,
        option: &RPCOption,
    ) -> Result<BoxStream<'static, Answer>, RPCError<TypeConfig>> {
        let session: Shared = Arc::new(std::sync::Mutex::new(Session {
            input: Some(input),
            sent: Default::default(),
            failure: None,
            waker: None,
        }));
        let end = EndSession(session.clone());
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut req = tonic::Request::new(Requests {
            session: session.clone(),
            from: self.from,
            to: self.target,
            varint: self.varint.clone(),
            gate: self.gate.clone(),
            wake: wake.clone(),
        });
        self.sign(&mut req);
        let (from, target, timeout) = (self.from, self.target, option.hard_ttl().max(self.append_timeout));
        let answers = match tokio::time::timeout(timeout, self.client()?.append_stream(req)).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout { action: RPCTypes::AppendEntries, id: from, target, timeout }))
            }
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    target,
                    "the peer does not serve AppendStream (an older build): appends go one at a time"
                );
                self.streams = false;
                return Err(RPCError::Network(NetworkError::from_string(format!(
                    "node {target} does not serve AppendStream"
                ))));
            }
            Ok(Err(s)) => return Err(append_err(s, from, target, timeout)),
            Ok(Ok(r)) => r.into_inner(),
        };
        let answers = Answers { answers, session, wake, from, target, timeout, _end: end };
        Ok(Box::pin(futures::stream::unfold(Some(answers), |a| async move {
            let mut a = a?;
            let (answer, more) = a.next().await?;
            Some((answer, more.then_some(a)))
        })))
    }
}

type Fatal = openraft::error::Fatal<TypeConfig>;
type RaftErr = openraft::error::RaftError<TypeConfig>;

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = tokio::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        if self.gate.holds() {
            return Err(RPCError::Unreachable(Unreachable::from_string(
                "no quorum has acknowledged this leader for a lease: appends are held (CheckQuorum)",
            )));
        }
        let mut req = self.request(&rpc, &option)?;
        let timeout = option.hard_ttl().max(self.append_timeout);
        req.set_timeout(timeout);
        let answer = self.client()?.append_entries(req).await;
        let msg = answer.map_err(|s| append_err(s, self.from, self.target, timeout))?.into_inner();
        Self::reply::<_, RaftErr>(msg)
    }

    /// A replication session: pipelined on one `AppendStream` call, so a round's entries need not wait for the
    /// answer to the request before them (openraft's default sends one request and waits for its answer). A
    /// stream of a single request (a heartbeat, a probe) is a unary append, and so is every session to a peer
    /// that does not serve the call.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, Answer>, RPCError<TypeConfig>>>
    where
        S: futures::Stream<Item = Request> + OptionalSend + Unpin + 'static,
    {
        use futures::{FutureExt, StreamExt};
        Box::pin(async move {
            if !self.streams {
                return stream_append_sequential(self, input, option).await;
            }
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(Box::pin(futures::stream::empty()) as BoxStream<'s, Answer>);
            };
            let second = match input.next().now_or_never() {
                Some(None) => return stream_append_sequential(self, futures::stream::iter([first]), option).await,
                Some(second) => second,
                None => None,
            };
            let requests = futures::stream::iter(std::iter::once(first).chain(second)).chain(input);
            Ok(self.open_stream(Box::pin(requests), &option).await? as BoxStream<'s, Answer>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let req = self.request(&rpc, &option)?;
        Self::reply::<_, RaftErr>(self.client()?.vote(req).await.map_err(status_err)?.into_inner())
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let req = self.request(&rpc, &option)?;
        Self::reply::<_, RaftErr>(self.client()?.pre_vote(req).await.map_err(status_err)?.into_inner())
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let req = self.request(&rpc, &option)?;
        Self::reply::<_, Fatal>(self.client()?.transfer_leader(req).await.map_err(status_err)?.into_inner())
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let unreachable = |e: String| StreamingError::Unreachable(Unreachable::from_string(e));
        let meta = bincode::serialize(&(vote, snapshot.meta)).map_err(|e| unreachable(e.to_string()))?;
        let (from, to) = (self.from, self.target);
        let mut file = snapshot.snapshot;
        let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotChunk>(2);
        // Reads the file into chunks as the transfer drains them.
        let reader = tokio::spawn(async move {
            let mut meta = Some(meta);
            loop {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
                let n = file.read(&mut buf).await?;
                buf.truncate(n);
                let chunk = SnapshotChunk { from, to, meta: meta.take().unwrap_or_default().into(), data: buf.into() };
                if tx.send(chunk).await.is_err() || n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
            }
        });
        let mut client = self.client().map_err(|e| unreachable(e.to_string()))?;
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        self.sign(&mut req);
        let call = client.install_snapshot(req);
        let resp = tokio::select! {
            r = call => r.map_err(|s| unreachable(s.to_string()))?,
            closed = cancel => {
                reader.abort();
                return Err(StreamingError::Closed(closed));
            }
        };
        match reader.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(unreachable(format!("reading snapshot: {e}"))),
            Err(e) => return Err(unreachable(e.to_string())),
        }
        let msg = resp.into_inner();
        let wire = Wire::of(msg.encoding).map_err(unreachable)?;
        match wire.decode::<Result<SnapshotResponse<TypeConfig>, Fatal>>(&msg.data) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(e) => Err(StreamingError::Network(NetworkError::new(&e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_are_held_in_alternate_phases_after_the_lease() {
        let (lease, phase) = (Duration::from_millis(400), Duration::from_millis(1200));
        let held = |ms| held_phase(Duration::from_millis(ms), lease, phase);
        assert!(!held(0) && !held(399), "within the lease appends go out");
        assert!(held(400) && held(1599), "then held for a phase");
        assert!(!held(1600) && !held(2799), "then sent for a phase (a probe)");
        assert!(held(2800) && !held(4000), "and so on");
    }

    #[test]
    fn both_wire_encodings_round_trip_and_an_unknown_one_is_refused_by_number() {
        use crate::queue::{Command, Request};
        let log_id = openraft::LogId::new(openraft::impls::leader_id_adv::LeaderId { term: 3, node_id: 1 }, 4_000_000);
        let entries = (0..10)
            .map(|i| crate::raft::types::Entry {
                log_id: openraft::LogId { index: log_id.index + i, ..log_id },
                payload: openraft::EntryPayload::Normal(Request::new(
                    1_795_000_000_000,
                    log_id.index + i,
                    Command::Tick,
                )),
            })
            .collect();
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: openraft::impls::Vote::new_committed(3, 1),
            prev_log_id: Some(log_id),
            entries,
            leader_commit: Some(log_id),
        };
        let (fixed, varint) = (Wire::Fixed.encode(&rpc).expect("fixed"), Wire::Varint.encode(&rpc).expect("varint"));
        assert!(varint.len() < fixed.len(), "varint {} bytes, fixed {}", varint.len(), fixed.len());
        for (wire, bytes) in [(Wire::Fixed, &fixed), (Wire::Varint, &varint)] {
            let back: AppendEntriesRequest<TypeConfig> = wire.decode(bytes).expect("decode");
            assert_eq!(back.entries, rpc.entries);
            assert_eq!(Wire::of(wire as u32), Ok(wire), "the field's number names the encoding");
        }
        // A message of one encoding read as the other does not come back as the same value.
        let crossed: Result<AppendEntriesRequest<TypeConfig>, _> = Wire::Fixed.decode(&varint);
        assert!(crossed.map_or(true, |r| r.entries != rpc.entries));
        assert_eq!(Wire::of(0), Ok(Wire::Fixed), "what older builds send: the field's default");
        assert!(Wire::of(2).expect_err("newer").contains("encoding 2"));
    }

    async fn append_to(addr: String) -> (Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>>, Duration) {
        let mut net = Network {
            node_id: 1,
            credential: None,
            tls: None,
            append_timeout: Duration::from_millis(150),
            gate: QuorumGate::new(&crate::config::Config::default()),
            varint: Default::default(),
        };
        let mut peer = net.new_client(2, &NodeInfo { raft_addr: addr, api_addr: String::new() }).await;
        let rpc = AppendEntriesRequest {
            vote: openraft::impls::Vote::new(1, 1),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        };
        let t = std::time::Instant::now();
        let r = RaftNetworkV2::append_entries(&mut peer, rpc, RPCOption::new(Duration::from_millis(50))).await;
        (r, t.elapsed())
    }

    #[tokio::test]
    async fn an_append_that_runs_out_of_time_is_a_timeout_and_a_refused_one_is_unreachable() {
        // A peer whose kernel accepts the connection but whose process never answers (a stopped or stalled
        // node): the append gives up after the append timeout, not openraft's shorter deadline, as a timeout,
        // which openraft retries at once instead of backing off.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (r, took) = append_to(silent.local_addr().expect("addr").to_string()).await;
        match r {
            Err(RPCError::Timeout(t)) => {
                assert_eq!((t.action, t.id, t.target), (RPCTypes::AppendEntries, 1, 2));
                assert_eq!(t.timeout, Duration::from_millis(150));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(took >= Duration::from_millis(140), "waited the append timeout: {took:?}");
        // Nothing listening: the connection is refused, and that is unreachable (backed off).
        let port = silent.local_addr().expect("addr").port();
        drop(silent);
        let (r, _) = append_to(format!("127.0.0.1:{port}")).await;
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "refused: {r:?}");
    }

    /// The quiet stretches of a leader no quorum answers: openraft holds its heartbeats from one lease on, the gate
    /// its appends from two, both in phases of `quorum_loss_probe_interval`. Every stretch in which both are held
    /// must outlast the followers' longest election timeout (so a leader cut off one way is replaced), and the
    /// first must begin at the gate's lease (so a shorter stall of the followers is not made into an election).
    #[test]
    fn heartbeats_and_appends_are_both_held_long_enough_for_an_election() {
        for (max, min) in [(300, 150), (1000, 500), (400, 200)] {
            let cfg = crate::config::Config {
                election_timeout_min_ms: min,
                election_timeout_max_ms: max,
                ..crate::config::Config::default()
            };
            let gate = QuorumGate::new(&cfg);
            let (lease, phase) = (Duration::from_millis(max), gate.phase);
            assert_eq!(gate.lease, 2 * lease);
            let quiet = |ms: u64| {
                let s = Duration::from_millis(ms);
                held_phase(s, lease, phase) && held_phase(s, gate.lease, phase)
            };
            let mut runs = Vec::new();
            let mut start = None;
            for ms in 0..20 * phase.as_millis() as u64 {
                match (quiet(ms), start) {
                    (true, None) => start = Some(ms),
                    (false, Some(s)) => {
                        runs.push((s, ms - s));
                        start = None;
                    }
                    _ => {}
                }
            }
            assert!(runs.len() >= 5, "quiet stretches recur: {runs:?}");
            assert_eq!(runs[0].0, 2 * max, "nothing is quiet before the gate's lease");
            for (at, len) in runs {
                assert!(len > max, "a quiet stretch at {at} ms of {len} ms is too short for an election");
            }
        }
    }

    #[test]
    fn the_gate_holds_nothing_before_it_knows_the_node() {
        let gate = QuorumGate::new(&crate::config::Config::default());
        assert!(!gate.holds());
    }
}
