//! The one place that wires the layers together: storage, Raft, the proposer, the servers, leader-only work;
//! and the order in which a node stops (`Node::stop`, with the pieces in `shutdown.rs`).

mod shutdown;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::shutdown::{hand_over, Connections, Tracked, TrackedListener};
use crate::api;
use crate::config::Config;
use crate::leader::dispatcher::Dispatcher;
use crate::leader::proposer::Proposer;
use crate::leader::{self, Leadership};
use crate::raft::network::{Network, MAX_RAFT_MESSAGE_BYTES};
use crate::raft::service::RaftServer;
use crate::raft::types::NodeInfo;
use crate::storage::log_store::LogStats;
use crate::storage::{files, Raft, SmShared};

/// Largest public gRPC message: a batch of max-size payloads.
const MAX_API_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

// The shutdown sequence and its time limits: at most about 5.5 s from the request to the files closed, whatever
// is in flight, well within the grace an orchestrator gives (Compose and Kubernetes: 30 s) before SIGKILL.
/// A stopping leader waits this long for the voter it hands the leadership to (a transfer takes tens of ms; a
/// lagging target first catches up on the log).
const HANDOVER_WAIT: Duration = Duration::from_millis(1500);
/// Streams, long polls and calls in flight get this long to end once the servers stop accepting; a stream ends
/// at once, most calls answer within it.
const DRAIN_WAIT: Duration = Duration::from_millis(1500);
/// After the drain, the connections still open are closed; their tasks get this long to notice.
const SEVERED_WAIT: Duration = Duration::from_millis(500);
/// Raft's own shutdown (core, replication and storage workers).
const RAFT_STOP_WAIT: Duration = Duration::from_secs(1);
/// The stores close when the last task holding them is gone.
const FILES_CLOSE_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("raft: {0}")]
    Raft(String),
}

/// The node's sockets, bound before start so tests can use port 0 and read the real addresses.
pub struct Listeners {
    pub grpc: TcpListener,
    pub raft: TcpListener,
    pub http: TcpListener,
}

impl Listeners {
    pub async fn bind(cfg: &Config) -> io::Result<Listeners> {
        let bind = |a: &str| {
            let a = a.to_string();
            async move { TcpListener::bind(&a).await.map_err(|e| io::Error::new(e.kind(), format!("cannot bind {a}: {e}"))) }
        };
        Ok(Listeners {
            grpc: bind(&cfg.grpc_addr).await?,
            raft: bind(&cfg.raft_addr).await?,
            http: bind(&cfg.http_addr).await?,
        })
    }
}

pub struct Node {
    pub raft: Raft,
    pub proposer: Arc<Proposer>,
    pub shared: Arc<SmShared>,
    pub log_stats: Arc<LogStats>,
    /// Producer flow control on this node (`leader::flow`).
    pub flow: Arc<crate::leader::flow::Flow>,
    pub grpc_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The caller's request to stop: `run_until_shutdown` waits for it, then runs `stop`.
    pub shutdown: CancellationToken,
    /// The node's own token, cancelled by `stop` after a leader handed its leadership over: servers, streams
    /// and leader-only work end on it.
    stopping: CancellationToken,
    node_id: u64,
    conns: Arc<Connections>,
    tasks: TaskTracker,
    leader_watch: openraft::WatchChangeHandle<crate::raft::types::TypeConfig>,
    /// Dropped once the files are closed: `stop` waits for both, so a restart can reopen them.
    files: (std::sync::Weak<redb::Database>, std::sync::Weak<()>),
}

impl Node {
    /// Starts a node on bound listeners; `requested` asks it to stop (see `run_until_shutdown`).
    pub async fn start(cfg: Config, listeners: Listeners, requested: CancellationToken) -> Result<Node, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let webhook_key = cfg.webhook_key()?;
        let raft_cfg = Arc::new(cfg.openraft().map_err(|e| StartError::Config(vec![e]))?);
        let grpc_addr = listeners.grpc.local_addr()?;
        let raft_addr = listeners.raft.local_addr()?;
        let http_addr = listeners.http.local_addr()?;
        // With port 0 the configured address is not the real one: advertise what was bound.
        let mut cfg = cfg;
        if cfg.advertise_raft_addr.is_none() {
            cfg.advertise_raft_addr = Some(raft_addr.to_string());
        }
        if cfg.advertise_grpc_addr.is_none() {
            cfg.advertise_grpc_addr = Some(grpc_addr.to_string());
        }
        let cfg = Arc::new(cfg);

        let (log, sm) = crate::storage::open_data_dir(&cfg.data_dir, cfg.shards)?;
        let log_stats = log.stats.clone();
        let log_closed = log.closed_watch();
        let shared = sm.shared.clone();
        let cluster_credential = crate::auth::cluster_secret(&cfg)
            .map_err(|e| StartError::Config(vec![e]))?
            .map(|s| crate::auth::cluster_credential(&s));
        let tls = crate::tls::Tls::from_config(&cfg).map_err(|e| StartError::Config(vec![e]))?;
        let network = Network {
            node_id: cfg.node_id,
            credential: cluster_credential.as_deref().map(Arc::from),
            tls: tls.clone(),
            append_timeout: crate::raft::network::append_timeout(&cfg),
            gate: crate::raft::network::QuorumGate::new(&cfg),
            varint: Default::default(),
        };
        tokio::spawn(crate::raft::network::follow_wire(Arc::downgrade(&shared), network.varint.clone()));
        let peers = network.clone();
        let raft =
            Raft::new(cfg.node_id, raft_cfg, network, log, sm).await.map_err(|e| StartError::Raft(e.to_string()))?;
        peers.gate.attach(raft.metrics());

        let me = NodeInfo { raft_addr: cfg.public_raft_addr(), api_addr: cfg.public_grpc_addr() };
        if cfg.bootstraps() && !raft.is_initialized().await.map_err(|e| StartError::Raft(e.to_string()))? {
            let mut members = BTreeMap::from([(cfg.node_id, me)]);
            for p in &cfg.peers {
                if p.id != cfg.node_id {
                    members.insert(p.id, NodeInfo { raft_addr: p.raft_addr.clone(), api_addr: p.api_addr.clone() });
                }
            }
            tracing::info!(node_id = cfg.node_id, members = ?members.keys().collect::<Vec<_>>(), "initialising the cluster");
            raft.initialize(members).await.map_err(|e| StartError::Raft(e.to_string()))?;
        }

        let tasks = TaskTracker::new();
        // Everything the node runs stops on its own token, which `stop` cancels after the leadership handover:
        // until then the node serves as before.
        let shutdown = CancellationToken::new();
        let conns = Connections::new();
        // Leader-only work (`crate::leader`) follows openraft's leader-change callback; everything it needs is
        // replicated state, so a new leader serves at once.
        let (leadership, leader_watch) = Leadership::follow(&raft, shutdown.clone());
        let flow = crate::leader::flow::Flow::new(cfg.flow_backlog, Duration::from_millis(cfg.flow_max_wait_ms));
        let (handoff, handoff_rx) = crate::leader::dispatcher::handoff();
        let proposer =
            Proposer::new(raft.clone(), shared.clone(), cfg.clone(), flow.clone(), handoff, &tasks, &shutdown);
        let auth = Arc::new(crate::auth::Authenticator::from_config(&cfg).map_err(|e| StartError::Config(vec![e]))?);
        let limits = Arc::new(api::limits::Limits::new(&cfg));

        let contact = crate::raft::control::Contact::default();
        let raft_svc = raftq_proto::v1::raft_service_server::RaftServiceServer::new(RaftServer {
            raft: raft.clone(),
            node_id: cfg.node_id,
            spool_dir: files::snap_dir(&cfg.data_dir),
            contact: contact.clone(),
            stopping: shutdown.clone(),
        })
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        let raft_svc = tonic::service::interceptor::InterceptedService::new(raft_svc, peer_check(cluster_credential));
        let tls_err = |e: tonic::transport::Error| StartError::Config(vec![format!("tls: {e}")]);
        let mut raft_server = api::http2::raft(tonic::transport::Server::builder());
        let mut api_server = api::http2::public(tonic::transport::Server::builder());
        if let Some(t) = &tls {
            raft_server = raft_server.tls_config(t.raft_server()).map_err(tls_err)?;
            api_server = api_server.tls_config(t.public_server()).map_err(tls_err)?;
        }
        let (token, incoming) = (shutdown.clone(), accepted(listeners.raft, conns.clone()));
        tasks.spawn(async move {
            let r = raft_server.add_service(raft_svc).serve_with_incoming_shutdown(incoming, token.cancelled()).await;
            if let Err(e) = r {
                tracing::error!(error = %e, "raft server failed");
            }
        });

        let dispatcher = Dispatcher::spawn(
            raft.clone(),
            shared.clone(),
            leadership.clone(),
            cfg.max_items_per_entry,
            Duration::from_millis(cfg.write_timeout_ms),
            flow.clone(),
            handoff_rx,
            &tasks,
        );
        let fwd = Arc::new(api::forward::Forwarder::new(raft.clone(), cfg.node_id, tls.clone(), contact));
        let task_api = Arc::new(api::grpc::TaskApi {
            proposer: proposer.clone(),
            dispatcher: dispatcher.clone(),
            fwd: fwd.clone(),
            auth: auth.clone(),
            limits: limits.clone(),
        });
        let task_svc = raftq_proto::v1::task_service_server::TaskServiceServer::from_arc(task_api.clone())
            .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
        let task_svc =
            tonic::service::interceptor::InterceptedService::new(task_svc, api::grpc::interceptor(auth.clone()));
        let jobs_api = Arc::new(api::jobs::JobsApi {
            proposer: proposer.clone(),
            dispatcher: dispatcher.clone(),
            fwd: fwd.clone(),
        });
        let jobs_svc = raftq_proto::v1::jobs_server::JobsServer::from_arc(jobs_api.clone())
            .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
        let jobs_svc =
            tonic::service::interceptor::InterceptedService::new(jobs_svc, api::grpc::interceptor(auth.clone()));
        let leases = api::revoke::LeaseWatch::new();
        tasks.spawn(leases.clone().run(shared.clone(), shutdown.clone()));
        let streams = api::stream::StreamApi {
            proposer: proposer.clone(),
            dispatcher: dispatcher.clone(),
            fwd: fwd.clone(),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            auth: auth.clone(),
            limits,
            leases,
            redirect: false,
        };
        let worker_svc = raftq_proto::v1::worker_stream_server::WorkerStreamServer::new(streams.clone())
            .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
        let producer_svc = raftq_proto::v1::producer_stream_server::ProducerStreamServer::new(streams)
            .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
        let admin_api = Arc::new(api::admin::AdminApi {
            raft: raft.clone(),
            shared: shared.clone(),
            fwd: fwd.clone(),
            node_id: cfg.node_id,
            peers: peers.clone(),
        });
        let admin_svc = raftq_proto::v1::admin_server::AdminServer::from_arc(admin_api.clone());
        let admin_svc = tonic::service::interceptor::InterceptedService::new(admin_svc, api::grpc::interceptor(auth));
        // The standard gRPC health service (ready by the /readyz rule) and reflection, on the public port.
        let (health, health_svc) = tonic_health::server::health_reporter();
        let (reflection, reflection_v1alpha) = api::discovery::reflection().map_err(StartError::Raft)?;
        tasks.spawn(health_loop(raft.clone(), fwd.clone(), health, shutdown.clone()));
        let (token, incoming) = (shutdown.clone(), accepted(listeners.grpc, conns.clone()));
        tasks.spawn(async move {
            let r = api_server
                .add_service(health_svc)
                .add_service(reflection)
                .add_service(reflection_v1alpha)
                .add_service(task_svc)
                .add_service(admin_svc)
                .add_service(worker_svc)
                .add_service(producer_svc)
                .add_service(jobs_svc)
                .serve_with_incoming_shutdown(incoming, token.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "grpc server failed");
            }
        });

        let rest = api::rest::Rest { tasks: task_api, admin: admin_api, jobs: jobs_api };
        let router = api::http::router(proposer.clone(), log_stats.clone(), rest);
        let token = shutdown.clone();
        match &tls {
            Some(t) => {
                let acceptor = t.http_acceptor().map_err(|e| StartError::Config(vec![e]))?;
                tasks.spawn(crate::tls::serve_http(listeners.http, acceptor, router, token));
            }
            None => {
                let listener = TrackedListener { listener: listeners.http, conns: conns.clone() };
                tasks.spawn(async move {
                    let r = axum::serve(listener, router).with_graceful_shutdown(token.cancelled_owned()).await;
                    if let Err(e) = r {
                        tracing::error!(error = %e, "http server failed");
                    }
                });
            }
        }

        leader::spawn(&proposer, &cfg, webhook_key, &leadership, &tasks);
        let p = proposer.clone();
        tasks.spawn(leadership.clone().while_leading(move || leader::versions::lead(p.clone(), peers.clone())));

        tracing::info!(
            node_id = cfg.node_id,
            grpc = %grpc_addr,
            raft = %raft_addr,
            http = %http_addr,
            data_dir = %cfg.data_dir.display(),
            shards = shared.read().count(),
            "raftq node started"
        );
        let files = (log_closed, shared.closed_watch());
        Ok(Node {
            raft,
            proposer,
            shared,
            log_stats,
            flow,
            grpc_addr,
            raft_addr,
            http_addr,
            shutdown: requested,
            stopping: shutdown,
            node_id: cfg.node_id,
            conns,
            tasks,
            leader_watch,
            files,
        })
    }

    /// Waits for the caller's request to stop, then stops (`stop`).
    pub async fn run_until_shutdown(self) {
        self.shutdown.cancelled().await;
        self.stop().await;
    }

    /// Stops in order, each step under a time limit (see the constants above): a leader hands its leadership
    /// to an up-to-date voter; the servers stop accepting and streams, long polls and leader-only work end;
    /// connections still open after the drain are closed; Raft stops; the stores close.
    pub async fn stop(self) {
        let Node { raft, proposer, shared, shutdown, stopping, node_id, conns, tasks, files, mut leader_watch, .. } =
            self;
        shutdown.cancel();
        let began = tokio::time::Instant::now();
        if let Some(leader) = hand_over(&raft, node_id, HANDOVER_WAIT).await {
            tracing::info!(node_id, leader, took_ms = began.elapsed().as_millis() as u64, "leadership handed over");
        }
        stopping.cancel();
        leader_watch.close().await;
        tasks.close();
        if tokio::time::timeout(DRAIN_WAIT, tasks.wait()).await.is_err() {
            let closed = conns.sever();
            tracing::info!(connections = closed, "calls still open after {DRAIN_WAIT:?}: connections closed");
            if tokio::time::timeout(SEVERED_WAIT, tasks.wait()).await.is_err() {
                tracing::warn!("some tasks did not stop after their connections were closed");
            }
        }
        match tokio::time::timeout(RAFT_STOP_WAIT, raft.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown"),
            Err(_) => tracing::warn!("raft did not stop within {RAFT_STOP_WAIT:?}"),
        }
        drop((raft, proposer, shared));
        // openraft's workers drop the stores as they wind down: wait for the files to close.
        let deadline = tokio::time::Instant::now() + FILES_CLOSE_WAIT;
        while files.0.strong_count() > 0 || files.1.strong_count() > 0 {
            if tokio::time::Instant::now() > deadline {
                tracing::warn!("storage still open {FILES_CLOSE_WAIT:?} after raft stopped");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!(took_ms = began.elapsed().as_millis() as u64, "raftq node stopped");
    }
}

/// The Raft port's gate: a call must carry the cluster credential (when the node has a cluster secret).
fn peer_check(expected: Option<String>) -> impl tonic::service::Interceptor + Clone {
    move |req: tonic::Request<()>| {
        let Some(want) = &expected else { return Ok(req) };
        let got = req.metadata().get(crate::auth::CLUSTER_AUTH_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
        if crate::auth::constant_time_eq(got, want.as_bytes()) {
            Ok(req)
        } else {
            let mut s = tonic::Status::unauthenticated(
                "CLUSTER_AUTH: the Raft port takes calls from cluster peers only (wrong or missing cluster secret)",
            );
            let reason = raftq_proto::reason::Reason::ClusterAuth.as_str();
            s.metadata_mut().insert(raftq_proto::reason::header::REASON, reason.parse().expect("ascii"));
            Err(s)
        }
    }
}

/// How often at most the health loop asks whether the node is ready. Raft's metrics change at every append,
/// flush, commit and apply (thousands of times a second under load, on every node); waking the loop for each
/// cost a task wake-up, often a thread's, per change. Readiness is now seen at most this late.
const HEALTH_RECHECK: Duration = Duration::from_millis(50);

/// How often the health loop looks again with no metric changed: a node cut off from the cluster hears nothing,
/// so only time tells it (readiness turns after the quorum silence limit, a second at least).
const HEALTH_POLL: Duration = Duration::from_millis(250);

/// Keeps the gRPC health status (the whole server, "", and each raftq service) in line with readiness.
async fn health_loop(
    raft: Raft,
    fwd: Arc<api::forward::Forwarder>,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) {
    let mut last = None;
    let mut metrics = raft.metrics();
    loop {
        let ready = api::http::readiness(&raft, &fwd).is_ok();
        if last != Some(ready) {
            let status =
                if ready { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
            for s in std::iter::once("").chain(api::discovery::RAFTQ_SERVICES) {
                health.set_service_status(s, status).await;
            }
            last = Some(ready);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = openraft::type_config::async_runtime::watch::WatchReceiver::changed(&mut metrics) => {
                if r.is_err() {
                    return;
                }
            }
            // Being cut off changes no metric (nothing arrives): a silence is seen by looking again.
            _ = tokio::time::sleep(HEALTH_POLL) => {}
        }
        // The changes of the next `HEALTH_RECHECK` are taken together: `changed` returns at once for them.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(HEALTH_RECHECK) => {}
        }
    }
}

/// Accepted connections with Nagle's algorithm off (a request larger than one segment would otherwise wait for
/// the peer's delayed ACK, 40 ms, before its last segment is sent), registered so that `stop` can close them.
fn accepted(l: TcpListener, conns: Arc<Connections>) -> impl futures::Stream<Item = io::Result<Tracked>> {
    use futures::StreamExt;
    TcpListenerStream::new(l).map(move |s| {
        let s = s?;
        s.set_nodelay(true)?;
        conns.track(s)
    })
}
