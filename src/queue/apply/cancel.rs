//! `Cancel`: ends a task that has not ended (pending, held, running or dead-lettered) as cancelled. A running
//! task's run is closed, so its token stops being accepted.

use super::context::ApplyContext;
use super::lifecycle::{close_run, note_ended};
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_cancel<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        tenant: &str,
        id: &TaskId,
        slot: &mut Option<ItemResult<TaskState>>,
    ) -> Result<(), S::Error> {
        if self.mine(id) {
            *slot = Some(self.cancel(store, cx, tenant, id)?);
        }
        Ok(())
    }

    fn cancel<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        tenant: &str,
        id: &TaskId,
    ) -> Result<ItemResult<TaskState>, S::Error> {
        let now = cx.now;
        let Some(before) = store.get(id)? else {
            return Ok(Err(Rejected::NotFound));
        };
        if before.tenant != tenant {
            return Ok(Err(Rejected::NotFound));
        }
        if before.state.is_terminal() {
            return Ok(Err(Rejected::AlreadyEnded));
        }
        let mut t = Task::clone(&before);
        close_run(&mut t, now, RunOutcome::Cancelled, "");
        t.state = TaskState::Cancelled;
        t.lease = None;
        t.dead_at = None;
        t.ended_at = Some(now);
        t.updated_at = now;
        let t = self.update(store, cx, &before, t)?;
        cx.fx.counts.cancelled += 1;
        note_ended(&t, now, cx.fx);
        Ok(Ok(TaskState::Cancelled))
    }
}
