//! The public gRPC task service.

use std::sync::Arc;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::task_service_server::TaskService;
use tonic::{Request, Response, Status};

use super::convert;
use super::error::{invalid, ApiError};
use crate::queue::{AckItem, Command, DlqSelector, Response as SmResponse, TaskId};
use crate::raft::dispatcher::Dispatcher;
use crate::raft::proposer::{wall_clock_ms, Proposer};

/// Who is calling. Authentication (JWT) fills this in one place; until then every caller is the default tenant.
pub struct Caller {
    pub tenant: String,
}

pub const DEFAULT_TENANT: &str = "default";

/// Who sends a unary request: every call is checked here.
pub fn caller<T>(req: &Request<T>) -> Result<Caller, ApiError> {
    let token = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_start_matches("Bearer ").to_string())
        .unwrap_or_default();
    authenticate(&token)
}

/// The one place a token becomes a caller. Until authentication is configured every token is accepted and
/// every caller is the default tenant.
pub fn authenticate(_token: &str) -> Result<Caller, ApiError> {
    Ok(Caller { tenant: DEFAULT_TENANT.to_string() })
}

pub fn enqueue_result(r: Result<crate::queue::Enqueued, ApiError>) -> pb::EnqueueResult {
    pb::EnqueueResult {
        result: Some(match r {
            Ok(e) => pb::enqueue_result::Result::Ok(pb::EnqueueResponse {
                task_id: e.task_id.to_string(),
                duplicate: e.duplicate,
            }),
            Err(e) => pb::enqueue_result::Result::Error(pb::Error { code: e.reason().to_string(), message: e.to_string() }),
        }),
    }
}

pub struct TaskApi {
    pub proposer: Arc<Proposer>,
    pub dispatcher: Dispatcher,
}

type Res<T> = Result<Response<T>, Status>;

impl TaskApi {
    fn wait(&self, ms: u64) -> Duration {
        Duration::from_millis(ms.min(self.proposer.cfg.max_wait_ms))
    }

    fn selection(&self, tenant: &str, sel: pb::DeadLetterSelection) -> Result<(String, String, DlqSelector), ApiError> {
        let pb::DeadLetterSelection { queue, ids, all } = sel;
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        let select = match (all, ids.is_empty()) {
            (true, true) => DlqSelector::All,
            (false, false) => DlqSelector::Ids(ids.iter().map(|s| convert::parse_id(s)).collect::<Result<_, _>>()?),
            (true, false) => return Err(invalid("give either ids or all, not both")),
            (false, true) => return Err(invalid("give the ids to take, or all")),
        };
        Ok((tenant.to_string(), queue, select))
    }
}

fn ids(v: Vec<TaskId>) -> pb::DeadLetterIds {
    pb::DeadLetterIds { ids: v.into_iter().map(|i| i.to_string()).collect() }
}

#[tonic::async_trait]
impl TaskService for TaskApi {
    async fn enqueue(&self, req: Request<pb::EnqueueRequest>) -> Res<pb::EnqueueResponse> {
        let who = caller(&req)?;
        let item = convert::new_task(&self.proposer.cfg, &who.tenant, req.into_inner(), wall_clock_ms())?;
        let mut out = self.proposer.enqueue(vec![item]).await.map_err(ApiError::from)?;
        let r = out.pop().ok_or_else(|| ApiError::Internal("no result".into()))?.map_err(ApiError::from)?;
        Ok(Response::new(pb::EnqueueResponse { task_id: r.task_id.to_string(), duplicate: r.duplicate }))
    }

    async fn enqueue_batch(&self, req: Request<pb::EnqueueBatchRequest>) -> Res<pb::EnqueueBatchResponse> {
        let who = caller(&req)?;
        let cfg = &self.proposer.cfg;
        let pb::EnqueueBatchRequest { items } = req.into_inner();
        if items.is_empty() || items.len() > cfg.max_batch_items {
            return Err(invalid(format!("a batch holds 1 to {} items", cfg.max_batch_items)).into());
        }
        let now = wall_clock_ms();
        // Items fail one by one: invalid ones get their error, valid ones are proposed together.
        let checked: Vec<Result<_, ApiError>> =
            items.into_iter().map(|i| convert::new_task(cfg, &who.tenant, i, now)).collect();
        let valid: Vec<_> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
        let mut applied = self.proposer.enqueue(valid).await.map_err(ApiError::from)?.into_iter();
        let results = checked
            .into_iter()
            .map(|c| {
                let r = match c {
                    Err(e) => Err(e),
                    Ok(_) => applied.next().unwrap_or(Err(crate::queue::Rejected::NotFound)).map_err(ApiError::from),
                };
                enqueue_result(r)
            })
            .collect();
        Ok(Response::new(pb::EnqueueBatchResponse { results }))
    }

    async fn get_task(&self, req: Request<pb::GetTaskRequest>) -> Res<pb::Task> {
        let who = caller(&req)?;
        let id = convert::parse_id(&req.get_ref().id)?;
        match self.proposer.get_task(&id).await.map_err(ApiError::from)? {
            Some(t) if t.tenant == who.tenant => Ok(Response::new(convert::task(t))),
            _ => Err(ApiError::NotFound.into()),
        }
    }

    async fn get_result(&self, req: Request<pb::GetResultRequest>) -> Res<pb::TaskResult> {
        let who = caller(&req)?;
        let pb::GetResultRequest { id, wait_ms } = req.into_inner();
        let id = convert::parse_id(&id)?;
        match self.proposer.wait_result(&id, self.wait(wait_ms)).await.map_err(ApiError::from)? {
            Some(t) if t.tenant == who.tenant => Ok(Response::new(convert::result(t))),
            _ => Err(ApiError::NotFound.into()),
        }
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Res<pb::CancelResponse> {
        let who = caller(&req)?;
        let task_id = convert::parse_id(&req.get_ref().id)?;
        match self.proposer.write(Command::Cancel { tenant: who.tenant, task_id }).await.map_err(ApiError::from)? {
            SmResponse::Cancelled(Ok(s)) => Ok(Response::new(pb::CancelResponse { state: convert::state(s) as i32 })),
            SmResponse::Cancelled(Err(r)) => Err(ApiError::from(r).into()),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}")).into()),
        }
    }

    async fn list_dead_letters(&self, req: Request<pb::ListDeadLettersRequest>) -> Res<pb::ListDeadLettersResponse> {
        let who = caller(&req)?;
        let pb::ListDeadLettersRequest { queue, limit } = req.into_inner();
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        let limit = if limit == 0 { 100 } else { limit.min(10_000) } as usize;
        self.proposer.linearize().await.map_err(ApiError::from)?;
        let tasks = self
            .proposer
            .shared
            .dead_letters(&who.tenant, &queue, limit)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok(Response::new(pb::ListDeadLettersResponse { tasks: tasks.into_iter().map(convert::task).collect() }))
    }

    async fn redrive(&self, req: Request<pb::DeadLetterSelection>) -> Res<pb::DeadLetterIds> {
        let who = caller(&req)?;
        let (tenant, queue, select) = self.selection(&who.tenant, req.into_inner())?;
        match self.proposer.write(Command::Redrive { tenant, queue, select }).await.map_err(ApiError::from)? {
            SmResponse::Redriven(v) => Ok(Response::new(ids(v))),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}")).into()),
        }
    }

    async fn purge_dead_letters(&self, req: Request<pb::DeadLetterSelection>) -> Res<pb::DeadLetterIds> {
        let who = caller(&req)?;
        let (tenant, queue, select) = self.selection(&who.tenant, req.into_inner())?;
        match self.proposer.write(Command::PurgeDeadLetters { tenant, queue, select }).await.map_err(ApiError::from)? {
            SmResponse::Purged(v) => Ok(Response::new(ids(v))),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}")).into()),
        }
    }

    async fn claim(&self, req: Request<pb::ClaimRequest>) -> Res<pb::ClaimResponse> {
        let who = caller(&req)?;
        let cfg = &self.proposer.cfg;
        let pb::ClaimRequest { worker_id, queues, count, lease_ms, wait_ms } = req.into_inner();
        if worker_id.is_empty() || worker_id.len() > 256 {
            return Err(invalid("worker_id must be 1 to 256 characters").into());
        }
        if queues.is_empty() || queues.len() > 64 {
            return Err(invalid("claim names 1 to 64 queues").into());
        }
        for q in &queues {
            convert::validate_queue(cfg, q)?;
        }
        if count == 0 || count as usize > cfg.max_batch_items {
            return Err(invalid(format!("count must be 1 to {}", cfg.max_batch_items)).into());
        }
        let lease = convert::lease_ms(cfg, lease_ms)?;
        let tasks = self
            .dispatcher
            .claim(&who.tenant, &worker_id, &queues, count as usize, lease, self.wait(wait_ms))
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::ClaimResponse { tasks: tasks.into_iter().map(convert::task).collect() }))
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Res<pb::AckResponse> {
        let who = caller(&req)?;
        let pb::AckRequest { task_id, token, action } = req.into_inner();
        let item = AckItem {
            task_id: convert::parse_id(&task_id)?,
            tenant: who.tenant,
            token,
            action: convert::ack_action(&self.proposer.cfg, action)?,
        };
        let mut out = self.proposer.ack(vec![item]).await.map_err(ApiError::from)?;
        let r = out.pop().ok_or_else(|| ApiError::Internal("no result".into()))?.map_err(ApiError::from)?;
        Ok(Response::new(pb::AckResponse {
            state: convert::state(r.state) as i32,
            at_ms: r.at.min(i64::MAX as u64) as i64,
        }))
    }
}
