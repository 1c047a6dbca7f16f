//! Flow control (issue 17): a queue's and a tenant's depth limit hold enqueues on the leader for room
//! (`depth_hold_ms`), then refuse them whole with `QUEUE_FULL` (gRPC `RESOURCE_EXHAUSTED`, REST 429 with
//! `Retry-After`); a queue's running cap holds claims back; limits are
//! replicated state that survives a restart and a leader change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use raftq_proto::v1::jobs_client::JobsClient;
use serde_json::json;
use tonic::transport::Channel;

use crate::rest::http;
use crate::support::*;

async fn jobs(addr: &str) -> JobsClient<Channel> {
    JobsClient::new(channel(addr).await)
}

/// Waits until the node runs cluster version 2, where limits exist (a fresh node raises it within a second).
async fn wait_version_2(n: &TestNode) {
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), move || shared.cluster_version() >= 2).await;
}

fn limits(queue: &str, max_running: u32, max_depth: u64) -> pb::QueueLimits {
    pb::QueueLimits { queue: queue.into(), max_running, max_depth }
}

async fn pending(c: &mut Client, queue: &str) -> u64 {
    let s = c.queue_stats(pb::QueueStatsRequest { queues: vec![queue.into()] }).await.expect("stats").into_inner();
    s.queues.first().map(|q| q.pending + q.delayed).unwrap_or(0)
}

fn complete(t: &pb::Task) -> pb::AckRequest {
    let token = t.lease.as_ref().expect("claimed").token;
    pb::AckRequest { task_id: t.id.clone(), token, action: Some(Action::Complete(pb::Complete::default())) }
}

fn batch(queue: &str, n: usize) -> pb::EnqueueBatchRequest {
    pb::EnqueueBatchRequest { items: (0..n).map(|i| enq(queue, &i.to_string())).collect() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_depth_limit_refuses_enqueues_whole_with_a_retry_hint_until_tasks_are_taken() {
    // Refused at once (no hold): the refusals below come back without waiting for room.
    let n = TestNode::start_with(|c| c.depth_hold_ms = 0).await;
    wait_version_2(&n).await;
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    let mut j = jobs(&addr).await;
    let set = j.set_queue_limits(limits("dq", 0, 5)).await.expect("set").into_inner();
    assert_eq!((set.queue.as_str(), set.max_running, set.max_depth), ("dq", 0, 5));

    c.enqueue_batch(batch("dq", 4)).await.expect("4 of 5 fit");
    // Two more do not fit: refused whole, nothing applied.
    let e = c.enqueue_batch(batch("dq", 2)).await.expect_err("over the limit");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::ResourceExhausted, "QUEUE_FULL"), "{e:?}");
    let hint: u64 = e.metadata().get("x-raftq-retry-after-ms").expect("hint").to_str().unwrap().parse().unwrap();
    assert!((100..=30_000).contains(&hint), "{hint}");
    assert!(e.message().contains("depth limit is 5"), "{}", e.message());
    assert_eq!(pending(&mut c, "dq").await, 4, "nothing of the refused batch was applied");
    c.enqueue(enq("dq", "fifth")).await.expect("the fifth fits");
    let e = c.enqueue(enq("dq", "sixth")).await.expect_err("full");
    assert_eq!(reason(&e), "QUEUE_FULL");
    c.enqueue(enq("other", "x")).await.expect("another queue has no limit");

    // REST: 429 with Retry-After and the JSON error body.
    let a = n.node().http_addr;
    let (code, headers, body) = http(a, "POST", "/v1/tasks", Some(json!({"queue": "dq", "payload": "x"}))).await;
    assert_eq!((code, body["error"]["code"].as_str()), (429, Some("QUEUE_FULL")), "{body}");
    assert!(headers.iter().any(|(k, v)| k == "retry-after" && v.parse::<u64>().is_ok()), "{headers:?}");

    // Depth is waiting tasks: claiming two makes room for two.
    let claimed = claim_now(&mut c, "dq", 2).await;
    assert_eq!(claimed.len(), 2);
    c.enqueue_batch(batch("dq", 2)).await.expect("room again");
    assert_eq!(reason(&c.enqueue(enq("dq", "x")).await.expect_err("full again")), "QUEUE_FULL");

    // The tenant's limit counts every queue: 5 waiting in dq and 1 in other already.
    let (code, _, t) = http(a, "PUT", "/v1/limits", Some(json!({"max_depth": 7}))).await;
    assert_eq!((code, t["queue"].as_str(), t["max_depth"].as_u64()), (200, Some(""), Some(7)), "{t}");
    c.enqueue(enq("third", "x")).await.expect("the seventh waiting task of the tenant");
    let e = c.enqueue(enq("fourth", "x")).await.expect_err("the tenant is full");
    assert!(reason(&e) == "QUEUE_FULL" && e.message().contains("tenant 'default'"), "{e:?}");
    let (code, _, bad) = http(a, "PUT", "/v1/limits", Some(json!({"max_running": 3}))).await;
    assert_eq!((code, bad["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{bad}");
    let (code, _, bad) = http(a, "PUT", "/v1/queues/dq/limits", Some(json!({"max_depth": 0}))).await;
    assert_eq!((code, bad["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{bad}");

    // Shown in the capacity view, listed, counted in metrics, and kept across a restart.
    let (_, _, cap) = http(a, "GET", "/v1/queues/dq/capacity", None).await;
    assert_eq!((cap["max_depth"].as_u64(), cap["max_running"].is_null()), (Some(5), true), "{cap}");
    let (_, _, list) = http(a, "GET", "/v1/limits", None).await;
    assert_eq!(
        list["limits"],
        json!([{"queue": "", "max_running": null, "max_depth": 7},
        {"queue": "dq", "max_running": null, "max_depth": 5}])
    );
    let (_, _, metrics) = crate::rest::exchange(a, "GET", "/metrics", None).await;
    let refused = counter(&metrics, "raftq_enqueue_refused_full_total");
    assert!(refused >= 5, "{refused}");
    assert_eq!(counter(&metrics, "raftq_enqueue_held_full_total"), 0, "depth_hold_ms = 0 holds nothing");
    let mut n = n;
    n.stop().await;
    n.restart().await;
    let mut c = n.client().await;
    let e = c.enqueue(enq("dq", "x")).await.expect_err("still full after a restart");
    assert_eq!(reason(&e), "QUEUE_FULL");

    // Removing the limits (both absent) lets everything in.
    let a = n.node().http_addr;
    let (code, _, cleared) = http(a, "PUT", "/v1/queues/dq/limits", Some(json!({}))).await;
    assert_eq!((code, cleared["max_depth"].is_null()), (200, true), "{cleared}");
    http(a, "PUT", "/v1/limits", Some(json!({"max_depth": null}))).await;
    c.enqueue_batch(batch("dq", 10)).await.expect("no limit any more");
    let (_, _, list) = http(a, "GET", "/v1/limits", None).await;
    assert_eq!(list["limits"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_cap_holds_claims_back_and_a_freed_slot_wakes_a_parked_claim() {
    let n = TestNode::start().await;
    wait_version_2(&n).await;
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    jobs(&addr).await.set_queue_limits(limits("cq", 3, 0)).await.expect("cap 3");
    c.enqueue_batch(batch("cq", 20)).await.expect("enqueue");
    c.enqueue_batch(batch("free", 5)).await.expect("enqueue");

    // Four workers ask for five each at once: three tasks are handed out in all.
    let claim = |count, wait_ms| pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec!["cq".into(), "free".into()],
        count,
        lease_ms: 30_000,
        wait_ms,
    };
    let mut calls = Vec::new();
    for _ in 0..4 {
        let mut c = n.client().await;
        calls.push(tokio::spawn(async move { c.claim(claim(5, 300)).await.expect("claim").into_inner().tasks }));
    }
    let mut held = Vec::new();
    for call in calls {
        held.extend(call.await.expect("join"));
    }
    let capped: Vec<&pb::Task> = held.iter().filter(|t| t.queue == "cq").collect();
    assert_eq!(capped.len(), 3, "the cap: {:?}", held.iter().map(|t| &t.queue).collect::<Vec<_>>());
    assert_eq!(held.len(), 8, "the uncapped queue is served beside it");

    // A claim parks on the capped queue and is woken when a running task ends.
    let mut c2 = n.client().await;
    let parked = tokio::spawn(async move {
        let t0 = Instant::now();
        let req = pb::ClaimRequest { queues: vec!["cq".into()], ..claim(5, 10_000) };
        (c2.claim(req).await.expect("claim").into_inner().tasks, t0.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let done = capped[0];
    c.ack(complete(done)).await.expect("complete");
    let (got, waited) = parked.await.expect("join");
    assert_eq!(got.len(), 1, "exactly the freed slot");
    assert!(waited < Duration::from_secs(5), "woken by the completion, not by its hold time: {waited:?}");
    let s = c.queue_stats(pb::QueueStatsRequest { queues: vec!["cq".into()] }).await.expect("stats").into_inner();
    assert_eq!(s.queues[0].in_progress, 3);
    let cap = jobs(&addr).await.queue_capacity(pb::QueueCapacityRequest { queues: vec!["cq".into()] }).await;
    let cap = cap.expect("capacity").into_inner().queues;
    assert_eq!((cap[0].running, cap[0].max_running, cap[0].max_depth), (3, 3, 0));
}

/// Many workers race for a capped queue while the cap is changed: the number running never passes the cap in
/// force (sampled from the leader's counts after every claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_never_run_more_than_the_cap() {
    let n = TestNode::start_with(|c| c.lease_min_ms = 50).await;
    wait_version_2(&n).await;
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    jobs(&addr).await.set_queue_limits(limits("race", 4, 0)).await.expect("cap 4");
    c.enqueue_batch(batch("race", 300)).await.expect("enqueue");
    let shared = n.node().shared.clone();
    let worst = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..6 {
        let mut c = n.client().await;
        let (shared, worst) = (shared.clone(), worst.clone());
        workers.push(tokio::spawn(async move {
            let mut done = 0;
            while done < 40 {
                let req = pb::ClaimRequest {
                    worker_id: format!("w{w}"),
                    queues: vec!["race".into()],
                    count: 3,
                    lease_ms: 30_000,
                    wait_ms: 200,
                };
                let tasks = c.claim(req).await.expect("claim").into_inner().tasks;
                let running = shared.queue_counts("default", "race").in_progress;
                worst.fetch_max(running, Ordering::Relaxed);
                for t in tasks {
                    c.ack(complete(&t)).await.expect("complete");
                    done += 1;
                }
            }
            done
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await.expect("worker");
    }
    assert!(worst.load(Ordering::Relaxed) <= 4, "ran {} at once", worst.load(Ordering::Relaxed));
    assert!(worst.load(Ordering::Relaxed) >= 2, "the workers did overlap");
    let s = c.queue_stats(pb::QueueStatsRequest { queues: vec!["race".into()] }).await.expect("stats").into_inner();
    assert_eq!(s.queues[0].completed, total);
}

/// Claims and completes tasks of `queue` through one node until `stop`; errors (a node gone, an unknown
/// outcome) are part of the run: a task whose answer was lost runs until its lease ends.
async fn churn(addr: String, queue: &'static str, stop: Arc<std::sync::atomic::AtomicBool>) {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    let mut c = raftq_proto::v1::task_service_client::TaskServiceClient::new(ch);
    while !stop.load(Ordering::Relaxed) {
        let req = pb::ClaimRequest {
            worker_id: format!("w-{addr}"),
            queues: vec![queue.into()],
            count: 2,
            lease_ms: 2_000,
            wait_ms: 200,
        };
        let Ok(tasks) = c.claim(req).await.map(|r| r.into_inner().tasks) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        for t in tasks {
            let _ = c.ack(complete(&t)).await;
        }
    }
}

/// The most runs of `tasks` open at once, in state-machine time (a run is open from its claim until it ends).
/// Runs starting and ending in the same millisecond count as not overlapping, so this can only under-count.
fn most_running_at_once(tasks: &[pb::Task]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for r in tasks.iter().flat_map(|t| &t.runs) {
        edges.push((r.started_at_ms, 1));
        edges.push((if r.ended_at_ms == 0 { i64::MAX } else { r.ended_at_ms }, -1));
    }
    // Ends before starts at the same time.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// A real 3-node cluster, workers claiming a capped queue through the followers, the leader killed with -9 and
/// brought back: from every task's runs (state-machine time, the same on every replica), never more than the cap
/// ran at once, before, across and after the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_cap_holds_across_a_leader_kill() {
    use crate::procs::*;
    const CAP: u32 = 3;
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.wait_cluster_version(leader, 2, Duration::from_secs(20)).await;
    let followers: Vec<String> = c.nodes.iter().filter(|n| n.id != leader).map(|n| n.grpc.clone()).collect();
    jobs(&followers[0]).await.set_queue_limits(limits("capf", CAP, 0)).await.expect("cap, forwarded to the leader");
    let mut p = connect(&followers[1]).await;
    for _ in 0..3 {
        p.enqueue_batch(batch("capf", 300)).await.expect("enqueue");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..6).map(|i| tokio::spawn(churn(followers[i % 2].clone(), "capf", stop.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.node(leader).kill9();
    let killed_ms = raftq::leader::proposer::wall_clock_ms() as i64;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.node(leader).start();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let now = c.wait_leader(Duration::from_secs(10)).await;
    let addr = c.node(now).grpc.clone();
    let mut j = jobs(&addr).await;
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListTasksRequest { queue: "capf".into(), page_size: 1000, page_token, ..Default::default() };
        let page = j.list_tasks(req).await.expect("list").into_inner();
        tasks.extend(page.tasks);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(tasks.len(), 900);
    let runs: usize = tasks.iter().map(|t| t.runs.len()).sum();
    assert!(runs > 30, "the workers ran tasks: {runs} runs");
    let after = tasks.iter().flat_map(|t| &t.runs).filter(|r| r.started_at_ms > killed_ms + 500).count();
    assert!(after > 10, "claims went on under the next leader: {after} runs");
    let most = most_running_at_once(&tasks);
    assert!(most <= CAP as usize, "{most} ran at once under a cap of {CAP}");
    assert_eq!(most, CAP as usize, "the workers kept the queue at its cap");
    c.wait_digests_agree(Duration::from_secs(20)).await;
}

fn counter(metrics: &str, name: &str) -> u64 {
    let line = metrics.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("no {name}"));
    line.split(' ').nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

async fn node_counter(n: &TestNode, name: &str) -> u64 {
    let (_, _, metrics) = crate::rest::exchange(n.node().http_addr, "GET", "/metrics", None).await;
    counter(&metrics, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_into_a_full_queue_waits_on_the_leader_for_room_then_is_refused() {
    const HOLD: Duration = Duration::from_millis(5_000);
    let n = TestNode::start_with(|c| c.depth_hold_ms = HOLD.as_millis() as u64).await;
    wait_version_2(&n).await;
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    jobs(&addr).await.set_queue_limits(limits("hq", 0, 3)).await.expect("depth 3");
    c.enqueue_batch(batch("hq", 3)).await.expect("fills the queue");

    // Three single enqueues find the queue full: they wait on the leader instead of being refused.
    let held: Vec<_> = (0..3)
        .map(|i| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let t0 = Instant::now();
                let r = c.enqueue(enq("hq", &format!("held {i}"))).await;
                (r, t0.elapsed(), Instant::now())
            })
        })
        .collect();
    let deadline = Instant::now() + HOLD / 2;
    while node_counter(&n, "raftq_enqueue_held_full_total").await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(node_counter(&n, "raftq_enqueue_held_full_total").await, 3, "three enqueues wait");
    assert!(held.iter().all(|h| !h.is_finished()), "the enqueues wait for room");
    assert_eq!(pending(&mut c, "hq").await, 3, "nothing past the limit got in");
    // A batch that could never fit is refused at once, held by nobody.
    let e = c.enqueue_batch(batch("hq", 4)).await.expect_err("4 never fit in 3");
    assert_eq!(reason(&e), "QUEUE_FULL");
    assert_eq!(node_counter(&n, "raftq_enqueue_held_full_total").await, 3, "the batch was not held");

    // Two claims make room for two: two of the held enqueues get in right after, the third is refused when its
    // hold runs out, and the queue never holds more than its limit.
    let claimed_at = Instant::now();
    assert_eq!(claim_now(&mut c, "hq", 2).await.len(), 2);
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for h in held {
        match h.await.expect("join") {
            (Ok(_), _, done) => admitted.push(done.duration_since(claimed_at)),
            (Err(e), took, _) => {
                assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::ResourceExhausted, "QUEUE_FULL"), "{e:?}");
                assert!(e.metadata().get("x-raftq-retry-after-ms").is_some(), "a refusal after the hold has a hint");
                refused.push(took);
            }
        }
    }
    assert_eq!(
        (admitted.len(), refused.len()),
        (2, 1),
        "admitted {admitted:?} after the claim, refused after {refused:?}"
    );
    assert!(admitted.iter().all(|t| *t < HOLD / 2), "let in as room came, not at the hold's end: {admitted:?}");
    assert!(refused[0] >= HOLD - Duration::from_millis(100), "refused only once the hold ran out: {refused:?}");
    assert_eq!(pending(&mut c, "hq").await, 3);
    let refusals = node_counter(&n, "raftq_enqueue_refused_full_total").await;
    assert_eq!(refusals, 5, "the batch of 4 and the last held one");

    // Two limits, both full for it: a batch that would fit the queue's limit later (5 of 6, with 3 waiting) but
    // never fits the tenant's is refused at once, for the tenant's, never held.
    jobs(&addr).await.set_queue_limits(limits("hq", 0, 6)).await.expect("depth 6");
    let a = n.node().http_addr;
    let (code, _, _) = http(a, "PUT", "/v1/limits", Some(json!({"max_depth": 4}))).await;
    assert_eq!(code, 200);
    let t0 = Instant::now();
    let e = c.enqueue_batch(batch("hq", 5)).await.expect_err("5 never fit the tenant's 4");
    assert!(reason(&e) == "QUEUE_FULL" && e.message().contains("tenant 'default'"), "{e:?}");
    assert!(t0.elapsed() < HOLD, "{:?}", t0.elapsed());
    assert_eq!(node_counter(&n, "raftq_enqueue_held_full_total").await, 3, "the batch was not held");
    c.enqueue(enq("hq", "fourth")).await.expect("the tenant's fourth waiting task fits");
}

/// A real 3-node cluster: enqueues waiting on the leader for room when an operator moves leadership are answered
/// `NOT_LEADER` there (nothing applied) and routed to the new leader, also after they have waited longer than a
/// request is routed without one (`LEADER_WAIT`, 5 s): the new leader holds them against its own counts and lets
/// in as many as claims make room for. Sent to the old leader, to the new one and to the third node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_waiting_for_room_follow_a_leadership_transfer() {
    use crate::procs::*;
    const HOLD: Duration = Duration::from_millis(8_000);
    let mut c = ProcCluster::start(3, &format!("{FAST}depth_hold_ms = {}\n", HOLD.as_millis())).await;
    let old = c.wait_leader(Duration::from_secs(10)).await;
    c.wait_cluster_version(old, 2, Duration::from_secs(20)).await;
    let new = old % 3 + 1;
    let node = |id: u64| c.nodes.iter().find(|n| n.id == id).expect("node");
    let grpc = |id: u64| node(id).grpc.clone();
    jobs(&grpc(old)).await.set_queue_limits(limits("tq", 0, 3)).await.expect("depth 3");
    let mut on_old = connect(&grpc(old)).await;
    on_old.enqueue_batch(batch("tq", 3)).await.expect("fills the queue");

    let sent = Instant::now();
    let held: Vec<_> = (1..=3u64)
        .map(|id| {
            let addr = grpc(id);
            tokio::spawn(async move {
                let r = connect(&addr).await.enqueue(enq("tq", &format!("via {id}"))).await;
                (id, r)
            })
        })
        .collect();
    let held_on = |id: u64| async move { node(id).metric("raftq_enqueue_held_full_total").await.unwrap_or(0.0) as u64 };
    let deadline = Instant::now() + HOLD / 2;
    while held_on(old).await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held_on(old).await, 3, "the three enqueues wait on the leader");
    // Past the routing budget of the calls, then the transfer.
    tokio::time::sleep(Duration::from_millis(5_300).saturating_sub(sent.elapsed())).await;
    assert!(held.iter().all(|h| !h.is_finished()), "still waiting for room");
    let mut admin = node(new).admin().await.expect("admin");
    let moved = admin.transfer_leader(pb::TransferLeaderRequest { to: new, timeout_ms: 10_000 }).await;
    assert_eq!(moved.expect("transfer").into_inner().leader_id, new);

    // The new leader holds them in turn: nothing was applied by the old one.
    let deadline = Instant::now() + HOLD / 2;
    while held_on(new).await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held_on(new).await, 3, "the new leader holds all three");
    assert!(held.iter().all(|h| !h.is_finished()), "routed, not answered");
    let mut on_new = connect(&grpc(new)).await;
    assert_eq!(pending(&mut on_new, "tq").await, 3, "nothing past the limit got in");
    assert_eq!(claim_now(&mut on_new, "tq", 2).await.len(), 2);
    let mut admitted = Vec::new();
    for h in held {
        match h.await.expect("join") {
            (id, Ok(_)) => admitted.push(id),
            (id, Err(e)) => assert_eq!(reason(&e), "QUEUE_FULL", "sent to node {id}: {e:?}"),
        }
    }
    assert_eq!(admitted.len(), 2, "room for two: {admitted:?}");
    assert_eq!(pending(&mut on_new, "tq").await, 3);
    let listed = jobs(&grpc(new))
        .await
        .list_tasks(pb::ListTasksRequest { queue: "tq".into(), page_size: 100, ..Default::default() })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    for id in &admitted {
        let via = format!("via {id}");
        let copies = listed.iter().filter(|t| t.payload.as_ref() == via.as_bytes()).count();
        assert_eq!(copies, 1, "the enqueue sent to node {id} applied once");
    }
    assert_eq!(listed.len(), 5, "3 + 2 admitted");
    c.wait_digests_agree(Duration::from_secs(20)).await;
}

/// The SDK's producer stream meets a full queue: refused creates wait the server's hint, holding their room in
/// the stream's in-flight limit, and get in once workers make room; past `request_timeout` they end refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_stream_waits_out_a_full_queue_and_gives_up_after_its_timeout() {
    use raftq_client::{NewTask, Producer, ProducerConfig};
    let n = TestNode::start().await;
    wait_version_2(&n).await;
    let addr = n.node().grpc_addr.to_string();
    jobs(&addr).await.set_queue_limits(limits("sq", 0, 5)).await.expect("depth 5");
    let p = Producer::connect(ProducerConfig { addrs: vec![addr.clone()], ..Default::default() }).await.expect("sdk");
    let s = p.stream().await.expect("stream");
    let mut creates = Vec::new();
    for i in 0..8 {
        creates.push(s.create(NewTask::new("sq", format!("t{i}"))).await.expect("on the stream"));
    }
    let all = tokio::spawn(futures::future::join_all(creates));
    let mut c = n.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pending(&mut c, "sq").await < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pending(&mut c, "sq").await, 5, "five got in, three wait");
    assert!(!all.is_finished(), "the refused creates are still waiting for room");
    for t in claim_now(&mut c, "sq", 3).await {
        c.ack(complete(&t)).await.expect("complete");
    }
    let results = all.await.expect("join");
    assert!(results.iter().all(|r| r.is_ok()), "every create got in: {results:?}");
    assert_eq!(pending(&mut c, "sq").await, 5);

    // Nobody makes room: a create gives up after the producer's request timeout, refused (nothing applied).
    let cfg = ProducerConfig { addrs: vec![addr], request_timeout: Duration::from_millis(800), ..Default::default() };
    let quick = Producer::connect(cfg).await.expect("sdk");
    let s = quick.stream().await.expect("stream");
    let t0 = Instant::now();
    let e = s.create(NewTask::new("sq", "late")).await.expect("sent").await.expect_err("still full");
    assert_eq!(e.reason(), Some("QUEUE_FULL"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(pending(&mut c, "sq").await, 5);
}

/// Producer flow control holds enqueues on the leader, never acks. Enqueues and acks share the coalescer's rounds
/// (both in one append when both are queued), so while the enqueues wait for room an ack goes alone; an ack held
/// behind them would keep its worker's slot, and claims (which earn the room) would stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_is_answered_while_enqueues_wait_for_flow_control_room() {
    use raftq::leader::flow::WINDOW;
    let n = TestNode::start_with(|c| {
        c.flow_backlog = 1;
        c.flow_max_wait_ms = 30_000;
        c.write_timeout_ms = 60_000;
    })
    .await;
    let mut c = n.client().await;
    c.enqueue_batch(batch("fq", 3)).await.expect("enqueue");
    let claimed = claim_now(&mut c, "fq", 1).await;
    assert_eq!(claimed.len(), 1);
    // The workers' side says they wait behind a full claim pipeline (what the dispatcher measures), with two
    // tasks ready over a backlog of one: enqueues are paced, and no claim comes to earn them room.
    let flow = n.node().flow.clone();
    let starving = tokio::spawn(async move {
        loop {
            flow.measured(WINDOW, WINDOW, tokio::time::Instant::now());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let mut producer = n.client().await;
    let held = tokio::spawn(async move { producer.enqueue(enq("fq", "held")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "the enqueue waits for room");

    let acked = tokio::time::timeout(Duration::from_secs(10), c.ack(complete(&claimed[0])))
        .await
        .expect("the ack is not held behind the paced enqueue")
        .expect("ack")
        .into_inner();
    assert_eq!(acked.state, pb::TaskState::Completed as i32);
    assert!(!held.is_finished(), "the enqueue still waits");

    // Once the workers' side is quiet again (its last measurement expires), the held enqueue goes in.
    starving.abort();
    let id = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("let in once pacing ends")
        .expect("task")
        .expect("enqueued")
        .into_inner()
        .task_id;
    assert!(!id.is_empty());
    assert_eq!(pending(&mut c, "fq").await, 3, "two left of the batch and the held one");
}
