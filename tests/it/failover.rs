//! What followers answer while the leader is gone, with real processes: every refusal carries a documented
//! reason (`x-raftq-reason`), never a raw transport error: `NOT_LEADER` (with no leader named) when nothing was
//! sent, `UNKNOWN_OUTCOME` when a forwarded write may have been applied; a read is simply served by the next
//! leader.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::task_service_client::TaskServiceClient;

use crate::procs::*;
use crate::support::*;

/// A client whose own deadline is longer than any the server keeps a request (routing gives up after 5 s), so
/// every error seen is the server's answer.
fn patient_client(addr: &str) -> Client {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .timeout(Duration::from_secs(20))
        .connect_lazy();
    TaskServiceClient::new(ch)
}

/// Writes and reads on one node until `stop`: counts answers, keeps every refusal as (reason, status).
async fn load(addr: String, stop: Arc<AtomicBool>, ok: Arc<AtomicUsize>, refused: Arc<Mutex<Vec<(String, String)>>>) {
    let mut c = patient_client(&addr);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let r = if i.is_multiple_of(2) {
            c.enqueue(enq("failover", &format!("{addr}-{i}"))).await.map(drop)
        } else {
            c.queue_stats(pb::QueueStatsRequest { queues: vec![] }).await.map(drop)
        };
        match r {
            Ok(()) => _ = ok.fetch_add(1, Ordering::Relaxed),
            Err(s) => refused.lock().expect("lock").push((reason(&s), format!("{s:?}"))),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_leader_is_killed_followers_answer_with_documented_reasons() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let followers: Vec<String> = c.nodes.iter().filter(|n| n.id != leader).map(|n| n.grpc.clone()).collect();
    for f in &followers {
        patient_client(f).enqueue(enq("failover", "warm")).await.expect("a follower forwards to the leader");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for f in &followers {
        for _ in 0..2 {
            jobs.push(tokio::spawn(load(f.clone(), stop.clone(), ok.clone(), refused.clone())));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.node(leader).kill9();
    let killed = Instant::now();
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, leader);
    // Keep the load on past the failover, then check the followers serve again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let served_before_stop = ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for j in jobs {
        j.await.expect("load");
    }
    assert!(ok.load(Ordering::Relaxed) > served_before_stop, "the followers serve again after the failover");
    let refused = refused.lock().expect("lock").clone();
    for (reason, status) in &refused {
        assert!(
            ["NOT_LEADER", "UNKNOWN_OUTCOME"].contains(&reason.as_str()),
            "a refusal without a documented reason, {:?} after the kill: {status}",
            killed.elapsed()
        );
    }
    // Reads are repeatable: they are routed to the new leader, never refused for the failover.
    for f in &followers {
        patient_client(f).queue_stats(pb::QueueStatsRequest { queues: vec![] }).await.expect("a read is served");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_knows_no_leader_answers_not_leader_without_an_address() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let (survivor, other) = {
        let f: Vec<u64> = c.nodes.iter().map(|n| n.id).filter(|id| *id != leader).collect();
        (f[0], f[1])
    };
    c.node(other).kill9();
    c.node(leader).kill9();
    let mut s = patient_client(&c.node(survivor).grpc);
    let started = Instant::now();
    let e = s.enqueue(enq("failover", "nobody-leads")).await.expect_err("no quorum: no leader");
    assert_eq!(reason(&e), "NOT_LEADER", "{e:?}");
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(e.metadata().get("x-raftq-leader").is_none(), "no leader to name: {e:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "answered within the routing bound: {:?}", started.elapsed());
    // A read is refused the same way: nothing can serve it linearizably.
    let e = s.queue_stats(pb::QueueStatsRequest { queues: vec![] }).await.expect_err("no leader");
    assert_eq!(reason(&e), "NOT_LEADER", "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_forwarded_to_a_leader_that_stops_answering_is_unknown_outcome() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.nodes.iter().map(|n| n.id).find(|id| *id != leader).expect("a follower");
    let addr = c.node(follower).grpc.clone();
    // The follower's connection to the leader is open and used.
    patient_client(&addr).enqueue(enq("failover", "before")).await.expect("forwarded");

    c.node(leader).signal("STOP");
    let write = tokio::spawn({
        let addr = addr.clone();
        async move { patient_client(&addr).enqueue(enq("failover", "into-the-pause")).await }
    });
    let read = tokio::spawn({
        let addr = addr.clone();
        async move { patient_client(&addr).queue_stats(pb::QueueStatsRequest { queues: vec![] }).await }
    });
    let e = write.await.expect("join").expect_err("the paused leader never answers");
    let read = read.await.expect("join");
    c.node(leader).signal("CONT");
    // Sent to the leader, which may have appended it before the pause: the outcome is unknown, and said so.
    assert_eq!(reason(&e), "UNKNOWN_OUTCOME", "{e:?}");
    // A read is repeatable: asked again of the new leader.
    read.expect("the read is served by the new leader");
}
