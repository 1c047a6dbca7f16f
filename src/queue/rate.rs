//! Rate limits: token buckets per (tenant, queue) and per (tenant, queue, fairness key), their arithmetic, and
//! the leader's budget of tokens while it picks claims.
//!
//! A bucket (`RateBucket`) is replicated state: `SetRateLimit` configures it and `RatedClaim` charges it, both
//! applied by every shard to its own copy, so every shard of every replica holds the same buckets whatever the
//! shard count. The level is computed, never stored per millisecond: `micros` millionths of a token at time
//! `at`, refilled at `milli_per_s` thousandths of a token per second, i.e. exactly `milli_per_s` millionths per
//! millisecond, so the arithmetic is integer and exact (no rounding drifts between replicas or over time).
//!
//! The leader decides (`RateBudget`): a key (or a queue) whose bucket, less the tokens promised to claims in
//! flight and taken by this pass, holds less than one whole token is passed over, uncharged, as a key at its
//! concurrency limit is. Apply records the charges the leader decided and never refuses a claim for lack of
//! tokens: a charge past the level leaves the bucket in debt, which the refill pays back before the next token.
//! Pure: no clock; the leader passes its own time.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use super::types::*;

/// Millionths of a token in one token.
pub const TOKEN: i64 = 1_000_000;
/// The highest rate: a million tasks per second (in thousandths).
pub const MAX_MILLI_PER_S: u64 = 1_000_000_000;
/// The largest burst: a million tokens (keeps every level well inside `i64` micros).
pub const MAX_BURST: u32 = 1_000_000;

impl RateLimit {
    /// A limit from a rate in thousandths of a task per second and an optional burst (default: the rate's whole
    /// tasks per second, at least 1), clamped into range; `milli_per_s == 0` is no limit.
    pub fn new(milli_per_s: u64, burst: Option<u32>) -> RateLimit {
        let milli_per_s = milli_per_s.min(MAX_MILLI_PER_S);
        let default = u32::try_from(milli_per_s / 1_000).unwrap_or(MAX_BURST).max(1);
        RateLimit { milli_per_s, burst: burst.filter(|b| *b > 0).unwrap_or(default).clamp(1, MAX_BURST) }
    }

    pub fn is_off(&self) -> bool {
        self.milli_per_s == 0
    }

    fn cap(&self) -> i64 {
        i64::from(self.burst.clamp(1, MAX_BURST)) * TOKEN
    }
}

impl RateBucket {
    /// A new bucket, full at `now`.
    pub fn full(limit: RateLimit, now: TimeMs) -> RateBucket {
        RateBucket { limit, micros: limit.cap(), at: now }
    }

    /// The level at `now` in millionths of a token: refilled since `at`, never above the burst. A `now` before
    /// `at` (a leader with a slower clock) reads the level at `at`.
    pub fn level(&self, now: TimeMs) -> i64 {
        let cap = self.limit.cap();
        if self.micros >= cap {
            return self.micros.min(cap);
        }
        let gained = i128::from(self.limit.milli_per_s) * i128::from(now.saturating_sub(self.at));
        (i128::from(self.micros) + gained).min(i128::from(cap)) as i64
    }

    /// Whole tokens at `now` (0 in debt).
    pub fn tokens(&self, now: TimeMs) -> u64 {
        (self.level(now).max(0) / TOKEN) as u64
    }

    /// Takes `tokens` at `now` (apply: the leader decided them). The level may go below zero.
    pub fn charge(&mut self, now: TimeMs, tokens: u32) {
        let now = now.max(self.at);
        self.micros = self.level(now).saturating_sub(i64::from(tokens).saturating_mul(TOKEN));
        self.at = now;
    }

    /// The bucket under a new configuration at `now`: its level kept, capped at the new burst.
    pub fn reconfigured(&self, limit: RateLimit, now: TimeMs) -> RateBucket {
        let now = now.max(self.at);
        RateBucket { limit, micros: self.level(now).min(limit.cap()), at: now }
    }

    /// When the level first reaches `needed` whole tokens (now, if it has them). `None` if the burst is smaller
    /// than `needed`, or the rate is 0.
    pub fn time_of(&self, now: TimeMs, needed: u64) -> Option<TimeMs> {
        let want = i64::try_from(needed).ok()?.checked_mul(TOKEN)?;
        if want > self.limit.cap() || self.limit.milli_per_s == 0 {
            return None;
        }
        let from = now.max(self.at);
        let level = self.level(from);
        if level >= want {
            return Some(from);
        }
        let missing = (want - level) as u64;
        Some(from + missing.div_ceil(self.limit.milli_per_s))
    }
}

/// The buckets of one queue (every shard holds them all): the whole queue's and its keys'.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRates {
    pub queue: Option<RateBucket>,
    pub keys: HashMap<String, RateBucket>,
}

impl QueueRates {
    pub fn get(&self, key: Option<&str>) -> Option<&RateBucket> {
        match key {
            None => self.queue.as_ref(),
            Some(k) => self.keys.get(k),
        }
    }

    pub fn get_mut(&mut self, key: Option<&str>) -> Option<&mut RateBucket> {
        match key {
            None => self.queue.as_mut(),
            Some(k) => self.keys.get_mut(k),
        }
    }

    pub fn set(&mut self, key: Option<&str>, bucket: Option<RateBucket>) {
        match (key, bucket) {
            (None, b) => self.queue = b,
            (Some(k), Some(b)) => {
                self.keys.insert(k.to_string(), b);
            }
            (Some(k), None) => {
                self.keys.remove(k);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_none() && self.keys.is_empty()
    }
}

/// Tokens per bucket, for the leader's promises (claims in flight) and a pass's takings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateCounts {
    queues: HashMap<QueueKey, ScopeCounts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ScopeCounts {
    queue: u64,
    keys: HashMap<String, u64>,
}

impl RateCounts {
    pub fn get(&self, qk: &QueueKey, key: Option<&str>) -> u64 {
        let Some(s) = self.queues.get(qk) else { return 0 };
        match key {
            None => s.queue,
            Some(k) => s.keys.get(k).copied().unwrap_or(0),
        }
    }

    pub fn add(&mut self, qk: &QueueKey, key: Option<&str>, n: u64) {
        let s = self.queues.entry(qk.clone()).or_default();
        match key {
            None => s.queue += n,
            Some(k) => *s.keys.entry(k.to_string()).or_default() += n,
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &RateCounts) {
        for (qk, s) in &other.queues {
            let mine = self.queues.entry(qk.clone()).or_default();
            mine.queue += s.queue;
            for (k, n) in &s.keys {
                *mine.keys.entry(k.clone()).or_default() += n;
            }
        }
    }

    /// Takes away every count of `other` (a settled promise), dropping what reaches zero.
    pub fn release(&mut self, other: &RateCounts) {
        for (qk, s) in &other.queues {
            if let Some(mine) = self.queues.get_mut(qk) {
                mine.queue = mine.queue.saturating_sub(s.queue);
                for (k, n) in &s.keys {
                    if let Some(v) = mine.keys.get_mut(k) {
                        *v = v.saturating_sub(*n);
                        if *v == 0 {
                            mine.keys.remove(k);
                        }
                    }
                }
                if mine.queue == 0 && mine.keys.is_empty() {
                    self.queues.remove(qk);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// The charges of a `RatedClaim`, in a stable order.
    pub fn charges(&self) -> Vec<RateCharge> {
        let mut out = Vec::new();
        for (qk, s) in &self.queues {
            let charge = |key: Option<String>, n: u64| RateCharge {
                tenant: qk.tenant.clone(),
                queue: qk.queue.clone(),
                key,
                tokens: u32::try_from(n).unwrap_or(u32::MAX),
            };
            if s.queue > 0 {
                out.push(charge(None, s.queue));
            }
            out.extend(s.keys.iter().filter(|(_, n)| **n > 0).map(|(k, n)| charge(Some(k.clone()), *n)));
        }
        out.sort_by(|a, b| (&a.tenant, &a.queue, &a.key).cmp(&(&b.tenant, &b.queue, &b.key)));
        out
    }
}

/// The leader's tokens during one dispatch pass: the buckets as applied, less what claims in flight were
/// promised and what this pass took. Interior mutability for what the pick notes while it only reads.
#[derive(Debug)]
pub struct RateBudget<'a> {
    /// The leader's time for the decision (the claim entry is stamped no earlier).
    pub now: TimeMs,
    /// The leader has applied an entry of its term: earlier leaders' charges are all in the buckets. Until
    /// then a rate-limited key or queue gets nothing.
    pub caught_up: bool,
    promised: &'a RateCounts,
    taken: RefCell<RateCounts>,
    /// Buckets passed over for lack of tokens in this pass (queue, key).
    throttled: RefCell<HashSet<(QueueKey, Option<String>)>>,
    /// The earliest time a passed-over bucket has its next token: when to look again.
    wake_at: Cell<Option<TimeMs>>,
}

impl<'a> RateBudget<'a> {
    pub fn new(now: TimeMs, caught_up: bool, promised: &'a RateCounts) -> Self {
        RateBudget {
            now,
            caught_up,
            promised,
            taken: RefCell::default(),
            throttled: RefCell::default(),
            wake_at: Cell::new(None),
        }
    }

    /// Whether the bucket `key` of `qk` (if it has one) can give one more token; notes a bucket passed over.
    pub fn allows(&self, rates: Option<&QueueRates>, qk: &QueueKey, key: Option<&str>) -> bool {
        let Some(b) = rates.and_then(|r| r.get(key)) else { return true };
        let owed = self.promised.get(qk, key) + self.taken.borrow().get(qk, key);
        if self.caught_up && b.tokens(self.now) > owed {
            return true;
        }
        if self.caught_up {
            if let Some(t) = b.time_of(self.now, owed + 1) {
                let t = t.max(self.now + 1);
                self.wake_at.set(Some(self.wake_at.get().map_or(t, |w| w.min(t))));
            }
        }
        self.throttled.borrow_mut().insert((qk.clone(), key.map(str::to_string)));
        false
    }

    /// Takes one token of each limited bucket of the task's queue and key.
    pub fn take(&self, rates: Option<&QueueRates>, qk: &QueueKey, key: &str) {
        let Some(r) = rates else { return };
        let mut taken = self.taken.borrow_mut();
        if r.queue.is_some() {
            taken.add(qk, None, 1);
        }
        if r.keys.contains_key(key) {
            taken.add(qk, Some(key), 1);
        }
    }

    /// Ends the pass: what it took (the charges of its claim entry, and the promises to hold until that is
    /// answered), how many buckets it passed over, and when the first of those has its next token.
    pub fn finish(&self) -> (RateCounts, usize, Option<TimeMs>) {
        (self.taken.take(), self.throttled.take().len(), self.wake_at.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_s: u64, burst: u32) -> RateLimit {
        RateLimit::new(per_s * 1_000, Some(burst))
    }

    #[test]
    fn a_full_bucket_gives_its_burst_then_refills_at_the_rate() {
        let mut b = RateBucket::full(limit(20, 5), 1_000);
        assert_eq!(b.tokens(1_000), 5);
        b.charge(1_000, 5);
        assert_eq!(b.tokens(1_000), 0);
        assert_eq!(b.tokens(1_049), 0, "20/s is a token per 50 ms");
        assert_eq!(b.tokens(1_050), 1);
        assert_eq!(b.tokens(1_250), 5);
        assert_eq!(b.tokens(100_000), 5, "never above the burst");
        assert_eq!(b.time_of(1_000, 1), Some(1_050));
        assert_eq!(b.time_of(1_000, 3), Some(1_150));
        assert_eq!(b.time_of(1_000, 6), None, "more than the burst never comes");
    }

    #[test]
    fn fractional_rates_are_exact_and_debt_is_paid_back() {
        // 0.5 per second: a token every 2 s.
        let mut b = RateBucket::full(RateLimit::new(500, None), 0);
        assert_eq!(b.limit.burst, 1, "the default burst is at least 1");
        b.charge(0, 1);
        assert_eq!(b.tokens(1_999), 0);
        assert_eq!(b.tokens(2_000), 1);
        // A charge past the level (decided with an earlier clock) leaves a debt.
        b.charge(2_000, 2);
        assert_eq!(b.level(2_000), -TOKEN);
        assert_eq!(b.time_of(2_000, 1), Some(6_000));
        // The level is the same however the time is cut into charges of zero.
        let mut c = b;
        for t in (2_000..6_000).step_by(7) {
            c.charge(t, 0);
        }
        assert_eq!(c.level(6_000), b.level(6_000));
    }

    #[test]
    fn defaults_and_bounds() {
        assert_eq!(RateLimit::new(20_000, None).burst, 20);
        assert_eq!(RateLimit::new(2_500, None).burst, 2);
        assert_eq!(
            RateLimit::new(u64::MAX, Some(u32::MAX)),
            RateLimit { milli_per_s: MAX_MILLI_PER_S, burst: MAX_BURST }
        );
        let b = RateBucket::full(RateLimit::new(MAX_MILLI_PER_S, Some(MAX_BURST)), 0);
        assert_eq!(b.tokens(u64::MAX), u64::from(MAX_BURST), "no overflow over any span");
    }

    #[test]
    fn a_new_configuration_keeps_the_level_capped_at_the_new_burst() {
        let mut b = RateBucket::full(limit(10, 10), 0);
        b.charge(0, 4);
        let r = b.reconfigured(limit(1, 3), 0);
        assert_eq!(r.tokens(0), 3);
        let r = b.reconfigured(limit(1, 100), 0);
        assert_eq!(r.tokens(0), 6, "a larger burst does not fill the bucket");
    }

    #[test]
    fn the_budget_counts_promises_and_takings_and_says_when_to_look_again() {
        let qk = QueueKey::new("t", "q");
        let mut rates = QueueRates::default();
        rates.set(Some("k"), Some(RateBucket::full(limit(10, 3), 0)));
        let mut promised = RateCounts::default();
        promised.add(&qk, Some("k"), 1);
        let budget = RateBudget::new(0, true, &promised);
        assert!(budget.allows(Some(&rates), &qk, None), "no queue bucket: no limit");
        assert!(budget.allows(Some(&rates), &qk, Some("other")), "an unlimited key");
        for _ in 0..2 {
            assert!(budget.allows(Some(&rates), &qk, Some("k")));
            budget.take(Some(&rates), &qk, "k");
        }
        assert!(!budget.allows(Some(&rates), &qk, Some("k")), "3 tokens: 1 promised, 2 taken");
        let (taken, throttled, wake) = budget.finish();
        assert_eq!(
            taken.charges(),
            vec![RateCharge { tenant: "t".into(), queue: "q".into(), key: Some("k".into()), tokens: 2 }]
        );
        assert_eq!(throttled, 1);
        assert_eq!(wake, None, "4 tokens never fit a burst of 3: the promise's answer wakes the dispatcher");
        let budget = RateBudget::new(0, false, &promised);
        assert!(!budget.allows(Some(&rates), &qk, Some("k")), "not caught up: nothing");
    }
}
