//! Concurrency key overrides (`SetKeyLimit`): an operator's limit replaces the one a key's tasks carry, in the
//! leader's pick and in apply's claim check alike; an expiry ends it by time alone; removal ends it at once.

use super::*;

fn keyed(h: &mut Harness, key: &str, limit: u32) -> TaskId {
    let mut spec = h.spec(A, Q);
    spec.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(A, key), h.next_id);
    spec.concurrency = Some(ConcurrencyKey { key: key.into(), limit });
    h.enqueue(spec)
}

fn set(h: &mut Harness, key: &str, limit: Option<(u32, Option<TimeMs>)>) -> Option<KeyLimit> {
    let limit = limit.map(|(limit, expires_at)| KeyLimit { limit, expires_at });
    match h.apply(Command::SetKeyLimit { tenant: A.into(), key: key.into(), limit }) {
        Response::KeyLimit(l) => l,
        other => panic!("set key limit answered {other:?}"),
    }
}

fn running(h: &Harness, key: &str) -> u32 {
    h.m.shards.iter().map(|s| s.running_with_key(A, key)).sum()
}

/// Claims everything the leader would pick, asserting apply accepts every pick (they agree on the limit).
fn claim_all(h: &mut Harness) -> Vec<Task> {
    h.claim(A, &[Q], 100, 600_000)
}

#[test]
fn an_override_raises_the_limit_and_releases_held_tasks_at_once() {
    let mut h = Harness::new();
    let ids: Vec<TaskId> = (0..5).map(|_| keyed(&mut h, "k", 1)).collect();
    assert_eq!(claim_all(&mut h).len(), 1);
    assert_eq!(h.pick(A, &[Q], 10), vec![], "the key is at its tasks' limit");
    // Raised to 3: the effects wake the dispatcher for the key's queue, and two more are claimable.
    let req = Request {
        time_ms: h.time,
        seed: 1,
        command: Command::SetKeyLimit {
            tenant: A.into(),
            key: "k".into(),
            limit: Some(KeyLimit { limit: 3, expires_at: None }),
        }
        .into(),
    };
    let (resp, fx) = h.m.apply(&req);
    assert_eq!(resp, Response::KeyLimit(Some(KeyLimit { limit: 3, expires_at: None })));
    assert!(fx.ready.contains(&QueueKey::new(A, Q)), "a raised limit wakes the parked claims");
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[1], ids[2]]);
    assert_eq!(claim_all(&mut h).len(), 2);
    assert_eq!(running(&h, "k"), 3);
    // The claim check alone (a claim the leader did not pick) refuses a fourth.
    assert_eq!(
        h.claim_ids(A, &[ids[3]], 60_000)[0].as_ref().map(|t| t.id).map_err(|e| *e),
        Err(Rejected::NotClaimable)
    );
    assert_eq!(h.m.rebuilt().pick(A, &queues(&[Q]), 10), vec![], "a rebuild reads the override from its record");
}

#[test]
fn lowering_below_the_running_count_stops_only_new_claims() {
    let mut h = Harness::new();
    let ids: Vec<TaskId> = (0..6).map(|_| keyed(&mut h, "k", 4)).collect();
    let claimed = claim_all(&mut h);
    assert_eq!(claimed.len(), 4);
    assert_eq!(set(&mut h, "k", Some((2, None))), Some(KeyLimit { limit: 2, expires_at: None }));
    assert_eq!(running(&h, "k"), 4, "nothing that runs is touched");
    assert!(claimed.iter().all(|t| h.state(t.id) == Some(TaskState::InProgress)));
    // Two end: 2 running, still not below the override of 2.
    for t in &claimed[..2] {
        h.ack(t.id, A, token(t), complete()).expect("completed");
    }
    assert_eq!(h.pick(A, &[Q], 10), vec![]);
    assert_eq!(
        h.claim_ids(A, &[ids[4]], 60_000)[0].as_ref().map(|t| t.id).map_err(|e| *e),
        Err(Rejected::NotClaimable)
    );
    // One more ends: one slot under the override.
    h.ack(claimed[2].id, A, token(&claimed[2]), complete()).expect("completed");
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[4]]);
    assert_eq!(claim_all(&mut h).len(), 1);
    assert_eq!(running(&h, "k"), 2);
}

#[test]
fn an_expired_override_gives_back_the_tasks_limit_with_no_command() {
    let mut h = Harness::new();
    let ids: Vec<TaskId> = (0..5).map(|_| keyed(&mut h, "k", 1)).collect();
    let until = h.time + 10_000;
    assert_eq!(set(&mut h, "k", Some((3, Some(until)))), Some(KeyLimit { limit: 3, expires_at: Some(until) }));
    assert_eq!(h.m.shards.iter().filter_map(|s| s.next_due()).min(), Some(until), "the leader ticks at the expiry");
    assert_eq!(claim_all(&mut h).len(), 3);
    // Just before the expiry it is in force: nothing more. At the expiry the tasks' limit of 1 applies again.
    h.tick_at(until - 1);
    assert!(h.m.shards.iter().all(|s| s.key_limits().contains_key(A)));
    h.tick_at(until);
    assert!(h.m.shards.iter().all(|s| s.key_limits().is_empty()), "every shard removed it at the same entry");
    assert!(h.m.stores.iter().all(|s| s.key_limits.is_empty()), "and its records");
    assert_eq!(running(&h, "k"), 3, "running tasks stay");
    let claimed: Vec<Task> = h.m.tasks().filter(|t| t.state == TaskState::InProgress).cloned().collect();
    for t in &claimed {
        h.ack(t.id, A, token(t), complete()).expect("completed");
    }
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[3]], "one at a time again");

    // An expiry between the leader's pick and the claim's entry: apply decides with the entry's time.
    let until = h.time + 5_000;
    set(&mut h, "k", Some((5, Some(until))));
    let picked = h.pick(A, &[Q], 10);
    assert_eq!(picked, vec![ids[3], ids[4]]);
    h.time = until;
    let got = h.claim_ids(A, &picked, 60_000);
    assert_eq!(got.iter().filter(|r| r.is_ok()).count(), 1, "the tasks' limit of 1 at the claim's time");
}

#[test]
fn an_override_already_past_its_expiry_or_removed_binds_nothing() {
    let mut h = Harness::new();
    let ids: Vec<TaskId> = (0..3).map(|_| keyed(&mut h, "k", 2)).collect();
    let now = h.time;
    assert_eq!(set(&mut h, "k", Some((1, Some(now)))), None, "expired when applied: no override");
    assert!(h.m.stores.iter().all(|s| s.key_limits.is_empty()));
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[0], ids[1]]);
    set(&mut h, "k", Some((1, None)));
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[0]]);
    // Replacing an expiring override with a lasting one forgets the old expiry.
    let soon = h.time + 100;
    set(&mut h, "k", Some((1, Some(soon))));
    set(&mut h, "k", Some((1, None)));
    h.advance(1_000);
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[0]], "still in force");
    // Removed: the tasks' limits at once.
    assert_eq!(set(&mut h, "k", None), None);
    assert_eq!(h.pick(A, &[Q], 10), vec![ids[0], ids[1]]);
    assert!(h.m.shards.iter().all(|s| s.key_limits().is_empty()));
}

#[test]
fn an_override_is_one_tenants_and_one_keys() {
    let mut h = Harness::new();
    let a = keyed(&mut h, "k", 1);
    let a2 = keyed(&mut h, "k", 1);
    let other = keyed(&mut h, "j", 1);
    let other2 = keyed(&mut h, "j", 1);
    let mut b = h.spec(B, Q);
    b.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(B, "k"), 900);
    b.concurrency = Some(ConcurrencyKey { key: "k".into(), limit: 1 });
    let mut b2 = b.clone();
    b2.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(B, "k"), 901);
    let (b, b2) = (h.enqueue(b), h.enqueue(b2));
    set(&mut h, "k", Some((2, None)));
    assert_eq!(h.pick(A, &[Q], 10).into_iter().collect::<HashSet<_>>(), [a, a2, other].into());
    assert!(!h.pick(A, &[Q], 10).contains(&other2));
    assert_eq!(h.pick(B, &[Q], 10), vec![b], "bravo's key of the same name keeps its tasks' limit");
    assert!(!h.pick(B, &[Q], 10).contains(&b2));
}

#[test]
fn overrides_are_in_every_shard_and_replicas_of_other_shard_counts_agree() {
    let mut h = Harness::new();
    for _ in 0..4 {
        keyed(&mut h, "k", 1);
    }
    let until = h.time + 2_000;
    set(&mut h, "k", Some((3, Some(until))));
    set(&mut h, "gone", Some((2, None)));
    set(&mut h, "gone", None);
    claim_all(&mut h);
    h.tick_at(until + 1);
    for shards in [1, 3, 7] {
        let mut r = MemMachine::new(shards);
        for req in &h.log {
            r.apply(req);
        }
        assert_eq!(r.tasks().filter(|t| t.state == TaskState::InProgress).count(), 3);
        assert!(r.stores.iter().all(|s| s.key_limits.is_empty()));
    }
}
