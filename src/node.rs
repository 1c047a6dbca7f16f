//! The one place that wires the layers together: storage, Raft, the proposer, the servers, leader-only work.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::config::Config;
use crate::queue::Command;
use crate::raft::dispatcher::Dispatcher;
use crate::raft::network::{Network, MAX_RAFT_MESSAGE_BYTES};
use crate::raft::proposer::{wall_clock_ms, Proposer};
use crate::raft::service::RaftServer;
use crate::raft::types::{NodeInfo, Raft};
use crate::storage::log_store::LogStats;
use crate::storage::{LogStore, SmShared, StateMachine};

/// Longest pause of the leader's tick loop: a due lease is expired at most this late.
const TICK_MAX_SLEEP: Duration = Duration::from_millis(200);
/// Largest public gRPC message: a batch of max-size payloads.
const MAX_API_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

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
    pub grpc_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub shutdown: CancellationToken,
    tasks: TaskTracker,
    leader_watch: openraft::WatchChangeHandle<crate::raft::types::TypeConfig>,
    /// Dropped once the files are closed: `stop` waits for both, so a restart can reopen them.
    files: (std::sync::Weak<redb::Database>, std::sync::Weak<SmShared>),
}

impl Node {
    pub async fn start(cfg: Config, listeners: Listeners, shutdown: CancellationToken) -> Result<Node, StartError> {
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

        std::fs::create_dir_all(&cfg.data_dir)?;
        let log = LogStore::open(&cfg.data_dir.join("raft-log.redb"))?;
        let log_stats = log.stats.clone();
        let log_closed = log.closed_watch();
        let sm = StateMachine::open(&cfg.data_dir, cfg.shards)?;
        let shared = sm.shared.clone();
        let cluster_credential = crate::auth::cluster_secret(&cfg)
            .map_err(|e| StartError::Config(vec![e]))?
            .map(|s| crate::auth::cluster_credential(&s));
        let tls = crate::tls::Tls::from_config(&cfg).map_err(|e| StartError::Config(vec![e]))?;
        let network = Network {
            node_id: cfg.node_id,
            credential: cluster_credential.as_deref().map(Arc::from),
            tls: tls.clone(),
        };
        let raft =
            Raft::new(cfg.node_id, raft_cfg, network, log, sm).await.map_err(|e| StartError::Raft(e.to_string()))?;

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
        // Leader-only work (claim dispatch, ticks) follows openraft's leader-change callback; everything it needs
        // is replicated state, so a new leader serves at once.
        let (leading_tx, leading) = tokio::sync::watch::channel(false);
        let leading_tx = Arc::new(leading_tx);
        let (up, down, sm_for_start) = (leading_tx.clone(), leading_tx, shared.clone());
        let leader_watch = raft.on_leader_change(
            move |_| {
                up.send_replace(true);
                // Parked claims are looked at again at once.
                sm_for_start.work.send_modify(|v| *v += 1);
                async {}
            },
            move |_| {
                down.send_replace(false);
                async {}
            },
        );
        let proposer = Proposer::new(raft.clone(), shared.clone(), cfg.clone(), &tasks, &shutdown);
        let auth = Arc::new(crate::auth::Authenticator::from_config(&cfg).map_err(|e| StartError::Config(vec![e]))?);
        let limits = Arc::new(api::limits::Limits::new(&cfg));

        let raft_svc = raftq_proto::v1::raft_service_server::RaftServiceServer::new(RaftServer {
            raft: raft.clone(),
            node_id: cfg.node_id,
            spool_dir: cfg.data_dir.join("snapshots"),
        })
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        let raft_svc = tonic::service::interceptor::InterceptedService::new(raft_svc, peer_check(cluster_credential));
        let tls_err = |e: tonic::transport::Error| StartError::Config(vec![format!("tls: {e}")]);
        let mut raft_server = tonic::transport::Server::builder();
        let mut api_server = tonic::transport::Server::builder();
        if let Some(t) = &tls {
            raft_server = raft_server.tls_config(t.raft_server()).map_err(tls_err)?;
            api_server = api_server.tls_config(t.public_server()).map_err(tls_err)?;
        }
        let token = shutdown.clone();
        tasks.spawn(async move {
            let r = raft_server
                .add_service(raft_svc)
                .serve_with_incoming_shutdown(no_delay(listeners.raft), token.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "raft server failed");
            }
        });

        let dispatcher = Dispatcher::spawn(
            raft.clone(),
            shared.clone(),
            leading.clone(),
            cfg.max_items_per_entry,
            Duration::from_millis(cfg.write_timeout_ms),
            &tasks,
            shutdown.clone(),
        );
        let fwd = Arc::new(api::forward::Forwarder::new(raft.clone(), cfg.node_id, tls.clone()));
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
        let streams = api::stream::StreamApi {
            proposer: proposer.clone(),
            dispatcher: dispatcher.clone(),
            fwd: fwd.clone(),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            auth: auth.clone(),
            limits,
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
        });
        let admin_svc = raftq_proto::v1::admin_server::AdminServer::from_arc(admin_api.clone());
        let admin_svc = tonic::service::interceptor::InterceptedService::new(admin_svc, api::grpc::interceptor(auth));
        // The standard gRPC health service (ready by the /readyz rule) and reflection, on the public port.
        let (health, health_svc) = tonic_health::server::health_reporter();
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(raftq_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| StartError::Raft(format!("reflection: {e}")))?;
        tasks.spawn(health_loop(raft.clone(), health, shutdown.clone()));
        let token = shutdown.clone();
        tasks.spawn(async move {
            let r = api_server
                .add_service(health_svc)
                .add_service(reflection)
                .add_service(task_svc)
                .add_service(admin_svc)
                .add_service(worker_svc)
                .add_service(producer_svc)
                .add_service(jobs_svc)
                .serve_with_incoming_shutdown(no_delay(listeners.grpc), token.cancelled())
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
                tasks.spawn(async move {
                    let r = axum::serve(listeners.http, router).with_graceful_shutdown(token.cancelled_owned()).await;
                    if let Err(e) = r {
                        tracing::error!(error = %e, "http server failed");
                    }
                });
            }
        }

        crate::raft::webhooks::spawn(proposer.clone(), &cfg, webhook_key, leading.clone(), &tasks, shutdown.clone());
        tasks.spawn(crate::raft::resolver::run(proposer.clone(), leading.clone(), shutdown.clone()));
        tasks.spawn(crate::raft::scheduler::run(proposer.clone(), leading.clone(), shutdown.clone()));
        tasks.spawn(tick_loop(proposer.clone(), leading, shutdown.clone()));

        tracing::info!(
            node_id = cfg.node_id,
            grpc = %grpc_addr,
            raft = %raft_addr,
            http = %http_addr,
            data_dir = %cfg.data_dir.display(),
            shards = shared.read().count(),
            "raftq node started"
        );
        let files = (log_closed, Arc::downgrade(&shared));
        Ok(Node {
            raft,
            proposer,
            shared,
            log_stats,
            grpc_addr,
            raft_addr,
            http_addr,
            shutdown,
            tasks,
            leader_watch,
            files,
        })
    }

    /// Waits for the shutdown token, then stops in order: servers and waits end, Raft stops, files close.
    pub async fn run_until_shutdown(self) {
        self.shutdown.cancelled().await;
        self.stop().await;
    }

    pub async fn stop(self) {
        let Node { raft, proposer, shared, shutdown, tasks, files, mut leader_watch, .. } = self;
        shutdown.cancel();
        leader_watch.close().await;
        tasks.close();
        if tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within 10 s");
        }
        if let Err(e) = raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        drop((raft, proposer, shared));
        // openraft's workers drop the stores as they wind down: wait for the files to close.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while files.0.strong_count() > 0 || files.1.strong_count() > 0 {
            if tokio::time::Instant::now() > deadline {
                tracing::warn!("storage still open 10 s after shutdown");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!("raftq node stopped");
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
            s.metadata_mut().insert(api::error::REASON_HEADER, "CLUSTER_AUTH".parse().expect("ascii"));
            Err(s)
        }
    }
}

/// Keeps the gRPC health status (the whole server, "", and each raftq service) in line with readiness.
async fn health_loop(raft: Raft, health: tonic_health::server::HealthReporter, shutdown: CancellationToken) {
    const SERVICES: [&str; 5] =
        ["", "raftq.v1.TaskService", "raftq.v1.WorkerStream", "raftq.v1.ProducerStream", "raftq.v1.Admin"];
    let mut last = None;
    let mut metrics = raft.metrics();
    loop {
        let ready = api::http::is_ready(&crate::raft::metrics(&raft));
        if last != Some(ready) {
            let status =
                if ready { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
            for s in SERVICES {
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
        }
    }
}

/// Accepted connections with Nagle's algorithm off: a request larger than one segment would otherwise wait
/// for the peer's delayed ACK (40 ms) before its last segment is sent.
fn no_delay(l: TcpListener) -> impl futures::Stream<Item = io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(l).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

/// Leader-only: proposes a tick when a lease, delayed task or retention deadline falls due, so time moves in
/// the state machine even when no client writes.
async fn tick_loop(proposer: Arc<Proposer>, leading: tokio::sync::watch::Receiver<bool>, shutdown: CancellationToken) {
    loop {
        let now = wall_clock_ms();
        let due = proposer.shared.next_due();
        let sleep = match due {
            Some(d) if d > now => Duration::from_millis(d - now).min(TICK_MAX_SLEEP),
            Some(_) => Duration::ZERO,
            None => TICK_MAX_SLEEP,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(sleep.max(Duration::from_millis(5))) => {}
        }
        let leader = *leading.borrow();
        if leader && proposer.shared.next_due().is_some_and(|d| d <= wall_clock_ms()) {
            if let Err(e) = proposer.write(Command::Tick).await {
                tracing::debug!(error = %e, "tick not applied");
            }
        }
    }
}
