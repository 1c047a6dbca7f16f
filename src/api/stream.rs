//! The worker and producer streams.
//!
//! A stream opens with Hello (authenticated once, fixing the caller's tenant) and then serves requests
//! concurrently: each Ready, result or create is handled by its own task and answered with an event carrying the
//! request's id (or sequence number). At most `stream_max_in_flight` requests of one stream are served at once
//! and at most `stream_send_buffer` events wait to be sent, so a slow client gets backpressure, not unbounded
//! memory. Leases belong to the replicated state, not to the stream: a worker that reconnects can still report on
//! its tasks.

use std::sync::Arc;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::producer_stream_server::ProducerStream;
use raftq_proto::v1::worker_stream_server::WorkerStream;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::error::{invalid, merge_items, valid_items, ApiError};
use super::forward::{Forwarder, Route};
use super::grpc::Caller;
use super::limits::{Limits, StreamSlot};
use crate::auth::{Authenticator, Scope};
use crate::queue::{AckAction, AckItem};
use crate::raft::dispatcher::Dispatcher;
use crate::raft::proposer::{wall_clock_ms, Proposer};
use raftq_proto::v1::task_service_client::TaskServiceClient;

/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct StreamApi {
    pub proposer: Arc<Proposer>,
    pub dispatcher: Dispatcher,
    pub fwd: Arc<Forwarder>,
    pub shutdown: CancellationToken,
    /// The node's tracker: stream sessions are tracked, so shutdown waits for them.
    pub tasks: tokio_util::task::TaskTracker,
    pub auth: Arc<Authenticator>,
    pub limits: Arc<Limits>,
}

/// A request to the leader on behalf of a stream's caller, with its token.
fn authorized<T>(caller: &Caller, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    if let Ok(v) = format!("Bearer {}", caller.token).parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r.metadata_mut().insert(super::forward::FORWARDED_HEADER, "1".parse().expect("ascii"));
    r
}

fn error_from_pb(e: &pb::Error) -> ApiError {
    let mut s = Status::unknown(e.message.clone());
    if let Ok(v) = e.code.parse() {
        s.metadata_mut().insert(super::error::REASON_HEADER, v);
    }
    ApiError::from_status(&s)
}

type Out<T> = mpsc::Sender<Result<T, Status>>;

/// Reads the Hello every stream starts with; anything else first ends the stream.
async fn hello<T>(
    api: &StreamApi,
    scope: Scope,
    inbound: &mut Streaming<T>,
    take: impl Fn(T) -> Option<pb::Hello>,
) -> Result<(Caller, String, StreamSlot), Status> {
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
        .await
        .map_err(|_| Status::from(invalid("HELLO_REQUIRED: no Hello within 10 s")))??
        .ok_or_else(|| Status::from(invalid("HELLO_REQUIRED: the stream ended before Hello")))?;
    let h = take(first).ok_or_else(|| Status::from(invalid("HELLO_REQUIRED: the first message must be Hello")))?;
    let caller = api.auth.authenticate(&h.token)?;
    caller.require(scope)?;
    if h.worker_id.len() > 256 {
        return Err(invalid("worker_id is longer than 256 characters").into());
    }
    let slot = api.limits.open_stream(&caller.tenant)?;
    let id = if h.worker_id.is_empty() { format!("anon-{:016x}", rand::random::<u64>()) } else { h.worker_id };
    Ok((caller, id, slot))
}

fn stream_error(request_id: u64, e: ApiError) -> pb::ServerEvent {
    let leader_addr = match &e {
        ApiError::NotLeader { leader_addr } => leader_addr.clone().unwrap_or_default(),
        _ => String::new(),
    };
    pb::ServerEvent {
        event: Some(pb::server_event::Event::Error(pb::StreamError {
            request_id,
            reason: e.reason().to_string(),
            message: e.to_string(),
            leader_addr,
        })),
    }
}

fn task_ack(request_id: u64, task_id: &str, r: Result<pb::AckResponse, ApiError>) -> pb::TaskAck {
    match r {
        Ok(o) => pb::TaskAck {
            request_id,
            task_id: task_id.to_string(),
            applied: true,
            reason: String::new(),
            message: String::new(),
            state: o.state,
            at_ms: o.at_ms,
        },
        Err(e) => pb::TaskAck {
            request_id,
            task_id: task_id.to_string(),
            applied: false,
            reason: e.reason().to_string(),
            message: e.to_string(),
            state: 0,
            at_ms: 0,
        },
    }
}

/// A worker request parsed into acks, keeping what is needed to answer it.
struct AckRequest {
    request_id: u64,
    batch: bool,
    /// Per item: its task id as sent, and the parsed item or why it was refused before proposing.
    items: Vec<(String, Result<AckItem, ApiError>)>,
}

impl StreamApi {
    fn parse_result(&self, tenant: &str, r: pb::Result) -> (String, Result<AckItem, ApiError>) {
        let pb::Result { request_id: _, task_id, token, outcome } = r;
        let action = match outcome {
            Some(pb::result::Outcome::Completed(c)) => Some(pb::ack_request::Action::Complete(c)),
            Some(pb::result::Outcome::Failed(f)) => Some(pb::ack_request::Action::Fail(f)),
            None => None,
        };
        let item = self.ack_item(tenant, &task_id, token, action);
        (task_id, item)
    }

    fn ack_item(
        &self,
        tenant: &str,
        task_id: &str,
        token: u64,
        action: Option<pb::ack_request::Action>,
    ) -> Result<AckItem, ApiError> {
        let task_id = convert::parse_id(task_id)?;
        let action = convert::ack_action(&self.proposer.cfg, tenant, &task_id, action, wall_clock_ms())?;
        Ok(AckItem { task_id, tenant: tenant.to_string(), token, action })
    }

    /// Applies acks here when this node leads, else on the leader, retrying across leader changes until the
    /// write timeout (an ack repeated with the same token and outcome is answered as applied, so a retry after
    /// an unknown outcome is safe).
    async fn apply_acks(
        &self,
        caller: &Caller,
        items: Vec<AckItem>,
    ) -> Result<Vec<Result<pb::AckResponse, ApiError>>, ApiError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.proposer.cfg.write_timeout_ms);
        loop {
            let attempt = match self.fwd.leader_route().await? {
                Route::Local => match self.proposer.ack(items.clone()).await {
                    Ok(v) => Ok(v
                        .into_iter()
                        .map(|r| {
                            r.map(|o| pb::AckResponse {
                                state: convert::state(o.state) as i32,
                                at_ms: o.at.min(i64::MAX as u64) as i64,
                                follow_up_ids: vec![],
                            })
                            .map_err(ApiError::from)
                        })
                        .collect()),
                    Err(e) => Err(ApiError::from(e)),
                },
                Route::Leader(ch) => {
                    let routed_to = self.fwd.leader().0;
                    let req = authorized(
                        caller,
                        pb::AckBatchRequest {
                            items: items.iter().map(|i| convert::ack_to_pb(i, wall_clock_ms())).collect(),
                        },
                    );
                    let mut c = TaskServiceClient::new(ch);
                    // A leader change abandons the forwarded call: sent again to the new leader, an ack that was
                    // applied meanwhile is answered as applied (same token and outcome).
                    let answer = tokio::select! {
                        r = c.ack_batch(req) => r,
                        _ = self.fwd.leader_moved(routed_to) => Err(tonic::Status::unavailable("the leader changed")),
                    };
                    match answer {
                        Ok(r) => Ok(r
                            .into_inner()
                            .results
                            .into_iter()
                            .map(|r| match r.result {
                                Some(pb::ack_result::Result::Ok(ok)) => Ok(ok),
                                Some(pb::ack_result::Result::Error(e)) => Err(error_from_pb(&e)),
                                None => Err(ApiError::Internal("empty ack result".into())),
                            })
                            .collect()),
                        Err(s) => Err(ApiError::from_status(&s)),
                    }
                }
            };
            match attempt {
                Err(
                    e @ (ApiError::InvalidArgument(_)
                    | ApiError::Unauthenticated { .. }
                    | ApiError::PermissionDenied { .. }),
                ) => return Err(e),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "acks not applied yet, retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    async fn serve_acks(&self, caller: &Caller, req: AckRequest, out: &Out<pb::ServerEvent>) {
        let (ids, checked): (Vec<String>, Vec<Result<AckItem, ApiError>>) = req.items.into_iter().unzip();
        let valid = valid_items(&checked);
        let applied = if valid.is_empty() { Ok(vec![]) } else { self.apply_acks(caller, valid).await };
        let event = match applied {
            Err(e) => stream_error(req.request_id, e),
            Ok(results) => {
                let acks: Vec<pb::TaskAck> = merge_items(checked, results)
                    .into_iter()
                    .zip(ids)
                    .map(|(r, id)| task_ack(req.request_id, &id, r))
                    .collect();
                if req.batch {
                    pb::ServerEvent {
                        event: Some(pb::server_event::Event::AckBatch(pb::AckBatch {
                            request_id: req.request_id,
                            acks,
                        })),
                    }
                } else {
                    let ack = acks
                        .into_iter()
                        .next()
                        .unwrap_or_else(|| task_ack(req.request_id, "", Err(invalid("empty request"))));
                    pb::ServerEvent { event: Some(pb::server_event::Event::Ack(ack)) }
                }
            }
        };
        let _ = out.send(Ok(event)).await;
    }

    /// Claims for a Ready here when this node leads, else on the leader; across leader changes it is sent again
    /// to the new leader until its hold time ends.
    async fn claim(
        &self,
        caller: &Caller,
        worker_id: &str,
        queues: &[String],
        count: usize,
        lease: u64,
        out: &Out<pb::ServerEvent>,
    ) -> Option<Result<Vec<pb::Task>, ApiError>> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.proposer.cfg.ready_hold_ms);
        loop {
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
            let attempt = match self.fwd.leader_route().await {
                Err(e) => Err(e),
                Ok(Route::Local) => {
                    let tenant = &caller.tenant;
                    let granted = match self.limits.claim(tenant, count) {
                        Ok(n) => n,
                        // Over the tenant's claim rate: answered now, the worker's Ready comes back later.
                        Err(e) => return Some(Err(e)),
                    };
                    let rx = self.dispatcher.submit(tenant, worker_id, queues, granted, lease, wait);
                    let r = match rx {
                        Err(e) => Err(ApiError::from(e)),
                        Ok(rx) => tokio::select! {
                            r = rx => match r {
                                Ok(Ok(tasks)) => Ok(tasks.into_iter().map(convert::task).collect::<Vec<_>>()),
                                Ok(Err(e)) => Err(ApiError::from(e)),
                                Err(_) => Err(ApiError::Unavailable("shutting down".into())),
                            },
                            // The client left: dropping `rx` withdraws the parked claim.
                            _ = out.closed() => {
                                self.limits.unclaimed(tenant, granted);
                                return None;
                            }
                        },
                    };
                    self.limits.unclaimed(tenant, granted - r.as_ref().map_or(0, |t| t.len()));
                    r
                }
                Ok(Route::Leader(ch)) => {
                    let req = authorized(
                        caller,
                        pb::ClaimRequest {
                            worker_id: worker_id.to_string(),
                            queues: queues.to_vec(),
                            count: count as u32,
                            lease_ms: lease,
                            wait_ms: wait.as_millis() as u64,
                        },
                    );
                    let routed_to = self.fwd.leader().0;
                    let mut c = TaskServiceClient::new(ch).max_decoding_message_size(64 << 20);
                    tokio::select! {
                        r = c.claim(req) => match r {
                            Ok(r) => Ok(r.into_inner().tasks),
                            Err(s) => Err(ApiError::from_status(&s)),
                        },
                        // The old leader may be paused or cut off: ask the new one (tasks a lost answer had
                        // claimed come back when their leases expire).
                        _ = self.fwd.leader_moved(routed_to) => Err(ApiError::NotLeader { leader_addr: None }),
                        _ = out.closed() => return None,
                    }
                }
            };
            match attempt {
                Err(
                    e @ (ApiError::InvalidArgument(_)
                    | ApiError::Unauthenticated { .. }
                    | ApiError::PermissionDenied { .. }
                    | ApiError::ResourceExhausted { .. }),
                ) => return Some(Err(e)),
                // Leadership moved or the leader went away: ask the next leader while the hold lasts. Tasks
                // a lost answer had claimed come back when their leases expire.
                Err(e) if tokio::time::Instant::now() + Duration::from_millis(50) < deadline => {
                    tracing::debug!(error = %e, "claim not served yet, retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => return Some(Ok(vec![])),
                ok => return Some(ok),
            }
        }
    }

    async fn serve_ready(&self, caller: &Caller, worker_id: &str, r: pb::Ready, out: &Out<pb::ServerEvent>) {
        let pb::Ready { request_id, queues, lease_seconds, count, lease_ms } = r;
        let cfg = &self.proposer.cfg;
        let checked = (|| {
            if queues.is_empty() || queues.len() > 64 {
                return Err(invalid("Ready names 1 to 64 queues"));
            }
            for q in &queues {
                convert::validate_queue(cfg, q)?;
                caller.check_queue(q)?;
            }
            if count as usize > cfg.max_batch_items {
                return Err(invalid(format!("count must be at most {}", cfg.max_batch_items)));
            }
            let ms = if lease_ms > 0 { lease_ms } else { u64::from(lease_seconds) * 1000 };
            convert::lease_ms(cfg, ms)
        })();
        let lease = match checked {
            Ok(l) => l,
            Err(e) => {
                let _ = out.send(Ok(stream_error(request_id, e))).await;
                return;
            }
        };
        let Some(answer) = self.claim(caller, worker_id, &queues, count.max(1) as usize, lease, out).await else {
            return;
        };
        let event = match answer {
            Ok(tasks) => {
                pb::ServerEvent { event: Some(pb::server_event::Event::TaskBatch(pb::TaskBatch { request_id, tasks })) }
            }
            Err(e) => stream_error(request_id, e),
        };
        let _ = out.send(Ok(event)).await;
    }
}

/// Runs `serve` for each inbound message with at most `limit` at once, until the client closes the stream, it
/// fails, the node shuts down or the caller's token expires (then `true`).
async fn serve_inbound<T: Send + 'static>(
    mut inbound: Streaming<T>,
    limit: usize,
    shutdown: CancellationToken,
    expires_at_ms: Option<u64>,
    serve: impl Fn(T) -> Option<futures::future::BoxFuture<'static, ()>>,
) -> bool {
    let permits = Arc::new(Semaphore::new(limit));
    let mut tasks = tokio::task::JoinSet::new();
    let expiry = async {
        match expires_at_ms {
            Some(at) => tokio::time::sleep(Duration::from_millis(at.saturating_sub(wall_clock_ms()))).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    let mut expired = false;
    loop {
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = shutdown.cancelled() => break,
            _ = &mut expiry => {
                expired = true;
                break;
            }
        };
        let msg = match msg {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "stream ended");
                break;
            }
        };
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        if let Some(fut) = serve(msg) {
            tasks.spawn(async move {
                fut.await;
                drop(permit);
            });
        }
        // Reap finished requests so the set stays small on long-lived streams.
        while tasks.try_join_next().is_some() {}
    }
    if expired {
        // An expired caller is served no more: requests in flight are dropped (a parked claim is withdrawn; a
        // result in flight may or may not apply, and the worker sends it again on its next stream).
        tasks.abort_all();
    }
    // Requests already received are still answered while the client listens.
    while tasks.join_next().await.is_some() {}
    expired
}

/// The status a stream ends with when its token expires: the client reconnects with a fresh token.
fn token_expired() -> Status {
    ApiError::Unauthenticated { reason: "TOKEN_EXPIRED", message: "the stream's token has expired".into() }.into()
}

#[tonic::async_trait]
impl WorkerStream for StreamApi {
    type StreamStream = ReceiverStream<Result<pb::ServerEvent, Status>>;

    async fn stream(&self, req: Request<Streaming<pb::WorkerEvent>>) -> Result<Response<Self::StreamStream>, Status> {
        let mut inbound = req.into_inner();
        let (caller, worker_id, slot) = hello(self, Scope::Work, &mut inbound, |e: pb::WorkerEvent| match e.event {
            Some(pb::worker_event::Event::Hello(h)) => Some(h),
            _ => None,
        })
        .await?;
        let (tx, rx) = mpsc::channel(self.proposer.cfg.stream_send_buffer.max(1));
        let ack = pb::HelloAck { worker_id: worker_id.clone(), tenant_id: caller.tenant.clone() };
        let _ = tx.send(Ok(pb::ServerEvent { event: Some(pb::server_event::Event::HelloAck(ack)) })).await;
        tracing::debug!(worker_id, tenant = caller.tenant, "worker stream opened");
        let api = Arc::new(self.clone());
        let caller = Arc::new(caller);
        let worker_id: Arc<str> = worker_id.into();
        let limit = api.proposer.cfg.stream_max_in_flight;
        let shutdown = api.shutdown.clone();
        let sessions = self.proposer.shared.metrics.clone();
        sessions.stream_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (expires, end) = (caller.expires_at_ms, tx.clone());
        let session = serve_inbound(inbound, limit, shutdown, expires, move |ev: pb::WorkerEvent| {
            use pb::worker_event::Event;
            let (api, caller, worker_id, out) = (api.clone(), caller.clone(), worker_id.clone(), tx.clone());
            let tenant = caller.tenant.clone();
            let event = ev.event?;
            Some(Box::pin(async move {
                let acks = match event {
                    Event::Ready(r) => {
                        api.serve_ready(&caller, &worker_id, r, &out).await;
                        return;
                    }
                    Event::Hello(_) => {
                        let _ = out.send(Ok(stream_error(0, invalid("Hello was already received")))).await;
                        return;
                    }
                    Event::Result(r) => {
                        AckRequest { request_id: r.request_id, batch: false, items: vec![api.parse_result(&tenant, r)] }
                    }
                    Event::ResultBatch(b) => AckRequest {
                        request_id: b.request_id,
                        batch: true,
                        items: b.results.into_iter().map(|r| api.parse_result(&tenant, r)).collect(),
                    },
                    Event::Nack(n) => {
                        let action = pb::ack_request::Action::Nack(pb::Nack { delay_ms: n.delay_ms, reason: n.reason });
                        let item = api.ack_item(&tenant, &n.task_id, n.token, Some(action));
                        AckRequest { request_id: n.request_id, batch: false, items: vec![(n.task_id, item)] }
                    }
                    Event::Abandon(a) => {
                        let item = AckItem::parse(&a.task_id, &tenant, a.token, AckAction::Abandon);
                        AckRequest { request_id: a.request_id, batch: false, items: vec![(a.task_id, item)] }
                    }
                    Event::Heartbeat(h) => {
                        let pb::HeartbeatTask { request_id, task_id, token, extend_ms, progress } = h;
                        let action = pb::ack_request::Action::Heartbeat(pb::Heartbeat { extend_ms, progress });
                        let item = api.ack_item(&tenant, &task_id, token, Some(action));
                        AckRequest { request_id, batch: false, items: vec![(task_id, item)] }
                    }
                    Event::Exception(x) => {
                        let pb::ExceptionTask { request_id, task_id, token, exception } = x;
                        let item =
                            api.ack_item(&tenant, &task_id, token, exception.map(pb::ack_request::Action::Exception));
                        AckRequest { request_id, batch: false, items: vec![(task_id, item)] }
                    }
                };
                if acks.items.len() > api.proposer.cfg.max_batch_items {
                    let e = invalid(format!("a batch holds at most {} results", api.proposer.cfg.max_batch_items));
                    let _ = out.send(Ok(stream_error(acks.request_id, e))).await;
                    return;
                }
                api.serve_acks(&caller, acks, &out).await;
            }) as futures::future::BoxFuture<'static, ()>)
        });
        self.tasks.spawn(async move {
            if session.await {
                let _ = end.send(Err(token_expired())).await;
            }
            drop(slot);
            sessions.stream_sessions.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl AckItem {
    fn parse(task_id: &str, tenant: &str, token: u64, action: AckAction) -> Result<AckItem, ApiError> {
        Ok(AckItem { task_id: convert::parse_id(task_id)?, tenant: tenant.to_string(), token, action })
    }
}

#[tonic::async_trait]
impl ProducerStream for StreamApi {
    type StreamStream = ReceiverStream<Result<pb::ProducerServerEvent, Status>>;

    async fn stream(&self, req: Request<Streaming<pb::ProducerEvent>>) -> Result<Response<Self::StreamStream>, Status> {
        let mut inbound = req.into_inner();
        let (caller, id, slot) = hello(self, Scope::Enqueue, &mut inbound, |e: pb::ProducerEvent| match e.event {
            Some(pb::producer_event::Event::Hello(h)) => Some(h),
            _ => None,
        })
        .await?;
        let (tx, rx) = mpsc::channel(self.proposer.cfg.stream_send_buffer.max(1));
        let ack = pb::HelloAck { worker_id: id, tenant_id: caller.tenant.clone() };
        let _ =
            tx.send(Ok(pb::ProducerServerEvent { event: Some(pb::producer_server_event::Event::HelloAck(ack)) })).await;
        let api = Arc::new(self.clone());
        let caller = Arc::new(caller);
        let limit = api.proposer.cfg.stream_max_in_flight;
        let shutdown = api.shutdown.clone();
        let sessions = self.proposer.shared.metrics.clone();
        sessions.stream_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (expires, end) = (caller.expires_at_ms, tx.clone());
        let session = serve_inbound(inbound, limit, shutdown, expires, move |ev: pb::ProducerEvent| {
            use pb::producer_event::Event;
            let (api, caller, out) = (api.clone(), caller.clone(), tx.clone());
            let (seq, items) = match ev.event? {
                Event::Hello(_) => (0, vec![]),
                Event::Create(c) => (c.seq, c.task.into_iter().collect()),
                Event::CreateBatch(b) => (b.seq, b.tasks),
            };
            Some(Box::pin(async move {
                let ack = api.create(&caller, seq, items).await;
                let _ = out
                    .send(Ok(pb::ProducerServerEvent { event: Some(pb::producer_server_event::Event::Ack(ack)) }))
                    .await;
            }) as futures::future::BoxFuture<'static, ()>)
        });
        self.tasks.spawn(async move {
            if session.await {
                let _ = end.send(Err(token_expired())).await;
            }
            drop(slot);
            sessions.stream_sessions.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl StreamApi {
    async fn create(&self, caller: &Caller, seq: u64, items: Vec<pb::EnqueueRequest>) -> pb::CreateAck {
        let cfg = &self.proposer.cfg;
        let whole = |e: ApiError| pb::CreateAck {
            seq,
            results: vec![],
            error: Some(pb::Error { code: e.reason().to_string(), message: e.to_string() }),
        };
        if items.is_empty() || items.len() > cfg.max_batch_items {
            return whole(invalid(format!("a create holds 1 to {} tasks", cfg.max_batch_items)));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(cfg.write_timeout_ms);
        loop {
            let attempt = match self.fwd.leader_route().await {
                Err(e) => Err(e),
                Ok(Route::Local) => self.create_here(caller, items.clone()).await,
                Ok(Route::Leader(ch)) => {
                    let req = authorized(caller, pb::EnqueueBatchRequest { items: items.clone() });
                    let mut c = TaskServiceClient::new(ch).max_encoding_message_size(64 << 20);
                    match c.enqueue_batch(req).await {
                        Ok(r) => Ok(r.into_inner().results),
                        Err(s) => Err(ApiError::from_status(&s)),
                    }
                }
            };
            match attempt {
                Ok(results) => return pb::CreateAck { seq, results, error: None },
                // Only a write that surely did not happen is sent again; anything else is reported (an unknown
                // outcome stays unknown: the producer decides, e.g. with an idempotency key).
                Err(e) if e.surely_not_applied() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return whole(e),
            }
        }
    }

    async fn create_here(
        &self,
        caller: &Caller,
        items: Vec<pb::EnqueueRequest>,
    ) -> Result<Vec<pb::EnqueueResult>, ApiError> {
        let checked = super::grpc::new_tasks(&self.proposer.cfg, &self.proposer.shared, caller, items, wall_clock_ms());
        let valid = valid_items(&checked);
        self.limits.enqueue(&caller.tenant, valid.len())?;
        let applied = self.proposer.enqueue(valid).await?;
        Ok(merge_items(checked, applied).into_iter().map(super::grpc::enqueue_result).collect())
    }
}
