//! The webhook outbox: one delivery per end of a task, outcomes, and deliveries outliving their tasks.

use super::*;

impl Harness {
    fn hooked(&mut self) -> TaskId {
        let mut s = self.spec(A, Q);
        s.webhook_url = Some(HOOK.to_string());
        s.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string());
        self.enqueue(s)
    }

    fn deliveries_of(&self, id: TaskId) -> Vec<WebhookDelivery> {
        self.m.deliveries().filter(|d| d.id.task_id == id).cloned().collect()
    }

    fn report(&mut self, reports: Vec<WebhookReport>) -> u32 {
        match self.apply(Command::WebhookOutcome(reports)) {
            Response::WebhooksRecorded(n) => n,
            other => panic!("webhook outcome answered {other:?}"),
        }
    }
}

#[test]
fn every_end_of_a_task_with_a_webhook_url_writes_one_delivery_in_its_shard() {
    let mut h = Harness::new();
    let plain = h.add(A, Q);
    let t = h.claim_one(A, 1_000);
    h.ack(plain, A, token(&t), complete()).expect("complete");

    let done = h.hooked();
    let t = h.claim_one(A, 1_000);
    h.ack(done, A, token(&t), AckAction::Complete { result: b"sent".to_vec() }).expect("complete");
    let failed = h.hooked();
    let t = h.claim_one(A, 1_000);
    h.ack(failed, A, token(&t), fail(false)).expect("fail");
    let cancelled = h.hooked();
    h.cancel(A, cancelled).expect("cancel");
    let retried = h.hooked();
    let t = h.claim_one(A, 1_000);
    h.ack(retried, A, token(&t), nack(Some(60_000))).expect("nack");

    assert!(h.deliveries_of(plain).is_empty(), "no URL, no delivery");
    assert!(h.deliveries_of(retried).is_empty(), "a retry does not end the task");
    for (id, state) in [(done, TaskState::Completed), (failed, TaskState::Failed), (cancelled, TaskState::Cancelled)] {
        let d = h.deliveries_of(id);
        assert_eq!(d.len(), 1, "{d:?}");
        let d = &d[0];
        let stored = &h.m.stores[id.shard(SHARDS)].outbox;
        assert!(stored.contains_key(&d.id), "the delivery lives in the task's shard");
        let t = h.task(id);
        assert_eq!((d.state, d.url.as_str(), d.tries, d.next_at), (state, HOOK, 0, h.now()));
        assert_eq!((d.attempts, &d.result, &d.error), (t.attempts, &t.result, &t.last_error));
        assert_eq!((d.ended_at, d.created_at), (t.ended_at.expect("ended"), t.created_at));
        assert_eq!(d.traceparent, t.traceparent);
    }
    assert_eq!(h.deliveries_of(done)[0].result.as_deref(), Some(b"sent".as_slice()));

    // Dead-lettered, then cancelled: two ends, two deliveries.
    let dead = h.hooked();
    h.dead_letter(dead);
    h.cancel(A, dead).expect("cancel");
    let states: Vec<TaskState> = h.deliveries_of(dead).iter().map(|d| d.state).collect();
    assert_eq!(states, vec![TaskState::DeadLettered, TaskState::Cancelled]);
}

#[test]
fn webhook_outcomes_reschedule_or_remove_and_stale_reports_change_nothing() {
    let mut h = Harness::new();
    let id = h.hooked();
    h.cancel(A, id).expect("cancel");
    let d = h.deliveries_of(id).remove(0);
    let due = |h: &Harness, at: TimeMs| -> Vec<DeliveryId> {
        h.m.shards.iter().flat_map(|c| c.due_deliveries(at, 10, &HashSet::new())).map(|k| k.1).collect()
    };
    assert_eq!(due(&h, h.now()), vec![d.id]);

    let retry_at = h.now() + 5_000;
    let retry = WebhookOutcome::Retry { at: retry_at, error: "HTTP 500".into() };
    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 0, outcome: retry.clone() }]), 1);
    let after = h.deliveries_of(id).remove(0);
    assert_eq!((after.tries, after.next_at, after.last_error.as_deref()), (1, retry_at, Some("HTTP 500")));
    assert!(due(&h, h.now()).is_empty(), "not due before its retry time");
    assert_eq!(due(&h, retry_at), vec![d.id]);

    // The same attempt reported again (a second sender, a resent entry): nothing changes.
    let before = h.deliveries_of(id);
    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 0, outcome: retry }]), 0);
    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 0, outcome: WebhookOutcome::Delivered }]), 0);
    assert_eq!(h.deliveries_of(id), before);

    // A restart rebuilds the outbox index from the records.
    assert_eq!(h.m.rebuilt().shards.iter().map(|c| c.pending_deliveries()).sum::<usize>(), 1);

    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 1, outcome: WebhookOutcome::Delivered }]), 1);
    assert!(h.deliveries_of(id).is_empty());
    assert!(due(&h, u64::MAX).is_empty());
    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 1, outcome: WebhookOutcome::Delivered }]), 0);

    let other = h.hooked();
    h.cancel(A, other).expect("cancel");
    let d = h.deliveries_of(other).remove(0);
    let gave_up = WebhookOutcome::GaveUp { error: "refused".into() };
    assert_eq!(h.report(vec![WebhookReport { id: d.id, tries: 0, outcome: gave_up }]), 1);
    assert!(h.deliveries_of(other).is_empty());
}

#[test]
fn a_delivery_outlives_its_task_after_retention() {
    let mut h = Harness::new();
    let mut s = h.spec(A, Q);
    s.webhook_url = Some(HOOK.to_string());
    s.retention_ms = 10;
    let id = h.enqueue(s);
    h.cancel(A, id).expect("cancel");
    h.advance(100);
    assert_eq!(h.state(id), None, "removed by retention");
    assert_eq!(h.deliveries_of(id).len(), 1, "its delivery still waits");
}
