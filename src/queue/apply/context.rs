//! What applying one entry carries besides the records: the entry's transients (`ApplyContext`), the response
//! being filled shard by shard (`PartialResponse`) and the side effects the node reacts to (`Effects`).

use std::sync::Arc;

use foldhash::HashSet;

use crate::queue::types::*;

/// The transients of one entry being applied, shared by every shard that applies it. Built by the caller
/// (`ApplyContext::new`), passed to `ShardCore::apply` of each shard in turn, then `finish`ed into the response.
#[derive(Debug)]
pub struct ApplyContext<'a> {
    /// The entry's log index: fencing tokens, FIFO sequence numbers and webhook delivery ids derive from it.
    pub log_index: u64,
    /// The proposer's randomness for this entry (retry jitter).
    pub seed: u64,
    /// The entry's first sequence number, `log_index * MAX_ITEMS_PER_COMMAND`: item `i` of a command gets
    /// `seq_base + i` as its FIFO sequence (an enqueue) or fencing token (a claim).
    pub seq_base: u64,
    /// The applying shard's time for this entry, set by `ShardCore::apply` once time has moved.
    pub now: TimeMs,
    /// The response, filled shard by shard: each item belongs to exactly one shard.
    pub out: PartialResponse,
    /// Side effects, accumulated over every entry of an applied batch.
    pub fx: &'a mut Effects,
}

impl<'a> ApplyContext<'a> {
    pub fn new(log_index: u64, req: &Request, fx: &'a mut Effects) -> Self {
        ApplyContext {
            log_index,
            seed: req.seed,
            seq_base: log_index.saturating_mul(MAX_ITEMS_PER_COMMAND),
            now: req.time_ms,
            out: PartialResponse::for_command(&req.command),
            fx,
        }
    }

    /// The entry's response once every shard has applied it.
    pub fn finish(self) -> Response {
        self.out.finish()
    }
}

/// Side effects of applying entries that the node reacts to after commit (waking parked claims, answering
/// result waiters, webhooks, metrics). Derived, never stored.
#[derive(Debug, Default)]
pub struct Effects {
    /// Queues that gained claimable work: an enqueue, a retry, a lease expiry, a delayed task coming due, a
    /// redrive, a resume, or a keyed task that stopped running (a slot of its key came free).
    pub ready: HashSet<QueueKey>,
    pub ended: Vec<TaskId>,
    pub counts: EventCounts,
    /// Per task, in state-machine ms: enqueue to first claim; claim to the end of a delivery; enqueue to the end.
    pub enqueue_to_claim_ms: Vec<u64>,
    pub claim_to_end_ms: Vec<u64>,
    pub enqueue_to_end_ms: Vec<u64>,
    /// Webhook deliveries added to an outbox (the leader's sender looks again).
    pub webhooks_added: u64,
    /// Deliveries ended without their worker (cancel, deadline, lease expiry): the node tells the worker stream
    /// that holds each one.
    pub revoked: Vec<RevokedLease>,
}

/// A delivery that ended while its worker still held it: the task was cancelled, its deadline passed, or its
/// lease expired. No outcome or extension carrying `token` can apply any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevokedLease {
    pub task_id: TaskId,
    pub token: LeaseToken,
    /// `Cancelled`, `DeadlineExceeded` or `LeaseExpired`.
    pub outcome: RunOutcome,
}

impl RevokedLease {
    /// The delivery of `token` that a change of its task to `after` closed without the worker.
    pub fn of(after: &Task, token: LeaseToken) -> Option<RevokedLease> {
        let outcome = after.runs.iter().rev().find(|r| r.token == token)?.outcome?;
        matches!(outcome, RunOutcome::Cancelled | RunOutcome::DeadlineExceeded | RunOutcome::LeaseExpired)
            .then_some(RevokedLease { task_id: after.id, token, outcome })
    }
}

/// What happened to tasks in the applied entries (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventCounts {
    pub enqueued: u64,
    pub claimed: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub lease_expired: u64,
}

/// Slots of a response being filled shard by shard; each item belongs to exactly one shard.
#[derive(Debug, Default)]
pub enum PartialResponse {
    #[default]
    None,
    Enqueued(Vec<Option<ItemResult<Enqueued>>>),
    Claimed(Vec<Option<ItemResult<Arc<Task>>>>),
    Acked(Vec<Option<ItemResult<AckOutcome>>>),
    Cancelled(Option<ItemResult<TaskState>>),
    Redriven(Vec<TaskId>),
    Purged(Vec<TaskId>),
    Ticked,
    WebhooksRecorded(u32),
    QueuePaused(bool),
    Resolved(u64),
    Schedule(Option<ItemResult<Option<Box<Schedule>>>>),
    Fired(bool),
    ClusterVersion(u32),
    LimitsSet(Limits),
    FairnessWeight(u32),
    RateLimit(Option<RateBucket>),
    KeyLimit(Option<KeyLimit>),
}

impl PartialResponse {
    pub fn for_command(cmd: &Command) -> Self {
        match cmd {
            Command::Enqueue(v) => PartialResponse::Enqueued(vec![None; v.len()]),
            Command::Claim(v) => PartialResponse::Claimed(vec![None; v.len()]),
            Command::Ack(v) => PartialResponse::Acked(vec![None; v.len()]),
            Command::Cancel { .. } => PartialResponse::Cancelled(None),
            Command::Redrive { .. } => PartialResponse::Redriven(vec![]),
            Command::PurgeDeadLetters { .. } => PartialResponse::Purged(vec![]),
            Command::Tick => PartialResponse::Ticked,
            Command::WebhookOutcome(_) => PartialResponse::WebhooksRecorded(0),
            Command::SetQueuePaused { paused, .. } => PartialResponse::QueuePaused(*paused),
            Command::ResolveDependencies(_) => PartialResponse::Resolved(0),
            Command::CreateSchedule(_) | Command::UpdateSchedule { .. } => PartialResponse::Schedule(None),
            Command::FireSchedule { .. } => PartialResponse::Fired(false),
            Command::SetClusterVersion { version } => PartialResponse::ClusterVersion(*version),
            Command::SetLimits { limits, .. } => PartialResponse::LimitsSet(*limits),
            Command::SetFairnessWeight { weight, .. } => PartialResponse::FairnessWeight(*weight),
            Command::SetRateLimit { .. } => PartialResponse::RateLimit(None),
            Command::RatedClaim { items, .. } => PartialResponse::Claimed(vec![None; items.len()]),
            Command::EnqueueKeyed(v) => PartialResponse::Enqueued(vec![None; v.len()]),
            Command::SetKeyLimit { .. } => PartialResponse::KeyLimit(None),
        }
    }

    /// The finished response. A slot no shard filled can only come from a shard that skipped the entry during
    /// crash recovery, where nobody waits for the answer; it reads as `NotFound`.
    pub fn finish(self) -> Response {
        fn fill<T>(v: Vec<Option<ItemResult<T>>>) -> Vec<ItemResult<T>> {
            v.into_iter().map(|s| s.unwrap_or(Err(Rejected::NotFound))).collect()
        }
        match self {
            PartialResponse::None => Response::None,
            PartialResponse::Enqueued(v) => Response::Enqueued(fill(v)),
            PartialResponse::Claimed(v) => Response::Claimed(fill(v)),
            PartialResponse::Acked(v) => Response::Acked(fill(v)),
            PartialResponse::Cancelled(v) => Response::Cancelled(v.unwrap_or(Err(Rejected::NotFound))),
            PartialResponse::Redriven(v) => Response::Redriven(v),
            PartialResponse::Purged(v) => Response::Purged(v),
            PartialResponse::Ticked => Response::Ticked,
            PartialResponse::WebhooksRecorded(n) => Response::WebhooksRecorded(n),
            PartialResponse::QueuePaused(p) => Response::QueuePaused(p),
            PartialResponse::Resolved(n) => Response::Resolved(n),
            PartialResponse::Schedule(v) => Response::Schedule(v.unwrap_or(Err(Rejected::NotFound))),
            PartialResponse::Fired(f) => Response::Fired(f),
            PartialResponse::ClusterVersion(v) => Response::ClusterVersion(v),
            PartialResponse::LimitsSet(l) => Response::LimitsSet(l),
            PartialResponse::FairnessWeight(w) => Response::FairnessWeight(w),
            PartialResponse::RateLimit(b) => Response::RateLimit(b),
            PartialResponse::KeyLimit(l) => Response::KeyLimit(l),
        }
    }
}
