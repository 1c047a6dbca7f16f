//! `Ack`: a worker's report on one delivery, named by its fencing token. Complete (with follow-ups: chaining),
//! fail, nack, abandon, exception end the delivery; heartbeat and progress extend its lease.
//!
//! A stale or unknown token is rejected as a value and changes nothing. The ack that ended a delivery is
//! remembered with its token (`Task.last_ack`): the same ack sent again is answered as applied and changes nothing,
//! which makes a retry after an unknown outcome safe.

use std::sync::Arc;

use super::context::ApplyContext;
use super::lifecycle::{backoff, close_run, count_requeue, note_ended, retry_or_dead};
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_ack<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        items: &[AckItem],
        slots: &mut [Option<ItemResult<AckOutcome>>],
    ) -> Result<(), S::Error> {
        for (item, slot) in items.iter().zip(slots.iter_mut()) {
            if self.mine(&item.task_id) {
                *slot = Some(self.ack(store, cx, item)?);
            }
        }
        Ok(())
    }

    fn ack<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        item: &AckItem,
    ) -> Result<ItemResult<AckOutcome>, S::Error> {
        let now = cx.now;
        // A retried task goes to the back of its queue: FIFO from this entry.
        let seq = cx.seq_base;
        let Some(mut before) = store.get(&item.task_id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if before.tenant != item.tenant {
            return Ok(Err(Rejected::NotFound));
        }
        let current =
            before.state == TaskState::InProgress && before.lease.as_ref().map(|l| l.token) == Some(item.token);
        if !current && before.last_ack == Some((item.token, item.action.kind())) {
            // The ack that ended this delivery, sent again: already applied, change nothing.
            return Ok(Ok(AckOutcome { state: before.state, at: now }));
        }
        if before.state != TaskState::InProgress {
            return Ok(Err(Rejected::NotInProgress));
        }
        if !current {
            return Ok(Err(Rejected::LeaseLost));
        }
        if let AckAction::CompleteWith { follow_ups, .. } = &item.action {
            // All or nothing: a follow-up that cannot be created (an id clash, or one the proposer placed in
            // another shard) refuses the whole completion.
            for n in follow_ups {
                if !self.mine(&n.id) || store.get(&n.id)?.is_some() {
                    return Ok(Err(Rejected::IdExists));
                }
            }
        }
        let claimed_at = before.lease.as_ref().map(|l| l.claimed_at);
        let was = self.take_for_change(store, &before)?;
        let t = Arc::make_mut(&mut before);
        t.updated_at = now;
        end_run(t, &item.action, now);
        let ended = act(t, &item.action, now, cx.seed, seq);
        if !item.action.is_heartbeat() {
            t.last_ack = Some((item.token, item.action.kind()));
            if let Some(claimed_at) = claimed_at {
                cx.fx.claim_to_end_ms.push(now.saturating_sub(claimed_at));
            }
            match t.state {
                TaskState::Completed => cx.fx.counts.completed += 1,
                TaskState::Failed => cx.fx.counts.failed += 1,
                _ => count_requeue(t, cx.fx),
            }
        }
        let t = self.put_changed(store, cx, was, before)?;
        self.note_pending(&t, cx.fx);
        if ended {
            note_ended(&t, now, cx.fx);
        }
        if let AckAction::CompleteWith { follow_ups, .. } = &item.action {
            for (j, n) in follow_ups.iter().enumerate() {
                // Checked above: each is created. FIFO among them follows their order.
                let created = self.enqueue(store, cx, n, seq + 1 + j as u64)?;
                debug_assert!(created.is_ok(), "follow-up {} refused: {created:?}", n.id);
            }
        }
        let at = match t.state {
            TaskState::InProgress => t.lease.as_ref().map(|l| l.deadline).unwrap_or(now),
            TaskState::Pending => t.visible_at,
            _ => now,
        };
        Ok(Ok(AckOutcome { state: t.state, at }))
    }
}

/// Closes the delivery's run with the action's outcome (heartbeats and progress keep it open).
fn end_run(t: &mut Task, action: &AckAction, now: TimeMs) {
    match action {
        AckAction::Complete { .. } | AckAction::CompleteWith { .. } => close_run(t, now, RunOutcome::Completed, ""),
        AckAction::Fail { error, retryable: false } => close_run(t, now, RunOutcome::Failed, error),
        AckAction::Fail { error, .. } | AckAction::Nack { reason: error, .. } => {
            close_run(t, now, RunOutcome::Retried, error)
        }
        AckAction::Abandon => close_run(t, now, RunOutcome::Abandoned, ""),
        AckAction::Exception { reason, .. } => close_run(t, now, RunOutcome::Exception, reason.as_str()),
        AckAction::Heartbeat { .. } | AckAction::Progress { .. } => {}
    }
}

/// The action's transition of a task in progress; returns whether the task ended (a terminal state).
fn act(t: &mut Task, action: &AckAction, now: TimeMs, seed: u64, seq: u64) -> bool {
    let end = |t: &mut Task, state: TaskState| {
        t.state = state;
        t.lease = None;
        t.ended_at = Some(now);
        true
    };
    match action {
        AckAction::Complete { result } => {
            t.result = Some(result.clone());
            end(t, TaskState::Completed)
        }
        AckAction::CompleteWith { result, follow_ups } => {
            t.result = Some(result.clone());
            t.follow_ups = follow_ups.iter().map(|n| n.id).collect();
            end(t, TaskState::Completed)
        }
        AckAction::Fail { error, retryable: false } => {
            t.last_error = Some(error.clone());
            end(t, TaskState::Failed)
        }
        AckAction::Fail { error, retryable: true } => {
            t.last_error = Some(error.clone());
            let delay = backoff(t, seed);
            retry_or_dead(t, now, delay, seq);
            false
        }
        AckAction::Nack { delay_ms, reason } => {
            t.last_error = Some(reason.clone());
            let delay = delay_ms.unwrap_or_else(|| backoff(t, seed));
            retry_or_dead(t, now, delay, seq);
            false
        }
        AckAction::Abandon => {
            // The attempt is given back: an abandoned delivery does not count.
            t.attempts = t.attempts.saturating_sub(1);
            retry_or_dead(t, now, 0, seq);
            false
        }
        AckAction::Heartbeat { extend_ms } => {
            extend_lease(t, now, *extend_ms);
            false
        }
        AckAction::Progress { extend_ms, percent, message } => {
            extend_lease(t, now, *extend_ms);
            t.progress = Some(Progress { percent: (*percent).min(100), message: message.clone(), at: now });
            false
        }
        AckAction::Exception { reason, message } => {
            t.last_error = Some(if message.is_empty() {
                reason.as_str().to_string()
            } else {
                format!("{}: {message}", reason.as_str())
            });
            match reason {
                ExceptionReason::MalformedPayload => end(t, TaskState::Failed),
                ExceptionReason::WorkerShutdown => {
                    t.attempts = t.attempts.saturating_sub(1);
                    retry_or_dead(t, now, 0, seq);
                    false
                }
                ExceptionReason::ResourceUnavailable | ExceptionReason::InternalError => {
                    let delay = backoff(t, seed);
                    retry_or_dead(t, now, delay, seq);
                    false
                }
            }
        }
    }
}

/// A lease is extended to `now + extend_ms`, never shortened.
fn extend_lease(t: &mut Task, now: TimeMs, extend_ms: u64) {
    if let Some(l) = t.lease.as_mut() {
        l.deadline = now.saturating_add(extend_ms).max(l.deadline);
    }
}
