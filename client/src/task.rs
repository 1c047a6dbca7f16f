//! The SDK's own task types and their conversions from and to the generated protobuf types. Conversions
//! destructure every field, so a new proto field breaks the build here until it is handled.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use raftq_proto::v1 as pb;

/// Where a task is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskState {
    /// Waiting to be claimed (possibly not yet visible: delayed or backing off).
    Pending,
    /// Claimed by a worker under a lease.
    InProgress,
    /// Ended with a result.
    Completed,
    /// Ended with a non-retryable failure.
    Failed,
    /// Cancelled by a client.
    Cancelled,
    /// Out of attempts; kept until redriven or purged.
    DeadLettered,
    /// A state this SDK does not know (a newer server).
    Unknown,
}

impl TaskState {
    pub(crate) fn from_proto(v: i32) -> TaskState {
        match pb::TaskState::try_from(v) {
            Ok(pb::TaskState::Pending) => TaskState::Pending,
            Ok(pb::TaskState::InProgress) => TaskState::InProgress,
            Ok(pb::TaskState::Completed) => TaskState::Completed,
            Ok(pb::TaskState::Failed) => TaskState::Failed,
            Ok(pb::TaskState::Cancelled) => TaskState::Cancelled,
            Ok(pb::TaskState::DeadLettered) => TaskState::DeadLettered,
            Ok(pb::TaskState::Unspecified) | Err(_) => TaskState::Unknown,
        }
    }

    pub(crate) fn to_proto(self) -> pb::TaskState {
        match self {
            TaskState::Pending => pb::TaskState::Pending,
            TaskState::InProgress => pb::TaskState::InProgress,
            TaskState::Completed => pb::TaskState::Completed,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Cancelled => pb::TaskState::Cancelled,
            TaskState::DeadLettered => pb::TaskState::DeadLettered,
            TaskState::Unknown => pb::TaskState::Unspecified,
        }
    }

    /// True for states a task never leaves (completed, failed, cancelled).
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Cancelled)
    }

    /// The state's name as the protocol, REST and the CLI spell it: `PENDING`, `IN_PROGRESS`, `COMPLETED`,
    /// `FAILED`, `CANCELLED`, `DEAD_LETTERED`, or `UNKNOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Unknown => "UNKNOWN",
            known => known.to_proto().as_str_name().trim_start_matches("TASK_STATE_"),
        }
    }

    /// The state named `name` (as [`TaskState::as_str`] spells it, in any case); `None` for another name.
    pub fn parse(name: &str) -> Option<TaskState> {
        let s = pb::TaskState::from_str_name(&format!("TASK_STATE_{}", name.trim().to_ascii_uppercase()))?;
        Some(TaskState::from_proto(s as i32)).filter(|s| *s != TaskState::Unknown)
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// W3C trace context carried with a task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// `00-<trace id>-<parent id>-<flags>`.
    pub traceparent: String,
    /// Vendor-specific trace state.
    pub tracestate: String,
}

/// The current delivery of a task: who holds it, until when, and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The worker holding the task.
    pub worker_id: String,
    /// Unique to this delivery; every result must carry it. Tokens only grow.
    pub token: u64,
    /// When the task was claimed (ms since the Unix epoch, the leader's clock).
    pub claimed_at_ms: i64,
    /// When the lease runs out unless extended (ms since the Unix epoch, the leader's clock).
    pub deadline_ms: i64,
}

/// Fires when a delivery ends before its handler does (see [`Task::cancellation`]). Shared by the clones of a
/// task (one allocation; a clone is a reference count); never part of its identity.
#[derive(Clone, Default)]
pub(crate) struct Signal(std::sync::Arc<SignalState>);

#[derive(Default)]
struct SignalState {
    /// Why it fired: set once, by the first `fire`.
    reason: std::sync::OnceLock<String>,
    /// The handler's token, made when first asked for (most handlers never ask, so most deliveries make none).
    token: std::sync::Mutex<Option<tokio_util::sync::CancellationToken>>,
}

impl Signal {
    /// Fires with `reason`; false when it had fired already (the first reason stays).
    pub(crate) fn fire(&self, reason: &str) -> bool {
        let first = self.0.reason.set(reason.to_string()).is_ok();
        // The reason is set first: a token made after this lock is cancelled as it is made (`token`).
        if let Some(t) = self.0.slot().as_ref() {
            t.cancel();
        }
        first
    }

    /// The handler's cancellation token: the same one on every call, cancelled if the signal fired.
    pub(crate) fn token(&self) -> tokio_util::sync::CancellationToken {
        let mut slot = self.0.slot();
        let t = slot.get_or_insert_with(tokio_util::sync::CancellationToken::new).clone();
        if self.0.reason.get().is_some() {
            t.cancel();
        }
        t
    }

    /// Whether the delivery ended: the signal fired, or the handler cancelled its token itself.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.reason.get().is_some() || self.0.slot().as_ref().is_some_and(|t| t.is_cancelled())
    }

    pub(crate) fn reason(&self) -> Option<&str> {
        self.0.reason.get().map(String::as_str)
    }
}

impl SignalState {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<tokio_util::sync::CancellationToken>> {
        self.token.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PartialEq for Signal {
    fn eq(&self, _: &Signal) -> bool {
        true
    }
}

impl Eq for Signal {}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signal({:?})", self.reason())
    }
}

/// A task as the server stores it. A task a worker hands to its handler also carries the signal that its
/// delivery ended early ([`Task::cancellation`]); [`Task::fencing_token`] is the delivery's token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Task {
    /// 32 hex characters.
    pub id: String,
    /// The queue it was enqueued on.
    pub queue: String,
    /// Opaque bytes from the producer.
    pub payload: Bytes,
    /// 0-9, higher is claimed first.
    pub priority: u32,
    /// Where the task is in its lifecycle.
    pub state: TaskState,
    /// Deliveries so far, this one included.
    pub attempts: u32,
    /// Deliveries allowed before the task is dead-lettered.
    pub max_attempts: u32,
    /// The tenant that owns the task.
    pub tenant: String,
    /// Trace context given at enqueue.
    pub trace: Option<TraceContext>,
    /// Set while the task is in progress.
    pub lease: Option<Lease>,
    /// Enqueue time (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// Time of the last change (ms since the Unix epoch).
    pub updated_at_ms: i64,
    /// A pending task is claimable from this time on (ms since the Unix epoch).
    pub visible_at_ms: i64,
    /// The idempotency key given at enqueue, or empty.
    pub idempotency_key: String,
    /// The webhook given at enqueue, or empty.
    pub webhook_url: String,
    /// The last failure, nack reason or expiry, or empty.
    pub last_error: String,
    /// When the task ended (ms since the Unix epoch), or 0.
    pub ended_at_ms: i64,
    /// When the task was dead-lettered (ms since the Unix epoch), or 0.
    pub dead_lettered_at_ms: i64,
    /// Every delivery, oldest first (the last 32).
    pub runs: Vec<Run>,
    /// The task must end by this time (ms since the Unix epoch), or 0 for no deadline.
    pub deadline_ms: i64,
    /// The last progress a worker reported for the current delivery.
    pub progress: Option<Progress>,
    /// The concurrency key given at enqueue, or empty.
    pub concurrency_key: String,
    /// Its limit (0 without a key).
    pub concurrency_limit: u32,
    /// Tasks created by this task's completion (chaining), in order.
    pub follow_up_ids: Vec<String>,
    /// The task whose completion created this one, or empty.
    pub parent_id: String,
    /// Tasks this one waits for.
    pub depends_on: Vec<String>,
    /// True: it waits for them to end whatever their outcome; false: for them to complete.
    pub all_resolved: bool,
    /// Dependencies not yet resolved (the task is not claimable while any remains).
    pub waiting_on: Vec<String>,
    /// The schedule that created this task, or empty.
    pub schedule_id: String,
    /// The schedule occurrence it is for (ms since the Unix epoch), or 0.
    pub scheduled_for_ms: i64,
    signal: Signal,
}

/// One delivery of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Run {
    /// The worker that ran it.
    pub worker_id: String,
    /// The fencing token of this delivery.
    pub token: u64,
    /// When the run started (ms since the Unix epoch).
    pub started_at_ms: i64,
    /// When it ended, or 0 while it is open.
    pub ended_at_ms: i64,
    /// Empty while open; else COMPLETED, FAILED, RETRIED, ABANDONED, LEASE_EXPIRED, EXCEPTION, CANCELLED or
    /// DEADLINE_EXCEEDED.
    pub outcome: String,
    /// The exception reason, `deadline-exceeded`, or the error or nack reason.
    pub reason: String,
}

/// Progress a worker reported with a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// 0-100.
    pub percent: u32,
    /// Free text.
    pub message: String,
    /// When it was reported (ms since the Unix epoch, the leader's clock).
    pub at_ms: i64,
}

impl From<pb::Task> for Task {
    fn from(t: pb::Task) -> Task {
        Task::from_proto(t)
    }
}

/// Back to the wire type (to store a task, forward it, or render it the way the server's REST API does).
impl From<Task> for pb::Task {
    fn from(t: Task) -> pb::Task {
        let Task {
            id,
            queue,
            payload,
            priority,
            state,
            attempts,
            max_attempts,
            tenant,
            trace,
            lease,
            created_at_ms,
            updated_at_ms,
            visible_at_ms,
            idempotency_key,
            webhook_url,
            last_error,
            ended_at_ms,
            dead_lettered_at_ms,
            runs,
            deadline_ms,
            progress,
            concurrency_key,
            concurrency_limit,
            follow_up_ids,
            parent_id,
            depends_on,
            all_resolved,
            waiting_on,
            schedule_id,
            scheduled_for_ms,
            // The handler's cancellation signal is the worker's, not the task's.
            signal: _,
        } = t;
        pb::Task {
            id,
            queue,
            payload,
            priority,
            state: state.to_proto() as i32,
            attempts,
            max_attempts,
            tenant,
            trace: trace.map(|TraceContext { traceparent, tracestate }| pb::TraceContext { traceparent, tracestate }),
            lease: lease.map(|Lease { worker_id, token, claimed_at_ms, deadline_ms }| pb::Lease {
                worker_id,
                token,
                claimed_at_ms,
                deadline_ms,
            }),
            created_at_ms,
            updated_at_ms,
            visible_at_ms,
            idempotency_key,
            webhook_url,
            last_error,
            ended_at_ms,
            dead_lettered_at_ms,
            runs: runs
                .into_iter()
                .map(|Run { worker_id, token, started_at_ms, ended_at_ms, outcome, reason }| pb::Run {
                    worker_id,
                    token,
                    started_at_ms,
                    ended_at_ms,
                    outcome,
                    reason,
                })
                .collect(),
            deadline_ms,
            progress: progress.map(|Progress { percent, message, at_ms }| pb::Progress { percent, message, at_ms }),
            concurrency_key,
            concurrency_limit,
            follow_up_ids,
            parent_id,
            depends_on,
            dependency_rule: if all_resolved {
                pb::DependencyRule::AllResolved
            } else {
                pb::DependencyRule::AllCompleted
            } as i32,
            waiting_on,
            schedule_id,
            scheduled_for_ms,
        }
    }
}

impl Task {
    pub(crate) fn from_proto(t: pb::Task) -> Task {
        let pb::Task {
            id,
            queue,
            payload,
            priority,
            state,
            attempts,
            max_attempts,
            tenant,
            trace,
            lease,
            created_at_ms,
            updated_at_ms,
            visible_at_ms,
            idempotency_key,
            webhook_url,
            last_error,
            ended_at_ms,
            dead_lettered_at_ms,
            runs,
            deadline_ms,
            progress,
            concurrency_key,
            concurrency_limit,
            follow_up_ids,
            parent_id,
            depends_on,
            dependency_rule,
            waiting_on,
            schedule_id,
            scheduled_for_ms,
        } = t;
        Task {
            id,
            queue,
            payload,
            priority,
            state: TaskState::from_proto(state),
            attempts,
            max_attempts,
            tenant,
            trace: trace.map(|pb::TraceContext { traceparent, tracestate }| TraceContext { traceparent, tracestate }),
            lease: lease.map(|pb::Lease { worker_id, token, claimed_at_ms, deadline_ms }| Lease {
                worker_id,
                token,
                claimed_at_ms,
                deadline_ms,
            }),
            created_at_ms,
            updated_at_ms,
            visible_at_ms,
            idempotency_key,
            webhook_url,
            last_error,
            ended_at_ms,
            dead_lettered_at_ms,
            runs: runs
                .into_iter()
                .map(|pb::Run { worker_id, token, started_at_ms, ended_at_ms, outcome, reason }| Run {
                    worker_id,
                    token,
                    started_at_ms,
                    ended_at_ms,
                    outcome,
                    reason,
                })
                .collect(),
            deadline_ms,
            progress: progress.map(|pb::Progress { percent, message, at_ms }| Progress { percent, message, at_ms }),
            concurrency_key,
            concurrency_limit,
            follow_up_ids,
            parent_id,
            depends_on,
            all_resolved: dependency_rule == pb::DependencyRule::AllResolved as i32,
            waiting_on,
            schedule_id,
            scheduled_for_ms,
            signal: Signal::default(),
        }
    }

    /// The fencing token of this delivery (0 when the task carries no lease).
    pub fn token(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.token)
    }

    /// The fencing token of this delivery, for downstream writes: tokens only grow, so a store that keeps the
    /// largest token it has seen per key can refuse a write from a delivery that was superseded (its lease ran
    /// out while its worker was paused or cut off, and another worker took the task). Same as [`Task::token`].
    pub fn fencing_token(&self) -> u64 {
        self.token()
    }

    /// Cancelled when this delivery ends before the handler returns: the task was cancelled (`CANCELLED`), its
    /// deadline passed (`DEADLINE_EXCEEDED`), its lease expired (`LEASE_EXPIRED`) or an extension of it was
    /// refused (`LEASE_LOST`), or the worker's shutdown grace ran out (`SHUTDOWN`). The server pushes the first
    /// three on the worker stream as it applies them. Any outcome sent afterwards is refused: stop and return.
    /// Never fires for a task read with a [`Producer`](crate::Producer).
    pub fn cancellation(&self) -> tokio_util::sync::CancellationToken {
        self.signal.token()
    }

    /// Why [`Task::cancellation`] fired, once it has.
    pub fn revocation(&self) -> Option<&str> {
        self.signal.reason()
    }

    pub(crate) fn signal(&self) -> &Signal {
        &self.signal
    }
}

/// The outcome of a task as far as it is known, from [`Producer::result`](crate::Producer::result).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskResult {
    /// The task's id.
    pub id: String,
    /// Its state when the answer was made.
    pub state: TaskState,
    /// True when the state is terminal (completed, failed, cancelled).
    pub done: bool,
    /// The worker's result, for a completed task.
    pub result: Bytes,
    /// The failure, for a failed task.
    pub error: String,
    /// Deliveries so far.
    pub attempts: u32,
    /// Enqueue time (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// When the task ended (ms since the Unix epoch), or 0.
    pub ended_at_ms: i64,
}

impl TaskResult {
    pub(crate) fn from_proto(r: pb::TaskResult) -> TaskResult {
        let pb::TaskResult { id, state, done, result, error, attempts, created_at_ms, ended_at_ms } = r;
        TaskResult {
            id,
            state: TaskState::from_proto(state),
            done,
            result,
            error,
            attempts,
            created_at_ms,
            ended_at_ms,
        }
    }
}

/// An accepted enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The new task's id, or the original task's id for a duplicate.
    pub task_id: String,
    /// Nothing was created: the idempotency key was seen before, a debounce key's pending task took the enqueue,
    /// or a singleton key's active task stood for it ([`NewTask::singleton_skip`]).
    pub duplicate: bool,
    /// A debounce key's pending task took this enqueue: its payload, priority and start changed.
    pub debounced: bool,
}

impl Enqueued {
    pub(crate) fn from_proto(r: pb::EnqueueResponse) -> Enqueued {
        let pb::EnqueueResponse { task_id, duplicate, debounced } = r;
        Enqueued { task_id, duplicate, debounced }
    }
}

/// A debounce or singleton key of an enqueue (see [`NewTask::debounce`], [`NewTask::singleton`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyMode {
    Debounce { key: String, delay: Duration, max_wait: Duration },
    Singleton { key: String, skip: bool },
}

/// A task to enqueue, built step by step:
///
/// ```
/// use std::time::Duration;
/// use raftq_client::NewTask;
///
/// let t = NewTask::new("emails", "hello")
///     .priority(5)
///     .delay(Duration::from_secs(10))
///     .max_attempts(3)
///     .idempotency_key("order-42");
/// # let _ = t;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    queue: String,
    payload: Bytes,
    priority: u32,
    delay: Duration,
    run_at: Option<SystemTime>,
    max_attempts: u32,
    idempotency_key: String,
    webhook_url: String,
    trace: Option<TraceContext>,
    deadline: Duration,
    concurrency: Option<(String, u32)>,
    depends_on: Vec<String>,
    all_resolved: bool,
    key_mode: Option<KeyMode>,
}

impl NewTask {
    /// A task for `queue` carrying `payload`, with the server's defaults for everything else.
    pub fn new(queue: impl Into<String>, payload: impl Into<Bytes>) -> NewTask {
        NewTask {
            queue: queue.into(),
            payload: payload.into(),
            priority: 0,
            delay: Duration::ZERO,
            run_at: None,
            max_attempts: 0,
            idempotency_key: String::new(),
            webhook_url: String::new(),
            trace: None,
            deadline: Duration::ZERO,
            concurrency: None,
            depends_on: Vec::new(),
            all_resolved: false,
            key_mode: None,
        }
    }

    /// 0-9, higher is claimed first (default 0).
    pub fn priority(mut self, priority: u32) -> NewTask {
        self.priority = priority;
        self
    }

    /// Not claimable before this much time has passed (millisecond precision).
    pub fn delay(mut self, delay: Duration) -> NewTask {
        self.delay = delay;
        self
    }

    /// Not claimable before this time; wins over [`NewTask::delay`].
    pub fn run_at(mut self, at: SystemTime) -> NewTask {
        self.run_at = Some(at);
        self
    }

    /// Deliveries allowed before the task is dead-lettered (default: the server's).
    pub fn max_attempts(mut self, n: u32) -> NewTask {
        self.max_attempts = n;
        self
    }

    /// A repeat of this key within the server's window returns the original task, marked duplicate.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> NewTask {
        self.idempotency_key = key.into();
        self
    }

    /// An http(s) URL told about the task's end.
    pub fn webhook(mut self, url: impl Into<String>) -> NewTask {
        self.webhook_url = url.into();
        self
    }

    /// W3C trace context to carry with the task.
    pub fn trace(mut self, traceparent: impl Into<String>, tracestate: impl Into<String>) -> NewTask {
        self.trace = Some(TraceContext { traceparent: traceparent.into(), tracestate: tracestate.into() });
        self
    }

    /// The task must end within this long from its enqueue, or it fails with reason `deadline-exceeded`.
    pub fn deadline(mut self, within: Duration) -> NewTask {
        self.deadline = within;
        self
    }

    /// At most `limit` tasks of the tenant with this key run at once, across queues and workers; a key at its
    /// limit never delays other keys. (0 counts as 1.)
    pub fn concurrency(mut self, key: impl Into<String>, limit: u32) -> NewTask {
        self.concurrency = Some((key.into(), limit));
        self
    }

    /// Waits for these tasks (existing tasks of the same tenant) to complete: claimable once all have, cancelled
    /// as soon as one fails or is cancelled.
    pub fn after_all_completed(mut self, ids: impl IntoIterator<Item = impl Into<String>>) -> NewTask {
        self.depends_on = ids.into_iter().map(Into::into).collect();
        self.all_resolved = false;
        self
    }

    /// Waits for these tasks to end, whatever their outcome.
    pub fn after_all_resolved(mut self, ids: impl IntoIterator<Item = impl Into<String>>) -> NewTask {
        self.depends_on = ids.into_iter().map(Into::into).collect();
        self.all_resolved = true;
        self
    }

    /// Debounce by `key` (the tenant's, in this queue): while the key's task is pending and was never claimed,
    /// this enqueue replaces its payload and priority and moves its start to `now + delay`, but never past
    /// `max_wait` after its first enqueue (`Duration::ZERO`: no cap), and answers that task with
    /// [`Enqueued::debounced`] set; otherwise it creates a task starting at `now + delay`. Not with a delay,
    /// `run_at`, an idempotency key or a singleton key. Needs a server cluster at version 3.
    pub fn debounce(mut self, key: impl Into<String>, delay: Duration, max_wait: Duration) -> NewTask {
        self.key_mode = Some(KeyMode::Debounce { key: key.into(), delay, max_wait });
        self
    }

    /// Singleton by `key` (the tenant's, in this queue): while the key's task is pending or in progress the
    /// enqueue is refused with reason `SINGLETON_ACTIVE` (naming that task). Once it has ended, the next enqueue
    /// creates a task. Needs a server cluster at version 3.
    pub fn singleton(mut self, key: impl Into<String>) -> NewTask {
        self.key_mode = Some(KeyMode::Singleton { key: key.into(), skip: false });
        self
    }

    /// As [`NewTask::singleton`], but an enqueue while the key's task is active is dropped: answered with that
    /// task, marked [`Enqueued::duplicate`].
    pub fn singleton_skip(mut self, key: impl Into<String>) -> NewTask {
        self.key_mode = Some(KeyMode::Singleton { key: key.into(), skip: true });
        self
    }

    /// The queue this task is for.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    pub(crate) fn into_proto(self) -> pb::EnqueueRequest {
        let NewTask {
            queue,
            payload,
            priority,
            delay,
            run_at,
            max_attempts,
            idempotency_key,
            webhook_url,
            trace,
            deadline,
            concurrency,
            depends_on,
            all_resolved,
            key_mode,
        } = self;
        let (debounce, singleton) = match key_mode {
            None => (None, None),
            Some(KeyMode::Debounce { key, delay, max_wait }) => {
                (Some(pb::Debounce { key, delay_ms: duration_ms(delay), max_wait_ms: duration_ms(max_wait) }), None)
            }
            Some(KeyMode::Singleton { key, skip }) => {
                let mode = if skip { pb::SingletonMode::Skip } else { pb::SingletonMode::Refuse };
                (None, Some(pb::Singleton { key, mode: mode as i32 }))
            }
        };
        pb::EnqueueRequest {
            queue,
            payload,
            priority,
            delay_ms: duration_ms(delay),
            // A time before the epoch is in the past: claimable at once, which 0 ("unset") also means.
            run_at_ms: run_at
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64),
            max_attempts,
            idempotency_key,
            webhook_url,
            trace: trace.map(|TraceContext { traceparent, tracestate }| pb::TraceContext { traceparent, tracestate }),
            deadline_in_ms: duration_ms(deadline),
            concurrency_limit: concurrency.as_ref().map_or(0, |c| c.1.max(1)),
            concurrency_key: concurrency.map(|c| c.0).unwrap_or_default(),
            depends_on,
            dependency_rule: if all_resolved {
                pb::DependencyRule::AllResolved as i32
            } else {
                pb::DependencyRule::AllCompleted as i32
            },
            debounce,
            singleton,
        }
    }
}

/// Whole milliseconds, saturating; a non-zero duration under 1 ms counts as 1 ms so it is not read as "unset".
pub(crate) fn duration_ms(d: Duration) -> u64 {
    if d.is_zero() {
        0
    } else {
        (d.as_millis().min(u64::MAX as u128) as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_signal_cancels_its_token_whether_asked_for_before_or_after_it_fires() {
        // Asked for first: the token fires with the signal, and later calls give the same token.
        let t = Task::from_proto(pb::Task { id: "a".into(), ..Default::default() });
        let token = t.cancellation();
        assert!(!token.is_cancelled() && !t.signal().is_cancelled());
        assert!(t.signal().fire("LEASE_EXPIRED"));
        assert!(token.is_cancelled() && t.signal().is_cancelled());
        assert!(!t.signal().fire("CANCELLED"), "the first reason stays");
        assert_eq!(t.revocation(), Some("LEASE_EXPIRED"));
        // Asked for after it fired (no token was made before): cancelled as it is made.
        let late = Task::from_proto(pb::Task { id: "b".into(), ..Default::default() });
        let clone = late.clone();
        assert!(clone.signal().fire("CANCELLED"));
        assert!(late.cancellation().is_cancelled(), "clones of a task share its signal");
        assert_eq!(late.revocation(), Some("CANCELLED"));
        // A handler that cancels its own token ends the delivery too, with no reason.
        let own = Task::from_proto(pb::Task { id: "c".into(), ..Default::default() });
        own.cancellation().cancel();
        assert!(own.signal().is_cancelled() && own.cancellation().is_cancelled());
        assert_eq!(own.revocation(), None);
    }

    #[test]
    fn new_task_builder_fills_every_field() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let req = NewTask::new("q", "p")
            .priority(7)
            .delay(Duration::from_secs(2))
            .run_at(at)
            .max_attempts(3)
            .idempotency_key("k")
            .webhook("http://h/x")
            .trace("00-tp", "ts")
            .into_proto();
        assert_eq!(
            req,
            pb::EnqueueRequest {
                queue: "q".into(),
                payload: Bytes::from_static(b"p"),
                priority: 7,
                delay_ms: 2000,
                run_at_ms: 1_700_000_000_123,
                max_attempts: 3,
                idempotency_key: "k".into(),
                webhook_url: "http://h/x".into(),
                trace: Some(pb::TraceContext { traceparent: "00-tp".into(), tracestate: "ts".into() }),
                deadline_in_ms: 0,
                concurrency_key: String::new(),
                concurrency_limit: 0,
                depends_on: vec![],
                dependency_rule: 0,
                debounce: None,
                singleton: None,
            }
        );
    }

    #[test]
    fn key_modes_go_into_the_request() {
        let d = NewTask::new("q", "p").debounce("k", Duration::from_secs(2), Duration::from_secs(10)).into_proto();
        assert_eq!(d.debounce, Some(pb::Debounce { key: "k".into(), delay_ms: 2000, max_wait_ms: 10_000 }));
        assert_eq!(d.singleton, None);
        let s = NewTask::new("q", "p").singleton("s").into_proto();
        assert_eq!(s.singleton, Some(pb::Singleton { key: "s".into(), mode: pb::SingletonMode::Refuse as i32 }));
        let skip = NewTask::new("q", "p").singleton_skip("s").into_proto();
        assert_eq!(skip.singleton.map(|s| s.mode), Some(pb::SingletonMode::Skip as i32));
    }

    #[test]
    fn defaults_leave_server_defaults_in_place() {
        let req = NewTask::new("q", Bytes::new()).into_proto();
        assert_eq!((req.delay_ms, req.run_at_ms, req.max_attempts), (0, 0, 0));
        assert!(req.trace.is_none());
    }

    #[test]
    fn sub_millisecond_delays_are_not_lost() {
        assert_eq!(duration_ms(Duration::from_micros(10)), 1);
        assert_eq!(duration_ms(Duration::ZERO), 0);
        assert_eq!(duration_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn task_states_map_and_unknown_values_do_not_panic() {
        assert_eq!(TaskState::from_proto(pb::TaskState::DeadLettered as i32), TaskState::DeadLettered);
        assert_eq!(TaskState::from_proto(99), TaskState::Unknown);
        assert!(TaskState::Cancelled.is_terminal());
        assert!(!TaskState::DeadLettered.is_terminal());
    }

    #[test]
    fn state_names_are_the_protocol_names_and_parse_back() {
        assert_eq!(TaskState::InProgress.as_str(), "IN_PROGRESS");
        assert_eq!(TaskState::DeadLettered.to_string(), "DEAD_LETTERED");
        assert_eq!(TaskState::Unknown.as_str(), "UNKNOWN");
        for s in [
            TaskState::Pending,
            TaskState::InProgress,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Cancelled,
            TaskState::DeadLettered,
        ] {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
            assert_eq!(TaskState::parse(&s.as_str().to_ascii_lowercase()), Some(s));
        }
        assert_eq!(TaskState::parse("UNSPECIFIED"), None);
        assert_eq!(TaskState::parse("done"), None);
    }

    #[test]
    fn a_task_converts_back_to_the_same_wire_task() {
        let wire = pb::Task {
            id: "a".into(),
            queue: "q".into(),
            payload: Bytes::from_static(b"p"),
            priority: 3,
            state: pb::TaskState::InProgress as i32,
            attempts: 2,
            max_attempts: 5,
            tenant: "t".into(),
            trace: Some(pb::TraceContext { traceparent: "00-x".into(), tracestate: "s".into() }),
            lease: Some(pb::Lease { worker_id: "w".into(), token: 9, claimed_at_ms: 1, deadline_ms: 2 }),
            created_at_ms: 10,
            updated_at_ms: 11,
            visible_at_ms: 12,
            idempotency_key: "k".into(),
            webhook_url: "http://h".into(),
            last_error: "e".into(),
            ended_at_ms: 13,
            dead_lettered_at_ms: 14,
            runs: vec![pb::Run {
                worker_id: "w".into(),
                token: 9,
                started_at_ms: 1,
                ended_at_ms: 0,
                outcome: String::new(),
                reason: String::new(),
            }],
            deadline_ms: 15,
            progress: Some(pb::Progress { percent: 40, message: "m".into(), at_ms: 3 }),
            concurrency_key: "c".into(),
            concurrency_limit: 2,
            follow_up_ids: vec!["f".into()],
            parent_id: "p".into(),
            depends_on: vec!["d".into()],
            dependency_rule: pb::DependencyRule::AllResolved as i32,
            waiting_on: vec!["d".into()],
            schedule_id: "s".into(),
            scheduled_for_ms: 16,
        };
        assert_eq!(pb::Task::from(Task::from(wire.clone())), wire);
    }

    #[test]
    fn task_token_comes_from_the_lease() {
        let t = Task::from_proto(pb::Task {
            id: "a".into(),
            lease: Some(pb::Lease { worker_id: "w".into(), token: 42, claimed_at_ms: 1, deadline_ms: 2 }),
            ..Default::default()
        });
        assert_eq!(t.token(), 42);
        assert_eq!(Task::from_proto(pb::Task::default()).token(), 0);
    }
}
