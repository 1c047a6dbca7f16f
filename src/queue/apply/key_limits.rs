//! `SetKeyLimit` and the expiry of its overrides: applied by every shard to its own copy (a record each and the
//! index), as weights are, so the shard that holds a key's tasks always has the key's override at hand.
//!
//! An override replaces the limit a key's tasks carry while it is in force (`ShardCore::key_limit`); apply's
//! claim check and the leader's pick both read it. An override with an expiry runs out by time alone: the sweep
//! at the start of every entry (`advance`) removes each one whose expiry the shard's time has reached, so every
//! replica removes it at the same entry and no command is needed. Nothing that runs is touched when a limit goes
//! down; when it may have gone up (set higher, removed, run out), the key's queues are reported as having
//! claimable work, which wakes the leader's parked claims.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_set_key_limit<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        tenant: &str,
        key: &str,
        limit: Option<KeyLimit>,
        out: &mut Option<KeyLimit>,
    ) -> Result<(), S::Error> {
        // The proposer validated the limit; normalizing keeps a bad entry harmless and every replica alike. An
        // override already run out when applied is no override.
        let after =
            limit.map(|l| KeyLimit { limit: l.limit.max(1), expires_at: l.expires_at }).filter(|l| l.in_force(cx.now));
        match &after {
            Some(l) => store.put_key_limit(tenant, key, l)?,
            None => store.remove_key_limit(tenant, key)?,
        }
        let before = self.idx.set_key_limit(tenant, key, after);
        if after.is_none_or(|a| before.is_none_or(|b| a.limit > b.limit)) {
            self.note_key_freed(cx, tenant, key);
        }
        *out = after;
        Ok(())
    }

    /// Overrides whose expiry the shard's time reached are removed: the tasks' own limits apply again.
    pub(super) fn expire_key_limits<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
    ) -> Result<(), S::Error> {
        while let Some(first) = self.idx.key_limit_expiries.first() {
            if first.0 > cx.now {
                break;
            }
            let (_, tenant, key) = self.idx.key_limit_expiries.pop_first().expect("checked first");
            store.remove_key_limit(&tenant, &key)?;
            self.idx.set_key_limit(&tenant, &key, None);
            self.note_key_freed(cx, &tenant, &key);
        }
        Ok(())
    }

    /// A key's limit may have gone up: every queue of the tenant with ready tasks of the key has claimable work.
    fn note_key_freed(&self, cx: &mut ApplyContext<'_>, tenant: &str, key: &str) {
        for (qk, keyed) in &self.idx.by_key {
            if qk.tenant == tenant && keyed.keys.contains_key(key) {
                cx.fx.ready.insert(qk.clone());
            }
        }
    }
}
