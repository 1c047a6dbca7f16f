//! `EnqueueKeyed`: an enqueue whose items may carry a debounce or singleton key (`KeyMode`). Built on the
//! idempotency records: a key's record (`KeyRecord` under `KeyMode::record_key`, in the shard of the task it
//! names) says which task stands for the key.
//!
//! Such a record lives exactly as long as its task holds the key (`KeyMode::holds`: a debounce key while the task
//! is pending and never claimed, a singleton key while it is pending or in progress): every change of a task goes
//! through `update` (`lifecycle.rs`), which calls `release_key`, and the record goes in the same entry as the
//! change that ends the hold. So a record never outlives its meaning and never leaks, and whether an enqueue
//! finds the key held depends on the log alone, not on when a sweep ran (a dead-lettered task that is redriven
//! does not hold its old key again). Its `expires_at` is `TimeMs::MAX`: the idempotency sweep never takes it.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_enqueue_keyed<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        items: &[KeyedTask],
        slots: &mut [Option<ItemResult<Enqueued>>],
    ) -> Result<(), S::Error> {
        for (pos, (item, slot)) in items.iter().zip(slots.iter_mut()).enumerate() {
            if self.mine(&item.task.id) {
                let seq = cx.seq_base + pos as u64;
                *slot = Some(match &item.mode {
                    None => self.enqueue(store, cx, &item.task, seq)?,
                    Some(mode) => self.enqueue_with_key(store, cx, &item.task, mode, seq)?,
                });
            }
        }
        Ok(())
    }

    /// One keyed item: acts on the key's task while it holds the key, else creates the task and points the key
    /// at it.
    fn enqueue_with_key<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        n: &NewTask,
        mode: &KeyMode,
        seq: u64,
    ) -> Result<ItemResult<Enqueued>, S::Error> {
        let now = cx.now;
        let rkey = mode.record_key(&n.queue, n.concurrency.as_ref());
        let rec = store.get_key(&n.tenant, &rkey)?;
        if let Some(before) = key_holder(store, &n.tenant, &n.queue, &rkey, rec.as_ref())? {
            let task_id = before.id;
            return Ok(match mode {
                KeyMode::Singleton { skip: true, .. } => Ok(Enqueued { task_id, duplicate: true }),
                KeyMode::Singleton { skip: false, .. } => Err(Rejected::SingletonActive(task_id)),
                KeyMode::Debounce { delay_ms, max_wait_ms, .. } => {
                    let mut t = Task::clone(&before);
                    t.payload = n.payload.clone();
                    t.priority = n.priority.min(9);
                    let start = now.saturating_add(*delay_ms);
                    t.visible_at = match *max_wait_ms {
                        0 => start,
                        cap => start.min(t.created_at.saturating_add(cap)),
                    };
                    t.updated_at = now;
                    let t = self.update(store, cx, &before, t)?;
                    self.note_pending(&t, cx.fx);
                    Ok(Enqueued { task_id, duplicate: true })
                }
            });
        }
        let created = self.enqueue(store, cx, n, seq)?;
        if let Ok(Enqueued { task_id, duplicate: false }) = created {
            // A record whose task no longer holds the key is gone already (`release_key`); one left by an older
            // state (its task removed or elsewhere) is replaced.
            if let Some(old) = &rec {
                self.idx.remove_key(&n.tenant, &rkey, old);
            }
            let rec = KeyRecord { task_id, expires_at: TimeMs::MAX };
            store.put_key(&n.tenant, &rkey, &rec)?;
            self.idx.add_key(&n.tenant, &rkey, &rec);
        }
        Ok(created)
    }

    /// Removes the debounce or singleton record naming `after` once the task no longer holds its key. Called by
    /// `update` for every changed task.
    pub(super) fn release_key<S: TaskStore>(&mut self, store: &mut S, after: &Task) -> Result<(), S::Error> {
        if self.idx.key_holders.is_empty() {
            return Ok(());
        }
        let Some((tenant, key)) = self.idx.key_holders.get(&after.id) else {
            return Ok(());
        };
        if KeyMode::holds(key, after) {
            return Ok(());
        }
        let (tenant, key) = (tenant.clone(), key.clone());
        let rec = KeyRecord { task_id: after.id, expires_at: TimeMs::MAX };
        store.remove_key(&tenant, &key)?;
        self.idx.remove_key(&tenant, &key, &rec);
        Ok(())
    }
}

/// The task the key's record `rec` names, if it still holds the key (and is of the tenant and queue the key is
/// scoped to).
fn key_holder<S: TaskStore>(
    store: &mut S,
    tenant: &str,
    queue: &str,
    rkey: &str,
    rec: Option<&KeyRecord>,
) -> Result<Option<std::sync::Arc<Task>>, S::Error> {
    let Some(rec) = rec else {
        return Ok(None);
    };
    Ok(store.get(&rec.task_id)?.filter(|t| t.tenant == tenant && t.queue == queue && KeyMode::holds(rkey, t)))
}
