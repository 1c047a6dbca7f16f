//! `SetLimits`: applied by every shard, each keeping its own copy (a record and the index), as paused queues are.
//! The limits are the leader's to enforce (see `Limits`): apply only stores them.

use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_set_limits<S: TaskStore>(
        &mut self,
        store: &mut S,
        qk: QueueKey,
        limits: Limits,
    ) -> Result<(), S::Error> {
        if limits.is_empty() {
            store.remove_limits(&qk)?;
            self.idx.limits.remove(&qk);
        } else {
            store.put_limits(&qk, &limits)?;
            self.idx.limits.insert(qk, limits);
        }
        Ok(())
    }
}
