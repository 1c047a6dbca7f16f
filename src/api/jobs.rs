//! The `Jobs` gRPC service (issue 9): pause and resume queues, fairness weights, rate limits and concurrency key
//! overrides (issue 17), list tasks with filters a page at a time, and the capacity view. Reads are linearizable
//! unless the request carries `x-raftq-read: stale`; requests reaching a follower are forwarded to the leader like
//! the task service's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;
use raftq_proto::v1::jobs_server::Jobs;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::convert;
use super::error::{invalid, not_found, reply, ApiError};
use super::forward::{stale_read, Forwarder, Kind};
use super::grpc::caller_with;
use crate::auth::Scope;
use crate::leader::dispatcher::Dispatcher;
use crate::leader::proposer::wall_clock_ms;
use crate::leader::proposer::Proposer;
use crate::queue::{
    self, Command, Limits, MissedPolicy, Response as SmResponse, Schedule, ScheduleSpec, TaskFilter, TaskId, TaskState,
};

/// Largest page a listing returns.
const MAX_PAGE_SIZE: u32 = 1000;
/// Shortest schedule interval: each occurrence is a Raft entry.
const MIN_INTERVAL_MS: u64 = 100;

fn schedule_pb(s: &Schedule) -> pb::Schedule {
    let ms = |t: u64| t.min(i64::MAX as u64) as i64;
    let (cron, time_zone, interval_ms) = match &s.spec {
        ScheduleSpec::Cron { expr, tz } => (expr.clone(), tz.clone(), 0),
        ScheduleSpec::Interval { every_ms } => (String::new(), String::new(), *every_ms),
    };
    pb::Schedule {
        id: s.id.to_string(),
        name: s.name.clone(),
        queue: s.template.queue.clone(),
        cron,
        time_zone,
        interval_ms,
        missed_policy: match s.missed {
            MissedPolicy::Skip => pb::MissedPolicy::Skip,
            MissedPolicy::RunOnce => pb::MissedPolicy::RunOnce,
        } as i32,
        paused: s.paused,
        created_at_ms: ms(s.created_at),
        last_occurrence_ms: s.last_occurrence.map(ms).unwrap_or(0),
        next_occurrence_ms: queue::cron::next_due(s).map(ms).unwrap_or(0),
        fired: s.fired,
    }
}

fn key_limit_pb(r: crate::storage::KeyLimitRow) -> pb::ConcurrencyOverride {
    let crate::storage::KeyLimitRow { key, limit, expires_at, running, pending } = r;
    pb::ConcurrencyOverride { key, limit, expires_at_ms: expires_at.unwrap_or(0), running, pending }
}

/// An override reaches every queue of the tenant: a token limited to some queues may not change one.
fn check_all_queues(who: &crate::auth::Caller) -> Result<(), ApiError> {
    if who.limited_to_queues() {
        return Err(invalid("a token limited to some queues cannot change a concurrency key override (a key spans every queue of the tenant)"));
    }
    Ok(())
}

fn limits_pb(queue: String, l: Limits) -> pb::QueueLimits {
    pb::QueueLimits { queue, max_running: l.max_running.unwrap_or(0), max_depth: l.max_depth.unwrap_or(0) }
}

fn fairness_pb(r: crate::storage::FairnessRow) -> pb::FairnessKey {
    let crate::storage::FairnessRow { queue, key, weight, ready, running, throttled } = r;
    pb::FairnessKey { queue, key, weight, ready, running, throttled }
}

fn rate_limit_pb(r: crate::storage::RateRow) -> pb::RateLimit {
    let crate::storage::RateRow { queue, key, limit, tokens, ready, throttled } = r;
    pb::RateLimit {
        queue,
        whole_queue: key.is_none(),
        key: key.unwrap_or_default(),
        per_second: limit.milli_per_s as f64 / 1_000.0,
        burst: limit.burst,
        tokens,
        ready,
        throttled,
    }
}

pub struct JobsApi {
    pub proposer: Arc<Proposer>,
    pub dispatcher: Dispatcher,
    pub fwd: Arc<Forwarder>,
}

type Res<T> = Result<Response<T>, Status>;

fn task_state(s: i32) -> Result<Option<TaskState>, ApiError> {
    Ok(match pb::TaskState::try_from(s).map_err(|_| invalid(format!("unknown task state {s}")))? {
        pb::TaskState::Unspecified => None,
        pb::TaskState::Pending => Some(TaskState::Pending),
        pb::TaskState::InProgress => Some(TaskState::InProgress),
        pb::TaskState::Completed => Some(TaskState::Completed),
        pb::TaskState::Failed => Some(TaskState::Failed),
        pb::TaskState::Cancelled => Some(TaskState::Cancelled),
        pb::TaskState::DeadLettered => Some(TaskState::DeadLettered),
    })
}

fn bound(ms: i64, name: &str) -> Result<Option<u64>, ApiError> {
    match ms {
        0 => Ok(None),
        n if n < 0 => Err(invalid(format!("{name} must not be negative"))),
        n => Ok(Some(n as u64)),
    }
}

impl JobsApi {
    async fn set_paused(&self, tenant: String, queue: String, paused: bool) -> Result<pb::QueuePauseState, ApiError> {
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        let cmd = Command::SetQueuePaused { tenant, queue: queue.clone(), paused };
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::QueuePaused(p) => Ok(pb::QueuePauseState { queue, paused: p }),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn pause_local(&self, req: Request<pb::PauseQueueRequest>) -> Result<pb::QueuePauseState, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let pb::PauseQueueRequest { queue } = req.into_inner();
        who.check_queue(&queue)?;
        self.set_paused(who.tenant, queue, true).await
    }

    async fn resume_local(&self, req: Request<pb::ResumeQueueRequest>) -> Result<pb::QueuePauseState, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let pb::ResumeQueueRequest { queue } = req.into_inner();
        who.check_queue(&queue)?;
        self.set_paused(who.tenant, queue, false).await
    }

    async fn list_paused_local(
        &self,
        req: Request<pb::ListPausedQueuesRequest>,
    ) -> Result<pb::ListPausedQueuesResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        if !stale_read(&req) {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let pb::ListPausedQueuesRequest {} = req.into_inner();
        Ok(pb::ListPausedQueuesResponse { queues: self.proposer.shared.paused_queues(&who.tenant) })
    }

    async fn set_limits_local(&self, req: Request<pb::QueueLimits>) -> Result<pb::QueueLimits, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let pb::QueueLimits { queue, max_running, max_depth } = req.into_inner();
        if queue.is_empty() {
            if who.limited_to_queues() {
                return Err(invalid("a token limited to some queues cannot set the tenant's limits"));
            }
            if max_running != 0 {
                return Err(invalid("max_running caps one queue: give queue (the tenant's limit is max_depth)"));
            }
        } else {
            convert::validate_queue(&self.proposer.cfg, &queue)?;
            who.check_queue(&queue)?;
        }
        let limits = Limits {
            max_running: (max_running > 0).then_some(max_running),
            max_depth: (max_depth > 0).then_some(max_depth),
        };
        let cmd = Command::SetLimits { tenant: who.tenant, queue: queue.clone(), limits };
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::LimitsSet(l) => Ok(limits_pb(queue, l)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn list_limits_local(
        &self,
        req: Request<pb::ListQueueLimitsRequest>,
    ) -> Result<pb::ListQueueLimitsResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        if !stale_read(&req) {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let pb::ListQueueLimitsRequest {} = req.into_inner();
        let limits = self
            .proposer
            .shared
            .tenant_limits(&who.tenant)
            .into_iter()
            .filter(|(q, _)| q.is_empty() || who.check_queue(q).is_ok())
            .map(|(q, l)| limits_pb(q, l))
            .collect();
        Ok(pb::ListQueueLimitsResponse { limits })
    }

    async fn set_fairness_weight_local(
        &self,
        req: Request<pb::SetFairnessWeightRequest>,
    ) -> Result<pb::FairnessKey, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let pb::SetFairnessWeightRequest { queue, key, weight } = req.into_inner();
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        who.check_queue(&queue)?;
        convert::validate_fairness(&self.proposer.cfg, &key, weight)?;
        let cmd =
            Command::SetFairnessWeight { tenant: who.tenant.clone(), queue: queue.clone(), key: key.clone(), weight };
        let weight = match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::FairnessWeight(w) => w,
            other => return Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        };
        let rows = self.proposer.shared.fairness(&who.tenant, Some(&queue), wall_clock_ms());
        let row = rows.into_iter().find(|r| r.key == key);
        let (ready, running, throttled) = row.map_or((0, 0, false), |r| (r.ready, r.running, r.throttled));
        Ok(pb::FairnessKey { queue, key, weight, ready, running, throttled })
    }

    async fn list_fairness_local(
        &self,
        req: Request<pb::ListFairnessRequest>,
    ) -> Result<pb::ListFairnessResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::ListFairnessRequest { queue } = req.into_inner();
        if !queue.is_empty() {
            convert::validate_queue(&self.proposer.cfg, &queue)?;
            who.check_queue(&queue)?;
        }
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let rows =
            self.proposer.shared.fairness(&who.tenant, Some(queue.as_str()).filter(|q| !q.is_empty()), wall_clock_ms());
        let keys = rows.into_iter().filter(|r| who.may_use_queue(&r.queue)).map(fairness_pb).collect();
        Ok(pb::ListFairnessResponse { keys })
    }

    async fn set_rate_limit_local(&self, req: Request<pb::SetRateLimitRequest>) -> Result<pb::RateLimit, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        let pb::SetRateLimitRequest { queue, key, whole_queue, per_second, burst } = req.into_inner();
        convert::validate_queue(&self.proposer.cfg, &queue)?;
        who.check_queue(&queue)?;
        if whole_queue && !key.is_empty() {
            return Err(invalid("whole_queue limits the queue: give no key"));
        }
        convert::validate_fairness(&self.proposer.cfg, &key, crate::queue::fair::DEFAULT_WEIGHT)?;
        let limit = convert::rate_limit(per_second, burst)?;
        let key = (!whole_queue).then_some(key);
        let cmd = Command::SetRateLimit { tenant: who.tenant.clone(), queue: queue.clone(), key: key.clone(), limit };
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::RateLimit(_) => {}
            other => return Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
        let rows = self.proposer.shared.rate_limits(&who.tenant, Some(&queue), wall_clock_ms());
        Ok(match rows.into_iter().find(|r| r.key == key) {
            Some(r) => rate_limit_pb(r),
            None => pb::RateLimit {
                queue,
                key: key.unwrap_or_default(),
                whole_queue,
                per_second: 0.0,
                burst: 0,
                tokens: 0.0,
                ready: 0,
                throttled: false,
            },
        })
    }

    async fn list_rate_limits_local(
        &self,
        req: Request<pb::ListRateLimitsRequest>,
    ) -> Result<pb::ListRateLimitsResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::ListRateLimitsRequest { queue } = req.into_inner();
        if !queue.is_empty() {
            convert::validate_queue(&self.proposer.cfg, &queue)?;
            who.check_queue(&queue)?;
        }
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let queue = Some(queue.as_str()).filter(|q| !q.is_empty());
        let rows = self.proposer.shared.rate_limits(&who.tenant, queue, wall_clock_ms());
        let limits = rows.into_iter().filter(|r| who.may_use_queue(&r.queue)).map(rate_limit_pb).collect();
        Ok(pb::ListRateLimitsResponse { limits })
    }

    async fn set_key_limit_local(
        &self,
        req: Request<pb::SetConcurrencyOverrideRequest>,
    ) -> Result<pb::ConcurrencyOverride, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        check_all_queues(&who)?;
        let pb::SetConcurrencyOverrideRequest { key, limit, ttl_ms, expires_at } = req.into_inner();
        let expires_at =
            match convert::key_limit(&self.proposer.cfg, &key, limit, ttl_ms, &expires_at, wall_clock_ms())? {
                convert::KeyLimitExpiry::Never => None,
                convert::KeyLimitExpiry::After(ttl) => Some(self.proposer.expiry_after(ttl)),
                convert::KeyLimitExpiry::At(at) => Some(at),
            };
        let cmd = Command::SetKeyLimit {
            tenant: who.tenant.clone(),
            key: key.clone(),
            limit: Some(queue::KeyLimit { limit, expires_at }),
        };
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::KeyLimit(_) => {}
            other => return Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
        let rows = self.proposer.shared.key_limits(&who.tenant, Some(&key), wall_clock_ms());
        Ok(rows.into_iter().next().map(key_limit_pb).unwrap_or(pb::ConcurrencyOverride {
            key,
            limit,
            expires_at_ms: expires_at.unwrap_or(0),
            running: 0,
            pending: 0,
        }))
    }

    async fn clear_key_limit_local(
        &self,
        req: Request<pb::ClearConcurrencyOverrideRequest>,
    ) -> Result<pb::ClearConcurrencyOverrideResponse, ApiError> {
        let who = caller_with(&req, Scope::Admin)?;
        check_all_queues(&who)?;
        let pb::ClearConcurrencyOverrideRequest { key } = req.into_inner();
        if key.is_empty() {
            return Err(invalid("key must not be empty: an override is for one concurrency key"));
        }
        let cleared = !self.proposer.shared.key_limits(&who.tenant, Some(&key), wall_clock_ms()).is_empty();
        let cmd = Command::SetKeyLimit { tenant: who.tenant.clone(), key, limit: None };
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::KeyLimit(_) => Ok(pb::ClearConcurrencyOverrideResponse { cleared }),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn list_key_limits_local(
        &self,
        req: Request<pb::ListConcurrencyOverridesRequest>,
    ) -> Result<pb::ListConcurrencyOverridesResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::ListConcurrencyOverridesRequest { key } = req.into_inner();
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let key = Some(key.as_str()).filter(|k| !k.is_empty());
        let rows = self.proposer.shared.key_limits(&who.tenant, key, wall_clock_ms());
        Ok(pb::ListConcurrencyOverridesResponse { overrides: rows.into_iter().map(key_limit_pb).collect() })
    }

    async fn list_tasks_local(&self, req: Request<pb::ListTasksRequest>) -> Result<pb::ListTasksResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::ListTasksRequest { queue, state, created_from_ms, created_to_ms, page_size, page_token } =
            req.into_inner();
        if !queue.is_empty() {
            convert::validate_queue(&self.proposer.cfg, &queue)?;
            who.check_queue(&queue)?;
        } else if who.limited_to_queues() {
            return Err(invalid("a token limited to some queues lists one queue at a time: give queue"));
        }
        let filter = TaskFilter {
            queue: (!queue.is_empty()).then_some(queue),
            state: task_state(state)?,
            created_from: bound(created_from_ms, "created_from_ms")?,
            created_to: bound(created_to_ms, "created_to_ms")?,
        };
        if page_size > MAX_PAGE_SIZE {
            return Err(invalid(format!("page_size must be at most {MAX_PAGE_SIZE}")));
        }
        let limit = if page_size == 0 { 100 } else { page_size } as usize;
        let after = if page_token.is_empty() {
            None
        } else {
            Some(page_token.parse().map_err(|_| invalid("page_token is not one this server gave"))?)
        };
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let (tasks, more) = self
            .proposer
            .shared
            .list_tasks(&who.tenant, &filter, after, limit)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let next_page_token = match (more, tasks.last()) {
            (true, Some(t)) => t.id.to_string(),
            _ => String::new(),
        };
        Ok(pb::ListTasksResponse { tasks: tasks.iter().map(convert::task).collect(), next_page_token })
    }

    async fn capacity_local(
        &self,
        req: Request<pb::QueueCapacityRequest>,
    ) -> Result<pb::QueueCapacityResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        let linearize = !stale_read(&req);
        let pb::QueueCapacityRequest { queues } = req.into_inner();
        for q in &queues {
            convert::validate_queue(&self.proposer.cfg, q)?;
            who.check_queue(q)?;
        }
        if linearize {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let shared = &self.proposer.shared;
        let window = Duration::from_millis(self.proposer.cfg.active_worker_window_ms);
        let mut counts = shared.counts(Some(&who.tenant));
        let mut keys: HashMap<String, Vec<pb::FairnessKey>> = HashMap::new();
        // One queue asked for: only its keys are read (the view of every queue walks them all).
        let only = match queues.as_slice() {
            [q] => Some(q.as_str()),
            _ => None,
        };
        for r in shared.fairness(&who.tenant, only, wall_clock_ms()) {
            keys.entry(r.queue.clone()).or_default().push(fairness_pb(r));
        }
        // A queue asked for by name is reported even when it holds nothing yet.
        for q in &queues {
            if !counts.iter().any(|(qk, _)| qk.queue == *q) {
                let qk = queue::QueueKey { tenant: who.tenant.clone(), queue: q.clone() };
                counts.push((qk, Default::default()));
            }
        }
        let out = counts
            .into_iter()
            .filter(|(qk, _)| (queues.is_empty() || queues.contains(&qk.queue)) && who.may_use_queue(&qk.queue))
            .map(|(qk, c)| {
                let tp = shared.throughput(&qk.tenant, &qk.queue);
                let active = self.dispatcher.workers_seen().active(&qk.tenant, &qk.queue, window);
                let cap = queue::capacity::capacity(&c, tp, active);
                let needed = |n: Option<u64>| n.map(|n| n.min(i64::MAX as u64) as i64).unwrap_or(-1);
                let limits = shared.limits(&qk.tenant, &qk.queue).unwrap_or_default();
                pb::QueueCapacity {
                    keys: keys.remove(&qk.queue).unwrap_or_default(),
                    paused: shared.is_paused(&qk.tenant, &qk.queue),
                    max_running: limits.max_running.unwrap_or(0),
                    max_depth: limits.max_depth.unwrap_or(0),
                    queue: qk.queue,
                    pending: cap.pending,
                    ready: cap.ready,
                    delayed: cap.delayed,
                    running: cap.running,
                    active_workers: cap.active_workers,
                    completed_1m: tp.completed_1m,
                    completed_5m: tp.completed_5m,
                    completed_15m: tp.completed_15m,
                    rate_1m: cap.rate_1m,
                    rate_5m: cap.rate_5m,
                    rate_15m: cap.rate_15m,
                    drain_seconds: cap.drain_s.unwrap_or(-1.0),
                    per_worker_rate: cap.per_worker_rate.unwrap_or(-1.0),
                    workers_needed_1h: needed(cap.workers_needed[0]),
                    workers_needed_4h: needed(cap.workers_needed[1]),
                    workers_needed_8h: needed(cap.workers_needed[2]),
                }
            })
            .collect();
        Ok(pb::QueueCapacityResponse { queues: out })
    }

    async fn create_schedule_local(&self, req: Request<pb::CreateScheduleRequest>) -> Result<pb::Schedule, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let cfg = &self.proposer.cfg;
        let pb::CreateScheduleRequest { name, task, cron, time_zone, interval_ms, missed_policy } = req.into_inner();
        if name.is_empty() || name.len() > 128 {
            return Err(invalid("name must be 1 to 128 characters"));
        }
        let task = task.ok_or_else(|| invalid("a schedule needs its task"))?;
        if !task.idempotency_key.is_empty()
            || !task.concurrency_key.is_empty()
            || !task.depends_on.is_empty()
            || task.delay_ms > 0
            || task.run_at_ms > 0
            || task.deadline_in_ms > 0
        {
            return Err(invalid("a schedule's task takes no keys, dependencies, delay or deadline"));
        }
        let spec = match (cron.is_empty(), interval_ms) {
            (false, 0) => {
                let tz = if time_zone.is_empty() { "UTC".to_string() } else { time_zone };
                queue::cron::Cron::parse(&cron, &tz).map_err(invalid)?;
                ScheduleSpec::Cron { expr: cron, tz }
            }
            (true, ms) if ms >= MIN_INTERVAL_MS => ScheduleSpec::Interval { every_ms: ms },
            (true, _) => return Err(invalid(format!("give a cron expression or interval_ms >= {MIN_INTERVAL_MS}"))),
            (false, _) => return Err(invalid("give a cron expression or an interval, not both")),
        };
        let missed = match pb::MissedPolicy::try_from(missed_policy) {
            Ok(pb::MissedPolicy::Skip) => MissedPolicy::Skip,
            Ok(pb::MissedPolicy::RunOnce) => MissedPolicy::RunOnce,
            Err(_) => return Err(invalid(format!("unknown missed_policy {missed_policy}"))),
        };
        let now = wall_clock_ms();
        who.check_queue(&task.queue)?;
        let mut template = convert::new_task(cfg, &who.tenant, task, now)?;
        template.deadline = None;
        let id = TaskId::new(now, rand::random(), rand::random());
        let sch = Schedule {
            id,
            tenant: who.tenant,
            name,
            spec,
            missed,
            paused: false,
            created_at: now,
            last_occurrence: None,
            fired: 0,
            template,
        };
        self.schedule_write(Command::CreateSchedule(Box::new(sch))).await
    }

    async fn schedule_write(&self, cmd: Command) -> Result<pb::Schedule, ApiError> {
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::Schedule(Ok(Some(s))) => Ok(schedule_pb(&s)),
            SmResponse::Schedule(Ok(None)) => Err(not_found("schedule")),
            SmResponse::Schedule(Err(r)) => Err(ApiError::from(r)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn update_schedule(&self, tenant: String, id: &str, paused: bool, delete: bool) -> Result<Command, ApiError> {
        let id: TaskId = convert::parse_id(id)?;
        Ok(Command::UpdateSchedule { tenant, id, paused, delete })
    }

    async fn pause_schedule_local(&self, req: Request<pb::ScheduleRef>) -> Result<pb::Schedule, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let cmd = self.update_schedule(who.tenant, &req.get_ref().id, true, false).await?;
        self.schedule_write(cmd).await
    }

    async fn resume_schedule_local(&self, req: Request<pb::ScheduleRef>) -> Result<pb::Schedule, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let cmd = self.update_schedule(who.tenant, &req.get_ref().id, false, false).await?;
        self.schedule_write(cmd).await
    }

    async fn delete_schedule_local(
        &self,
        req: Request<pb::ScheduleRef>,
    ) -> Result<pb::DeleteScheduleResponse, ApiError> {
        let who = caller_with(&req, Scope::Enqueue)?;
        let cmd = self.update_schedule(who.tenant, &req.get_ref().id, false, true).await?;
        match self.proposer.write(cmd).await.map_err(ApiError::from)? {
            SmResponse::Schedule(Ok(_)) => Ok(pb::DeleteScheduleResponse {}),
            SmResponse::Schedule(Err(r)) => Err(ApiError::from(r)),
            other => Err(ApiError::Internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn list_schedules_local(
        &self,
        req: Request<pb::ListSchedulesRequest>,
    ) -> Result<pb::ListSchedulesResponse, ApiError> {
        let who = caller_with(&req, Scope::Read)?;
        if !stale_read(&req) {
            self.proposer.linearize().await.map_err(ApiError::from)?;
        }
        let mut all = self.proposer.shared.schedules(Some(&who.tenant));
        all.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
        Ok(pb::ListSchedulesResponse { schedules: all.iter().map(schedule_pb).collect() })
    }
}

/// The client of this service on the leader.
fn jobs_on(ch: Channel) -> JobsClient<Channel> {
    JobsClient::new(ch).max_decoding_message_size(64 << 20)
}

/// The operations of the Jobs service, each routed to the leader: what gRPC (the `Jobs` impl below) and REST
/// call. A routed operation has the name of its RPC (inherent methods are found before the trait's).
impl JobsApi {
    /// Pausing sets a state: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn pause_queue(&self, req: Request<pb::PauseQueueRequest>) -> Result<pb::QueuePauseState, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).pause_queue(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.pause_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn resume_queue(&self, req: Request<pb::ResumeQueueRequest>) -> Result<pb::QueuePauseState, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).resume_queue(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.resume_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all)]
    pub async fn list_paused_queues(
        &self,
        req: Request<pb::ListPausedQueuesRequest>,
    ) -> Result<pb::ListPausedQueuesResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_paused_queues(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_paused_local(r), remote).await
    }

    /// Setting limits sets a state: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn set_queue_limits(&self, req: Request<pb::QueueLimits>) -> Result<pb::QueueLimits, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).set_queue_limits(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.set_limits_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all)]
    pub async fn list_queue_limits(
        &self,
        req: Request<pb::ListQueueLimitsRequest>,
    ) -> Result<pb::ListQueueLimitsResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_queue_limits(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_limits_local(r), remote).await
    }

    /// Setting a weight sets a state: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, weight = req.get_ref().weight))]
    pub async fn set_fairness_weight(
        &self,
        req: Request<pb::SetFairnessWeightRequest>,
    ) -> Result<pb::FairnessKey, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).set_fairness_weight(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.set_fairness_weight_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn list_fairness(
        &self,
        req: Request<pb::ListFairnessRequest>,
    ) -> Result<pb::ListFairnessResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_fairness(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_fairness_local(r), remote).await
    }

    /// Setting a rate limit sets a state: safe to repeat (a repeat keeps the bucket's level).
    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, per_second = req.get_ref().per_second))]
    pub async fn set_rate_limit(&self, req: Request<pb::SetRateLimitRequest>) -> Result<pb::RateLimit, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).set_rate_limit(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.set_rate_limit_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    pub async fn list_rate_limits(
        &self,
        req: Request<pb::ListRateLimitsRequest>,
    ) -> Result<pb::ListRateLimitsResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_rate_limits(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_rate_limits_local(r), remote).await
    }

    /// Setting an override sets a state: safe to repeat (a repeat with a TTL measures it from the repeat).
    #[instrument(level = "debug", skip_all, fields(key = %req.get_ref().key, limit = req.get_ref().limit))]
    pub async fn set_concurrency_override(
        &self,
        req: Request<pb::SetConcurrencyOverrideRequest>,
    ) -> Result<pb::ConcurrencyOverride, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).set_concurrency_override(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.set_key_limit_local(r), remote).await
    }

    /// Clearing sets a state: safe to repeat (a repeat answers `cleared: false`).
    #[instrument(level = "debug", skip_all, fields(key = %req.get_ref().key))]
    pub async fn clear_concurrency_override(
        &self,
        req: Request<pb::ClearConcurrencyOverrideRequest>,
    ) -> Result<pb::ClearConcurrencyOverrideResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).clear_concurrency_override(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.clear_key_limit_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(key = %req.get_ref().key))]
    pub async fn list_concurrency_overrides(
        &self,
        req: Request<pb::ListConcurrencyOverridesRequest>,
    ) -> Result<pb::ListConcurrencyOverridesResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_concurrency_overrides(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_key_limits_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, page_size = req.get_ref().page_size))]
    pub async fn list_tasks(&self, req: Request<pb::ListTasksRequest>) -> Result<pb::ListTasksResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_tasks(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_tasks_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(queues = req.get_ref().queues.len()))]
    pub async fn queue_capacity(
        &self,
        req: Request<pb::QueueCapacityRequest>,
    ) -> Result<pb::QueueCapacityResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).queue_capacity(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.capacity_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(name = %req.get_ref().name))]
    pub async fn create_schedule(&self, req: Request<pb::CreateScheduleRequest>) -> Result<pb::Schedule, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).create_schedule(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.create_schedule_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all)]
    pub async fn list_schedules(
        &self,
        req: Request<pb::ListSchedulesRequest>,
    ) -> Result<pb::ListSchedulesResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).list_schedules(r).await };
        self.fwd.unary(req, Kind::Read, |r| self.list_schedules_local(r), remote).await
    }

    /// Pausing and resuming set a state: safe to repeat.
    #[instrument(level = "debug", skip_all, fields(schedule_id = %req.get_ref().id))]
    pub async fn pause_schedule(&self, req: Request<pb::ScheduleRef>) -> Result<pb::Schedule, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).pause_schedule(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.pause_schedule_local(r), remote).await
    }

    #[instrument(level = "debug", skip_all, fields(schedule_id = %req.get_ref().id))]
    pub async fn resume_schedule(&self, req: Request<pb::ScheduleRef>) -> Result<pb::Schedule, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).resume_schedule(r).await };
        self.fwd.unary(req, Kind::Repeatable, |r| self.resume_schedule_local(r), remote).await
    }

    /// A repeated delete would answer NOT_FOUND for a delete that happened: a write.
    #[instrument(level = "debug", skip_all, fields(schedule_id = %req.get_ref().id))]
    pub async fn delete_schedule(&self, req: Request<pb::ScheduleRef>) -> Result<pb::DeleteScheduleResponse, ApiError> {
        let remote = |ch, r| async move { jobs_on(ch).delete_schedule(r).await };
        self.fwd.unary(req, Kind::Write, |r| self.delete_schedule_local(r), remote).await
    }
}

/// gRPC: each method is the routed operation of the same name above.
#[tonic::async_trait]
impl Jobs for JobsApi {
    async fn pause_queue(&self, req: Request<pb::PauseQueueRequest>) -> Res<pb::QueuePauseState> {
        reply(JobsApi::pause_queue(self, req).await)
    }

    async fn resume_queue(&self, req: Request<pb::ResumeQueueRequest>) -> Res<pb::QueuePauseState> {
        reply(JobsApi::resume_queue(self, req).await)
    }

    async fn list_paused_queues(&self, req: Request<pb::ListPausedQueuesRequest>) -> Res<pb::ListPausedQueuesResponse> {
        reply(JobsApi::list_paused_queues(self, req).await)
    }

    async fn set_queue_limits(&self, req: Request<pb::QueueLimits>) -> Res<pb::QueueLimits> {
        reply(JobsApi::set_queue_limits(self, req).await)
    }

    async fn list_queue_limits(&self, req: Request<pb::ListQueueLimitsRequest>) -> Res<pb::ListQueueLimitsResponse> {
        reply(JobsApi::list_queue_limits(self, req).await)
    }

    async fn set_fairness_weight(&self, req: Request<pb::SetFairnessWeightRequest>) -> Res<pb::FairnessKey> {
        reply(JobsApi::set_fairness_weight(self, req).await)
    }

    async fn list_fairness(&self, req: Request<pb::ListFairnessRequest>) -> Res<pb::ListFairnessResponse> {
        reply(JobsApi::list_fairness(self, req).await)
    }

    async fn set_rate_limit(&self, req: Request<pb::SetRateLimitRequest>) -> Res<pb::RateLimit> {
        reply(JobsApi::set_rate_limit(self, req).await)
    }

    async fn list_rate_limits(&self, req: Request<pb::ListRateLimitsRequest>) -> Res<pb::ListRateLimitsResponse> {
        reply(JobsApi::list_rate_limits(self, req).await)
    }

    async fn set_concurrency_override(
        &self,
        req: Request<pb::SetConcurrencyOverrideRequest>,
    ) -> Res<pb::ConcurrencyOverride> {
        reply(JobsApi::set_concurrency_override(self, req).await)
    }

    async fn clear_concurrency_override(
        &self,
        req: Request<pb::ClearConcurrencyOverrideRequest>,
    ) -> Res<pb::ClearConcurrencyOverrideResponse> {
        reply(JobsApi::clear_concurrency_override(self, req).await)
    }

    async fn list_concurrency_overrides(
        &self,
        req: Request<pb::ListConcurrencyOverridesRequest>,
    ) -> Res<pb::ListConcurrencyOverridesResponse> {
        reply(JobsApi::list_concurrency_overrides(self, req).await)
    }

    async fn list_tasks(&self, req: Request<pb::ListTasksRequest>) -> Res<pb::ListTasksResponse> {
        reply(JobsApi::list_tasks(self, req).await)
    }

    async fn queue_capacity(&self, req: Request<pb::QueueCapacityRequest>) -> Res<pb::QueueCapacityResponse> {
        reply(JobsApi::queue_capacity(self, req).await)
    }

    async fn create_schedule(&self, req: Request<pb::CreateScheduleRequest>) -> Res<pb::Schedule> {
        reply(JobsApi::create_schedule(self, req).await)
    }

    async fn list_schedules(&self, req: Request<pb::ListSchedulesRequest>) -> Res<pb::ListSchedulesResponse> {
        reply(JobsApi::list_schedules(self, req).await)
    }

    async fn pause_schedule(&self, req: Request<pb::ScheduleRef>) -> Res<pb::Schedule> {
        reply(JobsApi::pause_schedule(self, req).await)
    }

    async fn resume_schedule(&self, req: Request<pb::ScheduleRef>) -> Res<pb::Schedule> {
        reply(JobsApi::resume_schedule(self, req).await)
    }

    async fn delete_schedule(&self, req: Request<pb::ScheduleRef>) -> Res<pb::DeleteScheduleResponse> {
        reply(JobsApi::delete_schedule(self, req).await)
    }
}
