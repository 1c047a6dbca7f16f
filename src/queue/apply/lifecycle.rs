//! Transitions several commands share: writing a changed task (and moving it between indexes), retry or
//! dead-letter, closing the open run, and the accounting that goes with them.

use std::sync::Arc;

use super::context::{ApplyContext, Effects, RevokedLease};
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    /// Writes a changed task and moves it between indexes. A task with a webhook URL that has just ended (or been
    /// dead-lettered) gets a delivery in this shard's outbox, in the same transaction (`webhooks.rs`); a task that
    /// no longer holds its debounce or singleton key loses the key's record (`keyed.rs`).
    pub(super) fn update<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        before: &Task,
        after: Task,
    ) -> Result<Arc<Task>, S::Error> {
        self.idx.remove_task(before);
        self.put_changed(store, cx, Was::of(before), Arc::new(after))
    }

    /// [`update`](Self::update) in two steps, for the changes every task goes through (claim, ack): the record
    /// leaves the indexes and the store gives up its reference, so the caller, then holding the only one, changes
    /// it in place (`Arc::make_mut`) instead of copying it; a copy is made only while another holder shares it (a
    /// layer being flushed, a reader). The caller must hand the task to [`put_changed`](Self::put_changed) before
    /// apply reads it again: until then it is in no index and the store's answer for it is not its state.
    pub(super) fn take_for_change<S: TaskStore>(&mut self, store: &mut S, before: &Task) -> Result<Was, S::Error> {
        self.idx.remove_task(before);
        store.release(&before.id)?;
        Ok(Was::of(before))
    }

    /// Stores the changed task `after` of a record that was `was` (already out of the indexes), and moves it into
    /// the indexes its new state calls for.
    pub(super) fn put_changed<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        was: Was,
        after: Arc<Task>,
    ) -> Result<Arc<Task>, S::Error> {
        if was.state == TaskState::InProgress && after.state != TaskState::InProgress {
            // A slot of the key (or of a capped queue) came free: tasks of it may be claimable now.
            let capped = || {
                !self.idx.limits.is_empty()
                    && self.idx.limits.get(&*after as &dyn QueueRef).is_some_and(|l| l.max_running.is_some())
            };
            if (was.keyed || capped()) && !cx.fx.ready.contains(&*after as &dyn QueueRef) {
                cx.fx.ready.insert(QueueKey::of(&after));
            }
        }
        if let Some(r) = was.token.and_then(|token| RevokedLease::of(&after, token)) {
            cx.fx.revoked.push(r);
        }
        self.idx.add_task(&after, self.now);
        store.put(after.clone())?;
        self.release_key(store, &after)?;
        self.outbox_on_end(store, cx, was.state, &after)?;
        Ok(after)
    }

    /// Reports the task's queue as having claimable work if the task is ready now.
    pub(super) fn note_pending(&self, t: &Task, fx: &mut Effects) {
        // A batch's tasks mostly share their queue: its names are cloned once.
        if t.state == TaskState::Pending && t.visible_at <= self.now && !fx.ready.contains(t as &dyn QueueRef) {
            fx.ready.insert(QueueKey::of(t));
        }
    }
}

/// What a change needs to know of a task's record before it: its state, the token of the delivery it was running
/// (whose closing by the change may revoke the worker's lease) and whether it held a concurrency key. A task's
/// tenant and queue never change.
pub(super) struct Was {
    state: TaskState,
    token: Option<LeaseToken>,
    keyed: bool,
}

impl Was {
    fn of(t: &Task) -> Was {
        let token = t.lease.as_ref().filter(|_| t.state == TaskState::InProgress).map(|l| l.token);
        Was { state: t.state, token, keyed: t.concurrency.is_some() }
    }
}

/// Back to pending after `delay` while attempts remain, else to the dead-letter queue.
pub(super) fn retry_or_dead(t: &mut Task, now: TimeMs, delay: u64, seq: u64) {
    t.lease = None;
    t.updated_at = now;
    if t.attempts >= t.max_attempts {
        t.state = TaskState::DeadLettered;
        t.dead_at = Some(now);
    } else {
        t.state = TaskState::Pending;
        t.visible_at = now.saturating_add(delay);
        t.seq = seq;
    }
}

/// The backoff before the next attempt: the task's retry policy with jitter from the entry's seed.
pub(super) fn backoff(t: &Task, seed: u64) -> u64 {
    t.retry.delay_ms(t.attempts, jitter(seed, &t.id))
}

/// A deterministic mix of the proposer's seed with a task id, for per-task jitter.
fn jitter(seed: u64, id: &TaskId) -> u64 {
    let mut z = seed ^ u64::from_be_bytes(id.0[8..16].try_into().expect("8 bytes"));
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Ends the open run of a task (the current delivery), if there is one.
pub(super) fn close_run(t: &mut Task, now: TimeMs, outcome: RunOutcome, reason: &str) {
    let token = t.lease.as_ref().map(|l| l.token);
    if let Some(run) = t.runs.last_mut() {
        if run.outcome.is_none() && Some(run.token) == token {
            run.ended_at = Some(now);
            run.outcome = Some(outcome);
            run.reason = reason.chars().take(256).collect();
        }
    }
}

/// A delivery that did not end the task: retried later, or dead-lettered.
pub(super) fn count_requeue(t: &Task, fx: &mut Effects) {
    match t.state {
        TaskState::DeadLettered => fx.counts.dead_lettered += 1,
        TaskState::Pending => fx.counts.retried += 1,
        _ => {}
    }
}

/// A task ended (completed, failed or cancelled) in this entry: answer its result waiters, time it from enqueue.
pub(super) fn note_ended(t: &Task, now: TimeMs, fx: &mut Effects) {
    fx.ended.push(t.id);
    fx.enqueue_to_end_ms.push(now.saturating_sub(t.created_at));
}
