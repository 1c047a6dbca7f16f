//! Apply: the rules of the task lifecycle, one log entry on one shard.
//!
//! `ShardCore::apply` moves the shard's time to the entry's, runs what fell due (`tick.rs`), then hands the
//! command to the file of its family. Every family has the same shape: `apply_<command>(store, cx, <the
//! command's fields>, <its response slot>)`, which changes only records of this shard (the sharding rule), keeps
//! the indexes in step, and writes its answer into the slot. Business rejections are values in the slot; an
//! `Err` is a storage error and stops the node.
//!
//! | command                                | file                               |
//! |----------------------------------------|------------------------------------|
//! | (every entry, first), `Tick`           | `tick.rs`: `advance`, expiries     |
//! | `Enqueue`                              | `enqueue.rs`                       |
//! | `Claim`                                | `claim.rs`                         |
//! | `Ack` (every `AckAction`)              | `ack.rs`                           |
//! | `Cancel`                               | `cancel.rs`                        |
//! | `Redrive`, `PurgeDeadLetters`          | `dead_letters.rs`                  |
//! | `SetQueuePaused`                       | `pause.rs`                         |
//! | `ResolveDependencies`                  | `dependencies.rs`                  |
//! | `CreateSchedule`, `UpdateSchedule`, `FireSchedule` | `schedules.rs`         |
//! | `WebhookOutcome` (and outbox writes)   | `webhooks.rs`                      |
//! | `SetClusterVersion`                    | `version.rs`                       |
//! | `SetLimits`                            | `limits.rs`                        |
//! | `SetFairnessWeight`                    | `fairness.rs`                      |
//! | `SetRateLimit`, `RatedClaim`'s charges | `rates.rs` (its claims: `claim.rs`) |
//! | `EnqueueKeyed`                         | `keyed.rs` (its creations: `enqueue.rs`) |
//! | `SetKeyLimit` (and its expiry sweep)   | `key_limits.rs`                    |
//!
//! Transitions several commands share (writing a changed task, retry or dead-letter, closing a run) are in
//! `lifecycle.rs`; the entry's transients and the response slots in `context.rs`.

mod ack;
mod cancel;
mod claim;
mod context;
mod dead_letters;
mod dependencies;
mod enqueue;
mod fairness;
mod key_limits;
mod keyed;
mod lifecycle;
mod limits;
mod pause;
mod rates;
mod schedules;
mod tick;
mod version;
mod webhooks;

pub use context::{ApplyContext, Effects, EventCounts, PartialResponse, RevokedLease};

use super::shard::ShardCore;
use super::store::TaskStore;
use super::types::*;
use schedules::ScheduleChange;

impl ShardCore {
    /// Applies one log entry to this shard. `cx` is the entry's context, shared by every shard that applies it.
    pub fn apply<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        req: &Request,
    ) -> Result<(), S::Error> {
        self.now = self.now.max(req.time_ms);
        cx.now = self.now;
        self.advance(store, cx)?;
        // The slots are taken out of the context for the call, so the family gets both as separate borrows.
        let mut out = std::mem::take(&mut cx.out);
        let applied = self.apply_command(store, cx, &req.command, &mut out);
        cx.out = out;
        applied
    }

    /// The dispatch table: each command to its family's file.
    fn apply_command<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        command: &Command,
        out: &mut PartialResponse,
    ) -> Result<(), S::Error> {
        use PartialResponse as Out;
        match (command, out) {
            (Command::Tick, Out::Ticked) => Ok(()),
            (Command::Enqueue(items), Out::Enqueued(slots)) => self.apply_enqueue(store, cx, items, slots),
            (Command::Claim(items), Out::Claimed(slots)) => self.apply_claim(store, cx, items, slots),
            (Command::Ack(items), Out::Acked(slots)) => self.apply_ack(store, cx, items, slots),
            (Command::Cancel { tenant, task_id }, Out::Cancelled(slot)) => {
                self.apply_cancel(store, cx, tenant, task_id, slot)
            }
            (Command::Redrive { tenant, queue, select }, Out::Redriven(done)) => {
                self.apply_redrive(store, cx, &QueueKey::new(tenant, queue), select, done)
            }
            (Command::PurgeDeadLetters { tenant, queue, select }, Out::Purged(done)) => {
                self.apply_purge(store, cx, &QueueKey::new(tenant, queue), select, done)
            }
            (Command::SetQueuePaused { tenant, queue, paused }, Out::QueuePaused(_)) => {
                self.apply_set_queue_paused(store, cx, QueueKey::new(tenant, queue), *paused)
            }
            (Command::ResolveDependencies(items), Out::Resolved(n)) => {
                self.apply_resolve_dependencies(store, cx, items, n)
            }
            (Command::CreateSchedule(sch), Out::Schedule(slot)) => self.apply_create_schedule(store, cx, sch, slot),
            (Command::UpdateSchedule { tenant, id, paused, delete }, Out::Schedule(slot)) => {
                let change = if *delete { ScheduleChange::Delete } else { ScheduleChange::SetPaused(*paused) };
                self.apply_update_schedule(store, cx, tenant, id, change, slot)
            }
            (Command::FireSchedule { id, occurrence, task }, Out::Fired(done)) => {
                self.apply_fire_schedule(store, cx, id, *occurrence, task.as_deref(), done)
            }
            (Command::WebhookOutcome(reports), Out::WebhooksRecorded(n)) => {
                self.apply_webhook_outcome(store, cx, reports, n)
            }
            (Command::SetClusterVersion { version }, Out::ClusterVersion(now)) => {
                self.apply_set_cluster_version(store, *version, now)
            }
            (Command::SetLimits { tenant, queue, limits }, Out::LimitsSet(_)) => {
                self.apply_set_limits(store, QueueKey::new(tenant, queue), *limits)
            }
            (Command::SetFairnessWeight { tenant, queue, key, weight }, Out::FairnessWeight(out)) => {
                self.apply_set_fairness_weight(store, QueueKey::new(tenant, queue), key, *weight, out)
            }
            (Command::SetRateLimit { tenant, queue, key, limit }, Out::RateLimit(out)) => {
                self.apply_set_rate_limit(store, cx, QueueKey::new(tenant, queue), key.as_deref(), *limit, out)
            }
            (Command::RatedClaim { items, charges }, Out::Claimed(slots)) => {
                self.apply_claim(store, cx, items, slots)?;
                self.apply_rate_charges(store, cx, charges)
            }
            (Command::EnqueueKeyed(items), Out::Enqueued(slots)) => self.apply_enqueue_keyed(store, cx, items, slots),
            (Command::SetKeyLimit { tenant, key, limit }, Out::KeyLimit(out)) => {
                self.apply_set_key_limit(store, cx, tenant, key, *limit, out)
            }
            (_, out) => unreachable!("response slots built for another command: {out:?}"),
        }
    }
}
