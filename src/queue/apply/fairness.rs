//! `SetFairnessWeight`: applied by every shard, each keeping its own copy of the weights (records and the index),
//! as paused queues are. Weights only steer the leader's choice among ready tasks (`queue::fair`); no claim's
//! re-check reads them, so a weight changes no task.

use crate::queue::fair::{DEFAULT_WEIGHT, MAX_WEIGHT};
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_set_fairness_weight<S: TaskStore>(
        &mut self,
        store: &mut S,
        qk: QueueKey,
        key: &str,
        weight: u32,
        out: &mut u32,
    ) -> Result<(), S::Error> {
        // The proposer validated the range; clamping keeps a bad entry harmless and every replica alike.
        let weight = weight.clamp(DEFAULT_WEIGHT, MAX_WEIGHT);
        if weight == DEFAULT_WEIGHT {
            store.remove_weight(&qk, key)?;
        } else {
            store.put_weight(&qk, key, weight)?;
        }
        self.idx.set_weight(qk, key, weight);
        *out = weight;
        Ok(())
    }
}
