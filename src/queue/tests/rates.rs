//! Rate limits (`queue::rate`): the leader's picks with a token budget, the charges `RatedClaim` records, and
//! the buckets being identical on every shard and every replica whatever the shard count.

use proptest::prelude::*;

use super::*;
use crate::queue::{RateBudget, RateCounts};

/// Enqueues `n` ready tasks of a fairness key ("" for none) in `queue`.
fn add_keyed(h: &mut Harness, queue: &str, key: &str, n: usize) {
    let specs: Vec<NewTask> = (0..n)
        .map(|_| {
            let mut spec = h.spec(A, queue);
            if !key.is_empty() {
                spec.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(A, key), h.next_id);
                spec.concurrency = Some(ConcurrencyKey { key: key.into(), limit: 1_000_000 });
            }
            spec
        })
        .collect();
    assert!(h.enqueue_all(specs).iter().all(|r| r.is_ok()));
}

fn set_rate(h: &mut Harness, key: Option<&str>, per_s: f64, burst: u32) -> Option<RateBucket> {
    let limit = RateLimit { milli_per_s: (per_s * 1000.0) as u64, burst };
    let cmd = Command::SetRateLimit { tenant: A.into(), queue: Q.into(), key: key.map(str::to_string), limit };
    let Response::RateLimit(b) = h.apply(cmd) else { panic!("not a rate limit answer") };
    b
}

fn bucket(h: &Harness, key: Option<&str>) -> Option<RateBucket> {
    h.m.shards[0].rates(&QueueKey::new(A, Q)).and_then(|r| r.get(key)).copied()
}

/// One dispatch pass at the harness's time, as the leader runs it: pick with a budget, then claim the picks in
/// one `RatedClaim` carrying the budget's charges (a `Claim` when nothing was charged). Returns the fairness key
/// of each task claimed; every claimed task is completed at once (no concurrency limit gets in the way).
fn pass(h: &mut Harness, clock: &mut FairClock, count: usize) -> Vec<String> {
    let none = RateCounts::default();
    let budget = RateBudget::new(h.time, true, &none);
    let picked = pick_ready(&h.m.shards, clock, A, &queues(&[Q]), count, &Promised::default(), Some(&budget));
    let ids: Vec<TaskId> = picked.into_iter().map(|p| p.id).collect();
    let (taken, _, _) = budget.finish();
    let items: Vec<ClaimItem> = ids
        .iter()
        .map(|id| ClaimItem { task_id: *id, tenant: A.into(), worker_id: "w1".into(), lease_ms: 60_000 })
        .collect();
    let command =
        if taken.is_empty() { Command::Claim(items) } else { Command::RatedClaim { items, charges: taken.charges() } };
    let Response::Claimed(got) = h.apply(command) else { panic!("not a claim") };
    let mut keys = Vec::new();
    for t in got {
        let t = t.expect("a picked task is claimable");
        keys.push(fairness_key(t.concurrency.as_ref()).to_string());
        h.ack(t.id, A, token(&t), complete()).expect("completed");
    }
    keys
}

#[test]
fn a_key_out_of_tokens_is_passed_over_and_the_others_are_served_at_full_speed() {
    let mut h = Harness::new();
    add_keyed(&mut h, Q, "slow", 200);
    add_keyed(&mut h, Q, "fast", 200);
    let b = set_rate(&mut h, Some("slow"), 20.0, 5).expect("a bucket");
    assert_eq!(b.tokens(h.time), 5, "a new bucket starts full");
    let mut clock = FairClock::default();
    let start = h.time;
    let mut slow = 0u64;
    let mut fast = 0u64;
    // A pass every 10 ms for 2 s, each wanting 10 tasks.
    for step in 0..200u64 {
        h.tick_at(start + step * 10);
        let keys = pass(&mut h, &mut clock, 10);
        slow += keys.iter().filter(|k| *k == "slow").count() as u64;
        fast += keys.iter().filter(|k| *k == "fast").count() as u64;
        let elapsed = h.time - start;
        assert!(slow <= 5 + 20 * elapsed / 1_000, "{slow} slow claims after {elapsed} ms");
        assert_eq!(keys.len(), 10.min(keys.len() + (200 - fast as usize)), "the fast key fills every pass");
    }
    // 1990 ms: burst 5 + 39 refills (one per 50 ms).
    assert_eq!(slow, 5 + 39, "the slow key gets every token, no more");
    assert_eq!(fast, 200, "the fast key is never held back");
    let remaining = bucket(&h, Some("slow")).expect("bucket");
    assert!(remaining.tokens(h.time) == 0, "{remaining:?}");
}

#[test]
fn the_whole_queue_bucket_holds_every_key_together() {
    let mut h = Harness::new();
    add_keyed(&mut h, Q, "a", 100);
    add_keyed(&mut h, Q, "b", 100);
    add_keyed(&mut h, Q, "", 100);
    set_rate(&mut h, None, 10.0, 10);
    let mut clock = FairClock::default();
    let start = h.time;
    let mut served = Vec::new();
    for step in 0..100u64 {
        h.tick_at(start + step * 10);
        served.extend(pass(&mut h, &mut clock, 50));
    }
    // 990 ms: 10 at once, then one per 100 ms.
    assert_eq!(served.len(), 10 + 9);
    for key in ["a", "b", ""] {
        let n = served.iter().filter(|k| *k == key).count();
        assert!((5..=7).contains(&n), "keys still share the queue's tokens fairly: {key} got {n} of {served:?}");
    }
}

#[test]
fn rate_zero_removes_the_bucket_and_a_change_keeps_the_level() {
    let mut h = Harness::new();
    add_keyed(&mut h, Q, "k", 20);
    set_rate(&mut h, Some("k"), 1.0, 4);
    let mut clock = FairClock::default();
    assert_eq!(pass(&mut h, &mut clock, 10).len(), 4);
    assert_eq!(pass(&mut h, &mut clock, 10).len(), 0, "out of tokens: passed over, not failed");
    assert_eq!(machine_counts(&h.m)[&QueueKey::new(A, Q)].pending, 16, "nothing failed");
    // A new configuration keeps the level (empty), so raising the burst gives nothing at once.
    let b = set_rate(&mut h, Some("k"), 1.0, 10).expect("still limited");
    assert_eq!(b.tokens(h.time), 0);
    h.advance(2_000);
    assert_eq!(pass(&mut h, &mut clock, 10).len(), 2, "1/s for 2 s");
    assert_eq!(set_rate(&mut h, Some("k"), 0.0, 0), None, "rate 0 removes the limit");
    assert!(h.m.shards.iter().all(|s| s.rates(&QueueKey::new(A, Q)).is_none()));
    assert!(h.m.stores.iter().all(|s| s.rates.is_empty()), "and its records");
    assert_eq!(pass(&mut h, &mut clock, 100).len(), 14);
}

#[test]
fn apply_records_a_charge_past_the_level_and_the_debt_is_paid_back() {
    let mut h = Harness::new();
    add_keyed(&mut h, Q, "k", 10);
    set_rate(&mut h, Some("k"), 1.0, 1);
    let ids = h.m.pick(A, &queues(&[Q]), 3);
    let items: Vec<ClaimItem> = ids
        .iter()
        .map(|id| ClaimItem { task_id: *id, tenant: A.into(), worker_id: "w1".into(), lease_ms: 60_000 })
        .collect();
    let charges = vec![RateCharge { tenant: A.into(), queue: Q.into(), key: Some("k".into()), tokens: 3 }];
    let Response::Claimed(got) = h.apply(Command::RatedClaim { items, charges }) else { panic!("not a claim") };
    assert!(got.iter().all(|r| r.is_ok()), "the leader decided: apply claims them all");
    let b = bucket(&h, Some("k")).expect("bucket");
    assert_eq!(b.level(h.time), -2 * crate::queue::rate::TOKEN, "two tokens owed");
    assert_eq!(b.time_of(h.time, 1), Some(h.time + 3_000));
}

/// One step of a random history for the replica test.
#[derive(Debug, Clone)]
enum Step {
    Enqueue { key: u8, n: u8 },
    Limit { key: Option<u8>, milli: u32, burst: u8 },
    Pass { count: u8 },
    Advance { ms: u16 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..3, 1u8..20).prop_map(|(key, n)| Step::Enqueue { key, n }),
        (proptest::option::of(0u8..3), 0u32..30_000, 0u8..8).prop_map(|(key, milli, burst)| Step::Limit {
            key,
            milli,
            burst
        }),
        (1u8..20).prop_map(|count| Step::Pass { count }),
        (0u16..2_000).prop_map(|ms| Step::Advance { ms }),
    ]
}

/// The buckets of every shard of a machine, which must all be the same.
fn buckets(m: &MemMachine) -> Vec<(QueueKey, Option<String>, RateBucket)> {
    let one = |s: &ShardCore| {
        let mut v: Vec<(QueueKey, Option<String>, RateBucket)> = s
            .all_rates()
            .iter()
            .flat_map(|(qk, r)| {
                let q = r.queue.iter().map(|b| (qk.clone(), None, *b));
                q.chain(r.keys.iter().map(|(k, b)| (qk.clone(), Some(k.clone()), *b))).collect::<Vec<_>>()
            })
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        v
    };
    let first = one(&m.shards[0]);
    for s in &m.shards {
        assert_eq!(one(s), first, "shard {} holds other buckets", s.shard_no);
    }
    first
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the history, the entries the leader proposes leave the same buckets on every shard of replicas
    /// with 1, 2 and 4 shards, and a rebuild from the records (a restart) finds them again. And no key is ever
    /// served more than its burst plus its rate times the time elapsed since its limit was set.
    #[test]
    fn buckets_are_the_same_on_every_shard_and_replica_and_hold_the_rate(steps in proptest::collection::vec(step(), 1..60)) {
        let mut leader = Harness::new();
        let mut clock = FairClock::default();
        let keys = ["k0", "k1", ""];
        for s in steps {
            match s {
                Step::Enqueue { key, n } => add_keyed(&mut leader, Q, keys[key as usize], n as usize),
                Step::Limit { key, milli, burst } => {
                    let limit = RateLimit { milli_per_s: u64::from(milli), burst: u32::from(burst) };
                    let key = key.map(|k| keys[k as usize].to_string());
                    leader.apply(Command::SetRateLimit { tenant: A.into(), queue: Q.into(), key, limit });
                }
                Step::Pass { count } => {
                    pass(&mut leader, &mut clock, count as usize);
                }
                Step::Advance { ms } => leader.advance(u64::from(ms)),
            }
            // The tokens never go negative: the leader only takes what the bucket holds at its own time.
            for (_, _, b) in buckets(&leader.m) {
                prop_assert!(b.level(leader.time) >= 0, "{b:?}");
            }
        }
        let want = buckets(&leader.m);
        prop_assert_eq!(buckets(&leader.m.rebuilt()), want.clone(), "a restart finds the same buckets");
        for shards in [1, 2] {
            let mut m = MemMachine::new(shards);
            for req in &leader.log {
                m.apply(req);
            }
            prop_assert_eq!(buckets(&m), want.clone(), "a replica of {} shards", shards);
        }
    }
}

#[test]
fn replicas_with_other_shard_counts_apply_the_same_log_to_the_same_buckets() {
    let mut h = Harness::new();
    add_keyed(&mut h, Q, "a", 30);
    add_keyed(&mut h, Q, "", 30);
    set_rate(&mut h, Some("a"), 3.5, 2);
    set_rate(&mut h, None, 7.0, 4);
    let mut clock = FairClock::default();
    for step in 0..40u64 {
        h.tick_at(T0 + step * 137);
        pass(&mut h, &mut clock, 5);
    }
    // The same log applied by replicas of 1, 2 and 3 shards.
    let want = buckets(&h.m);
    assert!(!want.is_empty());
    for shards in [1, 2, 3] {
        let mut m = MemMachine::new(shards);
        for req in h.log.iter() {
            m.apply(req);
        }
        assert_eq!(buckets(&m), want, "{shards} shards");
        assert_eq!(buckets(&m.rebuilt()), want, "{shards} shards, rebuilt");
    }
}

#[test]
fn a_queue_without_fairness_keys_is_held_to_its_buckets_too() {
    // Only unkeyed tasks: the pick's plain merge for such a queue must not bypass the buckets.
    for key in [None, Some("")] {
        let mut h = Harness::new();
        add_keyed(&mut h, Q, "", 20);
        set_rate(&mut h, key, 10.0, 3);
        let mut clock = FairClock::default();
        assert_eq!(pass(&mut h, &mut clock, 10).len(), 3, "{key:?}: the burst");
        assert_eq!(pass(&mut h, &mut clock, 10).len(), 0, "{key:?}: out of tokens");
        h.advance(300);
        assert_eq!(pass(&mut h, &mut clock, 10).len(), 3, "{key:?}: 10/s for 300 ms");
    }
}
