//! The webhook outbox on the apply side: the delivery written when a task with a webhook URL ends (called from
//! `lifecycle.rs`'s `update`, so every command that ends a task writes it), and `WebhookOutcome`, the leader's
//! report of each delivery attempt. Sending is the leader's (`leader::webhooks`); apply never does I/O.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_webhook_outcome<S: TaskStore>(
        &mut self,
        store: &mut S,
        _cx: &mut ApplyContext<'_>,
        reports: &[WebhookReport],
        recorded: &mut u32,
    ) -> Result<(), S::Error> {
        for r in reports {
            if self.mine(&r.id.task_id) {
                *recorded += self.record_webhook(store, r)? as u32;
            }
        }
        Ok(())
    }

    /// Records one delivery attempt; a report about an attempt already recorded (or a delivery already gone)
    /// changes nothing.
    fn record_webhook<S: TaskStore>(&mut self, store: &mut S, r: &WebhookReport) -> Result<bool, S::Error> {
        let Some(before) = store.get_delivery(&r.id)? else {
            return Ok(false);
        };
        if before.tries != r.tries {
            return Ok(false);
        }
        self.idx.remove_delivery(&before);
        match &r.outcome {
            WebhookOutcome::Delivered | WebhookOutcome::GaveUp { .. } => store.remove_delivery(&r.id)?,
            WebhookOutcome::Retry { at, error } => {
                let mut d = before;
                d.tries += 1;
                d.next_at = *at;
                d.last_error = Some(error.clone());
                store.put_delivery(&d)?;
                self.idx.add_delivery(&d);
            }
        }
        Ok(true)
    }

    /// A task with a webhook URL that has just ended (or been dead-lettered) gets a delivery in this shard's
    /// outbox, named by the entry's log index and the state it reached, so each end of a task is one delivery.
    pub(super) fn outbox_on_end<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        before: TaskState,
        after: &Task,
    ) -> Result<(), S::Error> {
        let ended = after.state.is_terminal() || after.state == TaskState::DeadLettered;
        let (true, true, Some(url)) = (ended, before != after.state, &after.webhook_url) else {
            return Ok(());
        };
        let d = WebhookDelivery {
            id: DeliveryId { task_id: after.id, seq: cx.log_index << 4 | state_code(after.state) },
            url: url.clone(),
            tenant: after.tenant.clone(),
            queue: after.queue.clone(),
            state: after.state,
            attempts: after.attempts,
            result: after.result.clone(),
            error: after.last_error.clone(),
            created_at: after.created_at,
            ended_at: cx.now,
            traceparent: after.traceparent.clone(),
            tracestate: after.tracestate.clone(),
            tries: 0,
            next_at: cx.now,
            last_error: None,
        };
        store.put_delivery(&d)?;
        self.idx.add_delivery(&d);
        cx.fx.webhooks_added += 1;
        Ok(())
    }
}

/// A small code per state, part of a webhook delivery's id.
fn state_code(s: TaskState) -> u64 {
    match s {
        TaskState::Pending => 0,
        TaskState::InProgress => 1,
        TaskState::Completed => 2,
        TaskState::Failed => 3,
        TaskState::Cancelled => 4,
        TaskState::DeadLettered => 5,
    }
}
