//! The public gRPC task service: each operation checks its request and runs it here (`*_local`), and is routed
//! to the leader by `forward.rs`. The routed operations are what both gRPC (the `TaskService` impl at the end)
//! and REST (`rest.rs`) call.

use std::sync::Arc;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use raftq_proto::v1::task_service_server::TaskService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::convert;
use super::error::{invalid, merge_items, not_found, reply, split_items, ApiError};
use super::forward::{stale_read, Forwarder, Kind};
use super::limits::Limits;
use crate::auth::AuthError;
use crate::leader::dispatcher::Dispatcher;
use crate::leader::proposer::{wall_clock_ms, Proposer};
use crate::queue::{AckItem, Command, DlqSelector, KeyMode, KeyedTask, Response as SmResponse, TaskId};

pub use crate::auth::Caller;
use crate::auth::{Authenticator, Scope};

/// The bearer token of a request (`authorization: Bearer <jwt>`, the scheme in any case as RFC 7235 has it; a
/// bare token is taken as it is), or "".
pub fn bearer<T>(req: &Request<T>) -> String {
    let Some(v) = req.metadata().get("authorization").and_then(|v| v.to_str().ok()) else { return String::new() };
    let v = v.trim();
    match v.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim().to_string(),
        _ => v.to_string(),
    }
}

/// Authenticates a request once, where it enters (the gRPC interceptor, REST): the caller rides in its
/// extensions. A request without a token passes here and is refused by [`caller`].
pub fn authenticate_request<T>(auth: &Authenticator, req: &mut Request<T>) -> Result<(), ApiError> {
    let token = bearer(req);
    if token.is_empty() && auth.enabled() {
        return Ok(());
    }
    let who = auth.authenticate(&token)?;
    req.extensions_mut().insert(who);
    Ok(())
}

/// The interceptor of the public gRPC services that take a bearer token with every call.
pub fn interceptor(auth: Arc<Authenticator>) -> impl tonic::service::Interceptor + Clone {
    move |mut req: Request<()>| {
        authenticate_request(&auth, &mut req).map_err(Status::from)?;
        Ok(req)
    }
}

/// Who sends a unary request: authenticated on the way in, or `UNAUTHENTICATED`.
pub fn caller<T>(req: &Request<T>) -> Result<Caller, ApiError> {
    req.extensions().get::<Caller>().cloned().ok_or(ApiError::Auth(AuthError::Missing))
}

/// The caller, if it holds `scope`.
pub fn caller_with<T>(req: &Request<T>, scope: Scope) -> Result<Caller, ApiError> {
    let who = caller(req)?;
    who.require(scope)?;
    Ok(who)
}

/// A task's dependencies must exist and belong to its tenant (checked on the leader, from its applied state). A
/// dependency created in the same batch does not exist yet, so no cycle can ever form.
pub fn check_dependencies(shared: &crate::storage::SmShared, n: &crate::queue::NewTask) -> Result<(), ApiError> {
    for d in &n.depends_on {
        match shared.get_task(d).map_err(|e| ApiError::Internal(e.to_string()))? {
            Some(t) if t.tenant == n.tenant => {}
            _ => return Err(invalid(format!("depends_on: no task {d}"))),
        }
    }
    Ok(())
}

/// The answer to one enqueue; `debounce`: the item had a debounce key, so a duplicate is a debounced enqueue.
pub fn enqueued(e: &crate::queue::Enqueued, debounce: bool) -> pb::EnqueueResponse {
    pb::EnqueueResponse { task_id: e.task_id.to_string(), duplicate: e.duplicate, debounced: debounce && e.duplicate }
}

/// Whether an enqueue item carries a debounce key.
pub fn is_debounce(item: &Result<KeyedTask, ApiError>) -> bool {
    matches!(item, Ok(KeyedTask { mode: Some(KeyMode::Debounce { .. }), .. }))
}

pub fn enqueue_result((r, debounce): (Result<crate::queue::Enqueued, ApiError>, bool)) -> pb::EnqueueResult {
    pb::EnqueueResult {
        result: Some(match r {
            Ok(e) => pb::enqueue_result::Result::Ok(enqueued(&e, debounce)),
            Err(e) => pb::enqueue_result::Result::Error(super::stream::refusal(&e)),
        }),
    }
}

pub struct TaskApi {
    pub proposer: Arc<Proposer>,
    pub dispatcher: Dispatcher,
    pub fwd: Arc<Forwarder>,
    pub auth: Arc<Authenticator>,
    pub limits: Arc<Limits>,
}

type Res<T> = Result<Response<T>, Status>;

impl TaskApi {
    fn wait(&self, ms: u64) -> Duration {
        Duration::from_millis(ms.min(self.proposer.cfg.max_wait_ms))
    }

    fn selection(&self, who: &Caller, sel: pb::DeadLetterSelection) -> Result<(String, String, DlqSelector), ApiError> {
        let pb::DeadLetterSelection { queue, ids, all } = sel;
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        who.check_queue(&queue)?;
        let select = match (all, ids.is_empty()) {
            (true, true) => DlqSelector::All,
            (false, false) => DlqSelector::Ids(ids.iter().map(|s| convert::parse_id(s)).collect::<Result<_, _>>()?),
            (true, false) => return Err(invalid("give either ids or all, not both")),
            (false, true) => return Err(invalid("give the ids to take, or all")),
        };
        Ok((who.tenant.clone(), queue, select))
    }

    /// For a token limited to some queues: `PERMISSION_DENIED` when the task is in another queue (a linearized
    /// read; the task of another tenant, or none, is left to the command to answer `NOT_FOUND`).
    async fn check_task_queue(&self, who: &Caller, id: &TaskId) -> Result<(), ApiError> {
        if !who.limited_to_queues() {
            return Ok(());
        }
        match self.proposer.read_task(id, true).await.map_err(ApiError::from)? {
            Some(t) if t.tenant == who.tenant => Ok(who.check_queue(&t.queue)?),
            _ => Ok(()),
        }
    }
}

/// The tasks of an enqueue batch, each checked on its own: a queue outside the token's patterns fails that item.
/// Dependencies must name existing tasks of the caller's tenant.
pub fn new_tasks(
    cfg: &crate::config::Config,
    shared: &crate::storage::SmShared,
    who: &Caller,
    items: Vec<pb::EnqueueRequest>,
    now: u64,
) -> Vec<Result<KeyedTask, ApiError>> {
    items
        .into_iter()
        .map(|i| {
            who.check_queue(&i.queue)?;
            let n = convert::enqueue_item(cfg, &who.tenant, i, now)?;
            check_dependencies(shared, &n.task)?;
            Ok(n)
        })
        .collect()
}

fn ids(v: Vec<TaskId>) -> pb::DeadLetterIds {
    pb::DeadLetterIds { ids: v.into_iter().map(|i| i.to_string()).collect() }
}

impl TaskApi {
    async fn enqueue_local(&self, req: Request<pb::EnqueueRequest>) -> Result<pb::EnqueueResponse, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        who.check_queue(&req.get_ref().queue)?;
        let item = convert::enqueue_item(&self.proposer.cfg, &who.tenant, req.into_inner(), wall_clock_ms())?;
        check_dependencies(&self.proposer.shared, &item.task)?;
        self.limits.enqueue(&who.tenant, 1)?;
        let debounce = matches!(item.mode, Some(KeyMode::Debounce { .. }));
        let mut out = self.proposer.enqueue(vec![item]).await.map_err(ApiError::from)?;
        let r = out.pop().ok_or_else(|| ApiError::Internal("no result".into()))?.map_err(ApiError::from)?;
        Ok(enqueued(&r, debounce))
    }

    async fn enqueue_batch_local(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<pb::EnqueueBatchResponse, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let cfg = &self.proposer.cfg;
        let pb::EnqueueBatchRequest { items } = req.into_inner();
        if items.is_empty() || items.len() > cfg.max_batch_items {
            return Err(invalid(format!("a batch holds 1 to {} items", cfg.max_batch_items)));
        }
        let now = wall_clock_ms();
        // Items fail one by one: invalid ones get their error, valid ones are proposed together.
        let checked = new_tasks(cfg, &self.proposer.shared, &who, items, now);
        let debounce: Vec<bool> = checked.iter().map(is_debounce).collect();
        let (valid, checked) = split_items(checked);
        self.limits.enqueue(&who.tenant, valid.len())?;
        let applied = self.proposer.enqueue(valid).await.map_err(ApiError::from)?;
        let results = merge_items(checked, applied).into_iter().zip(debounce).map(enqueue_result).collect();
        Ok(pb::EnqueueBatchResponse { results })
    }

    async fn get_task_local(&self, req: Request<pb::GetTaskRequest>) -> Result<pb::Task, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let id = convert::parse_id(&req.get_ref().id)?;
        match self.proposer.read_task(&id, !stale_read(&req)).await.map_err(ApiError::from)? {
            Some(t) if t.tenant == who.tenant => {
                who.check_queue(&t.queue)?;
                Ok(convert::task(&t))
            }
            _ => Err(not_found("task")),
        }
    }

    async fn get_result_local(&self, req: Request<pb::GetResultRequest>) -> Result<pb::TaskResult, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::GetResultRequest { id, wait_ms } = req.into_inner();
        let id = convert::parse_id(&id)?;
        // Another tenant's task is not found, also after a wait: its existence is not revealed.
        match self.proposer.wait_result(&id, self.wait(wait_ms), linearize).await.map_err(ApiError::from)? {
            Some(t) if t.tenant == who.tenant => {
                who.check_queue(&t.queue)?;
                Ok(convert::result(t))
            }
            _ => Err(not_found("task")),
        }
    }

    async fn cancel_local(&self, req: Request<pb::CancelRequest>) -> Result<pb::CancelResponse, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let task_id = convert::parse_id(&req.get_ref().id)?;
        self.check_task_queue(&who, &task_id).await?;
        match self.proposer.write(Command::Cancel { tenant: who.tenant, task_id }).await.map_err(ApiError::from)? {
            SmResponse::Cancelled(Ok(s)) => Ok(pb::CancelResponse { state: convert::state(s) as i32 }),
            SmResponse::Cancelled(Err(r)) => Err(ApiError::from(r)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn list_dead_letters_local(
        &self,
        req: Request<pb::ListDeadLettersRequest>,
    ) -> Result<pb::ListDeadLettersResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::ListDeadLettersRequest { queue, limit } = req.into_inner();
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        who.check_queue(&queue)?;
        let limit = if limit == 0 { 100 } else { limit.min(10_000) } as usize;
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let tasks = self
            .proposer
            .shared
            .dead_letters(&who.tenant, &queue, limit)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok(pb::ListDeadLettersResponse { tasks: tasks.iter().map(convert::task).collect() })
    }

    async fn redrive_local(&self, req: Request<pb::DeadLetterSelection>) -> Result<pb::DeadLetterIds, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let (tenant, queue, select) = self.selection(&who, req.into_inner())?;
        let by_id = matches!(select, DlqSelector::Ids(_));
        match self.proposer.write(Command::Redrive { tenant, queue, select }).await.map_err(ApiError::from)? {
            // Ids of which none is a dead letter of this tenant's queue (another tenant's task, say): not found.
            SmResponse::Redriven(v) if by_id && v.is_empty() => Err(not_found("task")),
            SmResponse::Redriven(v) => Ok(ids(v)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn purge_dead_letters_local(
        &self,
        req: Request<pb::DeadLetterSelection>,
    ) -> Result<pb::DeadLetterIds, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let (tenant, queue, select) = self.selection(&who, req.into_inner())?;
        let by_id = matches!(select, DlqSelector::Ids(_));
        match self.proposer.write(Command::PurgeDeadLetters { tenant, queue, select }).await.map_err(ApiError::from)? {
            SmResponse::Purged(v) if by_id && v.is_empty() => Err(not_found("task")),
            SmResponse::Purged(v) => Ok(ids(v)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn claim_local(&self, req: Request<pb::ClaimRequest>) -> Result<pb::ClaimResponse, ApiError> {
        let who = caller_with(&req, Scope::Work)?;
        let cfg = &self.proposer.cfg;
        let pb::ClaimRequest { worker_id, queues, count, lease_ms, wait_ms } = req.into_inner();
        if worker_id.is_empty() || worker_id.len() > 256 {
            return Err(invalid("worker_id must be 1 to 256 characters"));
        }
        if queues.is_empty() || queues.len() > 64 {
            return Err(invalid("claim names 1 to 64 queues"));
        }
        for q in &queues {
            convert::validate_queue(cfg, q)?;
            who.check_queue(q)?;
        }
        if count == 0 || count as usize > cfg.max_batch_items {
            return Err(invalid(format!("count must be 1 to {}", cfg.max_batch_items)));
        }
        let lease = convert::lease_ms(cfg, lease_ms)?;
        let granted = self.limits.claim(&who.tenant, count as usize)?;
        let claimed =
            self.dispatcher.claim(&who.tenant, &worker_id.into(), &queues, granted, lease, self.wait(wait_ms)).await;
        let tasks = claimed.map_err(|e| {
            self.limits.unclaimed(&who.tenant, granted);
            ApiError::from(e)
        })?;
        self.limits.unclaimed(&who.tenant, granted - tasks.len());
        Ok(pb::ClaimResponse { tasks: tasks.iter().map(|t| convert::task(t)).collect() })
    }

    async fn ack_local(&self, req: Request<pb::AckRequest>) -> Result<pb::AckResponse, ApiError> {
        let who = caller_with(&req, Scope::Work)?;
        let pb::AckRequest { task_id, token, action } = req.into_inner();
        let task_id = convert::parse_id(&task_id)?;
        let action = convert::ack_action(&self.proposer.cfg, &who.tenant, &task_id, action, wall_clock_ms())?;
        let chained = matches!(action, crate::queue::AckAction::CompleteWith { .. });
        let item = AckItem { task_id, tenant: who.tenant, token, action };
        let mut out = self.proposer.ack(vec![item]).await.map_err(ApiError::from)?;
        let r = out.pop().ok_or_else(|| ApiError::Internal("no result".into()))?.map_err(ApiError::from)?;
        // The ids the completion created are stored with the task (a replayed ack created nothing new).
        let follow_up_ids = if chained {
            let t = self.proposer.shared.get_task(&task_id).map_err(|e| ApiError::Internal(e.to_string()))?;
            t.map(|t| t.follow_ups.iter().map(|id| id.to_string()).collect()).unwrap_or_default()
        } else {
            vec![]
        };
        Ok(pb::AckResponse {
            state: convert::state(r.state) as i32,
            at_ms: r.at.min(i64::MAX as u64) as i64,
            follow_up_ids,
        })
    }

    async fn ack_batch_local(&self, req: Request<pb::AckBatchRequest>) -> Result<pb::AckBatchResponse, ApiError> {
        let who = caller_with(&req, Scope::Work)?;
        let cfg = &self.proposer.cfg;
        let pb::AckBatchRequest { items } = req.into_inner();
        if items.is_empty() || items.len() > cfg.max_batch_items {
            return Err(invalid(format!("a batch holds 1 to {} acks", cfg.max_batch_items)));
        }
        let now = wall_clock_ms();
        let checked: Vec<Result<AckItem, ApiError>> = items
            .into_iter()
            .map(|pb::AckRequest { task_id, token, action }| {
                let task_id = convert::parse_id(&task_id)?;
                let action = convert::ack_action(cfg, &who.tenant, &task_id, action, now)?;
                Ok(AckItem { task_id, tenant: who.tenant.clone(), token, action })
            })
            .collect();
        let (valid, checked) = split_items(checked);
        let applied = self.proposer.ack(valid).await.map_err(ApiError::from)?;
        let results = merge_items(checked, applied).into_iter().map(ack_result).collect();
        Ok(pb::AckBatchResponse { results })
    }

    async fn queue_stats_local(&self, req: Request<pb::QueueStatsRequest>) -> Result<pb::QueueStatsResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::QueueStatsRequest { queues } = req.into_inner();
        for q in &queues {
            convert::validate_queue(&self.proposer.cfg, q)?;
        }
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let queues = self
            .proposer
            .shared
            .counts(Some(&who.tenant))
            .into_iter()
            .filter(|(qk, _)| (queues.is_empty() || queues.contains(&qk.queue)) && who.may_use_queue(&qk.queue))
            .map(|(qk, c)| pb::QueueStats {
                pending: c.pending,
                delayed: c.delayed,
                in_progress: c.in_progress,
                completed: c.completed,
                failed: c.failed,
                cancelled: c.cancelled,
                dead_lettered: c.dead_lettered,
                paused: self.proposer.shared.is_paused(&qk.tenant, &qk.queue),
                queue: qk.queue,
            })
            .collect();
        Ok(pb::QueueStatsResponse { queues })
    }
}

/// The client of this service on the leader.
fn tasks_on(ch: Channel) -> TaskServiceClient<Channel> {
    TaskServiceClient::new(ch).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20)
}

/// The operations of the task service, each routed to the leader: what gRPC (the `TaskService` impl below) and
/// REST call. A routed operation has the name of its RPC; the trait's methods call these (inherent methods are
/// found before trait methods of the same name).
///
/// Each has a span (`#[instrument]`) at debug level: one per request, so free unless asked for
/// (`RAFTQ_LOG=info,raftq::api=debug`); the streams' spans are per stream, at info level.
impl TaskApi {
    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn enqueue(&self, req: Request<pb::EnqueueRequest>) -> Result<pb::EnqueueResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).enqueue(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.enqueue_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(items = req.get_ref().items.len()))]
    pub async fn enqueue_batch(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<pb::EnqueueBatchResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).enqueue_batch(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.enqueue_batch_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(task_id = %req.get_ref().id))]
    pub async fn get_task(&self, req: Request<pb::GetTaskRequest>) -> Result<pb::Task, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).get_task(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.get_task_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(task_id = %req.get_ref().id, wait_ms = req.get_ref().wait_ms))]
    pub async fn get_result(&self, req: Request<pb::GetResultRequest>) -> Result<pb::TaskResult, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).get_result(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.get_result_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(task_id = %req.get_ref().id))]
    pub async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<pb::CancelResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).cancel(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.cancel_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn list_dead_letters(
        &self,
        req: Request<pb::ListDeadLettersRequest>,
    ) -> Result<pb::ListDeadLettersResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).list_dead_letters(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_dead_letters_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn redrive(&self, req: Request<pb::DeadLetterSelection>) -> Result<pb::DeadLetterIds, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).redrive(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.redrive_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn purge_dead_letters(
        &self,
        req: Request<pb::DeadLetterSelection>,
    ) -> Result<pb::DeadLetterIds, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).purge_dead_letters(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.purge_dead_letters_local(r), remote).await
    }

    /// Tasks a lost answer had claimed come back when their leases expire: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(worker_id = %req.get_ref().worker_id, count = req.get_ref().count))]
    pub async fn claim(&self, req: Request<pb::ClaimRequest>) -> Result<pb::ClaimResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).claim(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.claim_local(r), remote).await
    }

    /// An ack repeated with the same token and outcome is answered as applied: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(task_id = %req.get_ref().task_id))]
    pub async fn ack(&self, req: Request<pb::AckRequest>) -> Result<pb::AckResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).ack(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.ack_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(items = req.get_ref().items.len()))]
    pub async fn ack_batch(&self, req: Request<pb::AckBatchRequest>) -> Result<pb::AckBatchResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).ack_batch(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.ack_batch_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all)]
    pub async fn queue_stats(&self, req: Request<pb::QueueStatsRequest>) -> Result<pb::QueueStatsResponse, ApiError> {
        let remote = |ch, r| async move { tasks_on(ch).queue_stats(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.queue_stats_local(r), remote).await
    }
}

pub fn ack_result(r: Result<crate::queue::AckOutcome, ApiError>) -> pb::AckResult {
    pb::AckResult {
        result: Some(match r {
            Ok(o) => pb::ack_result::Result::Ok(pb::AckResponse {
                state: convert::state(o.state) as i32,
                at_ms: o.at.min(i64::MAX as u64) as i64,
                follow_up_ids: vec![],
            }),
            Err(e) => pb::ack_result::Result::Error(super::stream::refusal(&e)),
        }),
    }
}

/// gRPC: each method is the routed operation of the same name above.
#[tonic::async_trait]
impl TaskService for TaskApi {
    async fn enqueue(&self, req: Request<pb::EnqueueRequest>) -> Res<pb::EnqueueResponse> {
        reply(TaskApi::enqueue(self, req).await)
    }

    async fn enqueue_batch(&self, req: Request<pb::EnqueueBatchRequest>) -> Res<pb::EnqueueBatchResponse> {
        reply(TaskApi::enqueue_batch(self, req).await)
    }

    async fn get_task(&self, req: Request<pb::GetTaskRequest>) -> Res<pb::Task> {
        reply(TaskApi::get_task(self, req).await)
    }

    async fn get_result(&self, req: Request<pb::GetResultRequest>) -> Res<pb::TaskResult> {
        reply(TaskApi::get_result(self, req).await)
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Res<pb::CancelResponse> {
        reply(TaskApi::cancel(self, req).await)
    }

    async fn list_dead_letters(&self, req: Request<pb::ListDeadLettersRequest>) -> Res<pb::ListDeadLettersResponse> {
        reply(TaskApi::list_dead_letters(self, req).await)
    }

    async fn redrive(&self, req: Request<pb::DeadLetterSelection>) -> Res<pb::DeadLetterIds> {
        reply(TaskApi::redrive(self, req).await)
    }

    async fn purge_dead_letters(&self, req: Request<pb::DeadLetterSelection>) -> Res<pb::DeadLetterIds> {
        reply(TaskApi::purge_dead_letters(self, req).await)
    }

    async fn claim(&self, req: Request<pb::ClaimRequest>) -> Res<pb::ClaimResponse> {
        reply(TaskApi::claim(self, req).await)
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Res<pb::AckResponse> {
        reply(TaskApi::ack(self, req).await)
    }

    async fn ack_batch(&self, req: Request<pb::AckBatchRequest>) -> Res<pb::AckBatchResponse> {
        reply(TaskApi::ack_batch(self, req).await)
    }

    async fn queue_stats(&self, req: Request<pb::QueueStatsRequest>) -> Res<pb::QueueStatsResponse> {
        reply(TaskApi::queue_stats(self, req).await)
    }
}
