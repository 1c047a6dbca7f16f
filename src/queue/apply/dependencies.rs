//! `ResolveDependencies`: the leader's resolver read that a dependency ended (or is gone) and proposes it for
//! each task waiting on it. Apply on the waiting task's shard trusts the outcome carried by the entry, ignores a
//! dependency already crossed off (idempotent), and cancels the task or crosses the dependency off.

use super::context::ApplyContext;
use super::lifecycle::note_ended;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_resolve_dependencies<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        items: &[DependencyResolved],
        changed: &mut u64,
    ) -> Result<(), S::Error> {
        for (pos, r) in items.iter().enumerate() {
            let seq = cx.seq_base + pos as u64;
            if self.mine(&r.task_id) && self.resolve(store, cx, r, seq)? {
                *changed += 1;
            }
        }
        Ok(())
    }

    /// One dependency of a held task ended: under all-completed, anything but a completion cancels the task
    /// (it can no longer become ready); otherwise the dependency is crossed off, and with none left the task is
    /// pending like any other (FIFO from this entry). Returns whether the task changed.
    fn resolve<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        r: &DependencyResolved,
        seq: u64,
    ) -> Result<bool, S::Error> {
        let now = cx.now;
        let Some(before) = store.get(&r.task_id)? else { return Ok(false) };
        if before.state != TaskState::Pending || !before.waiting_on.contains(&r.dependency) {
            return Ok(false);
        }
        let mut t = Task::clone(&before);
        t.updated_at = now;
        t.waiting_on.retain(|d| *d != r.dependency);
        let met = r.outcome == Some(TaskState::Completed) || t.dependency_rule == DependencyRule::AllResolved;
        if !met {
            let outcome = r.outcome.map(|s| s.as_str()).unwrap_or("GONE");
            t.state = TaskState::Cancelled;
            t.last_error = Some(format!("dependency {} ended {outcome}", r.dependency));
            t.ended_at = Some(now);
            let t = self.update(store, cx, &before, t)?;
            cx.fx.counts.cancelled += 1;
            note_ended(&t, now, cx.fx);
        } else {
            if t.waiting_on.is_empty() {
                t.seq = seq;
            }
            let t = self.update(store, cx, &before, t)?;
            self.note_pending(&t, cx.fx);
        }
        Ok(true)
    }
}
