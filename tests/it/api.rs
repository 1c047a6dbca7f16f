//! The public task API against a real one-node server, through gRPC.

use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;

use crate::support::*;

fn fast(c: &mut raftq::config::Config) {
    c.lease_min_ms = 50;
    c.retry_base_ms = 10;
    c.retry_max_ms = 10;
    c.retry_exponential = false;
}

async fn claim(c: &mut Client, queue: &str, count: u32, lease_ms: u64, wait_ms: u64) -> Vec<pb::Task> {
    c.claim(pb::ClaimRequest { worker_id: "w1".into(), queues: vec![queue.into()], count, lease_ms, wait_ms })
        .await
        .expect("claim")
        .into_inner()
        .tasks
}

fn token(t: &pb::Task) -> u64 {
    t.lease.as_ref().expect("claimed task has a lease").token
}

async fn ack(c: &mut Client, t: &pb::Task, tok: u64, action: Action) -> Result<pb::AckResponse, tonic::Status> {
    c.ack(pb::AckRequest { task_id: t.id.clone(), token: tok, action: Some(action) }).await.map(|r| r.into_inner())
}

fn complete(result: &str) -> Action {
    Action::Complete(pb::Complete { result: result.as_bytes().to_vec().into(), follow_ups: vec![] })
}

fn fail(retryable: bool) -> Action {
    Action::Fail(pb::Fail { error: "boom".into(), retryable })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_claim_complete_and_read_the_result() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let id = c.enqueue(enq("emails", "hello")).await.expect("enqueue").into_inner().task_id;
    let t = c.get_task(pb::GetTaskRequest { id: id.clone() }).await.expect("get").into_inner();
    assert_eq!(t.state, pb::TaskState::Pending as i32);
    assert_eq!(&t.payload[..], b"hello");
    assert_eq!(t.tenant, "default");

    let got = claim(&mut c, "emails", 10, 30_000, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(got[0].attempts, 1);
    assert_eq!(got[0].state, pb::TaskState::InProgress as i32);
    let r = ack(&mut c, &got[0], token(&got[0]), complete("done")).await.expect("complete");
    assert_eq!(r.state, pb::TaskState::Completed as i32);

    let res = c.get_result(pb::GetResultRequest { id, wait_ms: 0 }).await.expect("result").into_inner();
    assert!(res.done);
    assert_eq!(res.state, pb::TaskState::Completed as i32);
    assert_eq!(&res.result[..], b"done");
    assert_eq!(res.attempts, 1);
    assert!(res.ended_at_ms >= res.created_at_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_result_waits_until_the_task_ends() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let id = c.enqueue(enq("q", "x")).await.expect("enqueue").into_inner().task_id;
    let mut waiter = c.clone();
    let wid = id.clone();
    let wait = tokio::spawn(async move {
        let start = Instant::now();
        let r = waiter.get_result(pb::GetResultRequest { id: wid, wait_ms: 10_000 }).await.expect("result");
        (r.into_inner(), start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = claim(&mut c, "q", 1, 30_000, 0).await.remove(0);
    ack(&mut c, &t, token(&t), complete("r")).await.expect("complete");
    let (res, took) = wait.await.expect("join");
    assert!(res.done, "the waiter saw the end");
    assert_eq!(&res.result[..], b"r");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(5), "{took:?}");

    // A bounded wait on a task that does not end returns the current state when the wait runs out.
    let id2 = c.enqueue(enq("q", "y")).await.expect("enqueue").into_inner().task_id;
    let start = Instant::now();
    let r = c.get_result(pb::GetResultRequest { id: id2, wait_ms: 200 }).await.expect("result").into_inner();
    assert!(!r.done);
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_is_rejected_with_stable_reasons() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let bad = [
        enq("", "x"),
        enq("has space", "x"),
        pb::EnqueueRequest { priority: 10, ..enq("q", "x") },
        pb::EnqueueRequest { payload: vec![0u8; 1024 * 1024 + 1].into(), ..enq("q", "x") },
        pb::EnqueueRequest { webhook_url: "not a url".into(), ..enq("q", "x") },
        pb::EnqueueRequest { idempotency_key: "k".repeat(300), ..enq("q", "x") },
        pb::EnqueueRequest { delay_ms: u64::MAX, ..enq("q", "x") },
    ];
    for req in bad {
        let e = c.enqueue(req).await.expect_err("rejected");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(reason(&e), "INVALID_ARGUMENT", "{e:?}");
    }
    let e = c.get_task(pb::GetTaskRequest { id: "nope".into() }).await.expect_err("bad id");
    assert_eq!(reason(&e), "INVALID_ARGUMENT");
    let e = c.get_task(pb::GetTaskRequest { id: "0".repeat(32) }).await.expect_err("unknown id");
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(reason(&e), "NOT_FOUND");
    let e = c
        .claim(pb::ClaimRequest { worker_id: "w".into(), queues: vec!["q".into()], count: 1, lease_ms: 1, wait_ms: 0 })
        .await
        .expect_err("lease too short");
    assert_eq!(reason(&e), "INVALID_ARGUMENT");
    let e = c.ack(pb::AckRequest { task_id: "0".repeat(32), token: 1, action: None }).await.expect_err("no action");
    assert_eq!(reason(&e), "INVALID_ARGUMENT");
    let e = c.enqueue_batch(pb::EnqueueBatchRequest { items: vec![] }).await.expect_err("empty batch");
    assert_eq!(reason(&e), "INVALID_ARGUMENT");
    // Nothing was stored by any of it.
    assert!(claim(&mut c, "q", 10, 30_000, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_items_succeed_or_fail_one_by_one() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let items = vec![enq("q", "a"), enq("bad queue", "b"), enq("q", "c")];
    let r = c.enqueue_batch(pb::EnqueueBatchRequest { items }).await.expect("batch").into_inner();
    assert_eq!(r.results.len(), 3);
    use pb::enqueue_result::Result as R;
    assert!(matches!(&r.results[0].result, Some(R::Ok(_))));
    assert!(matches!(&r.results[1].result, Some(R::Error(e)) if e.code == "INVALID_ARGUMENT"));
    assert!(matches!(&r.results[2].result, Some(R::Ok(_))));
    let got = claim(&mut c, "q", 10, 30_000, 0).await;
    let payloads: Vec<&[u8]> = got.iter().map(|t| &t.payload[..]).collect();
    assert_eq!(payloads, vec![&b"a"[..], &b"c"[..]], "FIFO within a priority");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_original_task() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let req = pb::EnqueueRequest { idempotency_key: "order-42".into(), ..enq("q", "x") };
    let a = c.enqueue(req.clone()).await.expect("first").into_inner();
    let b = c.enqueue(req).await.expect("repeat").into_inner();
    assert!(!a.duplicate);
    assert!(b.duplicate);
    assert_eq!(a.task_id, b.task_id);
    assert_eq!(claim(&mut c, "q", 10, 30_000, 0).await.len(), 1, "only one task was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_is_claimed_first() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    for (p, name) in [(1, "low"), (9, "high"), (5, "mid"), (9, "high2")] {
        c.enqueue(pb::EnqueueRequest { priority: p, ..enq("q", name) }).await.expect("enqueue");
    }
    let got = claim(&mut c, "q", 10, 30_000, 0).await;
    let order: Vec<String> = got.iter().map(|t| String::from_utf8_lossy(&t.payload).to_string()).collect();
    assert_eq!(order, vec!["high", "high2", "mid", "low"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_token_is_rejected_and_changes_nothing() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    c.enqueue(enq("q", "x")).await.expect("enqueue");
    let t = claim(&mut c, "q", 1, 100, 0).await.remove(0);
    // The lease expires; the task is retried and claimed again with a new token.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = claim(&mut c, "q", 1, 30_000, 2_000).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, t.id);
    assert_eq!(again[0].attempts, 2);
    assert!(token(&again[0]) > token(&t), "fencing tokens grow");
    let e = ack(&mut c, &t, token(&t), complete("late")).await.expect_err("stale");
    assert_eq!(reason(&e), "LEASE_LOST");
    let cur = c.get_task(pb::GetTaskRequest { id: t.id.clone() }).await.expect("get").into_inner();
    assert_eq!(cur.state, pb::TaskState::InProgress as i32);
    assert_eq!(token(&cur), token(&again[0]));
    ack(&mut c, &again[0], token(&again[0]), complete("ok")).await.expect("current token works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_the_lease_alive() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    c.enqueue(enq("q", "x")).await.expect("enqueue");
    // Heartbeats every 250 ms on a 1 s lease: room for a slow commit on a loaded debug build, and the task is
    // held well past the lease it was claimed with.
    let t = claim(&mut c, "q", 1, 1_000, 0).await.remove(0);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = ack(&mut c, &t, token(&t), Action::Heartbeat(pb::Heartbeat { extend_ms: 1_000, progress: None }))
            .await
            .expect("hb");
        assert_eq!(r.state, pb::TaskState::InProgress as i32);
    }
    ack(&mut c, &t, token(&t), complete("ok")).await.expect("still ours after 1.5 s on a 1 s lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_dead_letter_then_redrive_and_purge() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let id = c
        .enqueue(pb::EnqueueRequest { max_attempts: 2, ..enq("jobs", "payload-1") })
        .await
        .expect("enqueue")
        .into_inner()
        .task_id;
    for attempt in 1..=2 {
        let t = claim(&mut c, "jobs", 1, 30_000, 2_000).await.remove(0);
        assert_eq!(t.attempts, attempt);
        ack(&mut c, &t, token(&t), fail(true)).await.expect("fail");
    }
    let dl = c
        .list_dead_letters(pb::ListDeadLettersRequest { queue: "jobs".into(), limit: 0 })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].id, id);
    assert_eq!(&dl[0].payload[..], b"payload-1");
    assert_eq!(dl[0].last_error, "boom");
    assert_eq!(dl[0].state, pb::TaskState::DeadLettered as i32);
    assert!(claim(&mut c, "jobs", 1, 30_000, 0).await.is_empty(), "dead letters are not claimable");

    let r = c
        .redrive(pb::DeadLetterSelection { queue: "jobs".into(), ids: vec![id.clone()], all: false })
        .await
        .expect("redrive")
        .into_inner();
    assert_eq!(r.ids, vec![id.clone()]);
    let t = claim(&mut c, "jobs", 1, 30_000, 0).await.remove(0);
    assert_eq!(t.attempts, 1, "redrive resets attempts");
    ack(&mut c, &t, token(&t), fail(false)).await.expect("terminal fail");
    let res = c.get_result(pb::GetResultRequest { id: id.clone(), wait_ms: 0 }).await.expect("result").into_inner();
    assert_eq!(res.state, pb::TaskState::Failed as i32);
    assert_eq!(res.error, "boom");

    // A second task goes to the dead-letter queue and is purged.
    let id2 = c
        .enqueue(pb::EnqueueRequest { max_attempts: 1, ..enq("jobs", "p2") })
        .await
        .expect("enqueue")
        .into_inner()
        .task_id;
    let t = claim(&mut c, "jobs", 1, 30_000, 0).await.remove(0);
    ack(&mut c, &t, token(&t), Action::Nack(pb::Nack { delay_ms: 0, reason: "no".into() })).await.expect("nack");
    let r = c
        .purge_dead_letters(pb::DeadLetterSelection { queue: "jobs".into(), ids: vec![], all: true })
        .await
        .expect("purge")
        .into_inner();
    assert_eq!(r.ids, vec![id2.clone()]);
    let e = c.get_task(pb::GetTaskRequest { id: id2 }).await.expect_err("purged");
    assert_eq!(reason(&e), "NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_returns_the_task_without_using_an_attempt() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    c.enqueue(pb::EnqueueRequest { max_attempts: 1, ..enq("q", "x") }).await.expect("enqueue");
    for _ in 0..3 {
        let t = claim(&mut c, "q", 1, 30_000, 0).await.remove(0);
        assert_eq!(t.attempts, 1);
        let r = ack(&mut c, &t, token(&t), Action::Abandon(pb::Abandon {})).await.expect("abandon");
        assert_eq!(r.state, pb::TaskState::Pending as i32);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_task_is_claimable_only_after_its_delay() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let start = Instant::now();
    c.enqueue(pb::EnqueueRequest { delay_ms: 400, ..enq("q", "later") }).await.expect("enqueue");
    assert!(claim(&mut c, "q", 1, 30_000, 0).await.is_empty());
    let got = claim(&mut c, "q", 1, 30_000, 5_000).await;
    assert_eq!(got.len(), 1, "a parked claim is woken when the delayed task comes due");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_claim_is_woken_by_an_enqueue() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let mut w = c.clone();
    let parked = tokio::spawn(async move {
        let start = Instant::now();
        (claim(&mut w, "wake", 1, 30_000, 10_000).await, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.enqueue(enq("wake", "now")).await.expect("enqueue");
    let (got, took) = parked.await.expect("join");
    assert_eq!(got.len(), 1);
    assert!(took < Duration::from_secs(3), "woken by the enqueue, not by the timeout: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_task_and_its_token() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let pending = c.enqueue(enq("q", "a")).await.expect("enqueue").into_inner().task_id;
    let r = c.cancel(pb::CancelRequest { id: pending.clone() }).await.expect("cancel").into_inner();
    assert_eq!(r.state, pb::TaskState::Cancelled as i32);
    c.enqueue(enq("q", "b")).await.expect("enqueue");
    let t = claim(&mut c, "q", 5, 30_000, 0).await;
    assert_eq!(t.len(), 1, "the cancelled task is not claimable");
    c.cancel(pb::CancelRequest { id: t[0].id.clone() }).await.expect("cancel running");
    let e = ack(&mut c, &t[0], token(&t[0]), complete("x")).await.expect_err("token no longer accepted");
    assert_eq!(reason(&e), "NOT_IN_PROGRESS");
    let e = c.cancel(pb::CancelRequest { id: pending }).await.expect_err("already ended");
    assert_eq!(reason(&e), "ALREADY_ENDED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_tasks_are_removed_after_retention_counted_from_the_end() {
    let n = TestNode::start_with(|c| c.retention_ms = 500).await;
    let mut c = n.client().await;
    // Pending for longer than the retention: it must stay.
    let id = c.enqueue(pb::EnqueueRequest { delay_ms: 700, ..enq("q", "x") }).await.expect("e").into_inner().task_id;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let t = c.get_task(pb::GetTaskRequest { id: id.clone() }).await.expect("still there").into_inner();
    assert_eq!(t.state, pb::TaskState::Pending as i32);
    let t = claim(&mut c, "q", 1, 30_000, 0).await.remove(0);
    ack(&mut c, &t, token(&t), complete("r")).await.expect("complete");
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.get_result(pb::GetResultRequest { id: id.clone(), wait_ms: 0 }).await.expect("kept right after the end");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.get_task(pb::GetTaskRequest { id: id.clone() }).await {
            Err(e) if reason(&e) == "NOT_FOUND" => break,
            _ => assert!(Instant::now() < deadline, "not removed after retention"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_every_task_and_lease() {
    let mut n = TestNode::start().await;
    let mut c = n.client().await;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(c.enqueue(enq("q", &format!("t{i}"))).await.expect("enqueue").into_inner().task_id);
    }
    let held = claim(&mut c, "q", 5, 60_000, 0).await;
    n.stop().await;
    n.restart().await;
    let mut c = n.client().await;
    for id in &ids {
        c.get_task(pb::GetTaskRequest { id: id.clone() }).await.expect("kept");
    }
    // The leases survive the restart: the holder can still complete its tasks.
    for t in &held {
        ack(&mut c, t, token(t), complete("ok")).await.expect("complete after restart");
    }
    let rest = claim(&mut c, "q", 100, 30_000, 0).await;
    assert_eq!(rest.len(), 45);
    n.node().shared.check_indexes().expect("indexes agree with records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_answer() {
    let n = TestNode::start().await;
    let addr = n.node().http_addr;
    for path in ["/healthz", "/readyz"] {
        let body = http_get(addr, path).await;
        assert!(body.starts_with("HTTP/1.1 200"), "{path}: {body}");
    }
    let body = http_get(addr, "/readyz").await;
    assert!(body.contains("\"ready\":true"), "{body}");
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_stats_count_tasks_by_state() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    for i in 0..4 {
        c.enqueue(enq("stats", &format!("{i}"))).await.expect("enqueue");
    }
    c.enqueue(pb::EnqueueRequest { delay_ms: 60_000, ..enq("stats", "later") }).await.expect("enqueue");
    c.enqueue(enq("other", "x")).await.expect("enqueue");
    let t = claim(&mut c, "stats", 2, 30_000, 0).await;
    ack(&mut c, &t[0], token(&t[0]), complete("ok")).await.expect("complete");
    let r = c.queue_stats(pb::QueueStatsRequest { queues: vec!["stats".into()] }).await.expect("stats").into_inner();
    assert_eq!(r.queues.len(), 1);
    let q = &r.queues[0];
    assert_eq!((q.pending, q.delayed, q.in_progress, q.completed), (2, 1, 1, 1), "{q:?}");
    let all = c.queue_stats(pb::QueueStatsRequest { queues: vec![] }).await.expect("stats").into_inner();
    let names: Vec<&str> = all.queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, vec!["other", "stats"]);
}

/// Symbols whose files reflection is asked for: a raftq service and the health service.
const SYMBOLS: [&str; 2] = ["raftq.v1.Jobs", "grpc.health.v1.Health"];

/// Asks reflection (`v1` or `v1alpha`, the same messages in two packages) for its list of services (sorted) and
/// for the file of each of [`SYMBOLS`]: whether one came back.
macro_rules! reflect {
    ($version:ident, $ch:expr) => {{
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        let ask = |m| ServerReflectionRequest { host: String::new(), message_request: Some(m) };
        let mut reqs = vec![ask(MessageRequest::ListServices(String::new()))];
        reqs.extend(SYMBOLS.iter().map(|s| ask(MessageRequest::FileContainingSymbol(s.to_string()))));
        let mut stream = ServerReflectionClient::new($ch.clone())
            .server_reflection_info(futures::stream::iter(reqs))
            .await
            .expect(stringify!($version))
            .into_inner();
        let first = stream.message().await.expect("ok").expect("a response");
        let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else { panic!("{first:?}") };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        let mut found = Vec::new();
        for s in SYMBOLS {
            let r = stream.message().await.expect("ok").expect("a response");
            let file = matches!(r.message_response,
                Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty());
            found.push((s, file));
        }
        (names, found)
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let n = TestNode::start().await;
    let ch = channel(&n.node().grpc_addr.to_string()).await;
    let mut health = HealthClient::new(ch.clone());
    let raftq_services =
        ["raftq.v1.TaskService", "raftq.v1.WorkerStream", "raftq.v1.ProducerStream", "raftq.v1.Admin", "raftq.v1.Jobs"];
    for service in std::iter::once("").chain(raftq_services) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let req = tonic_health::pb::HealthCheckRequest { service: service.into() };
            let s = health.check(req).await.expect("health").into_inner().status;
            if s == ServingStatus::Serving as i32 {
                break;
            }
            assert!(Instant::now() < deadline, "{service:?} not serving: {s}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A service the port does not serve is unknown to the health service too.
    let req = tonic_health::pb::HealthCheckRequest { service: "raftq.v1.RaftService".into() };
    let e = health.check(req).await.expect_err("not served here");
    assert_eq!(e.code(), tonic::Code::NotFound);

    // Both reflection versions list what the port serves, and only that; each resolves the services' files.
    let served: Vec<&str> = raftq_services
        .into_iter()
        .chain([
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ])
        .collect();
    for (version, (listed, found)) in [("v1", reflect!(v1, &ch)), ("v1alpha", reflect!(v1alpha, &ch))] {
        let mut want = served.clone();
        want.sort();
        assert_eq!(listed, want, "{version}");
        for (symbol, found) in found {
            assert!(found, "{version}: no file descriptor for {symbol}");
        }
    }
}
