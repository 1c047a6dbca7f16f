//! Appends pipelined to a follower (`AppendStream`): a real node's Raft answers a leader's requests in order,
//! a session that ends lets go of openraft's requests at once, and a peer of an older build gets one at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, StreamAppendError};
use openraft::RaftNetworkV2;
use raftq::raft::network::{Network, PeerClient, QuorumGate};
use raftq::raft::types::{LogId, NodeInfo, TypeConfig};
use raftq_proto::v1 as pb;
use raftq_proto::v1::raft_service_client::RaftServiceClient;

use crate::support::{channel, wait_until, TestNode};

type Req = AppendEntriesRequest<TypeConfig>;

/// A node that leads alone, and stays a follower once it follows another leader (the only voter of a cluster
/// stands for election at its next tick): a test acts as that leader.
async fn patient_node() -> TestNode {
    let n = TestNode::start().await;
    n.node().raft.runtime_config().elect(false);
    n
}

/// The client a leader numbered `from` uses to replicate to node `target` at `addr`.
async fn peer(from: u64, target: u64, addr: String, append_timeout: Duration) -> PeerClient {
    let mut net = Network {
        node_id: from,
        credential: None,
        tls: None,
        append_timeout,
        gate: QuorumGate::new(&raftq::config::Config::default()),
        varint: Default::default(),
    };
    net.new_client(target, &NodeInfo { raft_addr: addr, api_addr: String::new() }).await
}

fn vote(term: u64, node: u64) -> raftq::raft::types::Vote {
    openraft::impls::Vote::new_committed(term, node)
}

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    openraft::LogId::new(openraft::impls::leader_id_adv::LeaderId { term, node_id: node }, index)
}

fn append(vote: raftq::raft::types::Vote, prev: Option<LogId>, entries: Vec<LogId>) -> Req {
    AppendEntriesRequest {
        vote,
        prev_log_id: prev,
        entries: entries
            .into_iter()
            .map(|log_id| raftq::raft::types::Entry { log_id, payload: openraft::EntryPayload::Blank })
            .collect(),
        leader_commit: None,
    }
}

/// Makes node 1 (leading alone) follow node 2 in a later term, as a real leader's first heartbeat would: returns
/// that term and node 1's last log id.
async fn follow_node_2(n: &TestNode, peer: &mut PeerClient) -> (u64, LogId) {
    let term = raftq::raft::metrics(&n.node().raft).current_term + 1;
    let opt = RPCOption::new(Duration::from_secs(2));
    let r = RaftNetworkV2::append_entries(peer, append(vote(term, 2), None, vec![]), opt).await.expect("heartbeat");
    assert!(r.is_success(), "{r:?}");
    let mut last = None;
    wait_until(Duration::from_secs(5), || {
        use openraft::type_config::async_runtime::watch::WatchReceiver;
        let following = raftq::raft::metrics(&n.node().raft).vote == vote(term, 2);
        // Its last entry, committed or not (a follower commits what its leader says, and the test says nothing).
        last = n.node().raft.data_metrics().borrow_watched().last_log.filter(|_| following);
        last.is_some()
    })
    .await;
    (term, last.expect("a last entry"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_appends_is_answered_in_order_and_ends_at_the_first_refusal() {
    let n = patient_node().await;
    let mut peer = peer(2, 1, n.node().raft_addr.to_string(), Duration::from_secs(2)).await;
    let (term, last) = follow_node_2(&n, &mut peer).await;
    let (e1, e2) = (log_id(term, 2, last.index + 1), log_id(term, 2, last.index + 2));
    let requests = vec![
        append(vote(term, 2), Some(last), vec![]),
        append(vote(term, 2), Some(last), vec![e1, e2]),
        // A leader of an earlier term: refused, and nothing after it is answered.
        append(vote(term - 1, 3), Some(e2), vec![]),
        append(vote(term, 2), Some(e2), vec![]),
    ];
    let answers = RaftNetworkV2::stream_append(
        &mut peer,
        futures::stream::iter(requests),
        RPCOption::new(Duration::from_secs(2)),
    )
    .await
    .expect("a stream");
    let answers: Vec<_> = answers.collect().await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0].as_ref().expect("answer"), &Ok(Some(last)));
    assert_eq!(answers[1].as_ref().expect("answer"), &Ok(Some(e2)), "both entries fsynced and matched");
    match &answers[2] {
        Ok(Err(StreamAppendError::HigherVote(v))) => assert_eq!(*v, vote(term, 2)),
        other => panic!("expected the node's higher vote, got {other:?}"),
    }
    let m = raftq::raft::metrics(&n.node().raft);
    assert_eq!(m.last_log_index, Some(e2.index), "the streamed entries are in node 1's log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_meant_for_another_node_is_refused_wrong_node() {
    let n = TestNode::start().await;
    let mut raft = RaftServiceClient::new(channel(&n.node().raft_addr.to_string()).await);
    let msg = |to| pb::RaftMessage {
        from: 2,
        to,
        data: bincode::serialize(&append(vote(1, 2), None, vec![])).expect("encode").into(),
        encoding: 0,
    };
    let answers = raft.append_stream(futures::stream::iter([msg(9), msg(9)])).await.expect("the call opens");
    let e = answers.into_inner().message().await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().starts_with("WRONG_NODE"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_to_a_peer_that_never_answers_times_out_at_the_append_timeout() {
    // The kernel accepts the connection, the process never speaks HTTP/2 (a stopped or stalled node).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut peer = peer(1, 2, silent.local_addr().expect("addr").to_string(), Duration::from_millis(300)).await;
    let requests = futures::stream::iter([append(vote(1, 1), None, vec![]), append(vote(1, 1), None, vec![])]);
    let t = Instant::now();
    let r = RaftNetworkV2::stream_append(&mut peer, requests, RPCOption::new(Duration::from_millis(50))).await;
    match r {
        Err(RPCError::Timeout(t)) => assert_eq!(t.timeout, Duration::from_millis(300)),
        Err(e) => panic!("expected a timeout, got {e:?}"),
        Ok(_) => panic!("expected a timeout, got a stream"),
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(3), "{took:?}");
}

/// openraft's requests, then none for as long as the stream lives; says when it is dropped.
fn requests_then_silence(first: Vec<Req>, dropped: Arc<AtomicBool>) -> impl futures::Stream<Item = Req> + Unpin {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Flag(dropped);
    futures::stream::iter(first).chain(futures::stream::pending().map(move |r: Req| {
        let _keep = &flag;
        r
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_lets_go_of_openrafts_requests_at_once_and_ends_its_call() {
    let n = TestNode::start().await;
    let ended = Arc::new(AtomicBool::new(false));
    let (addr, server) = serve(Peer(raft_server(&n), Fault::Hangs { answered: 2, ended: ended.clone() })).await;
    let mut peer = peer(2, 1, addr, Duration::from_secs(2)).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let first = vec![append(vote(1, 2), None, vec![]), append(vote(1, 2), None, vec![])];
    let input = requests_then_silence(first, dropped.clone());
    let mut answers =
        RaftNetworkV2::stream_append(&mut peer, input, RPCOption::new(Duration::from_secs(2))).await.expect("a stream");
    for _ in 0..2 {
        assert_eq!(answers.next().await.expect("an answer").expect("answered"), Ok(None));
    }
    // The transport still holds the request side, waiting for openraft's next request.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!dropped.load(Ordering::SeqCst), "the session is still open");
    assert!(!ended.load(Ordering::SeqCst), "the call is still open");
    // openraft leaves the session (a new payload, an error, a leader change): the requests go with it, at once,
    // not whenever the transport next polls them, and the call ends on both sides (the follower's task reading it
    // and the HTTP/2 stream are not left behind).
    drop(answers);
    assert!(dropped.load(Ordering::SeqCst), "openraft's request stream outlived its session");
    wait_until(Duration::from_secs(5), || ended.load(Ordering::SeqCst)).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_ends_the_streams_of_appends_it_serves() {
    let mut n = patient_node().await;
    let mut peer = peer(2, 1, n.node().raft_addr.to_string(), Duration::from_secs(2)).await;
    let (term, last) = follow_node_2(&n, &mut peer).await;
    let first = vec![append(vote(term, 2), Some(last), vec![]), append(vote(term, 2), Some(last), vec![])];
    let input = requests_then_silence(first, Default::default());
    let mut answers =
        RaftNetworkV2::stream_append(&mut peer, input, RPCOption::new(Duration::from_secs(2))).await.expect("a stream");
    for _ in 0..2 {
        assert_eq!(answers.next().await.expect("an answer").expect("answered"), Ok(Some(last)));
    }
    // The stream ends with the node's reason, not later when the drain gives up and closes the connection.
    let (_, answer) = tokio::join!(n.stop(), answers.next());
    match answer {
        Some(Err(RPCError::Unreachable(u))) => assert!(u.to_string().contains("stopping"), "{u}"),
        other => panic!("expected the node's refusal, got {other:?}"),
    }
}

/// A real node's Raft service, with `AppendStream` as it is in a build from before it, or hung.
struct Peer(raftq::raft::service::RaftServer<raftq::storage::StateMachine>, Fault);

enum Fault {
    /// Answers `UNIMPLEMENTED`.
    OlderBuild,
    /// Answers the first requests (as matched, with nothing to match), then reads the others and answers none
    /// (a node stalled by a pause, a full disk, a stuck fsync); sets `ended` when the leader ends its side.
    Hangs { answered: usize, ended: Arc<AtomicBool> },
}

/// The node's Raft service, as the node serves it.
fn raft_server(n: &TestNode) -> raftq::raft::service::RaftServer<raftq::storage::StateMachine> {
    raftq::raft::service::RaftServer {
        raft: n.node().raft.clone(),
        node_id: 1,
        spool_dir: n.cfg.data_dir.join("test-peer-spool"),
        contact: Default::default(),
        stopping: Default::default(),
    }
}

/// A peer on an ephemeral port, served until the handle is dropped or aborted.
async fn serve(peer: Peer) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(pb::raft_service_server::RaftServiceServer::new(peer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    (addr, server)
}

#[tonic::async_trait]
impl pb::raft_service_server::RaftService for Peer {
    type AppendStreamStream = raftq::raft::service::AppendAnswers;

    async fn vote(
        &self,
        r: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.vote(r).await
    }
    async fn pre_vote(
        &self,
        r: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.pre_vote(r).await
    }
    async fn append_entries(
        &self,
        r: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.append_entries(r).await
    }
    async fn append_stream(
        &self,
        r: tonic::Request<tonic::Streaming<pb::RaftMessage>>,
    ) -> Result<tonic::Response<Self::AppendStreamStream>, tonic::Status> {
        let (answered, ended) = match &self.1 {
            Fault::OlderBuild => return Err(tonic::Status::unimplemented("not in this build")),
            Fault::Hangs { answered, ended } => (*answered, ended.clone()),
        };
        let ok: Result<openraft::raft::StreamAppendResult<TypeConfig>, openraft::error::Fatal<TypeConfig>> =
            Ok(Ok(None));
        let ok = pb::RaftMessage { from: 1, to: 0, data: bincode::serialize(&ok).expect("encode").into(), encoding: 0 };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut incoming = r.into_inner();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok(Some(_)) = incoming.message().await {
                n += 1;
                if n <= answered {
                    let _ = tx.send(Ok(ok.clone()));
                }
            }
            ended.store(true, Ordering::SeqCst);
            // The answers stay open (a hung node answers nothing, not even the end).
            std::future::pending::<()>().await;
            drop(tx);
        });
        let answers = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        Ok(tonic::Response::new(Box::pin(answers)))
    }
    async fn transfer_leader(
        &self,
        r: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.transfer_leader(r).await
    }
    async fn install_snapshot(
        &self,
        r: tonic::Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.install_snapshot(r).await
    }
    async fn version(
        &self,
        r: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        self.0.version(r).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_an_older_build_is_sent_one_request_at_a_time() {
    let n = patient_node().await;
    let (addr, server) = serve(Peer(raft_server(&n), Fault::OlderBuild)).await;
    let mut peer = peer(2, 1, addr, Duration::from_secs(2)).await;
    let (term, last) = follow_node_2(&n, &mut peer).await;
    let e1 = log_id(term, 2, last.index + 1);
    let requests = || {
        futures::stream::iter([append(vote(term, 2), Some(last), vec![]), append(vote(term, 2), Some(last), vec![e1])])
    };
    let opt = || RPCOption::new(Duration::from_secs(2));
    match RaftNetworkV2::stream_append(&mut peer, requests(), opt()).await {
        Err(RPCError::Network(e)) => assert!(e.to_string().contains("does not serve AppendStream"), "{e}"),
        Err(e) => panic!("expected a network error, got {e:?}"),
        Ok(_) => panic!("the older build has no stream to give"),
    }
    // openraft starts the session again: now one request at a time, answered in order.
    let answers = RaftNetworkV2::stream_append(&mut peer, requests(), opt()).await.expect("one at a time");
    let answers: Vec<_> = answers.map(|a| a.expect("answered")).collect().await;
    assert_eq!(answers, vec![Ok(Some(last)), Ok(Some(e1))]);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_an_idle_session_whose_peer_stops_answering_times_out() {
    let n = TestNode::start().await;
    let hung = Fault::Hangs { answered: 2, ended: Default::default() };
    let (addr, server) = serve(Peer(raft_server(&n), hung)).await;
    let timeout = Duration::from_millis(400);
    let mut peer = peer(2, 1, addr, timeout).await;
    let req = || append(vote(1, 2), None, vec![]);
    // Two requests answered, a while with none in flight (no deadline runs), then one the peer never answers.
    let sent_at = Arc::new(std::sync::Mutex::new(None));
    let at = sent_at.clone();
    let later = futures::stream::once(Box::pin(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        *at.lock().expect("lock") = Some(Instant::now());
        req()
    }));
    let input = futures::stream::iter([req(), req()]).chain(later).chain(futures::stream::pending());
    let mut answers = RaftNetworkV2::stream_append(&mut peer, input, RPCOption::new(Duration::from_millis(50)))
        .await
        .expect("a stream");
    for _ in 0..2 {
        assert_eq!(answers.next().await.expect("an answer").expect("answered"), Ok(None));
    }
    let third =
        tokio::time::timeout(Duration::from_secs(5), answers.next()).await.expect("the unanswered request times out");
    match third {
        Some(Err(RPCError::Timeout(t))) => assert_eq!(t.timeout, timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The request's own 400 ms, counted from when it went out (600 ms after the others), not from before.
    let took = sent_at.lock().expect("lock").expect("the third request went out").elapsed();
    assert!(took >= Duration::from_millis(390) && took < Duration::from_secs(3), "{took:?}");
    assert!(answers.next().await.is_none(), "the session ends at its first error");
    server.abort();
}
