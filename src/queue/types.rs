//! Domain types of the task state machine: ids, task records, commands and their responses.
//!
//! The serde types here are written into the Raft log and into redb (bincode behind a version, see
//! `storage::format`), so their shape is a storage format: changing it means a new format version and its
//! upgrade path in `storage::format`, and the old version's fixtures must still decode.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Milliseconds since the Unix epoch, as stamped by the leader.
pub type TimeMs = u64;

/// A task id: 16 bytes chosen by the proposer.
///
/// Layout: bytes 0..6 are the leader's clock in ms (so ids sort roughly by creation), bytes 6..8 are the
/// *placement*, bytes 8..16 are random. The shard that stores a task is `placement % shard_count`, so tasks that
/// must live together (same idempotency key, same concurrency key) are given the same placement by the proposer,
/// and that holds for any shard count.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskId(pub [u8; 16]);

/// The order of the bytes (time first), as one 128-bit comparison: task ids key every in-memory map of apply
/// (the layers, the indexes), and a byte-wise comparison was a `memcmp` call per step of every search.
impl Ord for TaskId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        u128::from_be_bytes(self.0).cmp(&u128::from_be_bytes(other.0))
    }
}

impl PartialOrd for TaskId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A hasher for maps keyed by task ids alone (apply's layers): each 8 bytes folded in by one full 64×64→128-bit
/// multiplication (the product's halves XORed, so every bit of the word reaches every bit of the state), in place
/// of SipHash's rounds. Not for keys an outsider picks freely to collide: a task id's last 8 bytes are the
/// leader's random draw.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            let product = u128::from(self.0 ^ u64::from_le_bytes(word)) * 0x9e37_79b9_7f4a_7c15;
            self.0 = (product as u64) ^ ((product >> 64) as u64);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by task ids, hashed with [`IdHasher`].
pub type IdMap<V> = std::collections::HashMap<TaskId, V, std::hash::BuildHasherDefault<IdHasher>>;
/// A set of task ids, hashed with [`IdHasher`] (the dispatcher's promised tasks, which every pick looks up).
pub type IdSet = std::collections::HashSet<TaskId, std::hash::BuildHasherDefault<IdHasher>>;

impl TaskId {
    pub fn new(time_ms: TimeMs, placement: u16, random: u64) -> Self {
        let mut b = [0u8; 16];
        b[0..6].copy_from_slice(&time_ms.to_be_bytes()[2..8]);
        b[6..8].copy_from_slice(&placement.to_be_bytes());
        b[8..16].copy_from_slice(&random.to_be_bytes());
        TaskId(b)
    }

    /// The placement shared by every task of one tenant's concurrency key: that of the idempotency key
    /// `"\u{1}concurrency\u{1}{key}"` (a namespace apart from idempotency keys), hashed without building that
    /// string, since this runs for every keyed enqueue.
    pub fn placement_for_concurrency_key(tenant: &str, key: &str) -> u16 {
        Self::placement_of(tenant, "\u{1}concurrency\u{1}".bytes().chain(key.bytes()))
    }

    /// The placement shared by every task of one tenant's idempotency key, so the key and its task live in the
    /// same shard. FNV-1a: stable across versions and platforms, which `std`'s hasher is not.
    pub fn placement_for_key(tenant: &str, key: &str) -> u16 {
        Self::placement_of(tenant, key.bytes())
    }

    fn placement_of(tenant: &str, key: impl Iterator<Item = u8>) -> u16 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in tenant.bytes().chain([0u8]).chain(key) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h ^ (h >> 32) ^ (h >> 16)) as u16
    }

    pub fn placement(&self) -> u16 {
        u16::from_be_bytes([self.0[6], self.0[7]])
    }

    /// The shard this task lives in, for a state machine with `shards` shard stores.
    pub fn shard(&self, shards: usize) -> usize {
        self.placement() as usize % shards.max(1)
    }

    /// The id as 32 lowercase hex digits. Every answer that names a task prints its id, so this does it with a
    /// table rather than the formatter's machinery per digit (which cost more than the rest of a claimed task's
    /// conversion).
    pub fn hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
        }
        out
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task id must be 32 hex characters")]
pub struct BadTaskId;

impl FromStr for TaskId {
    type Err = BadTaskId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.as_bytes();
        if s.len() != 32 {
            return Err(BadTaskId);
        }
        let mut out = [0u8; 16];
        for (i, chunk) in s.chunks(2).enumerate() {
            let hex = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            };
            let hi = hex(chunk[0]).ok_or(BadTaskId)?;
            let lo = hex(chunk[1]).ok_or(BadTaskId)?;
            out[i] = hi << 4 | lo;
        }
        Ok(TaskId(out))
    }
}

/// A fencing token, unique to one delivery of one task. Derived from the log index of the claim entry and the
/// item's position in it, so tokens only ever grow.
pub type LeaseToken = u64;

/// How many items one command may carry: claim tokens are `log_index * MAX_ITEMS_PER_COMMAND + position`.
pub const MAX_ITEMS_PER_COMMAND: u64 = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    Pending,
    InProgress,
    Completed,
    Failed,
    Cancelled,
    DeadLettered,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Cancelled)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "PENDING",
            TaskState::InProgress => "IN_PROGRESS",
            TaskState::Completed => "COMPLETED",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
            TaskState::DeadLettered => "DEAD_LETTERED",
        }
    }
}

/// Retry backoff, stamped into each task at enqueue from the leader's config so apply never reads local config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub base_ms: u64,
    pub max_ms: u64,
    /// false: fixed `base_ms`; true: `base_ms * 2^(attempts-1)` capped at `max_ms`, with up to 50 % jitter.
    pub exponential: bool,
}

impl RetryPolicy {
    /// The delay before attempt `attempts + 1`, jitter taken from `jitter` (a proposer-chosen random value).
    pub fn delay_ms(&self, attempts: u32, jitter: u64) -> u64 {
        if !self.exponential {
            return self.base_ms;
        }
        let shift = attempts.saturating_sub(1).min(40);
        let full = self.base_ms.saturating_mul(1u64 << shift).min(self.max_ms);
        // Equal jitter: half fixed, half random, so a retry never comes sooner than half the backoff.
        let half = full / 2;
        half + if half == 0 { 0 } else { jitter % (half + 1) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Shared with the task's run and the claim that made it (encoded as a string).
    pub worker_id: Arc<str>,
    pub token: LeaseToken,
    pub claimed_at: TimeMs,
    pub deadline: TimeMs,
}

/// The stored task record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub tenant: String,
    pub queue: String,
    /// Shared, not copied, by the task's states (a claim or an ack makes a new state of the task), its claim's
    /// answer and the command that created it; encoded as the bytes of a `Vec<u8>` would be (the same records).
    pub payload: Bytes,
    pub priority: u8,
    pub state: TaskState,
    /// FIFO order within a priority: assigned from the log position each time the task becomes pending.
    pub seq: u64,
    pub created_at: TimeMs,
    pub updated_at: TimeMs,
    /// A pending task is claimable once state-machine time reaches this.
    pub visible_at: TimeMs,
    pub attempts: u32,
    pub max_attempts: u32,
    pub idempotency_key: Option<String>,
    pub webhook_url: Option<String>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub retry: RetryPolicy,
    pub retention_ms: u64,
    pub lease: Option<Lease>,
    pub result: Option<Vec<u8>>,
    pub last_error: Option<String>,
    pub ended_at: Option<TimeMs>,
    pub dead_at: Option<TimeMs>,
    /// The token and kind of the ack that ended the last lease: the same ack sent again (a retry after an
    /// unknown outcome, e.g. across a leader change) is answered as applied instead of rejected.
    pub last_ack: Option<(LeaseToken, u8)>,
    /// Every delivery of this task, oldest first (at most `MAX_RUNS_KEPT`): who ran it, when, and how it ended.
    pub runs: Vec<Run>,
    /// The task must end by this time: a task still pending, running or dead-lettered then fails with reason
    /// `deadline-exceeded`.
    pub deadline: Option<TimeMs>,
    /// The last progress a worker reported for the current delivery (cleared at each claim).
    pub progress: Option<Progress>,
    /// At most `limit` tasks of the tenant with this key run at once.
    pub concurrency: Option<ConcurrencyKey>,
    /// Tasks created by the completion of this one (chaining), in order.
    pub follow_ups: Vec<TaskId>,
    /// The task whose completion created this one.
    pub parent: Option<TaskId>,
    /// Dependencies given at enqueue, and the rule they must meet.
    pub depends_on: Vec<TaskId>,
    pub dependency_rule: DependencyRule,
    /// Dependencies not yet resolved: while any remains the pending task is held (not claimable).
    pub waiting_on: Vec<TaskId>,
    /// Created by a schedule: which one, and the occurrence it is for.
    pub scheduled: Option<(TaskId, TimeMs)>,
}

/// When a schedule's occurrences fall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleSpec {
    /// A 5-field cron expression in an IANA time zone.
    Cron { expr: String, tz: String },
    /// Every `every_ms` from the schedule's creation.
    Interval { every_ms: u64 },
}

/// What happens to occurrences missed while the cluster could not fire them (down, no leader).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MissedPolicy {
    /// Missed occurrences are not run; firing resumes with the next one.
    #[default]
    Skip,
    /// The latest missed occurrence runs once; older missed ones are dropped.
    RunOnce,
}

/// A recurring task of one tenant. Stored in the shard of its id's placement, with the tasks it creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub id: TaskId,
    pub tenant: String,
    pub name: String,
    pub spec: ScheduleSpec,
    pub missed: MissedPolicy,
    pub paused: bool,
    pub created_at: TimeMs,
    /// The occurrence most recently fired or skipped: the next one is the first after it.
    pub last_occurrence: Option<TimeMs>,
    /// How many tasks it created.
    pub fired: u64,
    /// The task each occurrence creates (its id and visible time are replaced when fired).
    pub template: NewTask,
}

/// When a task with dependencies becomes ready.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DependencyRule {
    /// Every dependency completed; one that fails or is cancelled cancels the task.
    #[default]
    AllCompleted,
    /// Every dependency ended, whatever its outcome.
    AllResolved,
}

/// The leader's report that a dependency ended (or is gone), for a task waiting on it. Apply trusts `outcome`
/// (the leader read it from replicated state); it is ignored unless the task still waits on `dependency`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyResolved {
    pub task_id: TaskId,
    pub dependency: TaskId,
    /// The dependency's terminal state; `None` when it no longer exists (removed after its retention).
    pub outcome: Option<TaskState>,
}

/// A per-tenant concurrency key and its limit. Every task of one key is placed in one shard (the proposer
/// derives the placement from the key), so the key's running count is that shard's alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConcurrencyKey {
    pub key: String,
    /// At least 1.
    pub limit: u32,
}

/// How many runs a task keeps: worker-shutdown retries consume no attempt, so runs are not bounded by
/// `max_attempts`; the oldest are dropped past this.
pub const MAX_RUNS_KEPT: usize = 32;

/// How a run (one delivery) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunOutcome {
    Completed,
    Failed,
    /// Retryable failure or nack: back to pending after a delay (or dead-lettered).
    Retried,
    Abandoned,
    LeaseExpired,
    /// The worker reported an exception; `Run::reason` says which.
    Exception,
    Cancelled,
    DeadlineExceeded,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "COMPLETED",
            RunOutcome::Failed => "FAILED",
            RunOutcome::Retried => "RETRIED",
            RunOutcome::Abandoned => "ABANDONED",
            RunOutcome::LeaseExpired => "LEASE_EXPIRED",
            RunOutcome::Exception => "EXCEPTION",
            RunOutcome::Cancelled => "CANCELLED",
            RunOutcome::DeadlineExceeded => "DEADLINE_EXCEEDED",
        }
    }
}

/// One delivery of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub worker_id: Arc<str>,
    pub token: LeaseToken,
    pub started_at: TimeMs,
    pub ended_at: Option<TimeMs>,
    pub outcome: Option<RunOutcome>,
    /// For an exception: its reason (`malformed-payload`, ...); otherwise the error or nack reason, if any.
    pub reason: String,
}

/// Progress reported by a worker with a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// 0-100.
    pub percent: u8,
    pub message: String,
    pub at: TimeMs,
}

/// Why a worker ended a run with an exception (Taskcluster's reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExceptionReason {
    /// The payload cannot be run: terminal (FAILED), no retry.
    MalformedPayload,
    /// The worker is going away: back to pending at once, the attempt is given back.
    WorkerShutdown,
    /// Something the task needs is missing: retried with backoff, the attempt counts.
    ResourceUnavailable,
    /// The worker broke: retried with backoff, the attempt counts.
    InternalError,
}

impl ExceptionReason {
    pub const ALL: [ExceptionReason; 4] = [
        ExceptionReason::MalformedPayload,
        ExceptionReason::WorkerShutdown,
        ExceptionReason::ResourceUnavailable,
        ExceptionReason::InternalError,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionReason::MalformedPayload => "malformed-payload",
            ExceptionReason::WorkerShutdown => "worker-shutdown",
            ExceptionReason::ResourceUnavailable => "resource-unavailable",
            ExceptionReason::InternalError => "internal-error",
        }
    }
    pub fn parse(s: &str) -> Option<ExceptionReason> {
        ExceptionReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// The reason recorded when a task's deadline passes.
pub const DEADLINE_EXCEEDED: &str = "deadline-exceeded";

impl Task {
    /// When a terminal task is removed: retention counts from the end, never from creation.
    pub fn retention_deadline(&self) -> Option<TimeMs> {
        match (self.state.is_terminal(), self.ended_at) {
            (true, Some(end)) => Some(end.saturating_add(self.retention_ms)),
            _ => None,
        }
    }
}

/// Which tasks a listing returns (every condition given must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub queue: Option<String>,
    pub state: Option<TaskState>,
    /// Created at or after this time.
    pub created_from: Option<TimeMs>,
    /// Created before this time.
    pub created_to: Option<TimeMs>,
}

impl TaskFilter {
    pub fn matches(&self, t: &Task) -> bool {
        self.queue.as_ref().is_none_or(|q| *q == t.queue)
            && self.state.is_none_or(|s| s == t.state)
            && self.created_from.is_none_or(|f| t.created_at >= f)
            && self.created_to.is_none_or(|to| t.created_at < to)
    }
}

/// A queue of one tenant: what the ready index, counts, paused flags and claim wake-ups are keyed by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub tenant: String,
    pub queue: String,
}

/// A queue of one tenant by borrowed names: a `QueueKey`-keyed hash map or set is looked up by one (a task is
/// one: its tenant and queue) without building a key, which allocates both names. Apply looks up a task's queue
/// several times per claim and per ack.
pub trait QueueRef {
    fn tenant(&self) -> &str;
    fn queue(&self) -> &str;
}

impl QueueRef for QueueKey {
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn queue(&self) -> &str {
        &self.queue
    }
}

impl QueueRef for Task {
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn queue(&self) -> &str {
        &self.queue
    }
}

impl QueueRef for (&str, &str) {
    fn tenant(&self) -> &str {
        self.0
    }
    fn queue(&self) -> &str {
        self.1
    }
}

impl<'a> std::borrow::Borrow<dyn QueueRef + 'a> for QueueKey {
    fn borrow(&self) -> &(dyn QueueRef + 'a) {
        self
    }
}

/// One hash for the key and every borrowed form of it (`Borrow` requires it).
impl std::hash::Hash for dyn QueueRef + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tenant().hash(state);
        self.queue().hash(state);
    }
}

impl PartialEq for dyn QueueRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.tenant() == other.tenant() && self.queue() == other.queue()
    }
}

impl Eq for dyn QueueRef + '_ {}

impl std::hash::Hash for QueueKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self as &dyn QueueRef).hash(state)
    }
}

impl QueueKey {
    pub fn new(tenant: &str, queue: &str) -> Self {
        QueueKey { tenant: tenant.to_string(), queue: queue.to_string() }
    }

    pub fn of(task: &Task) -> Self {
        QueueKey { tenant: task.tenant.clone(), queue: task.queue.clone() }
    }
}

/// An idempotency key: which task it created and until when it is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub task_id: TaskId,
    pub expires_at: TimeMs,
}

/// A task to create, fully decided by the proposer (id, visible time, defaults from config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTask {
    pub id: TaskId,
    pub tenant: String,
    pub queue: String,
    pub payload: Bytes,
    pub priority: u8,
    pub visible_at: TimeMs,
    pub max_attempts: u32,
    pub idempotency_key: Option<String>,
    /// How long the idempotency key is remembered, from the enqueue.
    pub idempotency_window_ms: u64,
    pub webhook_url: Option<String>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub retry: RetryPolicy,
    pub retention_ms: u64,
    /// Absolute deadline (the proposer adds the requested duration to its clock).
    pub deadline: Option<TimeMs>,
    pub concurrency: Option<ConcurrencyKey>,
    /// Set for a follow-up task: the task whose completion creates it.
    pub parent: Option<TaskId>,
    /// Tasks (of the same tenant, existing at enqueue) this one waits for.
    pub depends_on: Vec<TaskId>,
    pub dependency_rule: DependencyRule,
}

impl NewTask {
    /// The key under which the idempotency key is remembered: with a concurrency key it is namespaced by it, so
    /// duplicates are found among the tasks of the same concurrency key (they share a shard; tasks of another
    /// concurrency key may live elsewhere).
    pub fn idempotency_record_key(&self) -> Option<String> {
        let key = self.idempotency_key.as_ref()?;
        Some(match &self.concurrency {
            Some(c) => format!("\u{1}{}\u{1}{key}", c.key),
            None => key.clone(),
        })
    }
}

/// One claim: the proposer chose which task goes to which worker; apply checks it is still claimable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimItem {
    pub task_id: TaskId,
    /// Shared by the items of one request (encoded as strings).
    pub tenant: Arc<str>,
    pub worker_id: Arc<str>,
    pub lease_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckAction {
    Complete {
        result: Vec<u8>,
    },
    Fail {
        error: String,
        retryable: bool,
    },
    /// Back to pending after `delay_ms` (or the task's backoff when `None`), consuming the attempt.
    Nack {
        delay_ms: Option<u64>,
        reason: String,
    },
    /// Back to pending at once; the attempt is given back.
    Abandon,
    /// Extend the lease to `now + extend_ms`.
    Heartbeat {
        extend_ms: u64,
    },
    /// Ends the run with an exception (see `ExceptionReason` for what each does).
    Exception {
        reason: ExceptionReason,
        message: String,
    },
    /// A heartbeat that also records progress.
    Progress {
        extend_ms: u64,
        percent: u8,
        message: String,
    },
    /// Completes the task and creates `follow_ups` in the same entry, all or nothing. The proposer places every
    /// follow-up in the completed task's shard (same placement), so the whole effect stays in one shard.
    CompleteWith {
        result: Vec<u8>,
        follow_ups: Vec<NewTask>,
    },
}

impl AckAction {
    /// Heartbeats (with or without progress) extend a lease and end nothing.
    pub fn is_heartbeat(&self) -> bool {
        matches!(self, AckAction::Heartbeat { .. } | AckAction::Progress { .. })
    }

    /// A small code per kind of ack, recorded with the token of the ack that ended a lease.
    pub fn kind(&self) -> u8 {
        match self {
            AckAction::Complete { .. } => 1,
            AckAction::Fail { retryable: false, .. } => 2,
            AckAction::Fail { retryable: true, .. } => 3,
            AckAction::Nack { .. } => 4,
            AckAction::Abandon => 5,
            AckAction::Heartbeat { .. } => 6,
            AckAction::Exception { .. } => 7,
            AckAction::Progress { .. } => 8,
            AckAction::CompleteWith { .. } => 9,
        }
    }
}

/// An ack names the task and the fencing token of the delivery it reports on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckItem {
    pub task_id: TaskId,
    pub tenant: String,
    pub token: LeaseToken,
    pub action: AckAction,
}

/// Which dead-lettered tasks a redrive or purge takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DlqSelector {
    All,
    Ids(Vec<TaskId>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Enqueue(Vec<NewTask>),
    Claim(Vec<ClaimItem>),
    Ack(Vec<AckItem>),
    Cancel {
        tenant: String,
        task_id: TaskId,
    },
    Redrive {
        tenant: String,
        queue: String,
        select: DlqSelector,
    },
    PurgeDeadLetters {
        tenant: String,
        queue: String,
        select: DlqSelector,
    },
    /// Moves state-machine time forward: expiries and promotions happen on every entry, a tick just makes sure
    /// time advances while the cluster is otherwise idle.
    Tick,
    /// What the leader's webhook sender saw for each attempt: delivered, retry at a time it chose, or given up.
    WebhookOutcome(Vec<WebhookReport>),
    /// Pauses (or resumes) a queue: a paused queue keeps accepting enqueues and serves no claims. Every shard
    /// keeps its own copy of the flag, so a claim's check reads only its own shard.
    SetQueuePaused {
        tenant: String,
        queue: String,
        paused: bool,
    },
    /// Dependencies that ended, for the tasks waiting on them (proposed by the leader's resolver).
    ResolveDependencies(Vec<DependencyResolved>),
    CreateSchedule(Box<Schedule>),
    /// Pauses or resumes (`paused`), or deletes (`delete`) a schedule of the tenant.
    UpdateSchedule {
        tenant: String,
        id: TaskId,
        paused: bool,
        delete: bool,
    },
    /// One occurrence of a schedule, proposed by the leader's ticker: applied once per occurrence (an occurrence
    /// at or before the schedule's last is ignored). `task` is `None` for an occurrence skipped by the missed
    /// policy; otherwise it is created in the schedule's shard.
    FireSchedule {
        id: TaskId,
        occurrence: TimeMs,
        task: Option<Box<NewTask>>,
    },
    /// Raises the cluster version (`crate::raft::version`): proposed by the leader once every member's binary
    /// can apply `version`. Never lowers it. New variants go after this one (bincode numbers variants in order),
    /// and each names, in `required_version`, the cluster version that introduced it.
    SetClusterVersion {
        version: u32,
    },
    /// Sets (or, with every limit `None`, removes) the flow-control limits of a tenant's queue, or of the tenant
    /// as a whole when `queue` is empty. Every shard keeps a copy, as paused queues are kept; the leader enforces
    /// them (see `Limits`). Cluster version 2.
    SetLimits {
        tenant: String,
        queue: String,
        limits: Limits,
    },
    /// Sets the weight of a fairness key (a concurrency key; "" for tasks without one) in a tenant's queue: the
    /// leader serves the queue's keys in proportion to their weights (`queue::fair`). 1 is the default and
    /// removes the record. Every shard keeps its own copy, as for paused queues. Cluster version 2.
    SetFairnessWeight {
        tenant: String,
        queue: String,
        key: String,
        weight: u32,
    },
    /// Sets (or, with `limit.milli_per_s == 0`, removes) the token bucket of a tenant's queue (`key: None`, the
    /// whole queue) or of one fairness key of it (`Some("")` is the key of tasks without a concurrency key).
    /// Every shard keeps a copy of every bucket (config and level, one record each; `queue::rate`). A new bucket
    /// starts full; a changed one keeps its level, capped at the new burst. Cluster version 2.
    SetRateLimit {
        tenant: String,
        queue: String,
        key: Option<String>,
        limit: RateLimit,
    },
    /// A claim whose tasks draw on token buckets (`SetRateLimit`): the claims as `Claim` does, plus the tokens
    /// they take, decided by the leader. Every shard applies every charge to its copy of the bucket (whichever
    /// shard holds the task), so the buckets are identical on every shard and every replica whatever the shard
    /// count. Apply never refuses a claim for lack of tokens (the leader decided; see `queue::rate`). Proposed
    /// instead of `Claim` only when a charge is due, so a cluster without rate limits never sees it. Cluster
    /// version 2.
    RatedClaim {
        items: Vec<ClaimItem>,
        charges: Vec<RateCharge>,
    },
    /// An enqueue whose items may carry a debounce or singleton key (`KeyMode`): applied item by item as
    /// `Enqueue` is, each keyed item checked against its key's record first (`apply/keyed.rs`). Proposed instead
    /// of `Enqueue` only when an item has a key mode, so ordinary enqueues keep the old command. Cluster version 3.
    EnqueueKeyed(Vec<KeyedTask>),
    /// Sets (or, with `limit: None`, removes) the operator's override of a tenant's concurrency key: while it is
    /// in force (`KeyLimit::in_force`) it replaces the `limit` the key's tasks carry, in apply's claim check and in
    /// the leader's pick. An expiry is an absolute state-machine time the proposer computed from a TTL; once the
    /// shard's time reaches it the override is gone (every entry's sweep removes it, no command needed) and the
    /// tasks' own limits apply again. Every shard keeps a copy, as for weights. Cluster version 3.
    SetKeyLimit {
        tenant: String,
        key: String,
        limit: Option<KeyLimit>,
    },
}

/// A task to create and the key mode it was enqueued with (`None`: a plain enqueue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedTask {
    pub task: NewTask,
    pub mode: Option<KeyMode>,
}

/// A debounce or singleton key of an enqueue. The key is the tenant's, in a namespace of its own per mode and per
/// queue (apart from idempotency keys); its record (`KeyRecord` under `KeyMode::record_key`) names the task it
/// stands for and lives in that task's shard (the proposer places the task by the record key, or by its
/// concurrency key when it has one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyMode {
    /// While the key's task is pending and was never claimed, an enqueue replaces its payload and priority and
    /// moves its start to `min(now + delay_ms, created_at + max_wait_ms)` (`max_wait_ms` 0: no cap) instead of
    /// creating a task. Otherwise the enqueue creates a task (visible at `now + delay_ms`, as the proposer set).
    Debounce { key: String, delay_ms: u64, max_wait_ms: u64 },
    /// While the key's task is pending or in progress, an enqueue creates nothing: it is refused
    /// (`Rejected::SingletonActive`) or, with `skip`, answered with the active task as a duplicate.
    Singleton { key: String, skip: bool },
}

impl KeyMode {
    pub fn key(&self) -> &str {
        match self {
            KeyMode::Debounce { key, .. } | KeyMode::Singleton { key, .. } => key,
        }
    }

    /// The record key of this mode's key for a task of `queue` with concurrency key `concurrency`. It starts with
    /// NUL, which no idempotency record key does (the API refuses NUL in idempotency keys, and the concurrency
    /// namespace starts with `\u{1}`), so the kinds are told apart (`is_mode_record_key`). The mode's
    /// key (no control characters, checked by the API) comes before the concurrency key, so the parts cannot be
    /// confused. With a concurrency key the record lives in that key's shard, scoped by it as idempotency keys are.
    pub fn record_key(&self, queue: &str, concurrency: Option<&ConcurrencyKey>) -> String {
        let kind = match self {
            KeyMode::Debounce { .. } => "debounce",
            KeyMode::Singleton { .. } => "singleton",
        };
        let ck = concurrency.map(|c| c.key.as_str()).unwrap_or("");
        format!("\0{kind}\0{queue}\0{}\0{ck}", self.key())
    }

    /// Whether the task a record names still holds the key: a debounce key while the task is pending and was
    /// never claimed, a singleton key while it is pending or in progress.
    pub fn holds(record_key: &str, t: &Task) -> bool {
        if record_key.starts_with("\0debounce\0") {
            t.state == TaskState::Pending && t.runs.is_empty()
        } else {
            matches!(t.state, TaskState::Pending | TaskState::InProgress)
        }
    }
}

/// A debounce or singleton record key (`KeyMode::record_key`), as opposed to an idempotency key's.
pub fn is_mode_record_key(key: &str) -> bool {
    key.starts_with('\0')
}

/// An operator's override of a concurrency key's limit (`Command::SetKeyLimit`), in force until `expires_at`
/// (exclusive; `None`: until removed). Lowering it below the key's running count stops nothing that runs: it
/// only holds new claims until the count falls below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyLimit {
    /// At least 1.
    pub limit: u32,
    pub expires_at: Option<TimeMs>,
}

impl KeyLimit {
    /// Whether the override applies at state-machine time `now`.
    pub fn in_force(&self, now: TimeMs) -> bool {
        self.expires_at.is_none_or(|e| now < e)
    }
}

/// A token bucket's configuration: `milli_per_s` tokens per 1000 s (thousandths of a task per second, so
/// fractional rates such as 0.5/s or 30/min are exact) refill a bucket of `burst` tokens; a claimed task takes
/// one token. `milli_per_s == 0` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateLimit {
    pub milli_per_s: u64,
    pub burst: u32,
}

/// A token bucket: its configuration and its level, `micros` millionths of a token at state-machine time `at`
/// (the level later is `min(burst, micros + milli_per_s * elapsed_ms)`; see `queue::rate`). Negative after a
/// charge past the level (the leader decided with an earlier clock): the debt is paid back before the next token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateBucket {
    pub limit: RateLimit,
    pub micros: i64,
    pub at: TimeMs,
}

/// Tokens a `RatedClaim` takes from one bucket: the whole queue's (`key: None`) or a fairness key's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateCharge {
    pub tenant: String,
    pub queue: String,
    pub key: Option<String>,
    pub tokens: u32,
}

/// Flow-control limits of a queue (or of a tenant, over all its queues). `None` is no limit.
///
/// They are enforced by the leader, which alone decides what is enqueued and claimed: an enqueue that would take
/// the waiting tasks (pending, whether ready, delayed or held) past `max_depth` is refused whole before it is
/// proposed, and a claim is not proposed for a queue whose running tasks (applied, plus those promised to claims
/// in flight) reach `max_running`. A new leader decides only once it has applied every entry of the earlier
/// terms. The decisions are in the log, so every replica applies the same entries; apply does not re-check them
/// (a cross-shard count is not a single shard's to make).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Limits {
    /// Running (in-progress) tasks at most, across all keys (queue limits only).
    pub max_running: Option<u32>,
    /// Waiting tasks at most: enqueues past it are refused with `QUEUE_FULL`.
    pub max_depth: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.max_running.is_none() && self.max_depth.is_none()
    }
}

impl Command {
    /// The cluster version a command needs: a replica of an older binary could not decode or apply it, so the
    /// proposer refuses it until the cluster runs that version. Every command of version 0 is understood by every
    /// build; `SetClusterVersion` is proposed only by the version gate, which checks every member itself.
    pub fn required_version(&self) -> u32 {
        match self {
            Command::SetClusterVersion { .. } => 1,
            Command::SetLimits { .. } => 2,
            Command::SetFairnessWeight { .. } => 2,
            Command::SetRateLimit { .. } => 2,
            Command::RatedClaim { .. } => 2,
            Command::EnqueueKeyed(_) => 3,
            Command::SetKeyLimit { .. } => 3,
            _ => 0,
        }
    }
}

/// The Raft log payload: a command with the leader's clock and randomness.
///
/// The command is shared: openraft clones entries whenever it reads them from the log (for each follower's
/// replication, for apply), and a shared command makes that a count increment instead of a copy of every task in
/// it. Serialized as the command itself (serde's `rc`), so the log format is the same as an owned command's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub time_ms: TimeMs,
    /// Randomness for retry jitter, chosen by the proposer.
    pub seed: u64,
    pub command: Arc<Command>,
}

impl Request {
    pub fn new(time_ms: TimeMs, seed: u64, command: Command) -> Self {
        Request { time_ms, seed, command: Arc::new(command) }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, n) = match &*self.command {
            Command::Enqueue(v) => ("enqueue", v.len()),
            Command::Claim(v) => ("claim", v.len()),
            Command::Ack(v) => ("ack", v.len()),
            Command::Cancel { .. } => ("cancel", 1),
            Command::Redrive { .. } => ("redrive", 1),
            Command::PurgeDeadLetters { .. } => ("purge", 1),
            Command::Tick => ("tick", 0),
            Command::WebhookOutcome(v) => ("webhook_outcome", v.len()),
            Command::SetQueuePaused { .. } => ("pause", 1),
            Command::ResolveDependencies(v) => ("resolve", v.len()),
            Command::CreateSchedule(_) => ("schedule-create", 1),
            Command::UpdateSchedule { .. } => ("schedule-update", 1),
            Command::FireSchedule { .. } => ("schedule-fire", 1),
            Command::SetClusterVersion { .. } => ("cluster-version", 1),
            Command::SetLimits { .. } => ("limits", 1),
            Command::SetFairnessWeight { .. } => ("fairness-weight", 1),
            Command::SetRateLimit { .. } => ("rate-limit", 1),
            Command::RatedClaim { items, .. } => ("rated-claim", items.len()),
            Command::EnqueueKeyed(v) => ("enqueue-keyed", v.len()),
            Command::SetKeyLimit { .. } => ("key-limit", 1),
        };
        write!(f, "{name}[{n}]@{}", self.time_ms)
    }
}

/// A business rejection: a value in the response, never an error of the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum Rejected {
    #[error("task not found")]
    NotFound,
    #[error("the lease token is not the current one")]
    LeaseLost,
    #[error("the task is not in progress")]
    NotInProgress,
    #[error("the task is not claimable")]
    NotClaimable,
    #[error("the task has already ended")]
    AlreadyEnded,
    #[error("a task with this id already exists")]
    IdExists,
    /// A singleton key's task (this one) is pending or in progress.
    #[error("task {0} of this singleton key is pending or in progress")]
    SingletonActive(TaskId),
}

impl Rejected {
    /// Stable reason strings, shared by gRPC and REST.
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::NotFound => "NOT_FOUND",
            Rejected::LeaseLost => "LEASE_LOST",
            Rejected::NotInProgress => "NOT_IN_PROGRESS",
            Rejected::NotClaimable => "NOT_CLAIMABLE",
            Rejected::AlreadyEnded => "ALREADY_ENDED",
            Rejected::IdExists => "ALREADY_EXISTS",
            Rejected::SingletonActive(_) => "SINGLETON_ACTIVE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    pub task_id: TaskId,
    /// The idempotency key was seen before: `task_id` is the original task and nothing was created. Also for a
    /// debounce that changed the pending task, and a singleton key's skipped enqueue (`KeyMode`).
    pub duplicate: bool,
}

/// What an ack did to its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckOutcome {
    pub state: TaskState,
    /// For a heartbeat: the new lease deadline; for a retry: when the task is visible again.
    pub at: TimeMs,
}

pub type ItemResult<T> = Result<T, Rejected>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Blank and membership entries.
    None,
    Enqueued(Vec<ItemResult<Enqueued>>),
    Claimed(Vec<ItemResult<Arc<Task>>>),
    Acked(Vec<ItemResult<AckOutcome>>),
    Cancelled(ItemResult<TaskState>),
    Redriven(Vec<TaskId>),
    Purged(Vec<TaskId>),
    Ticked,
    /// How many webhook reports changed an outbox record (stale reports change nothing).
    WebhooksRecorded(u32),
    /// The queue's paused flag after a `SetQueuePaused`.
    QueuePaused(bool),
    /// How many waiting tasks a `ResolveDependencies` changed.
    Resolved(u64),
    /// A schedule command's outcome: the schedule after it (`None` once deleted).
    Schedule(ItemResult<Option<Box<Schedule>>>),
    /// Whether a `FireSchedule` took effect (false: an occurrence already fired, or no such schedule).
    Fired(bool),
    /// The cluster version in force after a `SetClusterVersion`.
    ClusterVersion(u32),
    /// The limits in force after a `SetLimits`.
    LimitsSet(Limits),
    /// The key's weight after a `SetFairnessWeight`.
    FairnessWeight(u32),
    /// The bucket after a `SetRateLimit` (`None`: removed).
    RateLimit(Option<RateBucket>),
    /// The key's override after a `SetKeyLimit` (`None`: removed, or already expired when applied).
    KeyLimit(Option<KeyLimit>),
}

/// Names one webhook delivery: the task and the point of its life it reports, `log_index << 4 | state code`, so
/// a task that ends twice (dead-lettered, then cancelled; or redriven and ended again) gets one delivery per end.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeliveryId {
    pub task_id: TaskId,
    pub seq: u64,
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:016x}", self.task_id, self.seq)
    }
}

impl fmt::Debug for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeliveryId({self})")
    }
}

/// A webhook delivery waiting in the outbox of its task's shard. Written by the same apply that ends the task,
/// and self-contained (the task may be removed by retention before its delivery succeeds). Removed once
/// delivered or given up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookDelivery {
    pub id: DeliveryId,
    pub url: String,
    pub tenant: String,
    pub queue: String,
    /// The state the task ended in (a terminal state, or `DeadLettered`).
    pub state: TaskState,
    pub attempts: u32,
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub created_at: TimeMs,
    pub ended_at: TimeMs,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Delivery attempts made so far.
    pub tries: u32,
    /// When the next attempt is due (state-machine time the leader chose).
    pub next_at: TimeMs,
    pub last_error: Option<String>,
}

/// The outcome of one delivery attempt, decided by the leader (which also chose the retry time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WebhookOutcome {
    Delivered,
    Retry { at: TimeMs, error: String },
    GaveUp { error: String },
}

/// One attempt's report. `tries` is the record's count when the attempt started: a report about an attempt
/// already recorded (a second leader's, or one sent again) changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookReport {
    pub id: DeliveryId,
    pub tries: u32,
    pub outcome: WebhookOutcome,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn placements_of_keys_stay_what_stored_tasks_were_given() {
        // Stored tasks were placed by these values: a change would put a key's new tasks in another shard than
        // its old ones and its records.
        for (tenant, key, concurrency, idempotency) in
            [("default", "k0", 16045, 31072), ("acme", "user-42", 5102, 47462), ("t", "", 31300, 57236)]
        {
            assert_eq!(TaskId::placement_for_concurrency_key(tenant, key), concurrency, "{tenant}/{key}");
            assert_eq!(TaskId::placement_for_key(tenant, key), idempotency, "{tenant}/{key}");
            let named = format!("\u{1}concurrency\u{1}{key}");
            assert_eq!(TaskId::placement_for_key(tenant, &named), concurrency);
        }
    }

    #[test]
    fn id_hashes_spread_over_a_tables_buckets_even_without_the_random_part() {
        // A table of 4,096 buckets indexes by the hash's low 12 bits and tags by its top 7. Ids a millisecond
        // apart with the random part constant (as some callers make them) must still spread over both, about as
        // random hashes would (4,096 random values fill ~2,590 of 4,096 slots).
        let build = std::hash::BuildHasherDefault::<IdHasher>::default();
        for random in [0u64, 7] {
            let hashes: Vec<u64> =
                (0..4096u64).map(|i| build.hash_one(TaskId::new(1_700_000_000_000 + i, 3, random))).collect();
            let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
            let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
            assert!(low.len() > 2400, "random part {random}: {} distinct low 12 bits of 4,096", low.len());
            assert_eq!(top.len(), 128, "random part {random}: every 7-bit tag is used");
        }
        // Placement and random part count too.
        let a = build.hash_one(TaskId::new(5, 1, 9));
        assert_ne!(a, build.hash_one(TaskId::new(5, 2, 9)));
        assert_ne!(a, build.hash_one(TaskId::new(5, 1, 10)));
    }

    #[test]
    fn a_queue_is_found_by_its_borrowed_names_and_only_by_its_own() {
        // Names whose concatenations are equal must stay apart ("ab"/"c" against "a"/"bc").
        let keys =
            [QueueKey::new("ab", "c"), QueueKey::new("a", "bc"), QueueKey::new("", "abc"), QueueKey::new("t", "q")];
        let map: std::collections::HashMap<QueueKey, usize> = keys.iter().cloned().zip(0..).collect();
        let set: std::collections::HashSet<QueueKey> = keys[..2].iter().cloned().collect();
        for (i, k) in keys.iter().enumerate() {
            let by_pair: &dyn QueueRef = &(k.tenant.as_str(), k.queue.as_str());
            assert_eq!(map.get(by_pair), Some(&i), "{k:?} by its names");
            assert_eq!(map.get(k as &dyn QueueRef), Some(&i), "{k:?} by itself");
            assert_eq!(set.contains(by_pair), i < 2);
        }
        assert_eq!(map.get(&("t", "") as &dyn QueueRef), None);
        assert_eq!(map.get(&("abc", "") as &dyn QueueRef), None);
    }
}
