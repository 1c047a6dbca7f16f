//! Weighted fair dispatch (`queue::fair`): the leader's picks across the fairness keys of a queue, with a clock
//! kept across picks as the dispatcher keeps it; and the replicated weights.

use super::*;

/// A limit high enough that a key is never held back by it.
const NO_LIMIT: u32 = 1_000_000;

/// Enqueues `n` tasks of a fairness key ("" for no concurrency key) in one entry, in FIFO order.
fn flood(h: &mut Harness, queue: &str, key: &str, limit: u32, n: usize, priority: u8) -> Vec<TaskId> {
    let specs: Vec<NewTask> = (0..n)
        .map(|_| {
            let mut spec = h.spec(A, queue);
            spec.priority = priority;
            if !key.is_empty() {
                spec.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(A, key), h.next_id);
                spec.concurrency = Some(ConcurrencyKey { key: key.into(), limit });
            }
            spec
        })
        .collect();
    let ids = specs.iter().map(|s| s.id).collect();
    assert!(h.enqueue_all(specs).iter().all(|r| r.is_ok()));
    ids
}

fn set_weight(h: &mut Harness, key: &str, weight: u32) {
    let cmd = Command::SetFairnessWeight { tenant: A.into(), queue: Q.into(), key: key.into(), weight };
    assert_eq!(h.apply(cmd), Response::FairnessWeight(weight));
}

/// Picks `batch` tasks with `clock` and claims them, `rounds` times, completing each claim at once (so running
/// tasks never fill a key); returns the fairness key of each task served, in order.
fn serve(h: &mut Harness, clock: &mut FairClock, rounds: usize, batch: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for _ in 0..rounds {
        let ids = h.m.pick_with(clock, A, &queues(&[Q]), batch);
        for t in h.claim_ids(A, &ids, 60_000) {
            let t = t.expect("a picked task is claimable");
            keys.push(fairness_key(t.concurrency.as_ref()).to_string());
            h.ack(t.id, A, token(&t), complete()).expect("completed");
        }
    }
    keys
}

fn count(keys: &[String], key: &str) -> usize {
    keys.iter().filter(|k| *k == key).count()
}

#[test]
fn backlogged_keys_are_served_in_proportion_to_their_weights() {
    let mut h = Harness::new();
    flood(&mut h, Q, "a", NO_LIMIT, 400, 0);
    flood(&mut h, Q, "b", NO_LIMIT, 400, 0);
    set_weight(&mut h, "a", 3);
    let mut clock = FairClock::default();
    // One task per pick, then batches of 8 (one pick serving several tasks), with one clock throughout.
    let mut keys = serve(&mut h, &mut clock, 200, 1);
    keys.extend(serve(&mut h, &mut clock, 25, 8));
    // Every prefix stays within one task of 3:1.
    for n in 1..=keys.len() {
        let a = count(&keys[..n], "a") as f64;
        assert!((a - n as f64 * 0.75).abs() <= 1.0, "{a} of {n} for a");
    }
}

#[test]
fn a_flood_does_not_delay_a_key_that_comes_later() {
    let mut h = Harness::new();
    flood(&mut h, Q, "flood", NO_LIMIT, 2_000, 0);
    let mut clock = FairClock::default();
    let early = serve(&mut h, &mut clock, 10, 10);
    assert_eq!(count(&early, "flood"), 100, "alone, the flood takes everything");
    let late = flood(&mut h, Q, "late", NO_LIMIT, 20, 0);
    // From now on the two alternate: the 20 late tasks are served within the next 40 claims.
    let keys = serve(&mut h, &mut clock, 4, 10);
    assert_eq!(count(&keys, "late"), 20, "{keys:?}");
    assert!(late.iter().all(|id| h.state(*id) == Some(TaskState::Completed)));
}

#[test]
fn an_idle_key_that_joins_gets_no_burst() {
    let mut h = Harness::new();
    flood(&mut h, Q, "a", NO_LIMIT, 300, 0);
    flood(&mut h, Q, "b", NO_LIMIT, 1, 0);
    let mut clock = FairClock::default();
    // "b" is served once, then idles while "a" is served alone for a long time.
    let keys = serve(&mut h, &mut clock, 100, 1);
    assert_eq!(count(&keys, "b"), 1);
    flood(&mut h, Q, "b", NO_LIMIT, 50, 0);
    // Back: it starts at the queue's virtual time, so the two alternate from the first pick (no catch-up).
    let keys = serve(&mut h, &mut clock, 20, 1);
    let b = count(&keys, "b");
    assert!((9..=11).contains(&b), "b got {b} of 20: {keys:?}");
    for pair in keys.chunks(2) {
        assert_ne!(pair[0], pair[1], "alternating: {keys:?}");
    }
}

#[test]
fn a_key_at_its_concurrency_limit_is_skipped_and_banks_no_credit() {
    let mut h = Harness::new();
    let c = flood(&mut h, Q, "c", 1, 10, 0);
    flood(&mut h, Q, "a", NO_LIMIT, 100, 0);
    let mut clock = FairClock::default();
    let held = h.claim_ids(A, &[c[0]], 60_000).remove(0).expect("claimed");
    // "c" is full: only "a" is served, and "c" is lifted along instead of falling behind.
    let keys = serve(&mut h, &mut clock, 20, 1);
    assert_eq!(count(&keys, "a"), 20);
    let qk = QueueKey::new(A, Q);
    let (pa, pc) = (clock.pass(&qk, "a").expect("a"), clock.pass(&qk, "c").expect("c"));
    assert!(pc + fair::STRIDE_ONE >= pa, "c at {pc}, a at {pa}: c would get a burst");
    h.ack(c[0], A, token(&held), complete()).expect("completed");
    let ids = h.m.pick_with(&mut clock, A, &queues(&[Q]), 4);
    assert_eq!(ids.iter().filter(|id| c.contains(id)).count(), 1, "one slot: one task of c");
}

#[test]
fn the_empty_key_is_a_key_like_the_others() {
    let mut h = Harness::new();
    flood(&mut h, Q, "", NO_LIMIT, 200, 0);
    flood(&mut h, Q, "a", NO_LIMIT, 200, 0);
    let mut clock = FairClock::default();
    let keys = serve(&mut h, &mut clock, 40, 1);
    assert_eq!((count(&keys, ""), count(&keys, "a")), (20, 20), "tasks without a key share one key");
    set_weight(&mut h, "", 2);
    let keys = serve(&mut h, &mut clock, 60, 1);
    let empty = count(&keys, "") as i64;
    assert!((empty - 40).abs() <= 1, "weight 2: {empty} of 60");
}

#[test]
fn priority_orders_tasks_within_a_key_not_across_keys() {
    let mut h = Harness::new();
    let low = flood(&mut h, Q, "a", NO_LIMIT, 3, 0);
    let high = flood(&mut h, Q, "a", NO_LIMIT, 3, 9);
    let b = flood(&mut h, Q, "b", NO_LIMIT, 3, 0);
    let picked = h.pick(A, &[Q], 12);
    assert_eq!(picked, vec![high[0], b[0], high[1], b[1], high[2], b[2], low[0], low[1], low[2]]);
}

#[test]
fn a_new_clock_starts_every_key_at_the_same_pass() {
    let mut h = Harness::new();
    flood(&mut h, Q, "a", NO_LIMIT, 50, 0);
    flood(&mut h, Q, "b", NO_LIMIT, 50, 0);
    let mut clock = FairClock::default();
    serve(&mut h, &mut clock, 1, 5);
    // A new leader (or a reset at a leadership change) carries no history: the keys alternate again.
    clock.reset();
    let keys = serve(&mut h, &mut clock, 1, 4);
    assert_eq!(keys, vec!["a", "b", "a", "b"]);
}

#[test]
fn weights_are_replicated_to_every_shard_survive_a_rebuild_and_1_removes_them() {
    let mut h = Harness::new();
    let qk = QueueKey::new(A, Q);
    set_weight(&mut h, "a", 5);
    set_weight(&mut h, "", 7);
    assert!(h.m.shards.iter().all(|s| s.fairness_weight(&qk, "a") == 5 && s.fairness_weight(&qk, "") == 7));
    assert!(h.m.stores.iter().all(|s| s.weights.len() == 2), "a record in every shard");
    let rebuilt = h.m.rebuilt();
    assert!(rebuilt.shards.iter().all(|s| s.fairness_weight(&qk, "a") == 5));
    set_weight(&mut h, "a", 1);
    assert!(h.m.stores.iter().all(|s| s.weights.len() == 1), "weight 1 is the default: no record");
    assert_eq!(h.m.shards[0].fairness_weight(&qk, "a"), 1);
    assert_eq!(h.m.shards[0].fairness_weight(&QueueKey::new(B, Q), ""), 1, "weights are per tenant");
    // Out of range in the log (the proposer refuses it): clamped, the same on every replica.
    let cmd = |weight| Command::SetFairnessWeight { tenant: A.into(), queue: Q.into(), key: "z".into(), weight };
    assert_eq!(h.apply(cmd(0)), Response::FairnessWeight(1));
    assert_eq!(h.apply(cmd(5_000)), Response::FairnessWeight(fair::MAX_WEIGHT));
    assert_eq!(h.m.shards[0].fairness_weight(&qk, "z"), fair::MAX_WEIGHT);
    assert_eq!(cmd(2).required_version(), 2, "needs cluster version 2");
}

#[test]
fn promises_count_per_tenant_and_key_once_per_task_until_released() {
    let (t, u): (Arc<str>, Arc<str>) = (Arc::from("t"), Arc::from("u"));
    let id = |n| TaskId::new(1, 0, n);
    let mut p = Promised::default();
    p.insert(&t, Picked { id: id(1), key: Some("k".into()) });
    p.insert(&t, Picked { id: id(1), key: Some("k".into()) });
    p.insert(&t, Picked { id: id(2), key: Some("k".into()) });
    p.insert(&u, Picked { id: id(3), key: Some("k".into()) });
    p.insert(&t, Picked::plain(id(4)));
    assert_eq!((p.len(), p.of_key("t", "k"), p.of_key("u", "k"), p.of_key("t", "")), (4, 2, 1, 0));
    assert!(p.contains(&id(4)) && !p.contains(&id(5)));
    p.remove(&id(1));
    p.remove(&id(1));
    p.remove(&id(4));
    assert_eq!((p.len(), p.of_key("t", "k"), p.of_key("u", "k")), (2, 1, 1));
    p.remove(&id(2));
    p.remove(&id(3));
    assert!(p.is_empty());
    assert_eq!((p.of_key("t", "k"), p.of_key("u", "k")), (0, 0));
}
