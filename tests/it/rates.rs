//! Rate limits (issue 17) on real nodes: a key's token bucket holds its claims to burst + rate × time while
//! another key of the queue is served at full speed, parked claims are answered when tokens refill, the bucket's
//! level survives a restart, and buckets are set, listed and refused over the SDK and REST.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_client::{Producer, ProducerConfig, RateScope};
use raftq_proto::v1 as pb;
use serde_json::json;

use crate::rest::http;
use crate::support::*;

/// A concurrency limit no test reaches: the keys here are fairness keys, not concurrency throttles.
const NO_LIMIT: u32 = 1_000_000;

async fn producer(n: &TestNode) -> Producer {
    let addr = format!("http://{}", n.node().grpc_addr);
    Producer::connect(ProducerConfig { addrs: vec![addr], ..Default::default() }).await.expect("connect")
}

async fn wait_version_2(n: &TestNode) {
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 2).await;
}

async fn enqueue_keyed(c: &mut Client, queue: &str, key: &str, count: usize) {
    let item = |i: usize| pb::EnqueueRequest {
        concurrency_key: key.into(),
        concurrency_limit: NO_LIMIT,
        ..enq(queue, &format!("{key}-{i}"))
    };
    let items: Vec<pb::EnqueueRequest> = (0..count).map(item).collect();
    let r = c.enqueue_batch(pb::EnqueueBatchRequest { items }).await.expect("batch").into_inner();
    assert!(r.results.iter().all(|r| matches!(r.result, Some(pb::enqueue_result::Result::Ok(_)))));
}

fn claim_req(queue: &str, count: u32, wait_ms: u64) -> pb::ClaimRequest {
    pb::ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], count, lease_ms: 600_000, wait_ms }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_key_is_claimed_at_its_rate_while_another_key_is_served_at_full_speed() {
    const RATE: f64 = 20.0;
    const BURST: f64 = 5.0;
    let n = TestNode::start().await;
    wait_version_2(&n).await;
    let p = producer(&n).await;
    let set = p.set_rate_limit("rl", RateScope::Key("slow".into()), RATE, Some(5)).await.expect("set");
    assert_eq!((set.per_second, set.burst, set.tokens), (RATE, 5, BURST), "a new bucket starts full");
    let mut c = n.client().await;
    enqueue_keyed(&mut c, "rl", "slow", 100).await;
    enqueue_keyed(&mut c, "rl", "fast", 100).await;

    // Four workers claim as fast as they can for 2.5 s; each claimed task is noted with when it arrived.
    let start = Instant::now();
    let seen: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..4 {
        let mut c = n.client().await;
        let seen = seen.clone();
        workers.push(tokio::spawn(async move {
            while start.elapsed() < Duration::from_millis(2_500) {
                let tasks = c.claim(claim_req("rl", 10, 200)).await.expect("claim").into_inner().tasks;
                let at = start.elapsed();
                seen.lock().expect("lock").extend(tasks.into_iter().map(|t| (at, t.concurrency_key)));
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let mut seen = seen.lock().expect("lock").clone();
    seen.sort();
    let elapsed = start.elapsed().as_secs_f64();
    // At any moment the slow key had at most its burst plus what refilled since the claiming began (the bucket
    // was full then); 2 tokens of slack for timing. Ignoring the limit, all 100 would come in the first claims.
    let mut slow = 0.0;
    for (at, key) in &seen {
        if key == "slow" {
            slow += 1.0;
            let bound = BURST + RATE * at.as_secs_f64() + 2.0;
            assert!(slow <= bound, "{slow} slow claims by {at:?}, more than {bound}");
        }
    }
    // And the refills were served: the parked claims were woken as tokens came back, not only by new work.
    assert!(slow >= BURST + RATE * (elapsed - 0.7) * 0.7, "only {slow} slow claims in {elapsed:.2} s");
    let fast: Vec<Duration> = seen.iter().filter(|(_, k)| k == "fast").map(|(at, _)| *at).collect();
    assert_eq!(fast.len(), 100, "the unlimited key is served in full");
    assert!(fast[99] < Duration::from_millis(1_000), "the unlimited key waited: its last claim at {:?}", fast[99]);

    // Visible: the bucket in the list and the metric.
    let rows = p.rate_limits(Some("rl")).await.expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].scope.clone(), rows[0].ready), (RateScope::Key("slow".into()), 100 - slow as u64));
    assert!(rows[0].tokens < BURST, "{rows:?}");
    assert!(n.node().shared.metrics.throttled_claims.load(std::sync::atomic::Ordering::Relaxed) > 0);
    // The capacity view breaks the queue down by key: the slow key's waiting and running tasks.
    let cap = p.capacity(&["rl"]).await.expect("capacity");
    let key = cap[0].keys.iter().find(|k| k.key == "slow").expect("the slow key in the capacity view");
    assert_eq!((key.ready, key.running), (100 - slow as u64, slow as u64), "{:?}", cap[0].keys);
    let (s, _, body) = http(n.node().http_addr, "GET", "/v1/queues/rl/capacity", None).await;
    assert_eq!(s, 200, "{body}");
    let keys = body["keys"].as_array().expect("keys");
    let slow_row = keys.iter().find(|k| k["key"] == "slow").expect("slow key over REST");
    assert_eq!(slow_row["ready"], json!(100 - slow as u64), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_bucket_stays_drained_across_a_restart() {
    let mut n = TestNode::start().await;
    wait_version_2(&n).await;
    let a = n.node().http_addr;
    // One token per 5 s, three at once.
    let (s, _, body) =
        http(a, "PUT", "/v1/queues/rr/rate-limits/keys/k", Some(json!({"per_second": 0.2, "burst": 3}))).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        (body["key"].as_str(), body["burst"].as_u64(), body["tokens"].as_f64()),
        (Some("k"), Some(3), Some(3.0))
    );
    let mut c = n.client().await;
    enqueue_keyed(&mut c, "rr", "k", 10).await;
    let got = c.claim(claim_req("rr", 10, 500)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.len(), 3, "the burst");

    n.stop().await;
    n.restart().await;
    // A fresh bucket would give three more at once; the replicated level has none.
    let mut c = n.client().await;
    let got = c.claim(claim_req("rr", 10, 300)).await.expect("claim").into_inner().tasks;
    assert!(got.is_empty(), "claimed {} right after the restart", got.len());
    let (s, _, body) = http(n.node().http_addr, "GET", "/v1/queues/rr/rate-limits", None).await;
    assert_eq!(s, 200, "{body}");
    let limit = &body["limits"][0];
    assert_eq!(
        (limit["key"].as_str(), limit["ready"].as_u64(), limit["throttled"].as_bool()),
        (Some("k"), Some(7), Some(true))
    );
    assert!(limit["tokens"].as_f64().is_some_and(|t| t < 1.0), "{body}");
    let keys = producer(&n).await.fairness(Some("rr")).await.expect("fairness");
    assert!(
        keys.iter().any(|k| k.key == "k" && k.throttled && k.ready == 7),
        "throttled in the fairness view: {keys:?}"
    );

    // Removing the limit serves the rest at once.
    let (s, _, body) =
        http(n.node().http_addr, "PUT", "/v1/queues/rr/rate-limits/keys/k", Some(json!({"per_second": 0}))).await;
    assert_eq!((s, body["per_second"].as_f64()), (200, Some(0.0)), "{body}");
    let got = c.claim(claim_req("rr", 10, 500)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_queue_bucket_holds_every_key_and_bad_limits_are_refused() {
    let n = TestNode::start().await;
    wait_version_2(&n).await;
    let a = n.node().http_addr;
    let (s, _, body) = http(a, "PUT", "/v1/queues/wq/rate-limits", Some(json!({"per_second": 1, "burst": 4}))).await;
    assert_eq!((s, body["key"].is_null()), (200, true), "{body}");
    let (s, _, body) = http(a, "PUT", "/v1/queues/wq/rate-limits/unkeyed", Some(json!({"per_second": 100}))).await;
    assert_eq!((s, body["key"].as_str(), body["burst"].as_u64()), (200, Some(""), Some(100)), "default burst: {body}");
    let mut c = n.client().await;
    enqueue_keyed(&mut c, "wq", "a", 5).await;
    enqueue_keyed(&mut c, "wq", "b", 5).await;
    c.enqueue(enq("wq", "plain")).await.expect("enqueue");
    let got = c.claim(claim_req("wq", 20, 300)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.len(), 4, "the queue's burst, across its keys");
    let keys: std::collections::HashSet<&str> = got.iter().map(|t| t.concurrency_key.as_str()).collect();
    assert!(keys.len() >= 2, "still fair across keys: {keys:?}");

    for (path, body) in [
        ("/v1/queues/wq/rate-limits", json!({"per_second": -1})),
        ("/v1/queues/wq/rate-limits", json!({"per_second": 0.0001})),
        ("/v1/queues/wq/rate-limits", json!({"per_second": 1, "burst": 2_000_000})),
        ("/v1/queues/wq/rate-limits", json!({"burst": 3})),
        ("/v1/queues/bad%20name/rate-limits", json!({"per_second": 1})),
    ] {
        let (s, _, answer) = http(a, "PUT", path, Some(body.clone())).await;
        assert_eq!((s, answer["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body} -> {answer}");
    }
    let (_, _, list) = http(a, "GET", "/v1/queues/wq/rate-limits", None).await;
    let limits = list["limits"].as_array().expect("limits");
    assert_eq!(limits.len(), 2, "{list}");
    assert!(limits[0]["key"].is_null(), "the whole queue's first: {list}");
}

/// Three processes: the leader that served a key's burst is killed with `kill -9`; the next leader continues the
/// same bucket (replicated, level included), so a claim right after the failover is still throttled, and every
/// replica ends with the same state (the digests, which cover the bucket records, agree).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_continues_the_same_bucket_after_a_leader_kill() {
    use crate::procs::*;
    use raftq_proto::v1::jobs_client::JobsClient;
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.wait_cluster_version(leader, 2, Duration::from_secs(20)).await;
    let follower = c.nodes.iter().find(|n| n.id != leader).expect("a follower").grpc.clone();
    let mut j = JobsClient::new(channel(&follower).await);
    // One token per 10 s, three at once: no election takes long enough to refill one.
    let set =
        pb::SetRateLimitRequest { queue: "rf".into(), key: "k".into(), whole_queue: false, per_second: 0.1, burst: 3 };
    j.set_rate_limit(set).await.expect("set, forwarded to the leader");
    let mut p = connect(&follower).await;
    enqueue_keyed(&mut p, "rf", "k", 10).await;
    let got = p.claim(claim_req("rf", 10, 1_000)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.len(), 3, "the burst");

    c.node(leader).kill9();
    let next = c.wait_leader(Duration::from_secs(10)).await;
    assert_ne!(next, leader);
    let addr = c.node(next).grpc.clone();
    let mut p = connect(&addr).await;
    let got = p.claim(claim_req("rf", 10, 500)).await.expect("claim").into_inner().tasks;
    assert!(got.is_empty(), "the new leader gave {} more: it started a fresh bucket", got.len());
    let mut j = JobsClient::new(channel(&addr).await);
    let list = j.list_rate_limits(pb::ListRateLimitsRequest { queue: "rf".into() }).await.expect("list").into_inner();
    assert_eq!(list.limits.len(), 1, "{list:?}");
    let l = &list.limits[0];
    assert!(l.tokens < 1.0 && l.throttled && l.ready == 7, "{l:?}");
    c.node(leader).start();
    c.wait_digests_agree(Duration::from_secs(20)).await;
}
