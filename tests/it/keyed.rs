//! Debounce and singleton keys (issue 17) on a real node: over gRPC and REST, the refusal's reason and status,
//! and the key records across a snapshot, a restart and a leader kill.

use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use serde_json::json;

use crate::rest::http;
use crate::support::*;

async fn wait_version_3(n: &TestNode) {
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
}

fn debounced(queue: &str, payload: &str, key: &str, delay_ms: u64) -> pb::EnqueueRequest {
    let debounce = Some(pb::Debounce { key: key.into(), delay_ms, max_wait_ms: 0 });
    pb::EnqueueRequest { debounce, ..enq(queue, payload) }
}

fn singleton(queue: &str, payload: &str, key: &str, mode: pb::SingletonMode) -> pb::EnqueueRequest {
    let singleton = Some(pb::Singleton { key: key.into(), mode: mode as i32 });
    pb::EnqueueRequest { singleton, ..enq(queue, payload) }
}

async fn get(c: &mut Client, id: &str) -> pb::Task {
    c.get_task(pb::GetTaskRequest { id: id.into() }).await.expect("get").into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_over_grpc_replaces_the_pending_task_until_it_is_claimed() {
    let n = TestNode::start().await;
    wait_version_3(&n).await;
    let mut c = n.client().await;
    let first = c.enqueue(debounced("db", "one", "doc-42", 60_000)).await.expect("enqueue").into_inner();
    assert!(!first.duplicate && !first.debounced, "{first:?}");
    let before = get(&mut c, &first.task_id).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = c.enqueue(debounced("db", "two", "doc-42", 60_000)).await.expect("enqueue").into_inner();
    assert_eq!(
        (again.task_id.as_str(), again.duplicate, again.debounced),
        (first.task_id.as_str(), true, true),
        "the pending task took it"
    );
    let after = get(&mut c, &first.task_id).await;
    assert_eq!(after.payload, b"two"[..]);
    assert!(
        after.visible_at_ms > before.visible_at_ms,
        "the start moved: {} -> {}",
        before.visible_at_ms,
        after.visible_at_ms
    );
    // Due at once (delay 0) and claimed: the next enqueue creates a task.
    let now = c.enqueue(debounced("db", "three", "doc-42", 0)).await.expect("enqueue").into_inner();
    assert_eq!(now.task_id, first.task_id);
    let claimed = claim_now(&mut c, "db", 10).await;
    assert_eq!(claimed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec![first.task_id.as_str()]);
    assert_eq!(claimed[0].payload, b"three"[..]);
    let next = c.enqueue(debounced("db", "four", "doc-42", 60_000)).await.expect("enqueue").into_inner();
    assert!(next.task_id != first.task_id && !next.duplicate && !next.debounced, "{next:?}");
    // Refused combinations.
    let with_idem = pb::EnqueueRequest { idempotency_key: "i".into(), ..debounced("db", "x", "k", 1) };
    let e = c.enqueue(with_idem).await.expect_err("idempotency key and debounce");
    assert_eq!(reason(&e), "INVALID_ARGUMENT", "{e:?}");
    let with_delay = pb::EnqueueRequest { delay_ms: 5, ..debounced("db", "x", "k", 1) };
    let e = c.enqueue(with_delay).await.expect_err("delay and debounce");
    assert_eq!(reason(&e), "INVALID_ARGUMENT", "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn singleton_over_grpc_refuses_or_skips_while_active_and_allows_after_the_end() {
    let n = TestNode::start().await;
    wait_version_3(&n).await;
    let mut c = n.client().await;
    let refuse = |p: &str| singleton("sg", p, "nightly", pb::SingletonMode::Refuse);
    let first = c.enqueue(refuse("1")).await.expect("enqueue").into_inner();
    assert!(!first.duplicate);
    let e = c.enqueue(refuse("2")).await.expect_err("refused while pending");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::AlreadyExists, "SINGLETON_ACTIVE"), "{e:?}");
    assert!(e.message().contains(&first.task_id), "names the active task: {}", e.message());
    let skip = c.enqueue(singleton("sg", "2", "nightly", pb::SingletonMode::Skip)).await.expect("skip").into_inner();
    assert_eq!((skip.task_id.as_str(), skip.duplicate, skip.debounced), (first.task_id.as_str(), true, false));
    // In a batch: that item's error, the others go through.
    let items = vec![refuse("3"), singleton("sg", "3", "other", pb::SingletonMode::Refuse)];
    let r = c.enqueue_batch(pb::EnqueueBatchRequest { items }).await.expect("batch").into_inner();
    match &r.results[0].result {
        Some(pb::enqueue_result::Result::Error(err)) => assert_eq!(err.code, "SINGLETON_ACTIVE", "{err:?}"),
        other => panic!("the active key's item was not refused: {other:?}"),
    }
    assert!(matches!(&r.results[1].result, Some(pb::enqueue_result::Result::Ok(o)) if !o.duplicate));
    let t = claim_now(&mut c, "sg", 1).await.remove(0);
    assert_eq!(t.id, first.task_id);
    let e = c.enqueue(refuse("4")).await.expect_err("refused while running");
    assert_eq!(reason(&e), "SINGLETON_ACTIVE");
    let token = t.lease.as_ref().expect("lease").token;
    let done = Action::Complete(pb::Complete { result: b"ok".to_vec().into(), follow_ups: vec![] });
    c.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(done) }).await.expect("complete");
    let metrics = n.node().shared.metrics.clone();
    let counted = |m: &std::sync::atomic::AtomicU64| m.load(std::sync::atomic::Ordering::Relaxed);
    // Refused: the single one while pending, the batch item, the one while running; skipped: one.
    assert_eq!((counted(&metrics.singleton_refused), counted(&metrics.singleton_skipped)), (3, 1));
    let next = c.enqueue(refuse("5")).await.expect("allowed after completion").into_inner();
    assert!(next.task_id != first.task_id && !next.duplicate);
    c.cancel(pb::CancelRequest { id: next.task_id.clone() }).await.expect("cancel");
    let third = c.enqueue(refuse("6")).await.expect("allowed after cancel").into_inner();
    assert!(third.task_id != next.task_id && !third.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_and_singleton_over_rest_with_a_409_naming_the_active_task() {
    let n = TestNode::start().await;
    wait_version_3(&n).await;
    let a = n.node().http_addr;
    let body = json!({"queue": "rs", "payload": "a", "singleton": {"key": "s1"}});
    let (s, _, first) = http(a, "POST", "/v1/tasks", Some(body.clone())).await;
    assert_eq!(s, 201, "{first}");
    let id = first["task_id"].as_str().expect("id").to_string();
    let (s, _, refused) = http(a, "POST", "/v1/tasks", Some(body)).await;
    assert_eq!(s, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "SINGLETON_ACTIVE", "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains(&id)), "{refused}");
    let skip = json!({"queue": "rs", "payload": "b", "singleton": {"key": "s1", "mode": "skip"}});
    let (s, _, skipped) = http(a, "POST", "/v1/tasks", Some(skip)).await;
    assert_eq!((s, &skipped["task_id"], &skipped["duplicate"]), (201, &json!(id), &json!(true)), "{skipped}");
    let bad = json!({"queue": "rs", "singleton": {"key": "s1", "mode": "sometimes"}});
    let (s, _, e) = http(a, "POST", "/v1/tasks", Some(bad)).await;
    assert_eq!((s, &e["error"]["code"]), (400, &json!("INVALID_ARGUMENT")), "{e}");

    let deb = |p: &str| json!({"queue": "rs", "payload": p, "debounce": {"key": "d1", "delay_ms": 60000, "max_wait_ms": 120000}});
    let (s, _, d1) = http(a, "POST", "/v1/tasks", Some(deb("x"))).await;
    assert_eq!((s, &d1["debounced"]), (201, &json!(false)), "{d1}");
    let (_, _, d2) = http(a, "POST", "/v1/tasks/batch", Some(json!({"items": [deb("y")]}))).await;
    let r = &d2["results"][0];
    assert_eq!((&r["task_id"], &r["duplicate"], &r["debounced"]), (&d1["task_id"], &json!(true), &json!(true)), "{d2}");
    let path = format!("/v1/tasks/{}", d1["task_id"].as_str().expect("id"));
    let (_, _, t) = http(a, "GET", &path, None).await;
    assert_eq!(t["payload"], "y", "{t}");
    let (_, _, metrics) = crate::rest::exchange(a, "GET", "/metrics", None).await;
    for line in [
        "raftq_enqueue_debounced_total 1",
        "raftq_enqueue_singleton_refused_total 1",
        "raftq_enqueue_singleton_skipped_total 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in /metrics");
    }
}

/// The records are replicated state: a snapshot (the log before it purged) and a restart find them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_across_a_snapshot_and_a_restart() {
    let mut n = TestNode::start_with(|c| {
        c.snapshot_every_entries = 10;
        c.snapshot_keep_entries = 0;
    })
    .await;
    wait_version_3(&n).await;
    let mut c = n.client().await;
    let s = c.enqueue(singleton("rk", "s", "one", pb::SingletonMode::Refuse)).await.expect("enqueue").into_inner();
    let d = c.enqueue(debounced("rk", "d1", "deb", 600_000)).await.expect("enqueue").into_inner();
    for i in 0..30 {
        c.enqueue(enq("filler", &i.to_string())).await.expect("filler");
    }
    let snapshots = raftq::raft::metrics(&n.node().raft).snapshot;
    assert!(snapshots.is_some(), "a snapshot was built");
    n.stop().await;
    n.restart().await;
    wait_version_3(&n).await;
    let mut c = n.client().await;
    let e = c.enqueue(singleton("rk", "s2", "one", pb::SingletonMode::Refuse)).await.expect_err("still active");
    assert_eq!(reason(&e), "SINGLETON_ACTIVE");
    assert!(e.message().contains(&s.task_id), "{}", e.message());
    let again = c.enqueue(debounced("rk", "d2", "deb", 600_000)).await.expect("enqueue").into_inner();
    assert_eq!((again.task_id.as_str(), again.debounced), (d.task_id.as_str(), true));
    assert_eq!(get(&mut c, &d.task_id).await.payload, b"d2"[..]);
}

/// Three processes: the keys set through a follower hold on the new leader after the old one is killed (the
/// records are replicated with their tasks), and keyed enqueues go on through a survivor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_across_a_leader_kill() {
    let mut c = crate::procs::ProcCluster::start(3, crate::procs::FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.nodes.iter().find(|n| n.id != leader).expect("a follower").id;
    c.wait_cluster_version(follower, 3, Duration::from_secs(20)).await;
    let mut client = c.node(follower).ready().await;
    let s = client.enqueue(singleton("lk", "s", "one", pb::SingletonMode::Refuse)).await.expect("singleton");
    let s = s.into_inner().task_id;
    let d = client.enqueue(debounced("lk", "d1", "deb", 600_000)).await.expect("debounce").into_inner().task_id;
    c.node(leader).kill9();
    let new_leader = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let mut client = c.node(follower).ready().await;
    let e = client.enqueue(singleton("lk", "s2", "one", pb::SingletonMode::Refuse)).await.expect_err("held");
    assert_eq!(reason(&e), "SINGLETON_ACTIVE", "{e:?}");
    assert!(e.message().contains(&s), "{}", e.message());
    let again = client.enqueue(debounced("lk", "d2", "deb", 600_000)).await.expect("debounce").into_inner();
    assert_eq!((again.task_id.as_str(), again.debounced), (d.as_str(), true));
    assert_eq!(get(&mut client, &d).await.payload, b"d2"[..]);
    c.wait_digests_agree(Duration::from_secs(30)).await;
}
