//! `Redrive` and `PurgeDeadLetters`: a queue's dead letters (all, or the listed ids of this shard) go back to
//! pending with fresh attempts, or are removed.

use std::collections::HashSet;

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_redrive<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        qk: &QueueKey,
        select: &DlqSelector,
        done: &mut Vec<TaskId>,
    ) -> Result<(), S::Error> {
        let now = cx.now;
        for id in self.select_dead(qk, select) {
            let Some(before) = store.get(&id)? else {
                continue;
            };
            let mut t = Task::clone(&before);
            t.state = TaskState::Pending;
            t.attempts = 0;
            t.dead_at = None;
            t.visible_at = now;
            t.seq = cx.seq_base;
            t.updated_at = now;
            self.update(store, cx, &before, t)?;
            cx.fx.ready.insert(qk.clone());
            done.push(id);
        }
        Ok(())
    }

    pub(super) fn apply_purge<S: TaskStore>(
        &mut self,
        store: &mut S,
        _cx: &mut ApplyContext<'_>,
        qk: &QueueKey,
        select: &DlqSelector,
        done: &mut Vec<TaskId>,
    ) -> Result<(), S::Error> {
        for id in self.select_dead(qk, select) {
            let Some(t) = store.get(&id)? else { continue };
            self.idx.remove_task(&t);
            store.remove(&id)?;
            done.push(id);
        }
        Ok(())
    }

    /// The dead letters of a queue in this shard that `select` takes, oldest first.
    fn select_dead(&self, qk: &QueueKey, select: &DlqSelector) -> Vec<TaskId> {
        let Some(set) = self.idx.dead.get(qk) else {
            return vec![];
        };
        match select {
            DlqSelector::All => set.iter().map(|k| k.1).collect(),
            DlqSelector::Ids(ids) => {
                let wanted: HashSet<&TaskId> = ids.iter().filter(|id| self.mine(id)).collect();
                set.iter().filter(|k| wanted.contains(&k.1)).map(|k| k.1).collect()
            }
        }
    }
}
