//! Job features on the [`Producer`]: pause and resume queues, fairness weights, list tasks a page at a time, the capacity view.
//! They use the server's `Jobs` service on the producer's connection, with the producer's retry rules.

use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

use crate::connection::MAX_MESSAGE_BYTES;
use crate::error::Result;
use crate::producer::{Kind, Producer};
use crate::task::{Task, TaskState};

/// Flow-control limits of a queue, or of the tenant over all its queues (`queue` empty). `None`: no limit.
/// An enqueue past `max_depth` waiting tasks waits on the leader for room (the server's `depth_hold_ms`), then
/// is refused whole with `QUEUE_FULL` (retried by the SDK after a backoff); claims past `max_running` running
/// tasks wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueLimits {
    /// The queue (empty: the tenant's own limit).
    pub queue: String,
    /// Running tasks at most (queues only).
    pub max_running: Option<u32>,
    /// Waiting (pending, delayed or held) tasks at most.
    pub max_depth: Option<u64>,
}

impl From<pb::QueueLimits> for QueueLimits {
    fn from(l: pb::QueueLimits) -> Self {
        QueueLimits {
            queue: l.queue,
            max_running: (l.max_running > 0).then_some(l.max_running),
            max_depth: (l.max_depth > 0).then_some(l.max_depth),
        }
    }
}

/// Which tasks [`Producer::list_tasks`] returns; every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    /// Only this queue (default: every queue of the tenant).
    pub queue: Option<String>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Created at or after this time (ms since the Unix epoch).
    pub created_from_ms: Option<i64>,
    /// Created before this time (ms since the Unix epoch).
    pub created_to_ms: Option<i64>,
    /// Tasks per page (0: the server's default of 100; at most 1000).
    pub page_size: u32,
    /// The `next_page_token` of the previous page.
    pub page_token: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskPage {
    /// In id order (ids begin with their creation time).
    pub tasks: Vec<Task>,
    /// Where the next page starts; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// The capacity view of one queue (see [`Producer::capacity`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueCapacity {
    /// The queue.
    pub queue: String,
    /// Paused: accepts enqueues, serves no claims.
    pub paused: bool,
    /// Not yet claimed: ready plus delayed.
    pub pending: u64,
    /// Claimable now.
    pub ready: u64,
    /// Waiting for their visible time.
    pub delayed: u64,
    /// In progress.
    pub running: u64,
    /// Workers that asked for this queue's work recently.
    pub active_workers: u64,
    /// Completed in the last 1, 5 and 15 minutes.
    pub completed: [u64; 3],
    /// Completions per second over the last 1, 5 and 15 minutes.
    pub rate: [f64; 3],
    /// Time to finish pending + running at the 5-minute rate; `None` when nothing completes.
    pub drain: Option<Duration>,
    /// Tasks one worker completes per second; `None` when unknown.
    pub per_worker_rate: Option<f64>,
    /// Workers needed to drain pending + running within 1, 4 and 8 hours; `None` when unknown.
    pub workers_needed: [Option<u64>; 3],
    /// The queue's running cap, if it has one.
    pub max_running: Option<u32>,
    /// The queue's depth limit, if it has one.
    pub max_depth: Option<u64>,
    /// Its fairness keys with ready or running tasks or a weight: each key's waiting and running tasks and
    /// whether its token bucket holds it back (as [`Producer::fairness`] reports them).
    pub keys: Vec<FairnessKey>,
}

/// One fairness key of a queue (see [`Producer::set_fairness_weight`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairnessKey {
    /// The queue.
    pub queue: String,
    /// A concurrency key; empty for the queue's tasks without one.
    pub key: String,
    /// Its weight (1 unless set): claims serve the keys of a queue in proportion to their weights.
    pub weight: u32,
    /// Its tasks ready to be claimed in the queue.
    pub ready: u64,
    /// Its running tasks (across the tenant's queues; 0 for the empty key).
    pub running: u64,
    /// It has ready tasks and its token bucket (or its queue's) is empty: claims pass it over until a token
    /// refills (see [`Producer::set_rate_limit`]).
    pub throttled: bool,
}

impl FairnessKey {
    fn from_proto(k: pb::FairnessKey) -> FairnessKey {
        let pb::FairnessKey { queue, key, weight, ready, running, throttled } = k;
        FairnessKey { queue, key, weight, ready, running, throttled }
    }
}

/// Which token bucket of a queue a rate limit is about (see [`Producer::set_rate_limit`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateScope {
    /// The whole queue: every claim of it takes a token.
    Queue,
    /// One fairness key: a concurrency key, or "" for the queue's tasks without one.
    Key(String),
}

/// A token bucket of a queue, as read at the time of the answer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateLimit {
    /// The queue.
    pub queue: String,
    /// The whole queue's bucket or a key's.
    pub scope: RateScope,
    /// Tokens (claims) per second; 0 once removed.
    pub per_second: f64,
    /// Tokens the bucket holds at most.
    pub burst: u32,
    /// The level now, in tokens (negative while a debt is paid back).
    pub tokens: f64,
    /// Ready tasks the bucket governs.
    pub ready: u64,
    /// Ready tasks and not one whole token: claims pass them over until one refills.
    pub throttled: bool,
}

impl RateLimit {
    fn from_proto(r: pb::RateLimit) -> RateLimit {
        let pb::RateLimit { queue, key, whole_queue, per_second, burst, tokens, ready, throttled } = r;
        let scope = if whole_queue { RateScope::Queue } else { RateScope::Key(key) };
        RateLimit { queue, scope, per_second, burst, tokens, ready, throttled }
    }
}

/// An operator's override of a concurrency key's limit (see [`Producer::set_concurrency_override`]), with the
/// key's tasks at the time of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyOverride {
    /// The concurrency key.
    pub key: String,
    /// Running tasks of the key at most while the override is in force (replacing the limit its tasks carry).
    pub limit: u32,
    /// When it runs out, Unix ms; `None`: until cleared.
    pub expires_at_ms: Option<u64>,
    /// The key's running tasks, across the tenant's queues.
    pub running: u64,
    /// The key's pending tasks (ready or delayed; not those held by dependencies).
    pub pending: u64,
}

impl ConcurrencyOverride {
    fn from_proto(o: pb::ConcurrencyOverride) -> ConcurrencyOverride {
        let pb::ConcurrencyOverride { key, limit, expires_at_ms, running, pending } = o;
        ConcurrencyOverride {
            key,
            limit,
            expires_at_ms: (expires_at_ms > 0).then_some(expires_at_ms),
            running,
            pending,
        }
    }
}

fn jobs(ch: Channel) -> JobsClient<Channel> {
    JobsClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
}

fn needed(n: i64) -> Option<u64> {
    u64::try_from(n).ok()
}

impl QueueCapacity {
    fn from_proto(c: pb::QueueCapacity) -> QueueCapacity {
        let pb::QueueCapacity {
            queue,
            pending,
            ready,
            delayed,
            running,
            active_workers,
            completed_1m,
            completed_5m,
            completed_15m,
            rate_1m,
            rate_5m,
            rate_15m,
            drain_seconds,
            per_worker_rate,
            workers_needed_1h,
            workers_needed_4h,
            workers_needed_8h,
            paused,
            max_running,
            max_depth,
            keys,
        } = c;
        QueueCapacity {
            queue,
            paused,
            pending,
            ready,
            delayed,
            running,
            active_workers,
            completed: [completed_1m, completed_5m, completed_15m],
            rate: [rate_1m, rate_5m, rate_15m],
            drain: (drain_seconds >= 0.0).then(|| Duration::from_secs_f64(drain_seconds.min(1e12))),
            per_worker_rate: (per_worker_rate >= 0.0).then_some(per_worker_rate),
            workers_needed: [needed(workers_needed_1h), needed(workers_needed_4h), needed(workers_needed_8h)],
            max_running: (max_running > 0).then_some(max_running),
            max_depth: (max_depth > 0).then_some(max_depth),
            keys: keys.into_iter().map(FairnessKey::from_proto).collect(),
        }
    }
}

impl Producer {
    /// Reports progress (0-100 and a message) on a task this process is running, with a lease extension to the
    /// server's default lease; `GetTask` shows it. For worker handlers: the task carries its fencing token.
    pub async fn report_progress(&self, task: &Task, percent: u32, message: &str) -> Result<()> {
        let req = pb::AckRequest {
            task_id: task.id.clone(),
            token: task.token(),
            action: Some(pb::ack_request::Action::Heartbeat(pb::Heartbeat {
                extend_ms: 0,
                progress: Some(pb::Progress { percent, message: message.to_string(), at_ms: 0 }),
            })),
        };
        let tasks = |ch| raftq_proto::v1::task_service_client::TaskServiceClient::new(ch);
        self.call_on(Kind::Read, Duration::ZERO, tasks, |mut c, conn| {
            let req = conn.request(req.clone());
            async move { c.ack(req).await }
        })
        .await?;
        Ok(())
    }

    /// Pauses a queue: it keeps accepting enqueues and serves no claims. Idempotent, so retried like a read.
    pub async fn pause_queue(&self, queue: &str) -> Result<bool> {
        let req = pb::PauseQueueRequest { queue: queue.to_string() };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.pause_queue(req).await }
            })
            .await?;
        Ok(r.paused)
    }

    /// Resumes a paused queue. Idempotent, so retried like a read.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        let req = pb::ResumeQueueRequest { queue: queue.to_string() };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.resume_queue(req).await }
            })
            .await?;
        Ok(r.paused)
    }

    /// One page of the tenant's tasks matching `query`.
    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<TaskPage> {
        let req = pb::ListTasksRequest {
            queue: query.queue.clone().unwrap_or_default(),
            state: query.state.map_or(pb::TaskState::Unspecified, TaskState::to_proto) as i32,
            created_from_ms: query.created_from_ms.unwrap_or(0),
            created_to_ms: query.created_to_ms.unwrap_or(0),
            page_size: query.page_size,
            page_token: query.page_token.clone().unwrap_or_default(),
        };
        let stale = self.stale;
        let pb::ListTasksResponse { tasks, next_page_token } = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.list_tasks(req).await }
            })
            .await?;
        Ok(TaskPage {
            tasks: tasks.into_iter().map(Task::from_proto).collect(),
            next_page_token: (!next_page_token.is_empty()).then_some(next_page_token),
        })
    }

    /// The capacity view of `queues` (empty: every queue of the tenant).
    pub async fn capacity(&self, queues: &[&str]) -> Result<Vec<QueueCapacity>> {
        let req = pb::QueueCapacityRequest { queues: queues.iter().map(|q| q.to_string()).collect() };
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.queue_capacity(req).await }
            })
            .await?;
        Ok(r.queues.into_iter().map(QueueCapacity::from_proto).collect())
    }

    /// Sets a queue's flow-control limits (see [`QueueLimits`]); both `None` removes them. Needs the admin
    /// scope and cluster version 2. Idempotent, so retried like a read.
    pub async fn set_queue_limits(
        &self,
        queue: &str,
        max_running: Option<u32>,
        max_depth: Option<u64>,
    ) -> Result<QueueLimits> {
        self.set_limits(queue, max_running.unwrap_or(0), max_depth.unwrap_or(0)).await
    }

    /// Sets the tenant's depth limit over all its queues (`None`: none).
    pub async fn set_tenant_max_depth(&self, max_depth: Option<u64>) -> Result<QueueLimits> {
        self.set_limits("", 0, max_depth.unwrap_or(0)).await
    }

    async fn set_limits(&self, queue: &str, max_running: u32, max_depth: u64) -> Result<QueueLimits> {
        let req = pb::QueueLimits { queue: queue.to_string(), max_running, max_depth };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.set_queue_limits(req).await }
            })
            .await?;
        Ok(QueueLimits::from(r))
    }

    /// The tenant's limits: each limited queue's, and the tenant's own (queue `""`).
    pub async fn queue_limits(&self) -> Result<Vec<QueueLimits>> {
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(pb::ListQueueLimitsRequest {}, stale);
                async move { c.list_queue_limits(req).await }
            })
            .await?;
        Ok(r.limits.into_iter().map(QueueLimits::from).collect())
    }

    /// Sets the weight (1 to 1000; 1 is the default) of a fairness key of a queue: a concurrency key, or "" for
    /// the queue's tasks without one. Claims serve the keys of a queue in proportion to their weights. Needs the
    /// `admin` scope and cluster version 2 (`FEATURE_NOT_ACTIVE` before). Sets a state, so retried like a read.
    pub async fn set_fairness_weight(&self, queue: &str, key: &str, weight: u32) -> Result<FairnessKey> {
        let req = pb::SetFairnessWeightRequest { queue: queue.to_string(), key: key.to_string(), weight };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.set_fairness_weight(req).await }
            })
            .await?;
        Ok(FairnessKey::from_proto(r))
    }

    /// The fairness keys of a queue (`None`: of every queue of the tenant) that have a weight other than 1 or
    /// ready tasks, by queue and key.
    pub async fn fairness(&self, queue: Option<&str>) -> Result<Vec<FairnessKey>> {
        let req = pb::ListFairnessRequest { queue: queue.unwrap_or_default().to_string() };
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.list_fairness(req).await }
            })
            .await?;
        Ok(r.keys.into_iter().map(FairnessKey::from_proto).collect())
    }

    /// Sets the token bucket of a queue (`RateScope::Queue`) or of one of its fairness keys: `per_second` tokens
    /// (to a thousandth: 0.5 is one every 2 s) refill a bucket of `burst` (`None`: the rate's whole tasks per
    /// second, at least 1); every claimed task takes a token of its queue's bucket and of its key's. A key or
    /// queue without a token is passed over, not failed, until one refills. `per_second` 0 removes the limit.
    /// The buckets are replicated: a new leader carries on with the same levels. Needs the `admin` scope and
    /// cluster version 2. Sets a state, so retried like a read (a repeat keeps the bucket's level).
    pub async fn set_rate_limit(
        &self,
        queue: &str,
        scope: RateScope,
        per_second: f64,
        burst: Option<u32>,
    ) -> Result<RateLimit> {
        let (key, whole_queue) = match scope {
            RateScope::Queue => (String::new(), true),
            RateScope::Key(k) => (k, false),
        };
        let burst = burst.unwrap_or(0);
        let req = pb::SetRateLimitRequest { queue: queue.to_string(), key, whole_queue, per_second, burst };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.set_rate_limit(req).await }
            })
            .await?;
        Ok(RateLimit::from_proto(r))
    }

    /// The token buckets of a queue (`None`: of every queue of the tenant), by queue, the whole queue's first.
    pub async fn rate_limits(&self, queue: Option<&str>) -> Result<Vec<RateLimit>> {
        let req = pb::ListRateLimitsRequest { queue: queue.unwrap_or_default().to_string() };
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.list_rate_limits(req).await }
            })
            .await?;
        Ok(r.limits.into_iter().map(RateLimit::from_proto).collect())
    }

    /// Overrides the limit of one concurrency key of the tenant (every queue): while in force, `limit` replaces
    /// the limit the key's tasks carry. `ttl`: the override runs out that long after the leader gets it, and the
    /// tasks' own limits apply again with no further call (`None`: until cleared). Lowering a limit below the
    /// key's running tasks stops nothing; new claims wait until the count falls below. Needs the `admin` scope and
    /// cluster version 3. Sets a state, so retried like a read (a retry measures the TTL from the retry).
    pub async fn set_concurrency_override(
        &self,
        key: &str,
        limit: u32,
        ttl: Option<Duration>,
    ) -> Result<ConcurrencyOverride> {
        let ttl_ms = ttl.map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1));
        self.put_override(pb::SetConcurrencyOverrideRequest {
            key: key.to_string(),
            limit,
            ttl_ms,
            expires_at: String::new(),
        })
        .await
    }

    /// As [`Producer::set_concurrency_override`], running out at an absolute time (RFC 3339, such as
    /// `2026-11-26T12:00:00Z`).
    pub async fn set_concurrency_override_until(
        &self,
        key: &str,
        limit: u32,
        expires_at: &str,
    ) -> Result<ConcurrencyOverride> {
        self.put_override(pb::SetConcurrencyOverrideRequest {
            key: key.to_string(),
            limit,
            ttl_ms: 0,
            expires_at: expires_at.to_string(),
        })
        .await
    }

    async fn put_override(&self, req: pb::SetConcurrencyOverrideRequest) -> Result<ConcurrencyOverride> {
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.set_concurrency_override(req).await }
            })
            .await?;
        Ok(ConcurrencyOverride::from_proto(r))
    }

    /// Removes a concurrency key's override: its tasks' own limits apply again at once. Whether one was in force.
    /// Needs the `admin` scope and cluster version 3.
    pub async fn clear_concurrency_override(&self, key: &str) -> Result<bool> {
        let req = pb::ClearConcurrencyOverrideRequest { key: key.to_string() };
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.clear_concurrency_override(req).await }
            })
            .await?;
        Ok(r.cleared)
    }

    /// The tenant's concurrency key overrides in force (`key`: only that one's), by key.
    pub async fn concurrency_overrides(&self, key: Option<&str>) -> Result<Vec<ConcurrencyOverride>> {
        let req = pb::ListConcurrencyOverridesRequest { key: key.unwrap_or_default().to_string() };
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.list_concurrency_overrides(req).await }
            })
            .await?;
        Ok(r.overrides.into_iter().map(ConcurrencyOverride::from_proto).collect())
    }

    /// The tenant's paused queues.
    pub async fn paused_queues(&self) -> Result<Vec<String>> {
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(pb::ListPausedQueuesRequest {}, stale);
                async move { c.list_paused_queues(req).await }
            })
            .await?;
        Ok(r.queues)
    }
}

/// A recurring task (see [`Producer::create_schedule`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Schedule {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The queue its tasks go to.
    pub queue: String,
    /// The cron expression and time zone, or empty for an interval.
    pub cron: String,
    /// The time zone of the cron expression.
    pub time_zone: String,
    /// The interval, or 0 for a cron schedule.
    pub interval_ms: u64,
    /// Paused schedules fire nothing.
    pub paused: bool,
    /// An occurrence missed while the cluster was down runs once (else missed ones are skipped).
    pub run_missed_once: bool,
    /// When the schedule was created (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// The last occurrence fired or skipped (ms since the Unix epoch), or 0.
    pub last_occurrence_ms: i64,
    /// The next occurrence, or 0 when paused.
    pub next_occurrence_ms: i64,
    /// Tasks created so far.
    pub fired: u64,
}

/// When a schedule fires: a cron expression in a time zone, or an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recurrence {
    /// A 5-field cron expression and an IANA time zone (`UTC`, `Europe/Paris`, ...).
    Cron {
        /// `minute hour day-of-month month day-of-week`.
        expr: String,
        /// The IANA time zone name.
        time_zone: String,
    },
    /// Every this long from the schedule's creation.
    Every(Duration),
}

impl Schedule {
    fn from_proto(s: pb::Schedule) -> Schedule {
        let pb::Schedule {
            id,
            name,
            queue,
            cron,
            time_zone,
            interval_ms,
            missed_policy,
            paused,
            created_at_ms,
            last_occurrence_ms,
            next_occurrence_ms,
            fired,
        } = s;
        Schedule {
            id,
            name,
            queue,
            cron,
            time_zone,
            interval_ms,
            paused,
            run_missed_once: missed_policy == pb::MissedPolicy::RunOnce as i32,
            created_at_ms,
            last_occurrence_ms,
            next_occurrence_ms,
            fired,
        }
    }
}

impl Producer {
    /// Creates a schedule that enqueues `task` at each occurrence; `run_missed_once` runs the latest occurrence
    /// missed while the cluster was down once (else missed ones are skipped).
    pub async fn create_schedule(
        &self,
        name: &str,
        task: crate::task::NewTask,
        when: Recurrence,
        run_missed_once: bool,
    ) -> Result<Schedule> {
        let (cron, time_zone, interval_ms) = match when {
            Recurrence::Cron { expr, time_zone } => (expr, time_zone, 0),
            Recurrence::Every(d) => (String::new(), String::new(), crate::task::duration_ms(d)),
        };
        let req = pb::CreateScheduleRequest {
            name: name.to_string(),
            task: Some(task.into_proto()),
            cron,
            time_zone,
            interval_ms,
            missed_policy: if run_missed_once { pb::MissedPolicy::RunOnce } else { pb::MissedPolicy::Skip } as i32,
        };
        let s = self
            .call_on(Kind::Write, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.create_schedule(req).await }
            })
            .await?;
        Ok(Schedule::from_proto(s))
    }

    /// The tenant's schedules.
    pub async fn schedules(&self) -> Result<Vec<Schedule>> {
        let stale = self.stale;
        let r = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.read_request(pb::ListSchedulesRequest {}, stale);
                async move { c.list_schedules(req).await }
            })
            .await?;
        Ok(r.schedules.into_iter().map(Schedule::from_proto).collect())
    }

    /// Pauses (`true`) or resumes a schedule. Idempotent, so retried like a read.
    pub async fn pause_schedule(&self, id: &str, paused: bool) -> Result<Schedule> {
        let req = pb::ScheduleRef { id: id.to_string() };
        let s = self
            .call_on(Kind::Read, Duration::ZERO, jobs, |mut c, conn| {
                let req = conn.request(req.clone());
                async move {
                    if paused {
                        c.pause_schedule(req).await
                    } else {
                        c.resume_schedule(req).await
                    }
                }
            })
            .await?;
        Ok(Schedule::from_proto(s))
    }

    /// Deletes a schedule.
    pub async fn delete_schedule(&self, id: &str) -> Result<()> {
        let req = pb::ScheduleRef { id: id.to_string() };
        self.call_on(Kind::Write, Duration::ZERO, jobs, |mut c, conn| {
            let req = conn.request(req.clone());
            async move { c.delete_schedule(req).await }
        })
        .await?;
        Ok(())
    }
}
