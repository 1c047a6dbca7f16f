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

use raftq_proto::reason::{header, Reason};
use raftq_proto::v1 as pb;
use raftq_proto::v1::producer_stream_server::ProducerStream;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use raftq_proto::v1::worker_stream_server::WorkerStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use super::convert;
use super::error::{invalid, merge_items, split_items, ApiError};
use super::forward::{Forwarder, Kind, Plan};
use super::grpc::Caller;
use super::limits::{Limits, StreamSlot};
use crate::auth::{AuthError, Authenticator, Scope};
use crate::leader::dispatcher::Dispatcher;
use crate::leader::proposer::{wall_clock_ms, Proposer};
use crate::queue::{AckAction, AckItem, TaskId};

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
    /// The deliveries this node's worker streams hold, told at once when the state machine revokes one.
    pub leases: Arc<super::revoke::LeaseWatch>,
    /// This stream asked for redirects: once another node is the live leader, its requests are answered
    /// `NOT_LEADER` with that leader's address (nothing applied) instead of being forwarded, so the client moves
    /// the stream there (after a leadership transfer, say). `false` on the shared handle.
    pub redirect: bool,
}

impl StreamApi {
    /// How a request of this stream is routed until `deadline`.
    fn plan(&self, kind: Kind, deadline: Instant) -> Plan {
        Plan::until(kind, deadline).moving_to_leader(self.redirect)
    }
}

/// A request to the leader on behalf of a stream's caller, with its token.
fn authorized<T>(caller: &Caller, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    if let Ok(v) = format!("Bearer {}", caller.token).parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r.metadata_mut().insert(header::FORWARDED, "1".parse().expect("ascii"));
    r
}

/// Claim slots taken from the tenant's claim rate; those not used are given back when it is dropped, also when
/// the claim is abandoned (the client left).
struct Grant<'a> {
    limits: &'a Limits,
    tenant: &'a str,
    granted: usize,
    used: usize,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.limits.unclaimed(self.tenant, self.granted - self.used.min(self.granted));
    }
}

type Out<T> = mpsc::Sender<Result<T, Status>>;

/// An error as a per-request or per-item refusal carries it.
pub(super) fn refusal(e: &ApiError) -> pb::Error {
    pb::Error { code: e.reason().to_string(), message: e.to_string(), retry_after_ms: e.retry_after_ms().unwrap_or(0) }
}

/// Reads the Hello every stream starts with; anything else first ends the stream. A stream that asks for
/// redirects (`x-raftq-redirect: 1`, as the SDKs' streams do) and reached a follower is answered `NOT_LEADER`
/// with the leader's address once its Hello is authenticated, so the client opens it on the leader and each of
/// its requests is served there, without a second hop.
async fn hello<T>(
    api: &StreamApi,
    scope: Scope,
    redirect: bool,
    inbound: &mut Streaming<T>,
    take: impl Fn(T) -> Option<pb::Hello>,
) -> Result<(Caller, String, StreamSlot), Status> {
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
        .await
        .map_err(|_| Status::from(invalid("HELLO_REQUIRED: no Hello within 10 s")))??
        .ok_or_else(|| Status::from(invalid("HELLO_REQUIRED: the stream ended before Hello")))?;
    let h = take(first).ok_or_else(|| Status::from(invalid("HELLO_REQUIRED: the first message must be Hello")))?;
    let caller = api.auth.authenticate(&h.token).map_err(|e| Status::from(ApiError::from(e)))?;
    caller.require(scope).map_err(|e| Status::from(ApiError::from(e)))?;
    if redirect {
        api.fwd.stream_redirect().await?;
    }
    if h.worker_id.len() > 256 {
        return Err(invalid("worker_id is longer than 256 characters").into());
    }
    let slot = api.limits.open_stream(&caller.tenant)?;
    let id = if h.worker_id.is_empty() { format!("anon-{:016x}", rand::random::<u64>()) } else { h.worker_id };
    Ok((caller, id, slot))
}

fn stream_error(request_id: u64, e: ApiError) -> pb::ServerEvent {
    let leader_addr = e.leader_addr().unwrap_or_default().to_string();
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

    /// Applies acks here when this node leads, else on the leader, sent again across leader changes until the
    /// write timeout (an ack repeated with the same token and outcome is answered as applied, so a retry after an
    /// unknown outcome is safe).
    async fn apply_acks(
        &self,
        caller: &Caller,
        items: Vec<AckItem>,
    ) -> Result<Vec<Result<pb::AckResponse, ApiError>>, ApiError> {
        let deadline = Instant::now() + Duration::from_millis(self.proposer.cfg.write_timeout_ms);
        let local = || {
            let items = items.clone();
            async move {
                let applied = self.proposer.ack(items).await?;
                Ok(applied
                    .into_iter()
                    .map(|r| {
                        r.map(|o| pb::AckResponse {
                            state: convert::state(o.state) as i32,
                            at_ms: o.at.min(i64::MAX as u64) as i64,
                            follow_up_ids: vec![],
                        })
                        .map_err(ApiError::from)
                    })
                    .collect())
            }
        };
        let remote = |ch| {
            let batch =
                pb::AckBatchRequest { items: items.iter().map(|i| convert::ack_to_pb(i, wall_clock_ms())).collect() };
            let req = authorized(caller, batch);
            async move {
                let answer = TaskServiceClient::new(ch).ack_batch(req).await?.into_inner();
                Ok(answer
                    .results
                    .into_iter()
                    .map(|r| match r.result {
                        Some(pb::ack_result::Result::Ok(ok)) => Ok(ok),
                        Some(pb::ack_result::Result::Error(e)) => {
                            Err(ApiError::leader_answer(&e.code, &e.message, None, None))
                        }
                        None => Err(ApiError::Internal("empty ack result".into())),
                    })
                    .collect())
            }
        };
        self.fwd.call(self.plan(Kind::Repeatable, deadline), local, remote).await
    }

    async fn serve_acks(&self, caller: &Caller, req: AckRequest, out: &Out<pb::ServerEvent>) {
        let (ids, checked): (Vec<String>, Vec<Result<AckItem, ApiError>>) = req.items.into_iter().unzip();
        let marks: Vec<Option<(TaskId, u64, bool)>> =
            checked.iter().map(|c| c.as_ref().ok().map(|i| (i.task_id, i.token, i.action.is_heartbeat()))).collect();
        let (valid, checked) = split_items(checked);
        let applied = if valid.is_empty() { Ok(vec![]) } else { self.apply_acks(caller, valid).await };
        let event = match applied {
            Err(e) => stream_error(req.request_id, e),
            Ok(results) => {
                let acks: Vec<pb::TaskAck> = merge_items(checked, results)
                    .into_iter()
                    .zip(ids)
                    .map(|(r, id)| task_ack(req.request_id, &id, r))
                    .collect();
                self.track_acks(&acks, &marks, out);
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

    /// An applied lease extension means this stream holds the delivery (again, after a reconnect); an answered
    /// outcome means it no longer does. `marks` are the valid items' task ids and tokens, and whether each is an
    /// extension.
    fn track_acks(&self, acks: &[pb::TaskAck], marks: &[Option<(TaskId, u64, bool)>], out: &Out<pb::ServerEvent>) {
        let (mut extended, mut answered) = (Vec::new(), Vec::with_capacity(acks.len()));
        for (ack, mark) in acks.iter().zip(marks) {
            match *mark {
                Some((id, token, true)) if ack.applied => extended.push((id, token)),
                Some((id, token, false)) => answered.push((id, token)),
                _ => {}
            }
        }
        self.leases.hold(&extended, out);
        self.leases.release(&answered);
    }

    /// Claims for a Ready here when this node leads, else on the leader; across leader changes it is sent again
    /// to the new leader until its hold time ends (tasks a lost answer had claimed come back when their leases
    /// expire).
    async fn claim(
        &self,
        caller: &Caller,
        worker_id: &Arc<str>,
        queues: &[String],
        count: usize,
        lease: u64,
    ) -> Result<Vec<pb::Task>, ApiError> {
        let deadline = Instant::now() + Duration::from_millis(self.proposer.cfg.ready_hold_ms);
        let local = || async move {
            let tenant = caller.tenant.as_str();
            // Over the tenant's claim rate: answered now, the worker's Ready comes back later.
            let granted = self.limits.claim(tenant, count)?;
            let mut grant = Grant { limits: &self.limits, tenant, granted, used: 0 };
            let wait = deadline.saturating_duration_since(Instant::now());
            // Dropping the receiver (the client left) withdraws the parked claim.
            let rx = self.dispatcher.submit(tenant, worker_id, queues, granted, lease, wait)?;
            let tasks = rx.await.map_err(|_| ApiError::Unavailable("shutting down".into()))??;
            grant.used = tasks.len();
            Ok(tasks.iter().map(|t| convert::task(t)).collect())
        };
        let remote = |ch| {
            let req = authorized(
                caller,
                pb::ClaimRequest {
                    worker_id: worker_id.to_string(),
                    queues: queues.to_vec(),
                    count: count as u32,
                    lease_ms: lease,
                    wait_ms: deadline.saturating_duration_since(Instant::now()).as_millis() as u64,
                },
            );
            async move {
                let mut c = TaskServiceClient::new(ch).max_decoding_message_size(64 << 20);
                Ok(c.claim(req).await?.into_inner().tasks)
            }
        };
        self.fwd.call(self.plan(Kind::Repeatable, deadline), local, remote).await
    }

    async fn serve_ready(&self, caller: &Caller, worker_id: &Arc<str>, r: pb::Ready, out: &Out<pb::ServerEvent>) {
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
            if count == 0 || count as usize > cfg.max_batch_items {
                return Err(invalid(format!("count must be 1 to {}", cfg.max_batch_items)));
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
        let answer = tokio::select! {
            r = self.claim(caller, worker_id, &queues, count as usize, lease) => r,
            // The client left: dropping the claim withdraws it and gives its slots back.
            _ = out.closed() => return,
        };
        let held: Vec<(TaskId, u64)> = match &answer {
            Ok(tasks) => tasks.iter().filter_map(|t| Some((t.id.parse().ok()?, t.lease.as_ref()?.token))).collect(),
            Err(_) => vec![],
        };
        let event = match answer {
            Ok(tasks) => {
                pb::ServerEvent { event: Some(pb::server_event::Event::TaskBatch(pb::TaskBatch { request_id, tasks })) }
            }
            // Another node is the live leader and this stream follows redirects: the worker moves there. So
            // it does from a leader cut off from its quorum, and from a follower cut off from its leader (no
            // leader to name: the worker tries the next node).
            Err(e)
                if self.redirect
                    && e.reason() == Reason::NotLeader
                    && (e.leader_addr().is_some()
                        || crate::raft::control::cut_off(&self.proposer.raft)
                        || self.fwd.leader_unheard()) =>
            {
                stream_error(request_id, e)
            }
            // The hold ended with no leader to claim from: an empty batch, and the worker asks again.
            Err(e) if matches!(e.reason(), Reason::NotLeader | Reason::UnknownOutcome | Reason::Unavailable) => {
                tracing::debug!(error = %e, "no claim within the hold");
                pb::ServerEvent {
                    event: Some(pb::server_event::Event::TaskBatch(pb::TaskBatch { request_id, tasks: vec![] })),
                }
            }
            Err(e) => stream_error(request_id, e),
        };
        // Held once the batch is queued on the stream, so a revocation is always sent after the batch.
        if out.send(Ok(event)).await.is_ok() {
            self.leases.hold(&held, out);
        }
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
    ApiError::Auth(AuthError::Expired).into()
}

#[tonic::async_trait]
impl WorkerStream for StreamApi {
    type StreamStream = ReceiverStream<Result<pb::ServerEvent, Status>>;

    #[instrument(
        skip_all,
        name = "worker_stream",
        fields(worker_id = tracing::field::Empty, tenant = tracing::field::Empty)
    )]
    async fn stream(&self, req: Request<Streaming<pb::WorkerEvent>>) -> Result<Response<Self::StreamStream>, Status> {
        let redirect = Plan::asks_redirect(&req);
        let mut inbound = req.into_inner();
        let (caller, worker_id, slot) =
            hello(self, Scope::Work, redirect, &mut inbound, |e: pb::WorkerEvent| match e.event {
                Some(pb::worker_event::Event::Hello(h)) => Some(h),
                _ => None,
            })
            .await?;
        let (tx, rx) = mpsc::channel(self.proposer.cfg.stream_send_buffer.max(1));
        let ack = pb::HelloAck { worker_id: worker_id.clone(), tenant_id: caller.tenant.clone(), max_create_items: 0 };
        let _ = tx.send(Ok(pb::ServerEvent { event: Some(pb::server_event::Event::HelloAck(ack)) })).await;
        let span = tracing::Span::current();
        span.record("worker_id", worker_id.as_str()).record("tenant", caller.tenant.as_str());
        tracing::debug!("worker stream opened");
        let api = Arc::new(StreamApi { redirect, ..self.clone() });
        let caller = Arc::new(caller);
        let worker_id: Arc<str> = worker_id.into();
        let limit = api.proposer.cfg.stream_max_in_flight;
        let shutdown = api.shutdown.clone();
        let sessions = self.proposer.shared.metrics.clone();
        sessions.stream_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (expires, end, leases) = (caller.expires_at_ms, tx.clone(), self.leases.clone());
        let session = serve_inbound(inbound, limit, shutdown, expires, move |ev: pb::WorkerEvent| {
            use pb::worker_event::Event;
            let (api, caller, worker_id, out) = (api.clone(), caller.clone(), worker_id.clone(), tx.clone());
            let tenant = caller.tenant.clone();
            let event = ev.event;
            Some(Box::pin(async move {
                let Some(event) = event else {
                    // Nothing to answer with a request id: the error names none (0).
                    let e = invalid("a WorkerEvent must set one of its events");
                    let _ = out.send(Ok(stream_error(0, e))).await;
                    return;
                };
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
            leases.forget_stream(&end);
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

    #[instrument(
        skip_all,
        name = "producer_stream",
        fields(producer_id = tracing::field::Empty, tenant = tracing::field::Empty)
    )]
    async fn stream(&self, req: Request<Streaming<pb::ProducerEvent>>) -> Result<Response<Self::StreamStream>, Status> {
        let redirect = Plan::asks_redirect(&req);
        let mut inbound = req.into_inner();
        let (caller, id, slot) =
            hello(self, Scope::Enqueue, redirect, &mut inbound, |e: pb::ProducerEvent| match e.event {
                Some(pb::producer_event::Event::Hello(h)) => Some(h),
                _ => None,
            })
            .await?;
        let (tx, rx) = mpsc::channel(self.proposer.cfg.stream_send_buffer.max(1));
        tracing::Span::current().record("producer_id", id.as_str()).record("tenant", caller.tenant.as_str());
        let max_create_items = u32::try_from(self.proposer.cfg.max_batch_items).unwrap_or(u32::MAX);
        let ack = pb::HelloAck { worker_id: id, tenant_id: caller.tenant.clone(), max_create_items };
        let _ =
            tx.send(Ok(pb::ProducerServerEvent { event: Some(pb::producer_server_event::Event::HelloAck(ack)) })).await;
        let api = Arc::new(StreamApi { redirect, ..self.clone() });
        let caller = Arc::new(caller);
        let limit = api.proposer.cfg.stream_max_in_flight;
        let shutdown = api.shutdown.clone();
        let sessions = self.proposer.shared.metrics.clone();
        sessions.stream_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (expires, end) = (caller.expires_at_ms, tx.clone());
        let session = serve_inbound(inbound, limit, shutdown, expires, move |ev: pb::ProducerEvent| {
            use pb::producer_event::Event;
            let (api, caller, out) = (api.clone(), caller.clone(), tx.clone());
            let request = match ev.event {
                Some(Event::Hello(_)) => Err(invalid("Hello was already received")),
                Some(Event::Create(c)) => Ok((c.seq, c.task.into_iter().collect())),
                Some(Event::CreateBatch(b)) => Ok((b.seq, b.tasks)),
                None => Err(invalid("a ProducerEvent must set one of its events")),
            };
            Some(Box::pin(async move {
                let ack = match request {
                    Ok((seq, items)) => api.create(&caller, seq, items).await,
                    // Nothing to answer with a sequence number: the refusal names none (0).
                    Err(e) => pb::CreateAck { seq: 0, results: vec![], error: Some(refusal(&e)) },
                };
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
        let whole = |e: ApiError| pb::CreateAck { seq, results: vec![], error: Some(refusal(&e)) };
        if items.is_empty() || items.len() > cfg.max_batch_items {
            return whole(invalid(format!("a create holds 1 to {} tasks", cfg.max_batch_items)));
        }
        let deadline = Instant::now() + Duration::from_millis(cfg.write_timeout_ms);
        let local = || self.create_here(caller, items.clone());
        let remote = |ch| {
            let req = authorized(caller, pb::EnqueueBatchRequest { items: items.clone() });
            async move {
                let mut c = TaskServiceClient::new(ch).max_encoding_message_size(64 << 20);
                Ok(c.enqueue_batch(req).await?.into_inner().results)
            }
        };
        // A write: sent again only when surely nothing was applied; an unknown outcome stays unknown (the producer
        // decides, e.g. with an idempotency key).
        match self.fwd.call(self.plan(Kind::Write, deadline), local, remote).await {
            Ok(results) => pb::CreateAck { seq, results, error: None },
            Err(e) => whole(e),
        }
    }

    async fn create_here(
        &self,
        caller: &Caller,
        items: Vec<pb::EnqueueRequest>,
    ) -> Result<Vec<pb::EnqueueResult>, ApiError> {
        let checked = super::grpc::new_tasks(&self.proposer.cfg, &self.proposer.shared, caller, items, wall_clock_ms());
        let debounce: Vec<bool> = checked.iter().map(super::grpc::is_debounce).collect();
        let (valid, checked) = split_items(checked);
        self.limits.enqueue(&caller.tenant, valid.len())?;
        let applied = self.proposer.enqueue(valid).await?;
        Ok(merge_items(checked, applied).into_iter().zip(debounce).map(super::grpc::enqueue_result).collect())
    }
}
