//! Three-node clusters of real processes: leader loss, leadership transfers, a paused leader, catching up by
//! snapshot, adding and removing nodes. Producers and workers talk to every node.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::worker_stream_client::WorkerStreamClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::procs::*;
use crate::support::*;

#[derive(Default)]
struct WorkLog {
    claims: Vec<Instant>,
    completed: HashSet<String>,
    /// Why the stream ended before the test stopped it.
    broke: Option<String>,
}

/// A worker on one node's stream: Ready for 16 tasks, complete them all, repeat, until `stop`.
async fn stream_worker(addr: String, queue: &'static str, stop: Arc<AtomicBool>, log: Arc<Mutex<WorkLog>>) {
    let ch = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("url").connect().await {
        Ok(ch) => ch,
        Err(e) => {
            log.lock().expect("lock").broke = Some(format!("connect: {e}"));
            return;
        }
    };
    let (tx, rx) = mpsc::channel(16);
    let ev = |e| pb::WorkerEvent { event: Some(e) };
    let hello = pb::Hello { token: String::new(), worker_id: format!("w-{addr}") };
    tx.send(ev(pb::worker_event::Event::Hello(hello))).await.expect("send");
    let mut inbound = match WorkerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            log.lock().expect("lock").broke = Some(format!("open: {e}"));
            return;
        }
    };
    let mut next_id = 0u64;
    let mut outstanding: Option<u64> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if outstanding.is_none() {
            next_id += 1;
            let ready = pb::Ready {
                request_id: next_id,
                queues: vec![queue.into()],
                lease_ms: 5_000,
                count: 16,
                ..Default::default()
            };
            if tx.send(ev(pb::worker_event::Event::Ready(ready))).await.is_err() {
                log.lock().expect("lock").broke = Some("send failed".into());
                return;
            }
            outstanding = Some(next_id);
        }
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        let event = match msg {
            Ok(Some(m)) => m.event,
            Ok(None) => {
                log.lock().expect("lock").broke = Some("stream closed".into());
                return;
            }
            Err(e) => {
                if !stop.load(Ordering::Relaxed) {
                    log.lock().expect("lock").broke = Some(format!("stream error: {e}"));
                }
                return;
            }
        };
        use pb::server_event::Event;
        match event {
            Some(Event::TaskBatch(b)) => {
                outstanding = None;
                if b.tasks.is_empty() {
                    continue;
                }
                log.lock().expect("lock").claims.push(Instant::now());
                next_id += 1;
                let results = b
                    .tasks
                    .iter()
                    .map(|t| pb::Result {
                        request_id: 0,
                        task_id: t.id.clone(),
                        token: t.lease.as_ref().map(|l| l.token).unwrap_or(0),
                        outcome: Some(pb::result::Outcome::Completed(pb::Complete {
                            result: Default::default(),
                            follow_ups: vec![],
                        })),
                    })
                    .collect();
                let batch = pb::ResultBatch { request_id: next_id, results };
                if tx.send(ev(pb::worker_event::Event::ResultBatch(batch))).await.is_err() {
                    return;
                }
                outstanding = Some(next_id);
            }
            Some(Event::AckBatch(a)) => {
                outstanding = None;
                let mut l = log.lock().expect("lock");
                for ack in a.acks.into_iter().filter(|a| a.applied) {
                    l.completed.insert(ack.task_id);
                }
            }
            // A request that failed (e.g. no leader for a moment): the stream stays open, ask again.
            Some(Event::Error(_)) => outstanding = None,
            _ => {}
        }
    }
}

/// Producers enqueue through every node in turn; every acknowledged id is recorded.
async fn producer(addrs: Vec<String>, queue: &'static str, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<String>>>) {
    let mut clients = Vec::new();
    for a in &addrs {
        clients.push(connect(a).await);
    }
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let c = &mut clients[i % addrs.len()];
        let req = enq(queue, &format!("v{i}"));
        match tokio::time::timeout(Duration::from_secs(5), c.enqueue(req)).await {
            Ok(Ok(r)) => acked.lock().expect("lock").push(r.into_inner().task_id),
            // Failed or unknown: not acknowledged, so not counted; a node that is down is skipped a while.
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
    workers: Vec<(u64, Arc<Mutex<WorkLog>>)>,
    jobs: Vec<tokio::task::JoinHandle<()>>,
    producers_stop: Arc<AtomicBool>,
}

fn start_load(c: &ProcCluster, queue: &'static str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let producers_stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.grpc.clone()).collect();
    let mut workers = Vec::new();
    let mut jobs = Vec::new();
    for n in &c.nodes {
        let log = Arc::new(Mutex::new(WorkLog::default()));
        workers.push((n.id, log.clone()));
        jobs.push(tokio::spawn(stream_worker(n.grpc.clone(), queue, stop.clone(), log)));
    }
    for k in 0..3 {
        let mut a = addrs.clone();
        a.rotate_left(k);
        jobs.push(tokio::spawn(producer(a, queue, producers_stop.clone(), acked.clone())));
    }
    Load { stop, acked, workers, jobs, producers_stop }
}

impl Load {
    /// Stops producing, waits until every acknowledged task has been completed by some worker, stops the workers.
    async fn drain(self, limit: Duration, mut client: Option<Client>) -> (Vec<String>, Vec<(u64, WorkLog)>) {
        self.producers_stop.store(true, Ordering::Relaxed);
        let acked: Vec<String> = self.acked.lock().expect("lock").clone();
        let deadline = Instant::now() + limit;
        let mut confirmed: HashSet<String> = HashSet::new();
        loop {
            let done: HashSet<String> =
                self.workers.iter().flat_map(|(_, l)| l.lock().expect("lock").completed.clone()).collect();
            let missing: Vec<&String> =
                acked.iter().filter(|id| !done.contains(*id) && !confirmed.contains(*id)).collect();
            if missing.is_empty() {
                break;
            }
            // A completion whose answer was lost with a dying node is still a completion: ask the cluster.
            if let Some(c) = client.as_mut() {
                for id in missing.iter().take(50) {
                    if let Ok(t) = c.get_task(pb::GetTaskRequest { id: (*id).clone() }).await {
                        if t.into_inner().state == pb::TaskState::Completed as i32 {
                            confirmed.insert((*id).clone());
                        }
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} acknowledged tasks never completed",
                missing.len(),
                acked.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        for j in self.jobs {
            let _ = tokio::time::timeout(Duration::from_secs(5), j).await;
        }
        let logs =
            self.workers.into_iter().map(|(id, l)| (id, std::mem::take(&mut *l.lock().expect("lock")))).collect();
        (acked, logs)
    }
}

/// The longest time without any claim, among claims made after `from`.
fn longest_claim_gap(logs: &[(u64, WorkLog)], from: Instant) -> Duration {
    let mut all: Vec<Instant> =
        logs.iter().flat_map(|(_, l)| l.claims.iter().copied()).filter(|t| *t >= from).collect();
    all.sort();
    let mut prev = from;
    let mut worst = Duration::ZERO;
    for t in all {
        worst = worst.max(t - prev);
        prev = t;
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_loses_nothing_and_streams_on_survivors_stay_open() {
    let mut c = ProcCluster::start(3, FAST).await;
    let load = start_load(&c, "failover");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let killed_at = Instant::now();
    c.node(leader).kill9();
    let new_leader = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let survivor = c.node(new_leader).client().await;
    let (acked, logs) = load.drain(Duration::from_secs(60), Some(survivor)).await;
    assert!(acked.len() > 50, "the load ran: {}", acked.len());
    for (id, log) in &logs {
        if *id != leader {
            assert!(log.broke.is_none(), "worker stream on surviving node {id} broke: {:?}", log.broke);
        }
    }
    let after: usize = logs.iter().map(|(_, l)| l.claims.iter().filter(|t| **t > killed_at).count()).sum();
    assert!(after > 0, "claims resumed after the leader died");
    eprintln!(
        "leader kill: {} tasks acknowledged and completed; longest claim gap after the kill {:?}",
        acked.len(),
        longest_claim_gap(&logs, killed_at)
    );
    c.wait_digests_agree(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_leadership_transfers_under_load_lose_nothing() {
    let c = ProcCluster::start(3, FAST).await;
    let load = start_load(&c, "transfers");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let mut admin = c.nodes[0].admin().await.expect("admin");
    let mut took = Vec::new();
    for i in 0..10 {
        let leader = c.wait_leader(Duration::from_secs(10)).await;
        let to = (leader % 3) + 1;
        let r = admin
            .transfer_leader(pb::TransferLeaderRequest { to, timeout_ms: 10_000 })
            .await
            .unwrap_or_else(|e| panic!("transfer {i} to {to}: {e}"))
            .into_inner();
        assert_eq!(r.leader_id, to);
        took.push(r.took_ms);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let any = c.nodes[0].client().await;
    let (acked, logs) = load.drain(Duration::from_secs(60), Some(any)).await;
    for (id, log) in &logs {
        assert!(log.broke.is_none(), "worker stream on node {id} broke: {:?}", log.broke);
    }
    eprintln!(
        "10 transfers: took {took:?} ms; {} tasks acknowledged and completed; longest claim gap {:?}",
        acked.len(),
        longest_claim_gap(&logs, started)
    );
    c.wait_digests_agree(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_is_replaced_and_replicas_agree_after_it_resumes() {
    let mut c = ProcCluster::start(3, FAST).await;
    let mut first = c.nodes[0].client().await;
    for i in 0..20 {
        first.enqueue(enq("pause", &format!("{i}"))).await.expect("enqueue");
    }
    let old = c.wait_leader(Duration::from_secs(10)).await;
    c.node(old).signal("STOP");
    // The others elect a new leader and keep serving.
    let new = c.wait_leader_besides(old, Duration::from_secs(20)).await;
    let mut live = c.node(new).client().await;
    let during = live.enqueue(enq("pause", "during")).await.expect("the new leader serves").into_inner().task_id;

    c.node(old).signal("CONT");
    // Whatever the old leader answers right after it resumes, it never acknowledges a write that is then lost.
    let mut old_client = c.node(old).client().await;
    let mut req = tonic::Request::new(enq("pause", "to-old-leader"));
    req.metadata_mut().insert("x-raftq-redirect", "1".parse().expect("ascii"));
    let to_old = old_client.enqueue(req).await;
    c.wait_digests_agree(Duration::from_secs(30)).await;
    let mut live = c.node(new).client().await;
    live.get_task(pb::GetTaskRequest { id: during }).await.expect("write made during the pause is kept");
    match to_old {
        Ok(r) => {
            let id = r.into_inner().task_id;
            live.get_task(pb::GetTaskRequest { id }).await.expect("an acknowledged write on the old leader is kept");
        }
        Err(e) => assert!(
            ["NOT_LEADER", "UNKNOWN_OUTCOME", "UNAVAILABLE"].contains(&reason(&e).as_str()),
            "unexpected answer from the resumed old leader: {e:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_catches_up_by_snapshot_and_an_added_node_serves() {
    let extra = format!("{FAST}snapshot_every_entries = 40\nsnapshot_keep_entries = 5\npurge_batch_entries = 1\n");
    let mut c = ProcCluster::start(3, &extra).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let lagger = if leader == 3 { 2 } else { 3 };
    let stopped_at = c.node(lagger).status().await.expect("status").last_log_index;
    c.node(lagger).terminate();
    let mut client = c.node(leader).client().await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(client.enqueue(enq("snap", &format!("{i}"))).await.expect("enqueue").into_inner().task_id);
    }
    // openraft postpones a purge while a replication request (here, to the stopped node) covers the logs: keep
    // writing until the leader has purged past what the stopped node holds.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.node(leader).status().await.expect("status").purged_index <= stopped_at + 1 {
        assert!(Instant::now() < deadline, "the leader never purged its log");
        ids.push(client.enqueue(enq("snap", "more")).await.expect("enqueue").into_inner().task_id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.node(lagger).start();
    c.node(lagger).ready().await;
    let d = c.wait_digests_agree(Duration::from_secs(60)).await;
    assert_eq!(d[&lagger].tasks, ids.len() as u64);
    let installed = c.node(lagger).metric("raftq_snapshots_installed_total").await.expect("metrics");
    assert!(installed >= 1.0, "the restarted node caught up by installing a snapshot");

    // A new node joins as a learner, catches up, becomes a voter and serves.
    let mut n4 = ProcNode::new(c.root.path(), 4, FAST);
    n4.start_with(&["--join"]);
    let mut admin = c.nodes[0].admin().await.expect("admin");
    let r = admin
        .add_node(pb::AddNodeRequest {
            node_id: 4,
            raft_addr: n4.raft.clone(),
            api_addr: n4.grpc.clone(),
            learner_only: false,
        })
        .await
        .expect("add node")
        .into_inner();
    let voters: BTreeSet<u64> = r.members.iter().filter(|m| m.voter).map(|m| m.node_id).collect();
    assert_eq!(voters, BTreeSet::from([1, 2, 3, 4]));
    c.nodes.push(n4);
    c.wait_digests_agree(Duration::from_secs(60)).await;
    let mut c4 = c.node(4).client().await;
    let mut stale = tonic::Request::new(pb::GetTaskRequest { id: ids[0].clone() });
    stale.metadata_mut().insert("x-raftq-read", "stale".parse().expect("ascii"));
    c4.get_task(stale).await.expect("the new node holds the data");
    c4.enqueue(enq("snap", "via-4")).await.expect("the new node serves writes (forwarded)");

    let r = admin.remove_node(pb::RemoveNodeRequest { node_id: 4, force: false }).await.expect("remove").into_inner();
    assert!(r.members.iter().all(|m| m.node_id != 4), "{r:?}");
    c.node(4).kill9();

    // With a voter down, removing another live voter could leave the change uncommitted and stop the cluster:
    // refused. Removing the dead one is safe and done, and the cluster serves on.
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    let (dead, alive) = (followers[0], followers[1]);
    c.node(dead).kill9();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut admin = c.node(leader).admin().await.expect("admin");
    let e = admin.remove_node(pb::RemoveNodeRequest { node_id: alive, force: false }).await.expect_err("unsafe");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::FailedPrecondition, "MEMBERSHIP_UNSAFE"), "{e:?}");
    let r = admin.remove_node(pb::RemoveNodeRequest { node_id: dead, force: false }).await.expect("remove the dead");
    let voters: BTreeSet<u64> = r.into_inner().members.iter().filter(|m| m.voter).map(|m| m.node_id).collect();
    assert_eq!(voters, BTreeSet::from([leader, alive]));
    let mut cl = c.node(leader).client().await;
    cl.enqueue(enq("snap", "after-removal")).await.expect("two voters serve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_worker_whose_node_dies_reconnects_to_another_listed_node() {
    use raftq_client::{CancellationToken, NewTask, Outcome, Producer, ProducerConfig, Task, Worker, WorkerConfig};

    let mut c = ProcCluster::start(3, FAST).await;
    // The SDK opens its streams on the leader (a follower named it), so killing the leader costs the worker its
    // stream; the worker must move to another listed node by itself, and on to the new leader.
    let victim = c.wait_leader(Duration::from_secs(10)).await;
    let mut addrs: Vec<String> = vec![c.node(victim).grpc.clone()];
    addrs.extend(c.nodes.iter().filter(|n| n.id != victim).map(|n| n.grpc.clone()));
    let producer = Producer::connect(ProducerConfig { addrs: addrs.clone(), ..Default::default() }).await.expect("p");
    let worker = Worker::new(WorkerConfig {
        addrs: addrs.clone(),
        queues: vec!["sdk-failover".into()],
        concurrency: 4,
        worker_id: "sdk-failover".into(),
        reconnect_backoff_max: Duration::from_millis(500),
        ..Default::default()
    })
    .expect("worker");
    let done = Arc::new(Mutex::new(HashSet::new()));
    let seen = done.clone();
    let shutdown = CancellationToken::new();
    let stats = worker.stats();
    let run = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            worker
                .run(
                    move |t: Task| {
                        seen.lock().expect("lock").insert(t.id.clone());
                        async { Outcome::Completed(Default::default()) }
                    },
                    shutdown,
                )
                .await
        })
    };
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(producer.enqueue(NewTask::new("sdk-failover", format!("before {i}"))).await.expect("enqueue").task_id);
    }
    wait_until(Duration::from_secs(20), || ids.iter().all(|id| done.lock().expect("lock").contains(id))).await;
    c.node(victim).kill9();
    // The producer was on the leader too: a write on the dead connection has an unknown outcome, so each is sent
    // with an idempotency key and sent again until answered (a repeat that had applied names the same task).
    for i in 0..20 {
        let deadline = Instant::now() + Duration::from_secs(20);
        let id = loop {
            let task = NewTask::new("sdk-failover", format!("after {i}")).idempotency_key(format!("after-{i}"));
            match producer.enqueue(task).await {
                Ok(e) => break e.task_id,
                Err(e) if Instant::now() < deadline => eprintln!("enqueue {i}: {e}; again"),
                Err(e) => panic!("enqueue {i}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ids.push(id);
    }
    wait_until(Duration::from_secs(30), || ids.iter().all(|id| done.lock().expect("lock").contains(id))).await;
    assert!(stats.snapshot().reconnects >= 1, "the worker reconnected: {:?}", stats.snapshot());
    shutdown.cancel();
    let summary = run.await.expect("join").expect("run");
    assert_eq!(summary.rejected, 0, "{summary:?}");
}

/// The SDK's producer stream is on the leader when it is paused (SIGSTOP: its sockets stay open, it only falls
/// silent). Once the stream breaks on the keepalive, the next create opens its stream on a live node at once:
/// going back to the paused one, as the SDK did, cost another keepalive timeout (1.5 s) before moving on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_producer_stream_leaves_a_paused_leader_for_a_live_node() {
    use raftq_client::{Error, NewTask, Producer, ProducerConfig};

    let mut c = ProcCluster::start(3, FAST).await;
    let victim = c.wait_leader(Duration::from_secs(10)).await;
    let mut addrs: Vec<String> = vec![c.node(victim).grpc.clone()];
    addrs.extend(c.nodes.iter().filter(|n| n.id != victim).map(|n| n.grpc.clone()));
    let producer = Producer::connect(ProducerConfig { addrs, ..Default::default() }).await.expect("producer");
    let s = producer.stream().await.expect("stream");
    s.create(NewTask::new("paused", "before")).await.expect("sent").await.expect("the leader acknowledges");

    c.node(victim).signal("STOP");
    let paused_at = Instant::now();
    // A create sent into the pause breaks with the stream: unknown outcome, never a plain failure.
    let into = s.create(NewTask::new("paused", "into").idempotency_key("into")).await.expect("sent");
    match into.await {
        Err(Error::UnknownOutcome { .. }) => {}
        other => panic!("a create on the paused leader's stream: {other:?}"),
    }
    let broke_after = paused_at.elapsed();
    // Another node leads before the next create is sent, so the time it takes is the SDK's choice of node.
    c.wait_leader_besides(victim, Duration::from_secs(20)).await;
    let sent = Instant::now();
    s.create(NewTask::new("paused", "after")).await.expect("sent").await.expect("a live node acknowledges");
    let took = sent.elapsed();
    c.node(victim).signal("CONT");
    // Going back to the paused node costs at least its keepalive (0.5 s of silence, then 1 s for the ping).
    assert!(
        took < Duration::from_millis(1400),
        "the next create took {took:?} (the stream broke {broke_after:?} into the pause): it went back to the \
         paused node and waited out its keepalive"
    );
}

/// Opens a worker stream on `addr` (asking for redirects or not): its HelloAck's stream, or the refusal.
async fn open_worker_stream(
    addr: &str,
    redirect: bool,
) -> Result<(mpsc::Sender<pb::WorkerEvent>, tonic::Streaming<pb::ServerEvent>), tonic::Status> {
    let ch = channel(addr).await;
    let (tx, rx) = mpsc::channel(16);
    let hello = pb::Hello { token: String::new(), worker_id: "redirected".into() };
    tx.send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Hello(hello)) }).await.expect("send");
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    if redirect {
        req.metadata_mut().insert("x-raftq-redirect", "1".parse().expect("ascii"));
    }
    let mut inbound = WorkerStreamClient::new(ch).stream(req).await?.into_inner();
    match inbound.message().await? {
        Some(pb::ServerEvent { event: Some(pb::server_event::Event::HelloAck(_)) }) => Ok((tx, inbound)),
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_ask_for_redirects_open_on_the_leader_and_follow_a_transfer() {
    let c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.nodes.iter().map(|n| n.id).find(|id| *id != leader).expect("a follower");
    let (leader_addr, follower_addr) =
        (c.nodes[leader as usize - 1].grpc.clone(), c.nodes[follower as usize - 1].grpc.clone());
    // The follower has heard from the leader by now (heartbeats every 100 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;

    // On a follower: NOT_LEADER naming the leader when asked for redirects, served (forwarding) when not.
    let Err(refused) = open_worker_stream(&follower_addr, true).await else {
        panic!("a follower redirects the stream");
    };
    assert_eq!(reason(&refused), "NOT_LEADER", "{refused:?}");
    let named = refused.metadata().get("x-raftq-leader").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert_eq!(named, leader_addr, "the refusal names the leader");
    open_worker_stream(&follower_addr, false).await.expect("without the header a follower serves the stream");

    // On the leader the stream opens; after a transfer, its next request is answered NOT_LEADER naming the new
    // leader (nothing applied), instead of being forwarded there.
    let (tx, mut inbound) = open_worker_stream(&leader_addr, true).await.expect("the leader serves the stream");
    let mut admin = c.nodes[0].admin().await.expect("admin");
    let r = admin
        .transfer_leader(pb::TransferLeaderRequest { to: follower, timeout_ms: 10_000 })
        .await
        .expect("transfer")
        .into_inner();
    assert_eq!(r.leader_id, follower);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready =
        pb::Ready { request_id: 7, queues: vec!["redirected".into()], lease_ms: 5_000, count: 1, ..Default::default() };
    tx.send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Ready(ready)) }).await.expect("send");
    let answer = tokio::time::timeout(Duration::from_secs(5), inbound.message())
        .await
        .expect("the Ready is answered at once, not parked on the new leader")
        .expect("stream")
        .expect("an event");
    match answer.event {
        Some(pb::server_event::Event::Error(e)) => {
            assert_eq!((e.request_id, e.reason.as_str()), (7, "NOT_LEADER"), "{e:?}");
            assert_eq!(e.leader_addr, follower_addr, "the answer names the new leader");
        }
        other => panic!("expected NOT_LEADER for the Ready, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_a_follower_is_served_by_the_new_leader_while_the_old_one_is_paused() {
    let mut c = ProcCluster::start(3, FAST).await;
    let old = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.nodes.iter().map(|n| n.id).find(|id| *id != old).expect("a follower");
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(WorkLog::default()));
    let job = tokio::spawn(stream_worker(c.node(follower).grpc.clone(), "moved", stop.clone(), log.clone()));
    // Nothing to claim yet: the worker's Ready is forwarded to the leader and parked there when it stops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.node(old).signal("STOP");
    let new = c.wait_leader_besides(old, Duration::from_secs(20)).await;
    let mut client = c.node(new).client().await;
    // Through the node that was seen leading (it forwards if an election moved the leadership again meanwhile).
    for i in 0..10 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.enqueue(enq("moved", &format!("{i}"))).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline && ["NOT_LEADER", "UNAVAILABLE"].contains(&reason(&e).as_str()) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the new leader serves: {e:?}"),
            }
        }
    }
    // The follower asks the new leader again instead of waiting for the paused one to come back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.lock().expect("lock").completed.len() < 10 {
        assert!(
            Instant::now() < deadline,
            "the worker on node {follower} got {} of 10 tasks while the old leader {old} stayed paused",
            log.lock().expect("lock").completed.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    c.node(old).signal("CONT");
    let _ = tokio::time::timeout(Duration::from_secs(5), job).await;
}

/// Elections wait 3-4 s here: a new leader known sooner after the old one's SIGTERM was handed the leadership,
/// since no follower could have timed out and won an election by then.
const SLOW_ELECTIONS: &str =
    "heartbeat_interval_ms = 100\nelection_timeout_min_ms = 3000\nelection_timeout_max_ms = 4000\n";
/// Longest a node may take to exit after SIGTERM in these tests, whatever it has in flight (node.rs budgets
/// about 5 s for the whole shutdown; the rest is slack for a loaded 2-core machine).
const EXIT_BOUND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_leader_under_load_hands_over_the_leadership_and_exits_in_bounded_time() {
    let mut c = ProcCluster::start(3, SLOW_ELECTIONS).await;
    let load = start_load(&c, "sigterm");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let old = c.wait_leader(Duration::from_secs(10)).await;
    let survivors: Vec<u64> = c.nodes.iter().map(|n| n.id).filter(|id| *id != old).collect();
    let term_at = Instant::now();
    c.node(old).signal("TERM");
    // Survivors are asked who leads until one names another node and the old leader has exited: the last time
    // one still named the old leader and the first time one named the new bound the time without a leader.
    let (mut last_old, mut new_leader, mut exited) = (Duration::ZERO, None, None);
    while new_leader.is_none() || exited.is_none() {
        if exited.is_none() {
            exited = c.node(old).exited().map(|s| (s, term_at.elapsed()));
        }
        if new_leader.is_none() {
            for id in &survivors {
                match c.node(*id).status().await.filter(|s| s.has_leader) {
                    Some(s) if s.leader_id == old => last_old = term_at.elapsed(),
                    Some(s) => new_leader = Some((s.leader_id, term_at.elapsed())),
                    None => {}
                }
            }
        }
        assert!(
            term_at.elapsed() < Duration::from_secs(30),
            "leader {new_leader:?}, exit {exited:?} 30 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ((status, exit_after), (leader, led_after)) = (exited.expect("exited"), new_leader.expect("leader"));
    assert!(status.success(), "the old leader exits cleanly: {status:?}");
    assert!(exit_after < EXIT_BOUND, "the old leader exited {exit_after:?} after SIGTERM");
    assert!(
        led_after < Duration::from_secs(3),
        "node {leader} led {led_after:?} after SIGTERM: later than a transfer, as late as an election"
    );
    eprintln!(
        "SIGTERM on leader {old}: node {leader} led after {led_after:?} (the old one was last named at {last_old:?}); \
         the old leader exited after {exit_after:?}"
    );
    // The load goes on a while with the new leader before it is drained.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Nothing acknowledged is lost, and the old leader rejoins with the same state.
    let client = c.node(leader).client().await;
    let (acked, logs) = load.drain(Duration::from_secs(60), Some(client)).await;
    assert!(acked.len() > 20, "the load ran: {}", acked.len());
    eprintln!(
        "{} tasks acknowledged and completed; longest claim gap {:?}",
        acked.len(),
        longest_claim_gap(&logs, term_at)
    );
    c.node(old).start();
    c.node(old).ready().await;
    c.wait_digests_agree(Duration::from_secs(30)).await;
}

/// Calls a node holds open until they are answered: a gRPC and a REST long poll for `task`, a claim waiting for
/// work, a worker stream waiting for work, and an enqueue (a proposal, or a call forwarded to the leader).
async fn calls_in_flight(node: &ProcNode, task: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let mut jobs = Vec::new();
    let (mut a, mut b, mut d) = (node.client().await, node.client().await, node.client().await);
    let id = task.to_string();
    jobs.push(tokio::spawn(async move {
        let _ = a.get_result(pb::GetResultRequest { id, wait_ms: 60_000 }).await;
    }));
    jobs.push(tokio::spawn(async move {
        let req = pb::ClaimRequest {
            worker_id: "held".into(),
            queues: vec!["in-flight-empty".into()],
            count: 1,
            wait_ms: 60_000,
            ..Default::default()
        };
        let _ = b.claim(req).await;
    }));
    jobs.push(tokio::spawn(async move {
        let _ = d.enqueue(enq("in-flight", "during shutdown")).await;
    }));
    let grpc = node.grpc.clone();
    jobs.push(tokio::spawn(async move {
        let stop = Arc::new(AtomicBool::new(false));
        stream_worker(grpc, "in-flight-empty", stop, Arc::default()).await;
    }));
    let (http, path) = (node.http.clone(), format!("/v1/tasks/{task}/result?wait_ms=60000"));
    jobs.push(tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Ok(mut s) = tokio::net::TcpStream::connect(&http).await {
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            if s.write_all(req.as_bytes()).await.is_ok() {
                let _ = s.read_to_end(&mut Vec::new()).await;
            }
        }
    }));
    // Let every call reach the node.
    tokio::time::sleep(Duration::from_millis(500)).await;
    jobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_node_in_bounded_time_whatever_it_has_in_flight() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let followers: Vec<u64> = c.nodes.iter().map(|n| n.id).filter(|id| *id != leader).collect();
    let (f1, f2) = (followers[0], followers[1]);
    let mut lc = c.node(leader).client().await;
    let task = lc.enqueue(enq("in-flight", "pending")).await.expect("enqueue").into_inner().task_id;

    // A follower whose leader and other peer are paused: its calls are forwarded to a leader that never answers,
    // and it cannot elect another.
    c.node(leader).signal("STOP");
    c.node(f2).signal("STOP");
    let calls = calls_in_flight(c.node(f1), &task).await;
    let (status, took) = c.node(f1).terminate_within(Duration::from_secs(30)).await;
    eprintln!("follower {f1} exited {took:?} after SIGTERM ({status:?})");
    assert!(status.success() && took < EXIT_BOUND, "follower {f1}: {status:?} after {took:?}");
    calls.iter().for_each(|j| j.abort());

    // The leader, one follower gone and the other paused: proposals and linearizable reads wait for a quorum
    // that never answers, and no follower can take the leadership.
    c.node(leader).signal("CONT");
    let calls = calls_in_flight(c.node(leader), &task).await;
    let (status, took) = c.node(leader).terminate_within(Duration::from_secs(30)).await;
    eprintln!("leader {leader} exited {took:?} after SIGTERM ({status:?})");
    assert!(status.success() && took < EXIT_BOUND, "leader {leader}: {status:?} after {took:?}");
    calls.iter().for_each(|j| j.abort());
    c.node(f2).signal("CONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_one_binary_raises_its_cluster_version_through_the_log() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    // Every member answers the gate with this binary's version, so the leader switches at once; the switch is a
    // log entry, so every replica ends at the same version (and the same digest).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut versions = Vec::new();
        for id in 1..=3 {
            let s = c.node(id).status().await.expect("status");
            versions.push((s.version, s.cluster_version));
        }
        let newest = raftq::raft::version::SUPPORTED;
        if versions.iter().all(|v| *v == (newest, newest)) {
            break;
        }
        assert!(Instant::now() < deadline, "the cluster version was never raised: {versions:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.wait_digests_agree(Duration::from_secs(20)).await;
    // It survives a restart of the leader: the version is replicated state, not a node's memory.
    c.node(leader).terminate();
    c.node(leader).start();
    c.node(leader).ready().await;
    assert_eq!(c.node(leader).status().await.expect("status").cluster_version, raftq::raft::version::SUPPORTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_quorum_stops_taking_writes_instead_of_holding_them() {
    // FAST: elections 500-1000 ms, so the leader gives up on a silent quorum after 2 s; writes time out after 10 s.
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let followers: Vec<u64> = c.nodes.iter().map(|n| n.id).filter(|id| *id != leader).collect();
    let redirect = |r: pb::EnqueueRequest| {
        let mut req = tonic::Request::new(r);
        req.metadata_mut().insert("x-raftq-redirect", "1".parse().expect("ascii"));
        req
    };
    let mut lc = c.node(leader).client().await;
    // Idle for longer than the limit: heartbeats keep the quorum's acknowledgements fresh, so writes go on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    lc.enqueue(redirect(enq("cut-off", "before"))).await.expect("an idle leader still takes writes");

    // Both followers stopped: the leader hears from no quorum. The write in flight is answered as of unknown
    // outcome once the quorum has been silent past the limit, well before the write timeout.
    c.node(followers[0]).signal("STOP");
    c.node(followers[1]).signal("STOP");
    let t = Instant::now();
    let held = lc.enqueue(redirect(enq("cut-off", "in-flight"))).await.expect_err("no quorum");
    let took = t.elapsed();
    assert_eq!(reason(&held), "UNKNOWN_OUTCOME", "{held:?}");
    assert!(took < Duration::from_secs(8), "answered after {took:?}, not at the write timeout");
    // A new write is refused before anything is proposed: NOT_LEADER naming no leader, so a client moves on.
    let t = Instant::now();
    let refused = lc.enqueue(redirect(enq("cut-off", "after"))).await.expect_err("cut off");
    assert_eq!(reason(&refused), "NOT_LEADER", "{refused:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "refused at once, not after {:?}", t.elapsed());

    // The quorum back: writes are taken again (by this node, or by a new leader if one was elected meanwhile).
    c.node(followers[0]).signal("CONT");
    c.node(followers[1]).signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut any = c.nodes[0].client().await;
        match any.enqueue(enq("cut-off", "healed")).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "no write taken after the quorum came back: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.wait_digests_agree(Duration::from_secs(30)).await;
}
