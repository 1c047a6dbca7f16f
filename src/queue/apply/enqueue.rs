//! `Enqueue`: creates tasks, each in the shard of its id's placement. A repeat of a live idempotency key answers
//! the original task as a duplicate and creates nothing; an id already stored is refused.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_enqueue<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        items: &[NewTask],
        slots: &mut [Option<ItemResult<Enqueued>>],
    ) -> Result<(), S::Error> {
        for (pos, (item, slot)) in items.iter().zip(slots.iter_mut()).enumerate() {
            if self.mine(&item.id) {
                let seq = cx.seq_base + pos as u64;
                *slot = Some(self.enqueue(store, cx, item, seq)?);
            }
        }
        Ok(())
    }

    /// Creates one task with FIFO sequence `seq`. Also creates follow-ups (`ack.rs`) and schedule occurrences
    /// (`schedules.rs`).
    pub(super) fn enqueue<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        n: &NewTask,
        seq: u64,
    ) -> Result<ItemResult<Enqueued>, S::Error> {
        let now = cx.now;
        if let Some(key) = &n.idempotency_record_key() {
            if let Some(rec) = store.get_key(&n.tenant, key)? {
                if rec.expires_at > now {
                    return Ok(Ok(Enqueued { task_id: rec.task_id, duplicate: true }));
                }
            }
        }
        if store.get(&n.id)?.is_some() {
            return Ok(Err(Rejected::IdExists));
        }
        let t = Task {
            id: n.id,
            tenant: n.tenant.clone(),
            queue: n.queue.clone(),
            payload: n.payload.clone(),
            priority: n.priority.min(9),
            state: TaskState::Pending,
            seq,
            created_at: now,
            updated_at: now,
            visible_at: n.visible_at,
            attempts: 0,
            max_attempts: n.max_attempts.max(1),
            idempotency_key: n.idempotency_key.clone(),
            webhook_url: n.webhook_url.clone(),
            traceparent: n.traceparent.clone(),
            tracestate: n.tracestate.clone(),
            retry: n.retry,
            retention_ms: n.retention_ms,
            lease: None,
            result: None,
            last_error: None,
            ended_at: None,
            dead_at: None,
            last_ack: None,
            runs: vec![],
            deadline: n.deadline,
            progress: None,
            concurrency: n.concurrency.clone(),
            follow_ups: vec![],
            parent: n.parent,
            depends_on: n.depends_on.clone(),
            dependency_rule: n.dependency_rule,
            waiting_on: n.depends_on.clone(),
            scheduled: None,
        };
        self.idx.add_task(&t, now);
        self.note_pending(&t, cx.fx);
        store.put(std::sync::Arc::new(t))?;
        cx.fx.counts.enqueued += 1;
        if let Some(key) = &n.idempotency_record_key() {
            let rec = KeyRecord { task_id: n.id, expires_at: now.saturating_add(n.idempotency_window_ms) };
            // A key replaced after expiry leaves its old index entry behind; `advance` skips it by deadline.
            store.put_key(&n.tenant, key, &rec)?;
            self.idx.add_key(&n.tenant, key, &rec);
        }
        Ok(Ok(Enqueued { task_id: n.id, duplicate: false }))
    }
}
