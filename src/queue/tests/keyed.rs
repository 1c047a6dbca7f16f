//! Debounce and singleton keys (`EnqueueKeyed`): what a keyed enqueue does while the key's task holds the key and
//! after, the scoping of keys, and the life of their records (renewed while held, removed after, rebuilt).

use super::*;

const DELAY: u64 = 1_000;

fn debounce(key: &str, max_wait_ms: u64) -> KeyMode {
    KeyMode::Debounce { key: key.to_string(), delay_ms: DELAY, max_wait_ms }
}

fn singleton(key: &str, skip: bool) -> KeyMode {
    KeyMode::Singleton { key: key.to_string(), skip }
}

/// Every key record of the machine, with the shard it is in.
fn key_records(m: &MemMachine) -> Vec<(usize, String, String, KeyRecord)> {
    let mut out = vec![];
    for (i, s) in m.stores.iter().enumerate() {
        for ((tenant, key), rec) in &s.keys {
            out.push((i, tenant.clone(), key.clone(), *rec));
        }
    }
    out
}

impl Harness {
    /// A task placed as the proposer places a keyed one (by its record key, or by its concurrency key), visible
    /// after the debounce delay for a debounce.
    fn keyed_spec(&mut self, tenant: &str, queue: &str, mode: &KeyMode) -> NewTask {
        let mut n = self.spec(tenant, queue);
        n.id = TaskId::new(self.time, TaskId::placement_for_key(tenant, &mode.record_key(queue, None)), self.next_id);
        if let KeyMode::Debounce { delay_ms, .. } = mode {
            n.visible_at = self.time + delay_ms;
        }
        n
    }

    fn enqueue_keyed(&mut self, items: Vec<KeyedTask>) -> Vec<ItemResult<Enqueued>> {
        match self.apply(Command::EnqueueKeyed(items)) {
            Response::Enqueued(v) => v,
            other => panic!("keyed enqueue answered {other:?}"),
        }
    }

    /// Enqueues one keyed task of `A`/`Q` with `payload`; its id and the answer.
    fn keyed(&mut self, mode: KeyMode, payload: &[u8]) -> (TaskId, ItemResult<Enqueued>) {
        let mut task = self.keyed_spec(A, Q, &mode);
        task.payload = payload.to_vec().into();
        let id = task.id;
        (id, self.enqueue_keyed(vec![KeyedTask { task, mode: Some(mode) }]).remove(0))
    }
}

#[test]
fn debounce_replaces_the_pending_tasks_payload_and_pushes_its_start_back() {
    let mut h = Harness::new();
    let (first, r) = h.keyed(debounce("k", 0), b"one");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: false }));
    assert_eq!(h.task(first).visible_at, T0 + DELAY);
    h.advance(600);
    let (_, r) = h.keyed(debounce("k", 0), b"two");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }), "the pending task took it");
    let t = h.task(first);
    assert_eq!((&t.payload[..], t.visible_at, t.created_at), (&b"two"[..], T0 + 600 + DELAY, T0));
    assert_eq!(h.m.tasks().count(), 1, "nothing was created");
    h.advance(600);
    assert_eq!(h.pick(A, &[Q], 10), vec![], "the start moved: not claimable at the first start");
    h.advance(400);
    assert_eq!(h.pick(A, &[Q], 10), vec![first]);
    // Ready but not claimed yet: still debounced (and its start moves again).
    let (_, r) = h.keyed(debounce("k", 0), b"three");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }));
    assert_eq!(h.pick(A, &[Q], 10), vec![], "pushed back again");
    assert_eq!(&h.task(first).payload[..], b"three");
}

#[test]
fn debounce_priority_follows_the_latest_enqueue() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(debounce("k", 0), b"one");
    let mut task = h.keyed_spec(A, Q, &debounce("k", 0));
    task.priority = 7;
    let r = h.enqueue_keyed(vec![KeyedTask { task, mode: Some(debounce("k", 0)) }]);
    assert_eq!(r, vec![Ok(Enqueued { task_id: first, duplicate: true })]);
    assert_eq!(h.task(first).priority, 7);
}

#[test]
fn max_wait_caps_how_far_a_stream_of_enqueues_postpones_the_task() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(debounce("k", 2_500), b"0");
    for (i, want) in [(1u8, T0 + 800 + DELAY), (2, T0 + 2_500), (3, T0 + 2_500)] {
        h.advance(800);
        let (_, r) = h.keyed(debounce("k", 2_500), &[i]);
        assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }));
        assert_eq!(h.task(first).visible_at, want, "enqueue {i}");
    }
    h.advance(100);
    assert_eq!(h.now(), T0 + 2_500);
    assert_eq!(h.pick(A, &[Q], 10), vec![first], "claimable at first enqueue + max_wait");
    // Past the cap the task starts at once.
    h.advance(50);
    let (_, r) = h.keyed(debounce("k", 2_500), b"late");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }));
    assert_eq!(h.task(first).visible_at, T0 + 2_500);
    assert_eq!(h.pick(A, &[Q], 10), vec![first]);
}

#[test]
fn a_claimed_task_is_not_debounced_a_new_one_is_created() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(debounce("k", 0), b"one");
    h.advance(DELAY);
    let t = h.claim_one(A, 60_000);
    assert_eq!(t.id, first);
    let (second, r) = h.keyed(debounce("k", 0), b"two");
    assert_eq!(r, Ok(Enqueued { task_id: second, duplicate: false }));
    assert_ne!(second, first);
    assert_eq!(&h.task(first).payload[..], b"one", "the running task is left alone");
    assert_eq!(h.task(second).visible_at, h.now() + DELAY);
    // The key now names the new task, and stays on it even after the first is retried back to pending.
    h.ack(first, A, token(&t), nack(Some(0))).expect("current token");
    let (_, r) = h.keyed(debounce("k", 0), b"three");
    assert_eq!(r, Ok(Enqueued { task_id: second, duplicate: true }));
    assert_eq!((&h.task(second).payload[..], &h.task(first).payload[..]), (&b"three"[..], &b"one"[..]));
}

#[test]
fn singleton_refuses_or_skips_while_the_task_is_pending_or_running() {
    let mut h = Harness::new();
    let (first, r) = h.keyed(singleton("s", false), b"one");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: false }));
    let before = records(&h.m);
    let (_, r) = h.keyed(singleton("s", false), b"two");
    assert_eq!(r, Err(Rejected::SingletonActive(first)), "refused while pending");
    assert_eq!(records(&h.m), before, "a refused enqueue changes nothing");
    assert_eq!(Rejected::SingletonActive(first).reason(), "SINGLETON_ACTIVE");
    assert!(Rejected::SingletonActive(first).to_string().contains(&first.to_string()));
    let (_, r) = h.keyed(singleton("s", true), b"two");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }), "skipped while pending");
    let t = h.claim_one(A, 60_000);
    assert_eq!(t.id, first);
    let (_, r) = h.keyed(singleton("s", false), b"three");
    assert_eq!(r, Err(Rejected::SingletonActive(first)), "refused while in progress");
    let (_, r) = h.keyed(singleton("s", true), b"three");
    assert_eq!(r, Ok(Enqueued { task_id: first, duplicate: true }), "skipped while in progress");
    assert_eq!(h.m.tasks().count(), 1);
    assert_eq!(&h.task(first).payload[..], b"one", "a singleton never changes the task");
    // A delayed (retried) task still holds the key.
    h.ack(first, A, token(&t), nack(Some(5_000))).expect("current token");
    let (_, r) = h.keyed(singleton("s", false), b"four");
    assert_eq!(r, Err(Rejected::SingletonActive(first)), "refused while delayed");
}

#[test]
fn singleton_allows_a_new_task_once_the_last_completed_was_cancelled_or_dead_lettered() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(singleton("s", false), b"1");
    let t = h.claim_one(A, 60_000);
    h.ack(first, A, token(&t), complete()).expect("current token");
    let (second, r) = h.keyed(singleton("s", false), b"2");
    assert_eq!(r, Ok(Enqueued { task_id: second, duplicate: false }), "after completion");
    assert_eq!(h.cancel(A, second), Ok(TaskState::Cancelled));
    let (third, r) = h.keyed(singleton("s", true), b"3");
    assert_eq!(r, Ok(Enqueued { task_id: third, duplicate: false }), "after cancel");
    h.dead_letter(third);
    let (fourth, r) = h.keyed(singleton("s", false), b"4");
    assert_eq!(r, Ok(Enqueued { task_id: fourth, duplicate: false }), "after dead-letter");
    let (_, r) = h.keyed(singleton("s", false), b"5");
    assert_eq!(r, Err(Rejected::SingletonActive(fourth)));
}

#[test]
fn keys_are_scoped_by_tenant_queue_mode_and_concurrency_key() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(singleton("k", false), b"a");
    // Another tenant, another queue, the other mode: each its own key.
    for (tenant, queue, mode) in
        [(B, Q, singleton("k", false)), (A, "other", singleton("k", false)), (A, Q, debounce("k", 0))]
    {
        let task = h.keyed_spec(tenant, queue, &mode);
        let id = task.id;
        let r = h.enqueue_keyed(vec![KeyedTask { task, mode: Some(mode) }]);
        assert_eq!(r, vec![Ok(Enqueued { task_id: id, duplicate: false })], "{tenant}/{queue}");
    }
    // With a concurrency key: placed by it, and scoped by it.
    let mode = singleton("k", false);
    let with_ck = |h: &mut Harness, ck: &str| {
        let mut task = h.spec(A, Q);
        task.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(A, ck), h.next_id);
        task.concurrency = Some(ConcurrencyKey { key: ck.to_string(), limit: 1 });
        task
    };
    let a1 = with_ck(&mut h, "c1");
    let (a1_id, a2) = (a1.id, with_ck(&mut h, "c1"));
    let b1 = with_ck(&mut h, "c2");
    let b1_id = b1.id;
    let r = h.enqueue_keyed(vec![
        KeyedTask { task: a1, mode: Some(mode.clone()) },
        KeyedTask { task: a2, mode: Some(mode.clone()) },
        KeyedTask { task: b1, mode: Some(mode.clone()) },
    ]);
    assert_eq!(
        r,
        vec![
            Ok(Enqueued { task_id: a1_id, duplicate: false }),
            Err(Rejected::SingletonActive(a1_id)),
            Ok(Enqueued { task_id: b1_id, duplicate: false }),
        ],
        "items of one entry see each other"
    );
    let shard_of_c1 = a1_id.shard(SHARDS);
    let recs = key_records(&h.m);
    assert!(recs.iter().any(|(i, _, _, r)| r.task_id == a1_id && *i == shard_of_c1), "{recs:?}");
    assert_eq!(&h.task(first).payload[..], b"a");
    assert_eq!(recs.len(), 6, "one record per key: {recs:?}");
}

#[test]
fn an_item_without_a_key_mode_is_a_plain_enqueue() {
    let mut h = Harness::new();
    let mut plain = h.spec(A, Q);
    plain.idempotency_key = Some("idem".into());
    let (id, dup) = (plain.id, h.spec(A, Q));
    let mut dup = dup;
    dup.idempotency_key = Some("idem".into());
    let r = h.enqueue_keyed(vec![KeyedTask { task: plain, mode: None }, KeyedTask { task: dup, mode: None }]);
    // The proposer would place both by the idempotency key; here they differ, so check only the first.
    assert_eq!(r[0], Ok(Enqueued { task_id: id, duplicate: false }));
    assert_eq!(h.task(id).idempotency_key.as_deref(), Some("idem"));
}

#[test]
fn a_record_lives_exactly_as_long_as_its_task_holds_the_key() {
    let mut h = Harness::new();
    let (s, _) = h.keyed(singleton("s", false), b"x");
    let (d, _) = h.keyed(debounce("d", 0), b"x");
    let holders = |h: &Harness| {
        let mut v: Vec<TaskId> = key_records(&h.m).iter().map(|r| r.3.task_id).collect();
        v.sort();
        v
    };
    let mut both = vec![s, d];
    both.sort();
    assert_eq!(holders(&h), both);
    assert!(key_records(&h.m).iter().all(|r| r.3.expires_at == TimeMs::MAX), "the idempotency sweep never takes them");
    h.advance(DELAY);
    let claimed = h.claim(A, &[Q], 2, 60_000);
    assert_eq!(claimed.len(), 2);
    assert_eq!(holders(&h), vec![s], "a claim ends a debounce key's hold, not a singleton key's");
    let ts = claimed.iter().find(|t| t.id == s).expect("claimed");
    h.ack(s, A, token(ts), fail(true)).expect("current token");
    assert_eq!(holders(&h), vec![s], "retried: pending again, still held");
    h.tick_at(h.task(s).visible_at);
    h.dead_letter(s);
    assert_eq!(holders(&h), vec![], "dead-lettered: released in the same entry");
    // Redriven, the old task does not take its key back: the next enqueue creates a task.
    assert_eq!(h.redrive(A, Q, DlqSelector::All), vec![s]);
    let (next, r) = h.keyed(singleton("s", false), b"y");
    assert_eq!(r, Ok(Enqueued { task_id: next, duplicate: false }));
    assert_eq!(holders(&h), vec![next]);
}

#[test]
fn a_record_whose_task_was_removed_lets_the_next_enqueue_create() {
    let mut h = Harness::new();
    let (first, _) = h.keyed(singleton("s", false), b"1");
    assert_eq!(h.cancel(A, first), Ok(TaskState::Cancelled));
    h.advance(60_001);
    assert_eq!(h.state(first), None, "removed after retention");
    let (second, r) = h.keyed(singleton("s", false), b"2");
    assert_eq!(r, Ok(Enqueued { task_id: second, duplicate: false }));
}

#[test]
fn keyed_state_survives_a_rebuild_and_replays_identically_on_other_shard_counts() {
    let mut h = Harness::new();
    let (s, _) = h.keyed(singleton("s", false), b"1");
    let (d, _) = h.keyed(debounce("d", 5_000), b"1");
    h.advance(300);
    let (_, r) = h.keyed(debounce("d", 5_000), b"2");
    assert_eq!(r, Ok(Enqueued { task_id: d, duplicate: true }));
    h.m = h.m.rebuilt();
    let (_, r) = h.keyed(singleton("s", false), b"2");
    assert_eq!(r, Err(Rejected::SingletonActive(s)), "a restart finds the singleton record");
    let (_, r) = h.keyed(debounce("d", 5_000), b"3");
    assert_eq!(r, Ok(Enqueued { task_id: d, duplicate: true }), "and the debounce record");
    for shards in [1, 2, 8] {
        let mut m = MemMachine::new(shards);
        let answers: Vec<Response> = h.log.iter().map(|req| m.apply(req).0).collect();
        assert_indexes_match_records(&m);
        let tasks: BTreeMap<TaskId, Task> = m.tasks().map(|t| (t.id, t.clone())).collect();
        let want: BTreeMap<TaskId, Task> = h.m.tasks().map(|t| (t.id, t.clone())).collect();
        assert_eq!(tasks, want, "{shards} shards");
        assert_eq!(key_records(&m).len(), key_records(&h.m).len(), "{shards} shards");
        assert!(answers.contains(&Response::Enqueued(vec![Err(Rejected::SingletonActive(s))])));
    }
}
