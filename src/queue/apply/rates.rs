//! `SetRateLimit` and the charges of a `RatedClaim`: applied by every shard to its own copy of the buckets
//! (a record each and the index), so every shard of every replica holds the same buckets whatever the shard
//! count. A charge is recorded as the leader decided it, whatever the level (`queue::rate`): apply never refuses
//! a claim for lack of tokens, as it never re-checks a running cap.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    pub(super) fn apply_set_rate_limit<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        qk: QueueKey,
        key: Option<&str>,
        limit: RateLimit,
        out: &mut Option<RateBucket>,
    ) -> Result<(), S::Error> {
        let now = cx.now;
        let before = self.idx.rates.get(&qk).and_then(|r| r.get(key)).copied();
        // The proposer validated the limit; normalizing keeps a bad entry harmless and every replica alike.
        let after = (!limit.is_off()).then(|| {
            let limit = RateLimit::new(limit.milli_per_s, Some(limit.burst));
            before.map_or_else(|| RateBucket::full(limit, now), |b| b.reconfigured(limit, now))
        });
        match &after {
            Some(b) => store.put_rate(&qk, key, b)?,
            None => store.remove_rate(&qk, key)?,
        }
        let rates = self.idx.rates.entry(qk.clone()).or_default();
        rates.set(key, after);
        if rates.is_empty() {
            self.idx.rates.remove(&qk);
        }
        if before.is_some() && after.is_none_or(|a| a.limit.milli_per_s > before.map_or(0, |b| b.limit.milli_per_s)) {
            // Removed or raised: tasks passed over may be claimable now.
            cx.fx.ready.insert(qk);
        }
        *out = after;
        Ok(())
    }

    pub(super) fn apply_rate_charges<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        charges: &[RateCharge],
    ) -> Result<(), S::Error> {
        let now = cx.now;
        for c in charges {
            let qk = QueueKey::new(&c.tenant, &c.queue);
            // A bucket removed since the leader decided takes nothing.
            let Some(b) = self.idx.rates.get_mut(&qk).and_then(|r| r.get_mut(c.key.as_deref())) else { continue };
            b.charge(now, c.tokens);
            store.put_rate(&qk, c.key.as_deref(), b)?;
        }
        Ok(())
    }
}
