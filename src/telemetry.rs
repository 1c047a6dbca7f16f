//! Metric names and the Prometheus text exposition at `/metrics`.
//!
//! Task lifecycle counters and latency histograms are fed from what apply did (so every replica counts the same
//! replicated events, in state-machine time); Raft and log figures are read when scraped. Labels come only from
//! small closed sets (event, outcome, state, peer id) and the `MAX_QUEUE_SERIES` busiest queues, tenants and
//! overridden concurrency keys, never a task id.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub const TASKS_TOTAL: &str = "raftq_tasks_total";
pub const QUEUE_TASKS: &str = "raftq_queue_tasks";
pub const TENANT_TASKS: &str = "raftq_tenant_tasks";
pub const KEY_LIMIT: &str = "raftq_concurrency_key_limit";
pub const KEY_TASKS: &str = "raftq_concurrency_key_tasks";
pub const ENQUEUE_TO_CLAIM: &str = "raftq_enqueue_to_claim_seconds";
pub const CLAIM_TO_END: &str = "raftq_claim_to_end_seconds";
pub const ENQUEUE_TO_END: &str = "raftq_enqueue_to_end_seconds";
pub const FSYNC_SECONDS: &str = "raftq_log_fsync_seconds";
pub const FSYNCS_TOTAL: &str = "raftq_log_fsyncs_total";
pub const SYNCED_ENTRIES_TOTAL: &str = "raftq_log_synced_entries_total";
pub const APPLIED_ENTRIES_TOTAL: &str = "raftq_applied_entries_total";
pub const APPLIED_ITEMS_TOTAL: &str = "raftq_applied_items_total";
pub const APPLY_BATCHES_TOTAL: &str = "raftq_apply_batches_total";
pub const STREAM_SESSIONS: &str = "raftq_stream_sessions";
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "raftq_webhook_deliveries_total";
pub const WEBHOOKS_PENDING: &str = "raftq_webhooks_pending";

/// How many queues get depth series: the busiest, so label cardinality stays bounded.
pub const MAX_QUEUE_SERIES: usize = 20;

/// Task events counted from apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEvent {
    Enqueued,
    Claimed,
    Completed,
    Failed,
    Cancelled,
    Retried,
    DeadLettered,
    LeaseExpired,
}

const EVENTS: [(TaskEvent, &str); 8] = [
    (TaskEvent::Enqueued, "enqueued"),
    (TaskEvent::Claimed, "claimed"),
    (TaskEvent::Completed, "completed"),
    (TaskEvent::Failed, "failed"),
    (TaskEvent::Cancelled, "cancelled"),
    (TaskEvent::Retried, "retried"),
    (TaskEvent::DeadLettered, "dead_lettered"),
    (TaskEvent::LeaseExpired, "lease_expired"),
];

/// The kinds of applied log entries counted by `raftq_applied_entries_total`: the per-task commands, every other
/// command, and openraft's own entries (blank and membership).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Enqueue,
    Claim,
    Ack,
    Other,
    Raft,
}

const ENTRY_KINDS: [(EntryKind, &str); 5] = [
    (EntryKind::Enqueue, "enqueue"),
    (EntryKind::Claim, "claim"),
    (EntryKind::Ack, "ack"),
    (EntryKind::Other, "other"),
    (EntryKind::Raft, "raft"),
];

/// Outcomes of webhook delivery attempts, counted by the leader that made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookEvent {
    Delivered,
    Retry,
    GaveUp,
}

const WEBHOOK_EVENTS: [(WebhookEvent, &str); 3] =
    [(WebhookEvent::Delivered, "delivered"), (WebhookEvent::Retry, "retry"), (WebhookEvent::GaveUp, "gave_up")];

/// Bucket bounds in seconds: 1 ms to ~1 h, roughly x2.5 apart.
const BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 3600.0];

#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe_us(&self, us: u64) {
        let secs = us as f64 / 1e6;
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i].fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i].load(Relaxed));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count.load(Relaxed));
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.count.load(Relaxed));
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    events: [AtomicU64; EVENTS.len()],
    pub enqueue_to_claim: Histogram,
    pub claim_to_end: Histogram,
    pub enqueue_to_end: Histogram,
    pub stream_sessions: AtomicU64,
    pub snapshots_installed: AtomicU64,
    pub snapshots_built: AtomicU64,
    webhooks: [AtomicU64; WEBHOOK_EVENTS.len()],
    /// Tasks whose enqueue was refused by a depth limit (on the leader).
    pub refused_full: AtomicU64,
    /// Tasks whose enqueue found a depth limit full and waited on the leader for room (`depth_hold_ms`), let in
    /// or, when the wait ran out, refused (and counted in `refused_full` too).
    pub enqueue_held_full: AtomicU64,
    /// Times the leader held back claims because a queue was at its running cap.
    pub capped_claims: AtomicU64,
    /// Token buckets (a queue's or a fairness key's) passed over by a dispatch pass for lack of tokens while
    /// they had ready tasks (on the leader; once per bucket per pass).
    pub throttled_claims: AtomicU64,
    /// Enqueues a debounce key's pending task took (nothing created), and singleton enqueues refused or skipped
    /// while the key's task was active (on the leader that proposed them).
    pub debounced: AtomicU64,
    pub singleton_refused: AtomicU64,
    pub singleton_skipped: AtomicU64,
    /// Tasks this leader let in only as claims made room (producer flow control, `leader::flow`), and enqueued
    /// tasks it refused with `RATE_LIMITED` after they waited `flow_max_wait_ms` for room.
    pub enqueue_paced: AtomicU64,
    pub enqueue_refused_overload: AtomicU64,
    /// Tasks this leader claimed for a waiting worker right behind their enqueue's entry (`leader::dispatcher`,
    /// hand-off), before that entry applied.
    pub handed_off: AtomicU64,
    /// Log entries applied on this replica, and the task items they carried (creates, claims, acks), by kind.
    entries: [AtomicU64; ENTRY_KINDS.len()],
    entry_items: [AtomicU64; ENTRY_KINDS.len()],
    /// Batches of committed entries openraft handed to apply.
    pub apply_batches: AtomicU64,
}

impl Metrics {
    pub fn count(&self, e: TaskEvent, n: u64) {
        if let Some(i) = EVENTS.iter().position(|(x, _)| *x == e) {
            self.events[i].fetch_add(n, Relaxed);
        }
    }

    pub fn webhook(&self, e: WebhookEvent) {
        if let Some(i) = WEBHOOK_EVENTS.iter().position(|(x, _)| *x == e) {
            self.webhooks[i].fetch_add(1, Relaxed);
        }
    }

    /// One applied entry of `kind` carrying `items` task items.
    pub fn applied(&self, kind: EntryKind, items: u64) {
        if let Some(i) = ENTRY_KINDS.iter().position(|(x, _)| *x == kind) {
            self.entries[i].fetch_add(1, Relaxed);
            self.entry_items[i].fetch_add(items, Relaxed);
        }
    }

    pub fn event(&self, e: TaskEvent) -> u64 {
        EVENTS.iter().position(|(x, _)| *x == e).map(|i| self.events[i].load(Relaxed)).unwrap_or(0)
    }

    /// The process-wide part of the exposition.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {TASKS_TOTAL} Task lifecycle events applied on this replica.");
        let _ = writeln!(out, "# TYPE {TASKS_TOTAL} counter");
        for (i, (_, name)) in EVENTS.iter().enumerate() {
            let _ = writeln!(out, "{TASKS_TOTAL}{{event=\"{name}\"}} {}", self.events[i].load(Relaxed));
        }
        self.enqueue_to_claim.render(out, ENQUEUE_TO_CLAIM, "Time from enqueue to first claim.");
        self.claim_to_end.render(out, CLAIM_TO_END, "Time from claim to the end of the delivery.");
        self.enqueue_to_end.render(out, ENQUEUE_TO_END, "Time from enqueue to the task's end.");
        for (name, help, v) in [
            ("raftq_snapshots_built_total", "State-machine snapshots built by this node.", &self.snapshots_built),
            (
                "raftq_snapshots_installed_total",
                "Snapshots received from a leader and installed.",
                &self.snapshots_installed,
            ),
            (
                "raftq_enqueue_refused_full_total",
                "Tasks refused by this leader because their queue or tenant was at its depth limit.",
                &self.refused_full,
            ),
            (
                "raftq_enqueue_held_full_total",
                "Tasks whose enqueue found its queue or tenant at its depth limit and waited on this leader for room.",
                &self.enqueue_held_full,
            ),
            (
                "raftq_claims_capped_total",
                "Times this leader held back claims of a queue at its running cap.",
                &self.capped_claims,
            ),
            (
                "raftq_claims_throttled_total",
                "Times this leader passed over a queue's or a fairness key's ready tasks for lack of rate-limit tokens.",
                &self.throttled_claims,
            ),
            (
                "raftq_enqueue_debounced_total",
                "Enqueues taken by a debounce key's pending task on this leader (nothing created).",
                &self.debounced,
            ),
            (
                "raftq_enqueue_singleton_refused_total",
                "Enqueues this leader refused because their singleton key's task was pending or running.",
                &self.singleton_refused,
            ),
            (
                "raftq_enqueue_singleton_skipped_total",
                "Enqueues this leader dropped (answered with the active task) for their singleton key.",
                &self.singleton_skipped,
            ),
            (
                "raftq_enqueue_paced_total",
                "Tasks this leader let in only as claims made room, while its workers waited on it (flow control).",
                &self.enqueue_paced,
            ),
            (
                "raftq_enqueue_refused_overload_total",
                "Tasks this leader refused (RATE_LIMITED) after they waited flow_max_wait_ms for room (flow control).",
                &self.enqueue_refused_overload,
            ),
            (
                "raftq_claims_handed_off_total",
                "Tasks this leader claimed for a waiting worker right behind their enqueue's entry (hand-off).",
                &self.handed_off,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP {WEBHOOK_DELIVERIES_TOTAL} Webhook delivery attempts made by this node (as leader), by outcome."
        );
        let _ = writeln!(out, "# TYPE {WEBHOOK_DELIVERIES_TOTAL} counter");
        for (i, (_, name)) in WEBHOOK_EVENTS.iter().enumerate() {
            let _ =
                writeln!(out, "{WEBHOOK_DELIVERIES_TOTAL}{{outcome=\"{name}\"}} {}", self.webhooks[i].load(Relaxed));
        }
        for (name, help, values) in [
            (APPLIED_ENTRIES_TOTAL, "Log entries applied on this replica, by kind of command.", &self.entries),
            (
                APPLIED_ITEMS_TOTAL,
                "Task items (creates, claims, acks) carried by the log entries applied on this replica, by kind.",
                &self.entry_items,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, (_, kind)) in ENTRY_KINDS.iter().enumerate() {
                let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {}", values[i].load(Relaxed));
            }
        }
        let _ = writeln!(
            out,
            "# HELP {APPLY_BATCHES_TOTAL} Batches of committed log entries applied on this replica.\n# TYPE \
             {APPLY_BATCHES_TOTAL} counter\n{APPLY_BATCHES_TOTAL} {}",
            self.apply_batches.load(Relaxed)
        );
        let _ = writeln!(out, "# HELP {STREAM_SESSIONS} Open worker and producer streams.");
        let _ =
            writeln!(out, "# TYPE {STREAM_SESSIONS} gauge\n{STREAM_SESSIONS} {}", self.stream_sessions.load(Relaxed));
    }
}

/// The target of per-task trace spans: off unless asked for (`RAFTQ_LOG=info,raftq::trace=debug`), so a busy
/// queue pays nothing for them by default.
pub const TRACE_TARGET: &str = "raftq::trace";

/// Whether per-task trace spans are recorded.
pub fn task_spans_enabled() -> bool {
    tracing::enabled!(target: "raftq::trace", tracing::Level::DEBUG)
}

/// The trace id and parent span id of a W3C `traceparent` (validated at enqueue), or nothing.
pub fn trace_ids(traceparent: Option<&str>) -> (Option<&str>, Option<&str>) {
    let mut parts = traceparent.unwrap_or_default().split('-');
    let (_, trace, parent) = (parts.next(), parts.next(), parts.next());
    match (trace, parent) {
        (Some(t), Some(p)) if t.len() == 32 && p.len() == 16 => (Some(t), Some(p)),
        _ => (None, None),
    }
}

/// Records one step of a task's life (`op`: enqueue, claim, complete, fail, ...) as a span whose parent is the
/// W3C trace context given at enqueue: the span carries `trace_id`, `parent_span_id` (the caller's span) and
/// its own `span_id`, so a log pipeline can attach it to the caller's trace. One event inside says what happened.
pub fn task_span(op: &'static str, task_id: &crate::queue::TaskId, traceparent: Option<&str>, state: &str) {
    let (trace_id, parent_span_id) = trace_ids(traceparent);
    let span_id = format!("{:016x}", rand::random::<u64>().max(1));
    let span = tracing::debug_span!(
        target: "raftq::trace",
        "task",
        op,
        task_id = %task_id,
        trace_id,
        parent_span_id,
        span_id = %span_id,
    );
    span.in_scope(|| tracing::debug!(target: "raftq::trace", state, "task {op}"));
}

/// A gauge line with labels.
pub fn gauge(out: &mut String, name: &str, help: &str, series: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (labels, v) in series {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

/// A label value with `\`, `"` and newlines escaped.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
