//! `Claim`: the leader chose which task goes to which worker (`queries.rs`); apply re-checks that each task is
//! still claimable, leases it with a fencing token derived from the entry, and opens a run.

use std::sync::Arc;

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_claim<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        items: &[ClaimItem],
        slots: &mut [Option<ItemResult<Arc<Task>>>],
    ) -> Result<(), S::Error> {
        for (pos, (item, slot)) in items.iter().zip(slots.iter_mut()).enumerate() {
            if self.mine(&item.task_id) {
                let token = cx.seq_base + pos as u64;
                *slot = Some(self.claim(store, cx, item, token)?);
            }
        }
        Ok(())
    }

    fn claim<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        item: &ClaimItem,
        token: LeaseToken,
    ) -> Result<ItemResult<Arc<Task>>, S::Error> {
        let now = cx.now;
        let Some(mut before) = store.get(&item.task_id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if *before.tenant != *item.tenant {
            return Ok(Err(Rejected::NotFound));
        }
        // The key's limit now: an operator's override in force, else the task's own.
        let key_full = before.concurrency.as_ref().is_some_and(|ck| {
            self.running_with_key(&before.tenant, &ck.key) >= self.key_limit(&before.tenant, ck, now)
        });
        if before.state != TaskState::Pending
            || !before.waiting_on.is_empty()
            || before.visible_at > now
            || before.attempts >= before.max_attempts
            || self.is_paused(&*before)
            || key_full
        {
            return Ok(Err(Rejected::NotClaimable));
        }
        let was = self.take_for_change(store, &before)?;
        let t = Arc::make_mut(&mut before);
        t.state = TaskState::InProgress;
        t.attempts += 1;
        t.updated_at = now;
        t.lease = Some(Lease {
            worker_id: item.worker_id.clone(),
            token,
            claimed_at: now,
            deadline: now.saturating_add(item.lease_ms),
        });
        t.progress = None;
        if t.runs.len() >= MAX_RUNS_KEPT {
            t.runs.remove(0);
        }
        t.runs.push(Run {
            worker_id: item.worker_id.clone(),
            token,
            started_at: now,
            ended_at: None,
            outcome: None,
            reason: String::new(),
        });
        let t = self.put_changed(store, cx, was, before)?;
        cx.fx.counts.claimed += 1;
        if t.attempts == 1 {
            cx.fx.enqueue_to_claim_ms.push(now.saturating_sub(t.created_at));
        }
        Ok(Ok(t))
    }
}
