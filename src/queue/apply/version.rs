//! `SetClusterVersion`: applied by every shard, each keeping its own copy (a record and `cluster_version`), as
//! paused queues are. The version only rises: an entry naming a lower or equal version changes nothing. Whether
//! this binary can apply the version at all is checked before any shard sees the entry (`storage::apply`).

use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;

impl ShardCore {
    pub(super) fn apply_set_cluster_version<S: TaskStore>(
        &mut self,
        store: &mut S,
        version: u32,
        now: &mut u32,
    ) -> Result<(), S::Error> {
        if version > self.cluster_version {
            store.put_cluster_version(version)?;
            self.cluster_version = version;
        }
        *now = self.cluster_version;
        Ok(())
    }
}
