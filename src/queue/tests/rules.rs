//! Unit tests of each lifecycle rule, driven through the `Harness` the way the leader drives the machine.

use super::*;

#[test]
fn tasks_are_stored_in_the_shard_of_their_placement() {
    let mut h = Harness::new();
    let ids: Vec<TaskId> = (0..8).map(|_| h.add(A, Q)).collect();
    for id in ids {
        let shard = id.placement() as usize % SHARDS;
        assert!(h.m.stores[shard].tasks.contains_key(&id));
        for (i, store) in h.m.stores.iter().enumerate() {
            assert_eq!(store.tasks.contains_key(&id), i == shard);
        }
    }
    assert!(h.m.stores.iter().all(|s| s.tasks.len() == 2), "8 consecutive placements over 4 shards");
}

#[test]
fn claim_order_is_priority_then_fifo() {
    let mut h = Harness::new();
    let mut batch = Vec::new();
    for (i, priority) in [1, 5, 1].into_iter().enumerate() {
        let mut s = h.spec(A, Q);
        s.priority = priority;
        s.id = TaskId::new(h.time - i as u64, i as u16, 7); // ids sort against positions
        batch.push(s);
    }
    let (a, b, c) = (batch[0].id, batch[1].id, batch[2].id);
    assert!(c < a);
    // One entry: FIFO among them is their position in the command, not their ids.
    h.enqueue_all(batch);
    h.advance(1);
    let mut s = h.spec(A, Q);
    s.priority = 5;
    let d = h.enqueue(s);
    let mut s = h.spec(A, Q);
    s.priority = 9;
    s.visible_at = h.time + 1_000;
    let e = h.enqueue(s);
    let f = h.add(A, Q);
    let mut s = h.spec(A, "other");
    s.priority = 9;
    let other_queue = h.enqueue(s);
    let mut s = h.spec(B, Q);
    s.priority = 9;
    let other_tenant = h.enqueue(s);

    assert_eq!(h.pick(A, &[Q], 10), vec![b, d, a, c, f]);
    assert_eq!(h.pick(A, &[Q], 2), vec![b, d]);
    assert_eq!(h.pick(A, &[Q, "other"], 3), vec![other_queue, b, d]);
    assert_eq!(h.pick(B, &[Q], 10), vec![other_tenant]);

    let claimed = h.claim(A, &[Q], 3, 1_000);
    let base = h.m.last_index * MAX_ITEMS_PER_COMMAND;
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b, d, a]);
    assert_eq!(claimed.iter().map(token).collect::<Vec<_>>(), vec![base, base + 1, base + 2]);
    for t in &claimed {
        assert_eq!(t.state, TaskState::InProgress);
        assert_eq!(t.attempts, 1);
        assert_eq!(t.lease.as_ref().map(|l| (l.claimed_at, l.deadline)), Some((h.now(), h.now() + 1_000)));
        assert_eq!(&h.task(t.id), t, "the response carries the stored record");
    }
    assert_eq!(h.pick(A, &[Q], 10), vec![c, f]);

    // The delayed task keeps the FIFO place of its enqueue and leads on priority once visible.
    h.advance(1_000);
    assert_eq!(h.pick(A, &[Q], 10), vec![e, c, f]);
}

#[test]
fn fifo_ties_within_one_entry_are_broken_by_task_id() {
    let mut h = Harness::new();
    let first = h.add(A, Q);
    let mut s = h.spec(A, Q);
    s.id = TaskId::new(T0 - 10, 2, 1); // enqueued later, but the smaller id
    let second = h.enqueue(s);
    assert!(second < first);
    assert_eq!(h.pick(A, &[Q], 10), vec![first, second], "FIFO by enqueue");

    let tasks = h.claim(A, &[Q], 2, 1_000);
    let items = tasks.iter().map(|t| ack_item(t.id, A, token(t), nack(Some(0)))).collect();
    let out = h.ack_all(items);
    assert!(out.iter().all(|r| r.map(|o| o.state) == Ok(TaskState::Pending)));
    let seq = h.m.last_index * MAX_ITEMS_PER_COMMAND;
    assert_eq!((h.task(first).seq, h.task(second).seq), (seq, seq), "both re-made pending by one entry");
    assert_eq!(h.pick(A, &[Q], 10), vec![second, first], "equal sequence: smaller id first");
}

#[test]
fn fencing_tokens_grow_with_every_delivery() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let mut last = 0;
    for _ in 0..3 {
        let t = h.claim_one(A, 1_000);
        assert_eq!(token(&t), h.m.last_index * MAX_ITEMS_PER_COMMAND);
        assert!(token(&t) > last);
        last = token(&t);
        assert_eq!(h.ack(id, A, last, AckAction::Abandon).map(|o| o.state), Ok(TaskState::Pending));
    }
}

#[test]
fn ack_with_stale_lease_token_is_rejected_and_changes_nothing() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let old = token(&h.claim_one(A, 1_000));
    assert_eq!(h.ack(id, A, old, nack(Some(0))), Ok(AckOutcome { state: TaskState::Pending, at: h.now() }));
    let current = token(&h.claim_one(A, 1_000));
    assert!(current > old);

    let before = records(&h.m);
    let sizes = index_sizes(&h.m);
    for action in every_action() {
        for stale in [old, current + 1, current - 1, 0, u64::MAX] {
            let got = h.ack(id, A, stale, action.clone());
            if stale == old && action.kind() == nack(Some(0)).kind() {
                // The nack that ended the old delivery, sent again: answered as applied, changing nothing.
                assert_eq!(got, Ok(AckOutcome { state: TaskState::InProgress, at: h.now() }));
            } else {
                assert_eq!(got, Err(Rejected::LeaseLost), "{action:?} {stale}");
            }
        }
    }
    assert_eq!(records(&h.m), before, "stale acks changed a record");
    assert_eq!(index_sizes(&h.m), sizes);

    assert_eq!(h.ack(id, A, current, complete()).map(|o| o.state), Ok(TaskState::Completed));
}

#[test]
fn ack_after_lease_expiry_is_rejected() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let expired = token(&h.claim_one(A, 100));
    h.advance(100);
    assert_eq!(h.state(id), Some(TaskState::Pending));
    assert_eq!(h.ack(id, A, expired, complete()), Err(Rejected::NotInProgress));
    h.advance(100); // FIXED backoff
    let current = token(&h.claim_one(A, 1_000));
    assert_eq!(h.ack(id, A, expired, complete()), Err(Rejected::LeaseLost));
    assert_eq!(h.ack(id, A, current, complete()).map(|o| o.state), Ok(TaskState::Completed));
}

#[test]
fn acks_for_unknown_or_foreign_tasks_are_not_found() {
    let mut h = Harness::new();
    let pending = h.add(A, Q);
    let running = h.add(A, Q);
    let t = h.claim(A, &[Q], 2, 1_000).pop().expect("two claimed");
    assert_eq!(t.id, running);
    let before = records(&h.m);

    let unknown = TaskId::new(T0, 1, 999_999);
    assert_eq!(h.ack(unknown, A, token(&t), complete()), Err(Rejected::NotFound));
    assert_eq!(h.ack(running, B, token(&t), complete()), Err(Rejected::NotFound), "other tenant, right token");
    assert_eq!(h.ack(pending, B, 0, complete()), Err(Rejected::NotFound), "other tenant, pending");
    assert_eq!(records(&h.m), before);
}

#[test]
fn acks_on_tasks_not_in_progress_are_rejected() {
    let mut h = Harness::new();
    let pending = h.add(A, Q);
    for action in every_action() {
        assert_eq!(h.ack(pending, A, 0, action), Err(Rejected::NotInProgress));
    }
    let t = h.claim_one(A, 1_000);
    assert_eq!(h.ack(pending, A, token(&t), complete()).map(|o| o.state), Ok(TaskState::Completed));
    for action in every_action() {
        let got = h.ack(pending, A, token(&t), action.clone());
        if action.kind() == complete().kind() {
            assert_eq!(got.map(|o| o.state), Ok(TaskState::Completed), "the same completion again is idempotent");
        } else {
            assert_eq!(got, Err(Rejected::NotInProgress), "{action:?}");
        }
    }
    assert_eq!(h.state(pending), Some(TaskState::Completed));
}

#[test]
fn claims_of_unclaimable_tasks_are_rejected() {
    let mut h = Harness::new();
    let running = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    let mut s = h.spec(A, Q);
    s.visible_at = h.time + 1;
    let delayed = h.enqueue(s);
    let ready = h.add(A, Q);
    let unknown = TaskId::new(T0, 1, 999_999);
    let before = records(&h.m);

    let got = h.claim_ids(A, &[running, delayed, unknown], 1_000);
    assert_eq!(got, vec![Err(Rejected::NotClaimable), Err(Rejected::NotClaimable), Err(Rejected::NotFound)]);
    assert_eq!(h.claim_ids(B, &[ready], 1_000), vec![Err(Rejected::NotFound)], "other tenant");
    assert_eq!(records(&h.m), before);
    assert_eq!(h.task(running).lease, t.lease, "the holder keeps its lease");

    // The same task twice in one claim: one delivery only.
    let got = h.claim_ids(A, &[ready, ready], 1_000);
    assert!(got[0].is_ok());
    assert_eq!(got[1], Err(Rejected::NotClaimable));
}

#[test]
fn enqueue_with_existing_id_is_rejected() {
    let mut h = Harness::new();
    let spec = h.spec(A, Q);
    let id = h.enqueue(spec.clone());
    let before = h.task(id);
    let again = NewTask { payload: b"other".to_vec().into(), priority: 9, ..spec };
    assert_eq!(h.enqueue_all(vec![again]), vec![Err(Rejected::IdExists)]);
    assert_eq!(h.task(id), before);
}

#[test]
fn lease_expiry_retries_then_dead_letters() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 2;
    let id = h.enqueue(s);

    let first = h.claim_one(A, 500);
    assert_eq!(first.lease.as_ref().map(|l| l.deadline), Some(h.now() + 500));
    h.advance(499);
    assert_eq!(h.state(id), Some(TaskState::InProgress));
    h.advance(1);
    let t = h.task(id);
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(t.attempts, 1);
    assert_eq!(t.visible_at, h.now() + FIXED.base_ms, "retried after the backoff");
    assert_eq!(t.last_error.as_deref(), Some("lease expired"));
    assert_eq!(t.lease, None);
    assert!(h.pick(A, &[Q], 10).is_empty());

    h.advance(FIXED.base_ms);
    let second = h.claim_one(A, 500);
    assert_eq!(second.attempts, 2);
    h.advance(10_000);
    let t = h.task(id);
    assert_eq!(t.state, TaskState::DeadLettered);
    assert_eq!((t.attempts, t.dead_at, t.lease.clone()), (2, Some(h.now()), None));
    assert!(h.pick(A, &[Q], 10).is_empty());
    assert_eq!(h.claim_ids(A, &[id], 1_000), vec![Err(Rejected::NotClaimable)]);
    assert_eq!(h.ack(id, A, token(&second), complete()), Err(Rejected::NotInProgress));
    let qk = QueueKey { tenant: A.to_string(), queue: Q.to_string() };
    assert_eq!(h.m.shards[id.shard(SHARDS)].dead_letters(&qk), vec![(h.now(), id)]);
}

#[test]
fn nack_delay_wins_over_backoff() {
    let mut h = Harness::new();
    let id = h.add(A, Q);

    let t = h.claim_one(A, 1_000);
    let out = h.ack(id, A, token(&t), nack(Some(5_000)));
    assert_eq!(out, Ok(AckOutcome { state: TaskState::Pending, at: h.now() + 5_000 }));
    assert_eq!(h.task(id).visible_at, h.now() + 5_000);
    h.advance(5_000);

    let t = h.claim_one(A, 1_000);
    let out = h.ack(id, A, token(&t), nack(Some(0)));
    assert_eq!(out, Ok(AckOutcome { state: TaskState::Pending, at: h.now() }), "shorter than the backoff, too");
    assert_eq!(h.pick(A, &[Q], 1), vec![id]);

    let t = h.claim_one(A, 1_000);
    assert_eq!(t.attempts, 3);
    let out = h.ack(id, A, token(&t), nack(None));
    assert_eq!(out, Ok(AckOutcome { state: TaskState::DeadLettered, at: h.now() }), "a nack uses the attempt");

    // Without a delay, the task's backoff applies.
    let other = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    let out = h.ack(other, A, token(&t), nack(None));
    assert_eq!(out, Ok(AckOutcome { state: TaskState::Pending, at: h.now() + FIXED.base_ms }));
}

#[test]
fn abandon_does_not_consume_an_attempt() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 1;
    let id = h.enqueue(s);
    for _ in 0..5 {
        let t = h.claim_one(A, 1_000);
        assert_eq!((t.id, t.attempts), (id, 1));
        assert_eq!(
            h.ack(id, A, token(&t), AckAction::Abandon),
            Ok(AckOutcome { state: TaskState::Pending, at: h.now() })
        );
        let t = h.task(id);
        assert_eq!((t.state, t.attempts, t.visible_at), (TaskState::Pending, 0, h.now()));
        h.advance(1);
    }
    // Abandoning re-queues at the back of its priority.
    let later = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    h.ack(id, A, token(&t), AckAction::Abandon).expect("current token");
    assert_eq!(h.pick(A, &[Q], 10), vec![later, id]);
    // The single attempt is still there to be used.
    let t = h.claim(A, &[Q], 2, 1_000).pop().expect("two claimed");
    assert_eq!(t.id, id);
    assert_eq!(h.ack(id, A, token(&t), nack(Some(0))).map(|o| o.state), Ok(TaskState::DeadLettered));
}

#[test]
fn retention_counts_from_end_not_creation() {
    let mut h = Harness::new();
    let retention = 1_000;
    let mut s = h.spec(A, Q);
    s.retention_ms = retention;
    s.visible_at = h.time + 100 * retention;
    let far = h.enqueue(s);
    let mut s = h.spec(A, Q);
    s.retention_ms = retention;
    let done = h.enqueue(s);

    h.advance(5 * retention);
    assert_eq!(h.state(far), Some(TaskState::Pending), "a pending task is never removed by retention");
    assert_eq!(h.state(done), Some(TaskState::Pending));

    let t = h.claim_one(A, 10 * retention);
    assert_eq!(t.id, done);
    h.advance(3 * retention);
    assert_eq!(h.state(done), Some(TaskState::InProgress), "nor a running one");
    h.ack(done, A, token(&t), complete()).expect("current token");
    let ended = h.now();
    assert_eq!(h.task(done).ended_at, Some(ended));
    h.tick_at(ended + retention - 1);
    assert_eq!(h.state(done), Some(TaskState::Completed));
    h.tick_at(ended + retention);
    assert_eq!(h.state(done), None, "removed once retention has passed since the end");

    assert_eq!(h.state(far), Some(TaskState::Pending));
    assert_eq!(h.cancel(A, far), Ok(TaskState::Cancelled));
    let cancelled = h.now();
    h.tick_at(cancelled + retention - 1);
    assert_eq!(h.state(far), Some(TaskState::Cancelled));
    h.tick_at(cancelled + retention);
    assert_eq!(h.state(far), None);
    assert_eq!(total_sizes(&h.m), IndexSizes::default());
}

#[test]
fn idempotency_key_is_scoped_by_tenant_and_window() {
    let mut h = Harness::new();
    let start = h.time;
    // The proposer gives tasks with one key the same placement, so they share a shard.
    let keyed = |h: &mut Harness, tenant: &str, key: &str| {
        let mut s = h.spec(tenant, Q);
        s.id = TaskId::new(h.time, 42, h.next_id);
        s.idempotency_key = Some(key.to_string());
        s.idempotency_window_ms = 1_000;
        s.retention_ms = 0;
        s
    };
    let first = keyed(&mut h, A, "order-7");
    let first = h.enqueue(first);

    h.tick_at(start + 500);
    let repeat = keyed(&mut h, A, "order-7");
    let repeat_id = repeat.id;
    let before = records(&h.m);
    assert_eq!(h.enqueue_all(vec![repeat]), vec![Ok(Enqueued { task_id: first, duplicate: true })]);
    assert_eq!(h.m.task(&repeat_id), None, "a duplicate creates nothing");
    assert_eq!(records(&h.m), before);

    let other_tenant = keyed(&mut h, B, "order-7");
    let other_tenant = h.enqueue(other_tenant);
    assert_ne!(other_tenant, first);

    // The key outlives its task: remembered from the enqueue for the window, not for the task's life.
    let t = h.claim_one(A, 1_000);
    h.ack(first, A, token(&t), complete()).expect("current token");
    h.tick_at(start + 999);
    assert_eq!(h.state(first), None, "retention 0: removed at the next entry");
    let repeat = keyed(&mut h, A, "order-7");
    assert_eq!(h.enqueue_all(vec![repeat]), vec![Ok(Enqueued { task_id: first, duplicate: true })]);

    h.tick_at(start + 1_000);
    let fresh = keyed(&mut h, A, "order-7");
    let fresh = h.enqueue(fresh);
    let repeat = keyed(&mut h, A, "order-7");
    assert_eq!(h.enqueue_all(vec![repeat]), vec![Ok(Enqueued { task_id: fresh, duplicate: true })]);

    // Two items of one command with the same key.
    let (x, y) = (keyed(&mut h, A, "order-8"), keyed(&mut h, A, "order-8"));
    let x_id = x.id;
    assert_eq!(
        h.enqueue_all(vec![x, y]),
        vec![Ok(Enqueued { task_id: x_id, duplicate: false }), Ok(Enqueued { task_id: x_id, duplicate: true })]
    );
}

#[test]
fn key_replaced_in_the_entry_it_expired_in_keeps_its_new_window() {
    let mut h = Harness::new();
    let keyed = |h: &mut Harness, window: u64| {
        let mut s = h.spec(A, Q);
        s.id = TaskId::new(h.time, 42, h.next_id);
        s.idempotency_key = Some("k".to_string());
        s.idempotency_window_ms = window;
        s
    };
    // A window of 0 remembers nothing, not even within its own entry.
    let (x, y) = (keyed(&mut h, 0), keyed(&mut h, 1_000));
    let (x_id, y_id) = (x.id, y.id);
    assert_eq!(
        h.enqueue_all(vec![x, y]),
        vec![Ok(Enqueued { task_id: x_id, duplicate: false }), Ok(Enqueued { task_id: y_id, duplicate: false })]
    );
    // The next entry drops x's expired index entry without forgetting y's key.
    h.advance(0);
    assert_eq!(total_sizes(&h.m).keys, 1);
    h.advance(999);
    let z = keyed(&mut h, 1_000);
    assert_eq!(h.enqueue_all(vec![z]), vec![Ok(Enqueued { task_id: y_id, duplicate: true })]);
    h.advance(1);
    assert_eq!(total_sizes(&h.m).keys, 0);
    assert!(h.m.stores.iter().all(|s| s.keys.is_empty()));
}

#[test]
fn cancel_running_task_stops_accepting_its_token() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    assert_eq!(h.cancel(B, id), Err(Rejected::NotFound));
    assert_eq!(h.state(id), Some(TaskState::InProgress));

    assert_eq!(h.cancel(A, id), Ok(TaskState::Cancelled));
    let c = h.task(id);
    assert_eq!((c.state, c.lease.clone(), c.ended_at), (TaskState::Cancelled, None, Some(h.now())));
    assert_eq!(total_sizes(&h.m).leases, 0);
    for action in every_action() {
        assert_eq!(h.ack(id, A, token(&t), action), Err(Rejected::NotInProgress));
    }
    h.advance(2_000);
    assert_eq!(h.task(id), c, "the old lease's deadline does nothing");
    assert_eq!(h.cancel(A, id), Err(Rejected::AlreadyEnded));
    assert_eq!(h.claim_ids(A, &[id], 1_000), vec![Err(Rejected::NotClaimable)]);
}

#[test]
fn cancel_applies_to_pending_and_dead_lettered_but_not_ended_tasks() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 1;
    let dead = h.enqueue(s);
    h.dead_letter(dead);
    let mut s = h.spec(A, Q);
    s.visible_at = h.time + 10_000;
    let delayed = h.enqueue(s);
    let pending = h.add(A, Q);
    let done = h.add(A, Q);
    let t = h.claim(A, &[Q], 2, 1_000).pop().expect("two claimed");
    assert_eq!(t.id, done);
    h.ack(done, A, token(&t), complete()).expect("current token");
    let failed = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    h.ack(failed, A, token(&t), fail(false)).expect("current token");

    for id in [dead, delayed, pending] {
        assert_eq!(h.cancel(A, id), Ok(TaskState::Cancelled));
        assert_eq!(h.task(id).ended_at, Some(h.now()));
    }
    let qk = QueueKey { tenant: A.to_string(), queue: Q.to_string() };
    assert!(h.m.shards.iter().all(|s| s.dead_letters(&qk).is_empty()));
    for id in [done, failed, dead] {
        assert_eq!(h.cancel(A, id), Err(Rejected::AlreadyEnded));
    }
    assert_eq!(h.cancel(A, TaskId::new(T0, 1, 999_999)), Err(Rejected::NotFound));
    assert!(h.pick(A, &[Q], 10).is_empty());
}

#[test]
fn redrive_resets_attempts() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 2;
    let id = h.enqueue(s);
    h.dead_letter(id);
    assert_eq!((h.task(id).state, h.task(id).attempts), (TaskState::DeadLettered, 2));

    assert!(h.redrive(B, Q, DlqSelector::All).is_empty(), "other tenant");
    assert!(h.redrive(A, "other", DlqSelector::All).is_empty(), "other queue");
    assert!(h.redrive(A, Q, DlqSelector::Ids(vec![TaskId::new(T0, 1, 999_999)])).is_empty());
    assert_eq!(h.state(id), Some(TaskState::DeadLettered));

    h.advance(10);
    assert_eq!(h.redrive(A, Q, DlqSelector::All), vec![id]);
    let t = h.task(id);
    assert_eq!((t.state, t.attempts, t.dead_at, t.visible_at), (TaskState::Pending, 0, None, h.now()));
    assert_eq!(t.seq, h.m.last_index * MAX_ITEMS_PER_COMMAND);
    assert_eq!(h.pick(A, &[Q], 10), vec![id]);

    // A full set of attempts again.
    let t = h.claim_one(A, 1_000);
    assert_eq!(t.attempts, 1);
    let out = h.ack(id, A, token(&t), fail(true)).expect("current token");
    assert_eq!(out.state, TaskState::Pending);
    h.tick_at(out.at);
    h.dead_letter(id);
    assert_eq!(h.task(id).attempts, 2);
    assert_eq!(h.redrive(A, Q, DlqSelector::Ids(vec![id])), vec![id]);
    assert_eq!(h.task(id).attempts, 0);
}

#[test]
fn purge_deletes_only_the_selected_dead_letters() {
    let mut h = Harness::new();
    let mut dead = Vec::new();
    for _ in 0..2 {
        let mut s = h.spec(A, Q);
        s.max_attempts = 1;
        let id = h.enqueue(s);
        h.dead_letter(id);
        dead.push(id);
    }
    let mut s = h.spec(B, Q);
    s.max_attempts = 1;
    let foreign = h.enqueue(s);
    let t = h.claim_one(B, 1_000);
    h.ack(foreign, B, token(&t), fail(true)).expect("current token");
    assert_eq!(h.state(foreign), Some(TaskState::DeadLettered));
    let pending = h.add(A, Q);

    assert_eq!(h.purge(A, Q, DlqSelector::Ids(vec![dead[0], pending])), vec![dead[0]]);
    assert_eq!(h.state(dead[0]), None);
    assert_eq!(h.state(dead[1]), Some(TaskState::DeadLettered));
    assert_eq!(h.purge(A, Q, DlqSelector::All), vec![dead[1]]);
    assert_eq!(h.state(dead[1]), None);
    assert_eq!(h.state(pending), Some(TaskState::Pending));
    assert_eq!(h.state(foreign), Some(TaskState::DeadLettered), "other tenant untouched");
}

#[test]
fn delayed_task_becomes_claimable_when_time_passes() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.visible_at = h.time + 500;
    let id = h.enqueue(s);
    let qk = QueueKey { tenant: A.to_string(), queue: Q.to_string() };
    assert_eq!(machine_counts(&h.m)[&qk], StateCounts { delayed: 1, ..StateCounts::default() });
    assert!(h.pick(A, &[Q], 10).is_empty());
    assert_eq!(h.claim_ids(A, &[id], 1_000), vec![Err(Rejected::NotClaimable)]);

    h.advance(499);
    assert!(h.pick(A, &[Q], 10).is_empty());
    h.advance(1);
    assert_eq!(h.pick(A, &[Q], 10), vec![id]);
    assert_eq!(machine_counts(&h.m)[&qk], StateCounts { pending: 1, ..StateCounts::default() });
    assert!(h.claim_ids(A, &[id], 1_000)[0].is_ok());

    // Any entry moves time, not only a tick: a claim stamped at the visible time succeeds.
    let mut s = h.spec(A, Q);
    s.visible_at = h.time + 500;
    let id = h.enqueue(s);
    let items = vec![ClaimItem { task_id: id, tenant: A.into(), worker_id: "w1".into(), lease_ms: 10 }];
    let Response::Claimed(got) = h.apply_at(h.time + 500, Command::Claim(items)) else { panic!("not a claim") };
    assert!(got[0].is_ok());
}

#[test]
fn time_never_moves_backwards() {
    let mut h = Harness::new();
    h.tick_at(T0 + 10_000);
    let mut s = h.spec(A, Q);
    s.visible_at = T0 + 9_000;
    let id = s.id;
    assert!(matches!(h.apply_at(T0 + 5_000, Command::Enqueue(vec![s])), Response::Enqueued(v) if v[0].is_ok()));
    assert_eq!(h.now(), T0 + 10_000);
    assert!(h.m.shards.iter().all(|s| s.now == T0 + 10_000));
    assert_eq!(h.task(id).created_at, T0 + 10_000);
    assert_eq!(h.pick(A, &[Q], 10), vec![id], "visible at 9 000 < now");

    let items = vec![ClaimItem { task_id: id, tenant: A.into(), worker_id: "w1".into(), lease_ms: 1_000 }];
    let Response::Claimed(got) = h.apply_at(T0 + 1, Command::Claim(items)) else { panic!("not a claim") };
    let lease = got[0].as_ref().expect("claimable").lease.clone().expect("leased");
    assert_eq!((lease.claimed_at, lease.deadline), (T0 + 10_000, T0 + 11_000));

    h.tick_at(T0 + 10_999);
    h.tick_at(T0);
    assert_eq!(h.now(), T0 + 10_999);
    assert_eq!(h.state(id), Some(TaskState::InProgress));
    h.tick_at(T0 + 11_000);
    assert_eq!(h.state(id), Some(TaskState::Pending));
}

#[test]
fn non_retryable_fail_ends_failed() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 5;
    let id = h.enqueue(s);
    let t = h.claim_one(A, 1_000);
    assert_eq!(h.ack(id, A, token(&t), fail(false)), Ok(AckOutcome { state: TaskState::Failed, at: h.now() }));
    let t2 = h.task(id);
    assert_eq!((t2.state, t2.attempts, t2.ended_at), (TaskState::Failed, 1, Some(h.now())));
    assert_eq!((t2.last_error.as_deref(), t2.lease.clone()), (Some("boom"), None));
    assert!(h.pick(A, &[Q], 10).is_empty());
    assert_eq!(total_sizes(&h.m).retention, 1);
    assert_eq!(h.ack(id, A, token(&t), fail(true)), Err(Rejected::NotInProgress));
    assert_eq!(h.cancel(A, id), Err(Rejected::AlreadyEnded));
    assert_eq!(h.claim_ids(A, &[id], 1_000), vec![Err(Rejected::NotClaimable)]);
}

#[test]
fn retryable_fail_backs_off_exponentially_then_dead_letters() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.max_attempts = 8;
    s.retry = RetryPolicy { base_ms: 100, max_ms: 1_000, exponential: true };
    let id = h.enqueue(s);
    for attempt in 1..=8u32 {
        let t = h.claim_one(A, 1_000);
        assert_eq!(t.attempts, attempt);
        let out = h.ack(id, A, token(&t), fail(true)).expect("current token");
        if attempt == 8 {
            assert_eq!(out, AckOutcome { state: TaskState::DeadLettered, at: h.now() });
            break;
        }
        let full = (100u64 << (attempt - 1)).min(1_000);
        let delay = out.at - h.now();
        assert_eq!(out.state, TaskState::Pending);
        assert!((full / 2..=full).contains(&delay), "attempt {attempt}: delay {delay} outside [{}, {full}]", full / 2);
        assert!(h.pick(A, &[Q], 1).is_empty(), "not claimable during the backoff");
        h.tick_at(out.at);
    }
}

#[test]
fn exponential_backoff_doubles_up_to_cap_with_at_most_half_jitter() {
    let exp = RetryPolicy { base_ms: 100, max_ms: 1_000, exponential: true };
    for attempts in 1..=50u32 {
        let full = 100u64.saturating_mul(1u64 << (attempts - 1).min(40)).min(1_000);
        for jitter in [0, 1, 7, 49, 50, 51, 12_345, u64::MAX] {
            let d = exp.delay_ms(attempts, jitter);
            assert!((full / 2..=full).contains(&d), "attempts {attempts} jitter {jitter}: {d}");
        }
    }
    assert_eq!(FIXED.delay_ms(7, 12_345), FIXED.base_ms);
}

#[test]
fn heartbeat_extends_lease() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let start = h.time;
    let t = h.claim_one(A, 1_000);
    h.tick_at(start + 800);
    let out = h.ack(id, A, token(&t), AckAction::Heartbeat { extend_ms: 1_000 });
    assert_eq!(out, Ok(AckOutcome { state: TaskState::InProgress, at: start + 1_800 }));
    assert_eq!(h.task(id).lease.map(|l| (l.token, l.deadline)), Some((token(&t), start + 1_800)));

    h.tick_at(start + 1_000);
    assert_eq!(h.state(id), Some(TaskState::InProgress), "survives the first deadline");
    let out = h.ack(id, A, token(&t), AckAction::Heartbeat { extend_ms: 10 });
    assert_eq!(out, Ok(AckOutcome { state: TaskState::InProgress, at: start + 1_800 }), "never shortens");
    assert_eq!(h.task(id).attempts, 1, "a heartbeat uses no attempt");
    h.tick_at(start + 1_799);
    assert_eq!(h.ack(id, A, token(&t), complete()).map(|o| o.state), Ok(TaskState::Completed));

    // Too late: the lease expired at the start of the heartbeat's own entry.
    let other = h.add(A, Q);
    let t = h.claim_one(A, 100);
    h.advance(100);
    assert_eq!(h.ack(other, A, token(&t), AckAction::Heartbeat { extend_ms: 1_000 }), Err(Rejected::NotInProgress));
    assert_eq!(h.state(other), Some(TaskState::Pending));
}

fn exception(reason: ExceptionReason) -> AckAction {
    AckAction::Exception { reason, message: "why".into() }
}

#[test]
fn each_exception_reason_has_its_effect_and_ends_the_run() {
    let mut h = Harness::new();
    // malformed-payload: terminal, no retry although attempts remain.
    let id = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    let out = h.ack(id, A, token(&t), exception(ExceptionReason::MalformedPayload));
    assert_eq!(out.map(|o| o.state), Ok(TaskState::Failed));
    let done = h.task(id);
    assert_eq!(done.last_error.as_deref(), Some("malformed-payload: why"));
    assert_eq!(done.runs.len(), 1);
    assert_eq!(done.runs[0].outcome, Some(RunOutcome::Exception));
    assert_eq!(done.runs[0].reason, "malformed-payload");
    assert_eq!(&*done.runs[0].worker_id, "w1");
    assert_eq!(done.runs[0].ended_at, Some(h.now()));

    // worker-shutdown: pending again at once, the attempt given back, a new run on the next claim.
    let id = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    let out = h.ack(id, A, token(&t), exception(ExceptionReason::WorkerShutdown));
    assert_eq!(out, Ok(AckOutcome { state: TaskState::Pending, at: h.now() }));
    assert_eq!(h.task(id).attempts, 0);
    let t2 = h.claim_one(A, 1_000);
    assert_eq!(t2.id, id);
    assert_eq!(t2.attempts, 1);
    assert_eq!(t2.runs.len(), 2);
    assert_eq!(t2.runs[0].reason, "worker-shutdown");
    assert_eq!(t2.runs[1].outcome, None, "the new run is open");
    assert_eq!(h.ack(id, A, token(&t2), complete()).map(|o| o.state), Ok(TaskState::Completed));

    // resource-unavailable and internal-error: retried with backoff, the attempt counts, then dead-lettered.
    for reason in [ExceptionReason::ResourceUnavailable, ExceptionReason::InternalError] {
        let id = h.add(A, Q);
        for attempt in 1..=3 {
            let t = h.claim_one(A, 1_000);
            assert_eq!(t.attempts, attempt);
            let out = h.ack(id, A, token(&t), exception(reason)).expect("applied");
            if attempt < 3 {
                assert_eq!(out, AckOutcome { state: TaskState::Pending, at: h.now() + FIXED.base_ms });
                h.advance(FIXED.base_ms);
            } else {
                assert_eq!(out.state, TaskState::DeadLettered);
            }
        }
        let runs = h.task(id).runs;
        assert_eq!(runs.len(), 3);
        assert!(runs.iter().all(|r| r.reason == reason.as_str() && r.outcome == Some(RunOutcome::Exception)));
    }
}

#[test]
fn a_task_not_finished_by_its_deadline_fails_with_deadline_exceeded() {
    let mut h = Harness::new();
    let mut spec = h.spec(A, Q);
    spec.deadline = Some(h.time + 5_000);
    let running = h.enqueue(spec);
    let mut spec = h.spec(A, Q);
    spec.deadline = Some(h.time + 5_000);
    spec.visible_at = h.time + 60_000;
    let delayed = h.enqueue(spec);
    let mut spec = h.spec(A, Q);
    spec.deadline = Some(h.time + 1_000);
    let finished = h.enqueue(spec);
    let t = h.claim_ids(A, &[running, finished], 60_000);
    let (tr, tf) = (t[0].clone().expect("claimed"), t[1].clone().expect("claimed"));
    assert_eq!(h.ack(finished, A, token(&tf), complete()).map(|o| o.state), Ok(TaskState::Completed));
    h.advance(4_999);
    assert_eq!(h.state(running), Some(TaskState::InProgress));
    assert_eq!(h.m.shards.iter().filter_map(|s| s.next_due()).min(), Some(h.time + 1), "the deadline is due next");
    h.advance(1);
    for id in [running, delayed] {
        let t = h.task(id);
        assert_eq!(t.state, TaskState::Failed, "{id}");
        assert_eq!(t.last_error.as_deref(), Some(DEADLINE_EXCEEDED));
        assert_eq!(t.ended_at, Some(h.now()));
    }
    let r = h.task(running).runs;
    assert_eq!((r[0].outcome, r[0].reason.as_str()), (Some(RunOutcome::DeadlineExceeded), DEADLINE_EXCEEDED));
    assert_eq!(h.ack(running, A, token(&tr), complete()), Err(Rejected::NotInProgress), "its token is dead");
    assert_eq!(h.state(finished), Some(TaskState::Completed), "a finished task keeps its outcome");
}

#[test]
fn progress_rides_on_heartbeats_and_resets_at_the_next_claim() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    let p = AckAction::Progress { extend_ms: 5_000, percent: 140, message: "step 3".into() };
    let out = h.ack(id, A, token(&t), p).expect("applied");
    assert_eq!(out, AckOutcome { state: TaskState::InProgress, at: h.now() + 5_000 });
    let got = h.task(id).progress.expect("progress");
    assert_eq!((got.percent, got.message.as_str(), got.at), (100, "step 3", h.now()));
    h.ack(id, A, token(&t), AckAction::Abandon).expect("abandoned");
    let t = h.claim_one(A, 1_000);
    assert_eq!(t.progress, None);
}

#[test]
fn a_paused_queue_accepts_enqueues_serves_no_claims_and_delays_nothing_else() {
    let mut h = Harness::new();
    let held = h.add(A, Q);
    let other = h.add(A, "other");
    let foreign = h.add(B, Q);
    let pause = |paused| Command::SetQueuePaused { tenant: A.into(), queue: Q.into(), paused };
    assert_eq!(h.apply(pause(true)), Response::QueuePaused(true));
    let later = h.add(A, Q);
    assert_eq!(h.state(later), Some(TaskState::Pending), "enqueues are accepted");
    assert_eq!(h.pick(A, &[Q], 10), vec![], "nothing is picked from a paused queue");
    assert_eq!(h.pick(A, &[Q, "other"], 10), vec![other], "other queues are served");
    assert_eq!(h.pick(B, &[Q], 10), vec![foreign], "the same queue name of another tenant is served");
    let r = h.claim_ids(A, &[held], 1_000);
    assert_eq!(r[0].clone().map(|t| t.id), Err(Rejected::NotClaimable), "apply re-checks the flag");
    // A restart keeps the flag.
    let rebuilt = h.m.rebuilt();
    assert_eq!(rebuilt.pick(A, &queues(&[Q]), 10), vec![]);
    assert!(rebuilt.shards.iter().all(|s| s.is_paused(&QueueKey { tenant: A.into(), queue: Q.into() })));
    assert_eq!(h.apply(pause(false)), Response::QueuePaused(false));
    assert_eq!(h.pick(A, &[Q], 10), vec![held, later], "resumed in FIFO order");
}

#[test]
fn completions_feed_the_throughput_windows_and_survive_a_rebuild() {
    let mut h = Harness::new();
    for _ in 0..3 {
        // Kept longer than the longest window, so a rebuild finds them (a shorter retention forgets them).
        let spec = NewTask { retention_ms: 3_600_000, ..h.spec(A, Q) };
        h.enqueue(spec);
    }
    for _ in 0..3 {
        let t = h.claim_one(A, 60_000);
        h.advance(200);
        h.ack(t.id, A, token(&t), complete()).expect("completed");
        h.advance(120_000 - 200);
    }
    let qk = QueueKey { tenant: A.into(), queue: Q.into() };
    let sum = |m: &MemMachine| {
        m.shards.iter().map(|s| s.throughput(&qk)).fold(Throughput::default(), |a, t| Throughput {
            completed_1m: a.completed_1m + t.completed_1m,
            completed_5m: a.completed_5m + t.completed_5m,
            completed_15m: a.completed_15m + t.completed_15m,
            run_ms_15m: a.run_ms_15m + t.run_ms_15m,
        })
    };
    // Completed 6 min, 4 min and 2 min ago.
    let want = Throughput { completed_1m: 0, completed_5m: 2, completed_15m: 3, run_ms_15m: 600 };
    assert_eq!(sum(&h.m), want);
    assert_eq!(sum(&h.m.rebuilt()), want, "derived from the records");
    h.advance(15 * 60_000);
    assert_eq!(sum(&h.m), Throughput::default(), "older than the longest window");
}

fn keyed(h: &mut Harness, queue: &str, key: &str, limit: u32) -> TaskId {
    let mut spec = h.spec(A, queue);
    spec.id = TaskId::new(h.time, TaskId::placement_for_concurrency_key(A, key), h.next_id);
    spec.concurrency = Some(ConcurrencyKey { key: key.into(), limit });
    h.enqueue(spec)
}

#[test]
fn a_blocked_concurrency_key_never_delays_other_keys_or_queues() {
    let mut h = Harness::new();
    let a: Vec<TaskId> = (0..5).map(|_| keyed(&mut h, Q, "a", 1)).collect();
    let b = keyed(&mut h, Q, "b", 1);
    let plain = h.add(A, Q);
    let other = keyed(&mut h, "other", "a", 1);
    // a[0] runs; the rest of "a" is blocked behind it, nothing else is.
    let first = h.claim_ids(A, &[a[0]], 60_000);
    assert!(first[0].is_ok());
    assert_eq!(h.pick(A, &[Q, "other"], 10), vec![plain, b], "key a is full in every queue");
    let r = h.claim_ids(A, &[a[1], other], 60_000);
    assert!(r.iter().all(|r| r.as_ref().err() == Some(&Rejected::NotClaimable)), "apply re-checks the limit");
    // The running task ends: the next of "a" becomes claimable (keys tied at one pass go by name: "", a, b).
    h.ack(a[0], A, token(&first[0].clone().expect("claimed")), complete()).expect("completed");
    assert_eq!(h.pick(A, &[Q], 10), vec![plain, a[1], b]);
    // Promised to a claim in flight counts as running for the key.
    let mut skip = Promised::default();
    skip.insert(&Arc::from(A), Picked { id: a[1], key: Some("a".into()) });
    let picked = pick_ready(&h.m.shards, &mut FairClock::default(), A, &queues(&[Q]), 10, &skip, None);
    assert_eq!(picked, vec![Picked::plain(plain), Picked { id: b, key: Some("b".into()) }]);
    // A task of another tenant's key "a" holds no slot of this tenant's "a".
    let mut other = Promised::default();
    other.insert(&Arc::from("another tenant"), Picked { id: a[2], key: Some("a".into()) });
    let picked = pick_ready(&h.m.shards, &mut FairClock::default(), A, &queues(&[Q]), 10, &other, None);
    assert_eq!(picked.iter().map(|p| p.id).collect::<Vec<_>>(), vec![plain, a[1], b]);
}

#[test]
fn claims_alternate_between_keys_and_respect_limits() {
    let mut h = Harness::new();
    let a: Vec<TaskId> = (0..4).map(|_| keyed(&mut h, Q, "a", 3)).collect();
    let b: Vec<TaskId> = (0..3).map(|_| keyed(&mut h, Q, "b", 3)).collect();
    let first = h.claim_ids(A, &[a[0]], 60_000);
    assert!(first[0].is_ok());
    // Equal weights: the keys alternate (FIFO within each) until "a" is at its limit of 3.
    assert_eq!(h.pick(A, &[Q], 10), vec![a[1], b[0], a[2], b[1], b[2]]);
    let picked = h.pick(A, &[Q], 10);
    let got = h.claim_ids(A, &picked, 60_000);
    assert!(got.iter().all(|r| r.is_ok()));
    let running = |key: &str| h.m.shards.iter().map(|s| s.running_with_key(A, key)).sum::<u32>();
    assert_eq!((running("a"), running("b")), (3, 3));
    assert_eq!(h.pick(A, &[Q], 10), vec![], "both keys full");
    assert_eq!(h.m.rebuilt().pick(A, &queues(&[Q]), 10), vec![], "a rebuild counts the running tasks again");
}

#[test]
fn a_chained_completion_creates_its_follow_ups_all_or_nothing() {
    let mut h = Harness::new();
    let parent = h.add(A, Q);
    let t = h.claim_one(A, 60_000);
    let follow = |h: &mut Harness, queue: &str| {
        let mut n = h.spec(A, queue);
        n.id = TaskId::new(h.time, parent.placement(), h.next_id);
        n.parent = Some(parent);
        n
    };
    let (f1, f2) = (follow(&mut h, "next"), follow(&mut h, "next"));
    let chained = |f: Vec<NewTask>| AckAction::CompleteWith { result: b"r".to_vec(), follow_ups: f };
    // A stale token: refused, and nothing is created.
    assert_eq!(h.ack(parent, A, token(&t) + 1, chained(vec![f1.clone(), f2.clone()])), Err(Rejected::LeaseLost));
    assert_eq!((h.state(f1.id), h.state(f2.id)), (None, None));
    // A follow-up id that exists (or lives in another shard) refuses the whole completion.
    let clash = NewTask { id: parent, ..f2.clone() };
    assert_eq!(h.ack(parent, A, token(&t), chained(vec![f1.clone(), clash])), Err(Rejected::IdExists));
    assert_eq!((h.state(parent), h.state(f1.id)), (Some(TaskState::InProgress), None));
    // Accepted: the completion and both follow-ups in one entry, in order.
    let out = h.ack(parent, A, token(&t), chained(vec![f1.clone(), f2.clone()])).expect("applied");
    assert_eq!(out.state, TaskState::Completed);
    assert_eq!(h.task(parent).follow_ups, vec![f1.id, f2.id]);
    assert_eq!((h.task(f1.id).parent, h.task(f1.id).state), (Some(parent), TaskState::Pending));
    assert_eq!(h.pick(A, &["next"], 10), vec![f1.id, f2.id], "FIFO in the order given");
    // The same completion sent again (another proposer stamped other ids): applied once, nothing new.
    let (g1, g2) = (follow(&mut h, "next"), follow(&mut h, "next"));
    assert_eq!(h.ack(parent, A, token(&t), chained(vec![g1.clone(), g2])).map(|o| o.state), Ok(TaskState::Completed));
    assert_eq!(h.state(g1.id), None);
}

fn dependent(h: &mut Harness, deps: &[TaskId], rule: DependencyRule) -> TaskId {
    let mut spec = h.spec(A, Q);
    spec.depends_on = deps.to_vec();
    spec.dependency_rule = rule;
    h.enqueue(spec)
}

fn resolve(h: &mut Harness, task_id: TaskId, dependency: TaskId) -> Response {
    let outcome = h.m.task(&dependency).map(|t| t.state);
    h.apply(Command::ResolveDependencies(vec![DependencyResolved { task_id, dependency, outcome }]))
}

#[test]
fn dependencies_hold_a_task_until_their_rule_is_met_or_cancel_it() {
    let mut h = Harness::new();
    let (a, b) = (h.add(A, "deps"), h.add(A, "deps"));
    let all_done = dependent(&mut h, &[a, b], DependencyRule::AllCompleted);
    let all_ended = dependent(&mut h, &[a, b], DependencyRule::AllResolved);
    assert_eq!(h.pick(A, &[Q], 10), vec![], "held tasks are not claimable");
    assert_eq!(h.claim_ids(A, &[all_done], 1_000)[0].clone().map(|t| t.id), Err(Rejected::NotClaimable));
    assert_eq!(h.task(all_done).waiting_on, vec![a, b]);
    let counts = machine_counts(&h.m)[&QueueKey { tenant: A.into(), queue: Q.into() }];
    assert_eq!((counts.pending, counts.delayed), (0, 2), "held tasks count as delayed");

    let ta = h.claim_ids(A, &[a], 1_000)[0].clone().expect("claimed");
    h.ack(a, A, token(&ta), complete()).expect("a completed");
    assert_eq!(resolve(&mut h, all_done, a), Response::Resolved(1));
    assert_eq!(resolve(&mut h, all_done, a), Response::Resolved(0), "a resolution is applied once");
    assert_eq!(h.task(all_done).waiting_on, vec![b]);
    let tb = h.claim_ids(A, &[b], 1_000)[0].clone().expect("claimed");
    h.ack(b, A, token(&tb), fail(false)).expect("b failed");
    // All-completed can no longer be met: cancelled. All-resolved: ready once both ended.
    resolve(&mut h, all_done, b);
    let t = h.task(all_done);
    assert_eq!(t.state, TaskState::Cancelled);
    assert!(t.last_error.as_deref().is_some_and(|e| e.contains("FAILED")), "{:?}", t.last_error);
    resolve(&mut h, all_ended, a);
    assert_eq!(h.pick(A, &[Q], 10), vec![], "still waiting on b");
    resolve(&mut h, all_ended, b);
    assert_eq!(h.pick(A, &[Q], 10), vec![all_ended]);
    assert_eq!(h.m.rebuilt().pick(A, &queues(&[Q]), 10), vec![all_ended]);
}

#[test]
fn a_held_task_survives_a_rebuild_and_can_be_cancelled_or_time_out() {
    let mut h = Harness::new();
    let a = h.add(A, "deps");
    let held = dependent(&mut h, &[a], DependencyRule::AllCompleted);
    let mut spec = h.spec(A, Q);
    spec.depends_on = vec![a];
    spec.deadline = Some(h.time + 1_000);
    let timed = h.enqueue(spec);
    let r = h.m.rebuilt();
    let waiting: Vec<TaskId> =
        r.shards.iter().flat_map(|s| s.waiters().get(&a).into_iter().flatten().copied()).collect();
    assert_eq!(waiting.len(), 2);
    assert_eq!(h.cancel(A, held), Ok(TaskState::Cancelled));
    h.advance(1_000);
    assert_eq!(h.task(timed).last_error.as_deref(), Some(DEADLINE_EXCEEDED));
    assert!(h.m.shards.iter().all(|s| s.waiters().is_empty()), "nothing waits any more");
    // A gone dependency (removed after its retention) counts as not completed.
    let b = h.add(A, "deps");
    let c = dependent(&mut h, &[b], DependencyRule::AllResolved);
    h.apply(Command::ResolveDependencies(vec![DependencyResolved { task_id: c, dependency: b, outcome: None }]));
    assert_eq!(h.pick(A, &[Q], 10), vec![c]);
}

#[test]
fn a_schedule_fires_each_occurrence_once_into_its_own_shard() {
    let mut h = Harness::new();
    let id = TaskId::new(h.time, 7, 7);
    let template = h.spec(A, "cron");
    let sch = Schedule {
        id,
        tenant: A.into(),
        name: "n".into(),
        spec: ScheduleSpec::Interval { every_ms: 1_000 },
        missed: MissedPolicy::Skip,
        paused: false,
        created_at: 0,
        last_occurrence: None,
        fired: 0,
        template: template.clone(),
    };
    let Response::Schedule(Ok(Some(created))) = h.apply(Command::CreateSchedule(Box::new(sch))) else { panic!() };
    assert_eq!(created.created_at, h.now(), "creation time is the entry's");
    let task = |h: &Harness, n: u64| {
        Some(Box::new(NewTask { id: TaskId::new(h.time, id.placement(), 100 + n), ..template.clone() }))
    };
    let occ = created.created_at + 1_000;
    assert_eq!(h.apply(Command::FireSchedule { id, occurrence: occ, task: task(&h, 1) }), Response::Fired(true));
    // The same occurrence again (a second leader, a retry): nothing.
    assert_eq!(h.apply(Command::FireSchedule { id, occurrence: occ, task: task(&h, 2) }), Response::Fired(false));
    let made: Vec<&Task> = h.m.tasks().filter(|t| t.scheduled.is_some()).collect();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].scheduled, Some((id, occ)));
    assert_eq!(made[0].id.shard(SHARDS), id.shard(SHARDS));
    // A skipped occurrence moves on without a task; a paused schedule fires nothing.
    assert_eq!(h.apply(Command::FireSchedule { id, occurrence: occ + 1_000, task: None }), Response::Fired(true));
    let pause = Command::UpdateSchedule { tenant: A.into(), id, paused: true, delete: false };
    assert!(matches!(h.apply(pause), Response::Schedule(Ok(Some(s))) if s.paused));
    assert_eq!(
        h.apply(Command::FireSchedule { id, occurrence: occ + 2_000, task: task(&h, 3) }),
        Response::Fired(false)
    );
    let r = h.m.rebuilt();
    let kept = &r.shards[id.shard(SHARDS)].schedules()[&id];
    assert_eq!((kept.last_occurrence, kept.fired, kept.paused), (Some(occ + 1_000), 1, true), "survives a rebuild");
    let foreign = Command::UpdateSchedule { tenant: B.into(), id, paused: false, delete: true };
    assert_eq!(h.apply(foreign), Response::Schedule(Err(Rejected::NotFound)), "tenants see only their own");
    let delete = Command::UpdateSchedule { tenant: A.into(), id, paused: false, delete: true };
    assert_eq!(h.apply(delete), Response::Schedule(Ok(None)));
    assert!(h.m.shards.iter().all(|s| s.schedules().is_empty()));
}

#[test]
fn rebuilt_machine_has_the_same_indexes_and_claim_order() {
    let mut h = Harness::new();
    for p in [3, 1, 3, 7, 0, 7] {
        let mut s = h.spec(A, Q);
        s.priority = p;
        h.enqueue(s);
    }
    let mut s = h.spec(A, Q);
    s.visible_at = h.time + 5_000;
    h.enqueue(s);
    let mut s = h.spec(B, "other");
    s.idempotency_key = Some("k".to_string());
    h.enqueue(s);
    let claimed = h.claim(A, &[Q], 3, 2_000);
    h.ack(claimed[0].id, A, token(&claimed[0]), complete()).expect("current token");
    h.ack(claimed[1].id, A, token(&claimed[1]), nack(Some(0))).expect("current token");
    let mut s = h.spec(A, Q);
    s.max_attempts = 1;
    s.priority = 9;
    let dead = h.enqueue(s);
    h.dead_letter(dead);
    h.cancel(A, h.pick(A, &[Q], 1)[0]).expect("pending");

    let r = h.m.rebuilt();
    assert_indexes_match_records(&r);
    assert_eq!(index_sizes(&r), index_sizes(&h.m));
    assert_eq!(machine_counts(&r), machine_counts(&h.m));
    for (live, rebuilt) in h.m.shards.iter().zip(&r.shards) {
        assert_eq!(rebuilt.next_due(), live.next_due());
    }
    for tenant in [A, B] {
        for qs in [&[Q][..], &["other"], &[Q, "other"]] {
            assert_eq!(r.pick(tenant, &queues(qs), 100), h.m.pick(tenant, &queues(qs), 100));
        }
    }

    // Both go on identically: expiries, promotions and claims.
    let mut r = Harness { m: r, time: h.time, next_id: h.next_id, log: Vec::new() };
    for dt in [1_000, 2_000, 5_000] {
        h.advance(dt);
        r.advance(dt);
        let a = h.claim(A, &[Q], 2, 1_000);
        let b = r.claim(A, &[Q], 2, 1_000);
        assert_eq!(a, b);
        assert_eq!(records(&h.m), records(&r.m));
        assert_eq!(index_sizes(&h.m), index_sizes(&r.m));
    }
}

// ---- revoked leases: deliveries ended without their worker ------------------------------------------------

impl Harness {
    /// Applies `command` at `time` and returns the deliveries it ended without their worker.
    fn revoked_by(&mut self, time: TimeMs, command: Command) -> Vec<RevokedLease> {
        self.time = time;
        let (_, fx) = self.m.apply(&Request::new(time, 7, command));
        assert_indexes_match_records(&self.m);
        fx.revoked
    }
}

#[test]
fn cancelling_a_running_task_reports_its_delivery_as_revoked() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let t = h.claim_one(A, 10_000);
    let cancel = Command::Cancel { tenant: A.to_string(), task_id: id };
    let revoked = h.revoked_by(h.time, cancel.clone());
    assert_eq!(revoked, vec![RevokedLease { task_id: id, token: token(&t), outcome: RunOutcome::Cancelled }]);
    assert!(h.revoked_by(h.time, cancel).is_empty(), "a second cancel ends nothing");
    // A pending task has no delivery to revoke.
    let pending = h.add(A, Q);
    assert!(h.revoked_by(h.time, Command::Cancel { tenant: A.to_string(), task_id: pending }).is_empty());
}

#[test]
fn an_expired_lease_and_a_passed_deadline_report_the_delivery_they_end() {
    let mut h = Harness::new();
    let id = h.add(A, Q);
    let start = h.time;
    let t = h.claim_one(A, 1_000);
    assert!(h.revoked_by(start + 999, Command::Tick).is_empty(), "not yet due");
    let revoked = h.revoked_by(start + 1_000, Command::Tick);
    assert_eq!(revoked, vec![RevokedLease { task_id: id, token: token(&t), outcome: RunOutcome::LeaseExpired }]);

    let mut s = h.spec(A, "deadlines");
    s.deadline = Some(h.time + 5_000);
    let id = h.enqueue(s);
    let t = h.claim(A, &["deadlines"], 1, 60_000).pop().expect("claimed");
    let revoked = h.revoked_by(h.time + 5_000, Command::Tick);
    assert_eq!(revoked, vec![RevokedLease { task_id: id, token: token(&t), outcome: RunOutcome::DeadlineExceeded }]);
}

#[test]
fn the_workers_own_outcomes_and_extensions_revoke_nothing() {
    let mut h = Harness::new();
    for action in every_action() {
        let id = h.add(A, Q);
        let t = h.claim_one(A, 10_000);
        let heartbeat = Command::Ack(vec![ack_item(id, A, token(&t), AckAction::Heartbeat { extend_ms: 5_000 })]);
        assert!(h.revoked_by(h.time, heartbeat).is_empty());
        let ack = Command::Ack(vec![ack_item(id, A, token(&t), action.clone())]);
        assert!(h.revoked_by(h.time, ack).is_empty(), "{action:?}");
        // Whatever it left behind (a pending retry, a held lease) goes away before the next action.
        let _ = h.cancel(A, id);
    }
}

proptest::proptest! {
    /// Task ids order as their bytes do: the layers (maps by `TaskId`) and the shard files (keys by bytes) are
    /// merged in one order by the read views, and a listing's cursor is a task id.
    #[test]
    fn task_ids_order_as_their_bytes(a in proptest::array::uniform16(proptest::num::u8::ANY),
                                     b in proptest::array::uniform16(proptest::num::u8::ANY),
                                     common in 0usize..16) {
        // Ids sharing a prefix, as ids of one millisecond do.
        let mut b = b;
        b[..common].copy_from_slice(&a[..common]);
        proptest::prop_assert_eq!(TaskId(a).cmp(&TaskId(b)), a.cmp(&b));
        proptest::prop_assert_eq!(TaskId(a).partial_cmp(&TaskId(b)), Some(a.cmp(&b)));
    }

    /// A printed id is its bytes as 32 lowercase hex digits, in order, and parses back to the same id (the API,
    /// the CLI and stored cursors rely on both).
    #[test]
    fn task_ids_print_as_hex_and_parse_back(a in proptest::array::uniform16(proptest::num::u8::ANY)) {
        let printed = TaskId(a).to_string();
        let expected: String = a.iter().map(|b| format!("{b:02x}")).collect();
        proptest::prop_assert_eq!(&printed, &expected);
        proptest::prop_assert_eq!(printed.parse::<TaskId>(), Ok(TaskId(a)));
    }
}
