//! `SetQueuePaused`: applied by every shard, each keeping its own copy of the flag (a record and the index), so
//! a claim's re-check reads only its own shard. A paused queue serves no claims; nothing else changes.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_set_queue_paused<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        qk: QueueKey,
        paused: bool,
    ) -> Result<(), S::Error> {
        if paused {
            store.put_paused(&qk)?;
            self.idx.paused.insert(qk);
        } else {
            store.remove_paused(&qk)?;
            self.idx.paused.remove(&qk);
            // Resumed: its ready tasks are claimable again.
            if self.idx.by_key.contains_key(&qk) {
                cx.fx.ready.insert(qk);
            }
        }
        Ok(())
    }
}
