//! Concurrency key overrides (issue 17) on a real node: an operator's limit replaces the one a key's tasks carry
//! (parked claims are woken when it goes up), clearing it gives the tasks' limit back at once, an expiring one
//! runs out with no further call, overrides are set, listed, cleared and refused over the SDK and REST, and the
//! next leader keeps them after a leader kill.

use std::time::Duration;

use raftq_client::{Producer, ProducerConfig};
use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;
use serde_json::json;

use crate::rest::http;
use crate::support::*;

const TENANT: &str = raftq::auth::DEFAULT_TENANT;

async fn producer(n: &TestNode) -> Producer {
    let addr = format!("http://{}", n.node().grpc_addr);
    Producer::connect(ProducerConfig { addrs: vec![addr], ..Default::default() }).await.expect("connect")
}

async fn wait_version_3(n: &TestNode) {
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
}

/// `count` tasks of `queue` under concurrency key `key`, each carrying `limit`.
async fn enqueue_keyed(c: &mut Client, queue: &str, key: &str, limit: u32, count: usize) {
    let item = |i: usize| pb::EnqueueRequest {
        concurrency_key: key.into(),
        concurrency_limit: limit,
        ..enq(queue, &format!("{key}-{i}"))
    };
    let items: Vec<pb::EnqueueRequest> = (0..count).map(item).collect();
    let r = c.enqueue_batch(pb::EnqueueBatchRequest { items }).await.expect("batch").into_inner();
    assert!(r.results.iter().all(|r| matches!(r.result, Some(pb::enqueue_result::Result::Ok(_)))));
}

async fn claim(c: &mut Client, queue: &str, wait_ms: u64) -> Vec<pb::Task> {
    let req =
        pb::ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], count: 10, lease_ms: 600_000, wait_ms };
    c.claim(req).await.expect("claim").into_inner().tasks
}

async fn complete_all(c: &mut Client, tasks: &[pb::Task]) {
    for t in tasks {
        let token = t.lease.as_ref().expect("a claimed task has a lease").token;
        let action = pb::ack_request::Action::Complete(pb::Complete { result: vec![].into(), follow_ups: vec![] });
        c.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(action) }).await.expect("complete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_raises_lowers_and_runs_out_in_place_of_the_tasks_limit() {
    let n = TestNode::start().await;
    wait_version_3(&n).await;
    let p = producer(&n).await;
    let mut c = n.client().await;
    enqueue_keyed(&mut c, "ko", "k", 1, 12).await;
    let first = claim(&mut c, "ko", 0).await;
    assert_eq!(first.len(), 1, "the tasks' limit of 1");

    // A claim parked on the full key is answered when an override raises the limit to 3.
    let mut parked_client = n.client().await;
    let parked = tokio::spawn(async move { claim(&mut parked_client, "ko", 10_000).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let set = p.set_concurrency_override("k", 3, None).await.expect("set");
    assert_eq!((set.key.as_str(), set.limit, set.expires_at_ms), ("k", 3, None));
    let woken = parked.await.expect("parked claim");
    assert_eq!(woken.len(), 2, "two more slots under the override");
    let rows = p.concurrency_overrides(None).await.expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].limit, rows[0].running, rows[0].pending), (3, 3, 9));
    assert!(claim(&mut c, "ko", 0).await.is_empty(), "at the override");

    // Lowered to 2 with 3 running: nothing that runs is touched; cleared: the tasks' limit of 1 at once.
    p.set_concurrency_override("k", 2, None).await.expect("lower");
    assert_eq!(p.concurrency_overrides(Some("k")).await.expect("list")[0].running, 3);
    assert!(p.clear_concurrency_override("k").await.expect("clear"), "one was in force");
    assert!(!p.clear_concurrency_override("k").await.expect("clear again"), "a repeat clears nothing");
    assert!(p.concurrency_overrides(None).await.expect("list").is_empty());
    complete_all(&mut c, &first).await;
    complete_all(&mut c, &woken).await;
    let one = claim(&mut c, "ko", 0).await;
    assert_eq!(one.len(), 1, "the tasks' limit again");
    complete_all(&mut c, &one).await;

    // An override of 4 for 1.5 s: four at once, then, once it ran out, one at a time with no further call.
    let set = p.set_concurrency_override("k", 4, Some(Duration::from_millis(1_500))).await.expect("set");
    let expires_at = set.expires_at_ms.expect("an expiry");
    assert!(expires_at > raftq::leader::proposer::wall_clock_ms(), "an absolute time ahead: {expires_at}");
    let four = claim(&mut c, "ko", 0).await;
    assert_eq!(four.len(), 4);
    let shared = n.node().shared.clone();
    // The leader's ticker proposes a tick at the expiry; its sweep removes the record in every shard.
    wait_until(Duration::from_secs(10), || shared.key_limits(TENANT, None, 0).is_empty()).await;
    assert!(shared.now() >= expires_at);
    complete_all(&mut c, &four).await;
    assert_eq!(claim(&mut c, "ko", 0).await.len(), 1, "the tasks' limit after the expiry");
    shared.check_indexes().expect("indexes agree with the records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_over_rest_survive_a_restart_and_bad_input_is_refused() {
    let mut n = TestNode::start().await;
    wait_version_3(&n).await;
    let a = n.node().http_addr;
    let mut c = n.client().await;
    enqueue_keyed(&mut c, "kr", "tenant-7", 2, 5).await;
    let (s, _, body) = http(a, "PUT", "/v1/concurrency-keys/tenant-7", Some(json!({"limit": 1, "ttl_s": 3600}))).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        (body["key"].as_str(), body["limit"].as_u64(), body["pending"].as_u64()),
        (Some("tenant-7"), Some(1), Some(5))
    );
    let at = body["expires_at_ms"].as_u64().expect("an expiry");
    let rfc = body["expires_at"].as_str().expect("RFC 3339").to_string();
    assert_eq!(chrono::DateTime::parse_from_rfc3339(&rfc).expect("parses").timestamp_millis() as u64, at);
    assert_eq!(claim(&mut c, "kr", 0).await.len(), 1, "the override of 1 over the tasks' 2");

    // An absolute expiry replaces it; the list shows the key's running and pending tasks.
    let until = chrono::DateTime::from_timestamp_millis(at as i64 + 60_000).expect("time").to_rfc3339();
    let (s, _, body) =
        http(a, "PUT", "/v1/concurrency-keys/tenant-7", Some(json!({"limit": 1, "expires_at": until}))).await;
    assert_eq!((s, body["expires_at_ms"].as_u64()), (200, Some(at + 60_000)), "{body}");
    let (s, _, body) = http(a, "GET", "/v1/concurrency-keys", None).await;
    assert_eq!(s, 200);
    assert_eq!(body["overrides"][0]["running"].as_u64(), Some(1), "{body}");
    assert_eq!(body["overrides"][0]["pending"].as_u64(), Some(4), "{body}");

    // Kept across a restart (a record in every shard), and still binding.
    drop(c);
    n.stop().await;
    n.restart().await;
    let a = n.node().http_addr;
    let mut c = n.client().await;
    let (s, _, body) = http(a, "GET", "/v1/concurrency-keys/tenant-7", None).await;
    assert_eq!(
        (s, body["limit"].as_u64(), body["expires_at_ms"].as_u64()),
        (200, Some(1), Some(at + 60_000)),
        "{body}"
    );
    assert!(claim(&mut c, "kr", 0).await.is_empty(), "still at the override after the restart");

    // Cleared: the tasks' limit of 2 at once; the key has no override to read.
    let (s, _, body) = http(a, "DELETE", "/v1/concurrency-keys/tenant-7", None).await;
    assert_eq!((s, body["cleared"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(claim(&mut c, "kr", 0).await.len(), 1);
    let (s, _, body) = http(a, "GET", "/v1/concurrency-keys/tenant-7", None).await;
    assert_eq!((s, body["error"]["code"].as_str()), (404, Some("NOT_FOUND")), "{body}");

    // Bad input: a clear error, nothing applied.
    let past = chrono::DateTime::from_timestamp_millis(1_000).expect("time").to_rfc3339();
    for (body, says) in [
        (json!({"limit": 0}), "limit must be 1"),
        (json!({"limit": 2, "ttl_s": -5}), "ttl_s must be a positive"),
        (json!({"limit": 2, "ttl_s": 1_000_000_000_000i64}), "at most 366 days"),
        (json!({"limit": 2, "ttl_s": 5, "expires_at": until}), "at most one of"),
        (json!({"limit": 2, "expires_at": "tomorrow"}), "RFC 3339"),
        (json!({"limit": 2, "expires_at": past}), "in the future"),
        (json!({"limit": 2, "ttl": 5}), "unknown field"),
    ] {
        let (s, _, got) = http(a, "PUT", "/v1/concurrency-keys/k", Some(body.clone())).await;
        assert_eq!((s, got["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}: {got}");
        let msg = got["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{body}: {msg}");
    }
    let mut j = JobsClient::new(channel(&n.node().grpc_addr.to_string()).await);
    let empty =
        pb::SetConcurrencyOverrideRequest { key: String::new(), limit: 2, ttl_ms: 0, expires_at: String::new() };
    let e = j.set_concurrency_override(empty).await.expect_err("an empty key");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::InvalidArgument, "INVALID_ARGUMENT"), "{e:?}");
    let list = j.list_concurrency_overrides(pb::ListConcurrencyOverridesRequest::default()).await.expect("list");
    assert!(list.into_inner().overrides.is_empty(), "nothing was applied");
}

/// Three processes: an override lowering a key's limit is replicated state, so after the leader is killed with
/// `kill -9` the next leader holds the key to it (no claim past it), and every replica ends with the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_keeps_an_override_after_a_leader_kill() {
    use crate::procs::*;
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.wait_cluster_version(leader, 3, Duration::from_secs(20)).await;
    let follower = c.nodes.iter().find(|n| n.id != leader).expect("a follower").grpc.clone();
    let mut j = JobsClient::new(channel(&follower).await);
    let set = pb::SetConcurrencyOverrideRequest { key: "k".into(), limit: 2, ttl_ms: 0, expires_at: String::new() };
    j.set_concurrency_override(set).await.expect("set, forwarded to the leader");
    let mut p = connect(&follower).await;
    enqueue_keyed(&mut p, "kf", "k", 10, 6).await;
    assert_eq!(claim(&mut p, "kf", 1_000).await.len(), 2, "the override of 2 over the tasks' 10");

    c.node(leader).kill9();
    let next = c.wait_leader(Duration::from_secs(10)).await;
    assert_ne!(next, leader);
    let addr = c.node(next).grpc.clone();
    let mut p = connect(&addr).await;
    assert!(claim(&mut p, "kf", 500).await.is_empty(), "the new leader claimed past the override");
    let mut j = JobsClient::new(channel(&addr).await);
    let list = j.list_concurrency_overrides(pb::ListConcurrencyOverridesRequest::default()).await.expect("list");
    let rows: Vec<(String, u32, u64, u64)> =
        list.into_inner().overrides.into_iter().map(|o| (o.key, o.limit, o.running, o.pending)).collect();
    assert_eq!(rows, vec![("k".to_string(), 2, 2, 4)]);
    c.node(leader).start();
    c.wait_digests_agree(Duration::from_secs(20)).await;
}
