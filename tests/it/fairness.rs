//! Weighted fair dispatch (issue 17) on real nodes: a flooding key does not hold back a key that comes later,
//! weights are served in proportion, weights are set and listed over gRPC, REST and the CLI's SDK calls,
//! survive a restart, and are refused before the cluster runs version 2; a slot held back from a flooding key
//! serves another key at once.

use std::collections::HashMap;
use std::time::Duration;

use raftq::config::Peer;
use raftq::node::{Listeners, Node};
use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::rest::http;
use crate::support::*;

/// A concurrency limit no test reaches: the keys here are fairness keys, not throttles.
const NO_LIMIT: u32 = 1_000_000;

async fn jobs(n: &TestNode) -> JobsClient<Channel> {
    JobsClient::new(channel(&n.node().grpc_addr.to_string()).await)
}

/// Waits until the node runs cluster version 2 (the gate raises it within a second of the first election).
async fn wait_version_2(n: &TestNode) {
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 2).await;
}

/// Enqueues `count` tasks of a concurrency key in batches of 500.
async fn flood(c: &mut Client, queue: &str, key: &str, count: usize) {
    let item = |i: usize| pb::EnqueueRequest {
        concurrency_key: key.into(),
        concurrency_limit: NO_LIMIT,
        ..enq(queue, &format!("{key}-{i}"))
    };
    let items: Vec<pb::EnqueueRequest> = (0..count).map(item).collect();
    for chunk in items.chunks(500) {
        let r = c.enqueue_batch(pb::EnqueueBatchRequest { items: chunk.to_vec() }).await.expect("batch");
        assert!(r.into_inner().results.iter().all(|r| matches!(r.result, Some(pb::enqueue_result::Result::Ok(_)))));
    }
}

/// Claims in batches of `batch` until `total` tasks are claimed; the concurrency key of each, in claim order.
async fn claim_keys(c: &mut Client, queue: &str, batch: u32, total: usize) -> Vec<String> {
    let mut keys = Vec::new();
    while keys.len() < total {
        let req = pb::ClaimRequest {
            worker_id: "w".into(),
            queues: vec![queue.into()],
            count: batch,
            lease_ms: 600_000,
            wait_ms: 2_000,
        };
        let tasks = c.claim(req).await.expect("claim").into_inner().tasks;
        assert!(!tasks.is_empty(), "nothing to claim after {}", keys.len());
        keys.extend(tasks.into_iter().map(|t| t.concurrency_key));
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_enqueued_after_a_flood_is_claimed_within_the_first_claims() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    flood(&mut c, "fair", "a", 2_000).await;
    flood(&mut c, "fair", "b", 20).await;
    let keys = claim_keys(&mut c, "fair", 10, 100).await;
    let last_b = keys.iter().rposition(|k| k == "b").expect("b was served");
    assert_eq!(keys.iter().filter(|k| *k == "b").count(), 20, "{keys:?}");
    assert!(last_b < 60, "b's 20 tasks took until claim {last_b}: {keys:?}");
}

/// One claim of a task of `queue`, waiting up to `wait_ms`: its key, id and token (None if nothing came).
async fn claim_one(c: &mut Client, queue: &str, wait_ms: u64) -> Option<(String, String, u64)> {
    let req =
        pb::ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], count: 1, lease_ms: 600_000, wait_ms };
    let t = c.claim(req).await.expect("claim").into_inner().tasks.into_iter().next()?;
    let token = t.lease.as_ref().expect("a claimed task has a lease").token;
    Some((t.concurrency_key, t.id, token))
}

/// The reserve (README, "Fair dispatch"): with an operator's override holding a flooding key one below the
/// workers' slots, the spare slot's claim stays parked while the key has thousands ready, and takes another key's
/// task as it arrives; a slot of the flooding key that comes free goes back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_back_from_a_flooding_key_takes_another_keys_task_as_it_arrives() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
    let mut c = n.client().await;
    flood(&mut c, "reserve", "a", 1_000).await;
    let mut j = jobs(&n).await;
    let set = pb::SetConcurrencyOverrideRequest { key: "a".into(), limit: 2, ..Default::default() };
    j.set_concurrency_override(set).await.expect("override");

    // Three slots: two run a's tasks, the third finds a at its limit and parks.
    let first = claim_one(&mut c, "reserve", 0).await.expect("a's first");
    let second = claim_one(&mut c, "reserve", 0).await.expect("a's second");
    assert_eq!((first.0.as_str(), second.0.as_str()), ("a", "a"));
    let mut spare = n.client().await;
    let parked = tokio::spawn(async move { claim_one(&mut spare, "reserve", 10_000).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!parked.is_finished(), "the spare slot got a task of a past its override");

    let b = pb::EnqueueRequest { concurrency_key: "b".into(), concurrency_limit: NO_LIMIT, ..enq("reserve", "b-0") };
    c.enqueue(b).await.expect("enqueue b");
    let got = tokio::time::timeout(Duration::from_secs(5), parked).await.expect("b within 5 s").expect("join");
    assert_eq!(got.expect("the parked claim was answered with a task").0, "b");

    // A slot of a comes free: the next claim is a's again (a gets every slot but the one held back).
    let (_, id, token) = first;
    let action = pb::ack_request::Action::Complete(pb::Complete { result: vec![].into(), follow_ups: vec![] });
    c.ack(pb::AckRequest { task_id: id, token, action: Some(action) }).await.expect("complete");
    let next = claim_one(&mut c, "reserve", 2_000).await.expect("a slot of a came free");
    assert_eq!(next.0, "a");
    assert!(claim_one(&mut c, "reserve", 0).await.is_none(), "a is at its override again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_3_to_1_are_served_within_5_percent() {
    let n = TestNode::start().await;
    wait_version_2(&n).await;
    let mut c = n.client().await;
    let mut j = jobs(&n).await;
    let set = pb::SetFairnessWeightRequest { queue: "w31".into(), key: "heavy".into(), weight: 3 };
    let k = j.set_fairness_weight(set).await.expect("set").into_inner();
    assert_eq!((k.key.as_str(), k.weight), ("heavy", 3));
    flood(&mut c, "w31", "heavy", 1_500).await;
    flood(&mut c, "w31", "light", 1_500).await;
    let keys = claim_keys(&mut c, "w31", 25, 1_600).await;
    let heavy = keys.iter().filter(|k| *k == "heavy").count() as f64;
    let light = keys.iter().filter(|k| *k == "light").count() as f64;
    let ratio = heavy / light;
    assert!((ratio - 3.0).abs() <= 0.15, "served {heavy}:{light} = {ratio:.3}, not within 5% of 3");

    // The fairness view counts what is left per key.
    let list = j.list_fairness(pb::ListFairnessRequest { queue: "w31".into() }).await.expect("list").into_inner();
    let by_key: HashMap<&str, &pb::FairnessKey> = list.keys.iter().map(|k| (k.key.as_str(), k)).collect();
    assert_eq!((by_key["heavy"].weight, by_key["heavy"].ready), (3, 1_500 - heavy as u64));
    assert_eq!((by_key["light"].weight, by_key["light"].running), (1, light as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_are_set_over_rest_validated_and_survive_a_restart() {
    let mut n = TestNode::start().await;
    wait_version_2(&n).await;
    let a = n.node().http_addr;
    let (s, _, body) = http(a, "PUT", "/v1/queues/rq/fairness/cust-1", Some(json!({"weight": 4}))).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!((body["key"].as_str(), body["weight"].as_u64()), (Some("cust-1"), Some(4)));
    let (s, _, body) = http(a, "PUT", "/v1/queues/rq/fairness", Some(json!({"weight": 2}))).await;
    assert_eq!((s, body["key"].as_str(), body["weight"].as_u64()), (200, Some(""), Some(2)), "{body}");
    for (path, weight) in [("/v1/queues/rq/fairness/x", json!(0)), ("/v1/queues/rq/fairness/x", json!(1_001))] {
        let (s, _, body) = http(a, "PUT", path, Some(json!({ "weight": weight }))).await;
        assert_eq!((s, body["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");
    }
    let (s, _, body) = http(a, "PUT", "/v1/queues/bad%20name/fairness/x", Some(json!({"weight": 2}))).await;
    assert_eq!((s, body["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");

    n.stop().await;
    n.restart().await;
    let (s, _, body) = http(a_of(&n), "GET", "/v1/queues/rq/fairness", None).await;
    assert_eq!(s, 200, "{body}");
    let weights: Vec<(String, u64)> = body["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| (k["key"].as_str().unwrap_or_default().to_string(), k["weight"].as_u64().unwrap_or_default()))
        .collect();
    assert_eq!(weights, vec![(String::new(), 2), ("cust-1".to_string(), 4)], "replicated state, read back");
    // Weight 1 is the default: the key leaves the view (it has no ready tasks).
    let (s, _, _) = http(a_of(&n), "PUT", "/v1/queues/rq/fairness/cust-1", Some(json!({"weight": 1}))).await;
    assert_eq!(s, 200);
    let (_, _, body) = http(a_of(&n), "GET", "/v1/queues/rq/fairness", None).await;
    assert_eq!(body["keys"].as_array().map(Vec::len), Some(1), "{body}");
}

fn a_of(n: &TestNode) -> std::net::SocketAddr {
    n.node().http_addr
}

/// Two in-process nodes of a three-node membership whose third member never starts: the gate cannot ask it,
/// so the cluster stays at version 0 and a weight, a rate limit or a queue cap (version 2), and a debounce or
/// singleton enqueue or a concurrency key override (version 3), are refused with FEATURE_NOT_ACTIVE, nothing
/// proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_rates_limits_and_keyed_enqueues_are_refused_before_their_cluster_version() {
    let dirs = [tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir")];
    let addr = || format!("127.0.0.1:{}", free_port());
    let peers: Vec<Peer> = (1..=3).map(|id| Peer { id, raft_addr: addr(), api_addr: addr() }).collect();
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let mut cfg = test_config(dir.path());
        cfg.node_id = i as u64 + 1;
        cfg.raft_addr = peers[i].raft_addr.clone();
        cfg.grpc_addr = peers[i].api_addr.clone();
        cfg.peers = peers.clone();
        let listeners = Listeners::bind(&cfg).await.expect("bind");
        nodes.push(Node::start(cfg, listeners, CancellationToken::new()).await.expect("start"));
    }
    let leader = |nodes: &Vec<Node>| nodes.iter().any(|n| raftq::raft::metrics(&n.raft).current_leader.is_some());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !leader(&nodes) {
        assert!(std::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give the gate a few of its rounds: it must keep the version while node 3 cannot be asked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(nodes[0].shared.cluster_version(), 0);
    let mut j = JobsClient::new(channel(&nodes[0].grpc_addr.to_string()).await);
    let set = pb::SetFairnessWeightRequest { queue: "v".into(), key: "k".into(), weight: 3 };
    let e = j.set_fairness_weight(set).await.expect_err("refused before version 2");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    let list = j.list_fairness(pb::ListFairnessRequest { queue: "v".into() }).await.expect("list").into_inner();
    assert!(list.keys.is_empty(), "nothing was applied: {list:?}");
    // The other commands of version 2 are held back the same way.
    let rate = pb::SetRateLimitRequest { queue: "v".into(), key: "k".into(), per_second: 2.0, ..Default::default() };
    let e = j.set_rate_limit(rate).await.expect_err("refused before version 2");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    let cap = pb::QueueLimits { queue: "v".into(), max_running: 1, max_depth: 0 };
    let e = j.set_queue_limits(cap).await.expect_err("refused before version 2");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    let rates = j.list_rate_limits(pb::ListRateLimitsRequest { queue: "v".into() }).await.expect("list");
    assert!(rates.into_inner().limits.is_empty(), "nothing was applied");
    // A debounce or singleton enqueue (cluster version 3) is refused the same way; a plain enqueue goes through.
    let mut c = connect(&nodes[0].grpc_addr.to_string()).await;
    let single = pb::Singleton { key: "s".into(), mode: pb::SingletonMode::Refuse as i32 };
    let e = c.enqueue(pb::EnqueueRequest { singleton: Some(single), ..enq("v", "x") }).await.expect_err("version 3");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    assert!(e.message().contains("needs cluster version 3"), "{e:?}");
    let deb = pb::Debounce { key: "d".into(), delay_ms: 0, max_wait_ms: 0 };
    let e = c.enqueue(pb::EnqueueRequest { debounce: Some(deb), ..enq("v", "x") }).await.expect_err("version 3");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    c.enqueue(enq("v", "plain")).await.expect("a plain enqueue keeps the old command");
    // So is a concurrency key override (cluster version 3): FAILED_PRECONDITION, nothing proposed.
    let set = pb::SetConcurrencyOverrideRequest { key: "k".into(), limit: 3, ttl_ms: 0, expires_at: String::new() };
    let e = j.set_concurrency_override(set).await.expect_err("refused before version 3");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::FailedPrecondition, "FEATURE_NOT_ACTIVE"), "{e:?}");
    assert!(e.message().contains("needs cluster version 3"), "{e:?}");
    let clear = pb::ClearConcurrencyOverrideRequest { key: "k".into() };
    let e = j.clear_concurrency_override(clear).await.expect_err("refused before version 3");
    assert_eq!(reason(&e), "FEATURE_NOT_ACTIVE", "{e:?}");
    let list = j.list_concurrency_overrides(pb::ListConcurrencyOverridesRequest::default()).await.expect("list");
    assert!(list.into_inner().overrides.is_empty());
    for n in nodes {
        n.stop().await;
    }
}
