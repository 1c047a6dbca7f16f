//! Job features (issue 9) through gRPC, REST and the SDK against a real one-node server: runs and exception
//! reasons, deadlines, heartbeat progress.

use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use serde_json::json;

use crate::rest::http;
use crate::support::*;

fn fast(c: &mut raftq::config::Config) {
    c.lease_min_ms = 50;
    c.retry_base_ms = 10;
    c.retry_max_ms = 10;
    c.retry_exponential = false;
}

async fn claim_one(c: &mut Client, queue: &str, worker: &str) -> pb::Task {
    let req = pb::ClaimRequest {
        worker_id: worker.into(),
        queues: vec![queue.into()],
        count: 1,
        lease_ms: 30_000,
        wait_ms: 2_000,
    };
    c.claim(req).await.expect("claim").into_inner().tasks.pop().expect("a task")
}

fn token(t: &pb::Task) -> u64 {
    t.lease.as_ref().expect("claimed").token
}

async fn ack(c: &mut Client, t: &pb::Task, action: Action) -> Result<pb::AckResponse, tonic::Status> {
    c.ack(pb::AckRequest { task_id: t.id.clone(), token: token(t), action: Some(action) }).await.map(|r| r.into_inner())
}

fn exception(reason: &str) -> Action {
    Action::Exception(pb::Exception { reason: reason.into(), message: "details".into() })
}

async fn get(c: &mut Client, id: &str) -> pb::Task {
    c.get_task(pb::GetTaskRequest { id: id.into() }).await.expect("get").into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exception_reasons_runs_and_progress_through_grpc() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;

    // malformed-payload: failed for good, one run with the reason.
    let id = c.enqueue(pb::EnqueueRequest { max_attempts: 5, ..enq("mp", "x") }).await.expect("enqueue");
    let id = id.into_inner().task_id;
    let t = claim_one(&mut c, "mp", "w-a").await;
    let r = ack(&mut c, &t, exception("malformed-payload")).await.expect("applied");
    assert_eq!(r.state, pb::TaskState::Failed as i32);
    let t = get(&mut c, &id).await;
    assert_eq!((t.runs.len(), t.runs[0].outcome.as_str()), (1, "EXCEPTION"));
    assert_eq!((t.runs[0].reason.as_str(), t.runs[0].worker_id.as_str()), ("malformed-payload", "w-a"));
    assert!(t.runs[0].ended_at_ms >= t.runs[0].started_at_ms && t.runs[0].ended_at_ms > 0);
    assert_eq!(t.last_error, "malformed-payload: details");

    // worker-shutdown: back at once without using the attempt; the next run is a second run.
    let id = c.enqueue(pb::EnqueueRequest { max_attempts: 1, ..enq("ws", "x") }).await.expect("enqueue");
    let id = id.into_inner().task_id;
    let t = claim_one(&mut c, "ws", "w-a").await;
    let r = ack(&mut c, &t, exception("worker-shutdown")).await.expect("applied");
    assert_eq!(r.state, pb::TaskState::Pending as i32);
    let t = claim_one(&mut c, "ws", "w-b").await;
    assert_eq!((t.id.as_str(), t.attempts, t.runs.len()), (id.as_str(), 1, 2));
    // Progress rides on a heartbeat and shows in GetTask.
    let hb = Action::Heartbeat(pb::Heartbeat {
        extend_ms: 30_000,
        progress: Some(pb::Progress { percent: 40, message: "copying".into(), at_ms: 0 }),
    });
    ack(&mut c, &t, hb).await.expect("heartbeat");
    let shown = get(&mut c, &id).await;
    let p = shown.progress.expect("progress");
    assert_eq!((p.percent, p.message.as_str()), (40, "copying"));
    assert!(p.at_ms > 0);
    let bad = Action::Heartbeat(pb::Heartbeat {
        extend_ms: 30_000,
        progress: Some(pb::Progress { percent: 101, message: String::new(), at_ms: 0 }),
    });
    assert_eq!(reason(&ack(&mut c, &t, bad).await.expect_err("percent > 100")), "INVALID_ARGUMENT");
    ack(&mut c, &t, Action::Complete(pb::Complete::default())).await.expect("complete");
    let t = get(&mut c, &id).await;
    let runs: Vec<(&str, &str, &str)> =
        t.runs.iter().map(|r| (r.worker_id.as_str(), r.outcome.as_str(), r.reason.as_str())).collect();
    assert_eq!(runs, vec![("w-a", "EXCEPTION", "worker-shutdown"), ("w-b", "COMPLETED", "")]);

    // resource-unavailable and internal-error: retried after the backoff, the attempt counts.
    for why in ["resource-unavailable", "internal-error"] {
        let q = format!("q-{why}");
        c.enqueue(pb::EnqueueRequest { max_attempts: 2, ..enq(&q, "x") }).await.expect("enqueue");
        let t1 = claim_one(&mut c, &q, "w").await;
        let r = ack(&mut c, &t1, exception(why)).await.expect("applied");
        assert_eq!(r.state, pb::TaskState::Pending as i32, "{why}");
        let t2 = claim_one(&mut c, &q, "w").await;
        assert_eq!((t2.id.as_str(), t2.attempts), (t1.id.as_str(), 2), "{why}");
        let r = ack(&mut c, &t2, exception(why)).await.expect("applied");
        assert_eq!(r.state, pb::TaskState::DeadLettered as i32, "{why}: attempts spent");
    }

    // An unknown reason is refused and changes nothing.
    c.enqueue(enq("bad", "x")).await.expect("enqueue");
    let t = claim_one(&mut c, "bad", "w").await;
    assert_eq!(reason(&ack(&mut c, &t, exception("bored")).await.expect_err("unknown")), "INVALID_ARGUMENT");
    assert_eq!(get(&mut c, &t.id).await.state, pb::TaskState::InProgress as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_deadline_fails_with_deadline_exceeded() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let running = c.enqueue(pb::EnqueueRequest { deadline_in_ms: 400, ..enq("dl", "x") }).await.expect("enqueue");
    let running = running.into_inner().task_id;
    let waiting = c.enqueue(pb::EnqueueRequest { deadline_in_ms: 400, delay_ms: 60_000, ..enq("dl", "y") }).await;
    let waiting = waiting.expect("enqueue").into_inner().task_id;
    let t = claim_one(&mut c, "dl", "w").await;
    assert_eq!(t.id, running);
    assert!(t.deadline_ms > 0);
    // Nothing else is written: the leader's tick moves time to the deadline.
    let res = c.get_result(pb::GetResultRequest { id: running.clone(), wait_ms: 5_000 }).await.expect("result");
    let res = res.into_inner();
    assert!(res.done);
    assert_eq!((res.state, res.error.as_str()), (pb::TaskState::Failed as i32, "deadline-exceeded"));
    let t2 = get(&mut c, &running).await;
    assert_eq!((t2.runs[0].outcome.as_str(), t2.runs[0].reason.as_str()), ("DEADLINE_EXCEEDED", "deadline-exceeded"));
    let res = c.get_result(pb::GetResultRequest { id: waiting, wait_ms: 5_000 }).await.expect("result").into_inner();
    assert_eq!((res.state, res.error.as_str()), (pb::TaskState::Failed as i32, "deadline-exceeded"), "pending too");
    let late = ack(&mut c, &t, Action::Complete(pb::Complete::default())).await.expect_err("too late");
    assert_eq!(reason(&late), "NOT_IN_PROGRESS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_exception_progress_and_runs() {
    let n = TestNode::start_with(fast).await;
    let a = n.node().http_addr;
    let (code, _, body) =
        http(a, "POST", "/v1/tasks", Some(json!({"queue": "r", "payload": "p", "deadline_in_ms": 600000}))).await;
    assert_eq!(code, 201, "{body}");
    let id = body["task_id"].as_str().expect("id").to_string();
    let claim = json!({"worker_id": "rest-w", "queues": ["r"], "lease_ms": 30000});
    let (_, _, c) = http(a, "POST", "/v1/claim", Some(claim)).await;
    let token = c["tasks"][0]["lease"]["token"].as_str().expect("token").to_string();
    let hb = json!({"token": token, "extend_ms": 30000, "progress_percent": 75, "message": "almost"});
    let (code, _, h) = http(a, "POST", &format!("/v1/tasks/{id}/heartbeat"), Some(hb)).await;
    assert_eq!(code, 200, "{h}");
    let (_, _, t) = http(a, "GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!((t["progress"]["percent"].as_u64(), t["progress"]["message"].as_str()), (Some(75), Some("almost")));
    assert!(t["deadline_ms"].as_i64().expect("deadline") > 0);
    let x = json!({"token": token, "reason": "malformed-payload", "message": "not json"});
    let (code, _, e) = http(a, "POST", &format!("/v1/tasks/{id}/exception"), Some(x)).await;
    assert_eq!((code, e["state"].as_str()), (200, Some("FAILED")), "{e}");
    let (_, _, t) = http(a, "GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!(t["runs"][0]["outcome"].as_str(), Some("EXCEPTION"));
    assert_eq!(t["runs"][0]["reason"].as_str(), Some("malformed-payload"));
    assert_eq!(t["runs"][0]["worker_id"].as_str(), Some("rest-w"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_worker_reports_an_exception_and_producer_sees_the_runs() {
    use raftq_client::{NewTask, Outcome, Producer, ProducerConfig, Worker, WorkerConfig};
    let n = TestNode::start_with(fast).await;
    let addr = n.node().grpc_addr.to_string();
    let p = Producer::connect(ProducerConfig { addrs: vec![addr.clone()], ..Default::default() }).await.expect("p");
    let e = p.enqueue(NewTask::new("sdk-x", "payload").deadline(Duration::from_secs(600))).await.expect("enqueue");
    let w = Worker::new(WorkerConfig {
        addrs: vec![addr],
        queues: vec!["sdk-x".into()],
        worker_id: "sdk-w".into(),
        ..Default::default()
    })
    .expect("worker");
    let stop = raftq_client::CancellationToken::new();
    let run = {
        let (stop, p) = (stop.clone(), p.clone());
        tokio::spawn(async move {
            w.run(
                move |t| {
                    let p = p.clone();
                    async move {
                        p.report_progress(&t, 50, "parsing").await.expect("progress");
                        Outcome::Exception { reason: "malformed-payload".into(), message: "cannot parse".into() }
                    }
                },
                stop,
            )
            .await
        })
    };
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert!(r.done);
    stop.cancel();
    let summary = run.await.expect("join").expect("worker");
    assert_eq!(summary.exceptions, 1);
    let t = p.get(&e.task_id).await.expect("get");
    assert_eq!(t.state, raftq_client::TaskState::Failed);
    assert_eq!((t.runs.len(), t.runs[0].reason.as_str()), (1, "malformed-payload"));
    let progress = t.progress.expect("reported progress");
    assert_eq!((progress.percent, progress.message.as_str()), (50, "parsing"));
    assert!(t.deadline_ms > 0);
}

async fn jobs_client(n: &TestNode) -> raftq_proto::v1::jobs_client::JobsClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", n.node().grpc_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    raftq_proto::v1::jobs_client::JobsClient::new(ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_keeps_accepting_serves_nothing_and_resumes_in_order() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let mut j = jobs_client(&n).await;
    let first = c.enqueue(enq("pq", "1")).await.expect("enqueue").into_inner().task_id;
    let p = j.pause_queue(pb::PauseQueueRequest { queue: "pq".into() }).await.expect("pause").into_inner();
    assert!(p.paused);
    let second = c.enqueue(enq("pq", "2")).await.expect("accepted while paused").into_inner().task_id;
    c.enqueue(enq("open", "x")).await.expect("enqueue");
    let claim = |queue: &str, wait_ms| pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec![queue.into()],
        count: 10,
        lease_ms: 30_000,
        wait_ms,
    };
    assert!(c.claim(claim("pq", 200)).await.expect("claim").into_inner().tasks.is_empty(), "paused");
    assert_eq!(c.claim(claim("open", 0)).await.expect("claim").into_inner().tasks.len(), 1, "others are served");
    let stats = c.queue_stats(pb::QueueStatsRequest { queues: vec!["pq".into()] }).await.expect("stats");
    let stats = stats.into_inner().queues;
    assert_eq!((stats[0].pending, stats[0].paused), (2, true));
    let paused = j.list_paused_queues(pb::ListPausedQueuesRequest {}).await.expect("list").into_inner().queues;
    assert_eq!(paused, vec!["pq".to_string()]);

    // A claim parked on the paused queue is woken by the resume.
    let mut c2 = n.client().await;
    let parked = tokio::spawn(async move { c2.claim(claim("pq", 10_000)).await.expect("claim").into_inner().tasks });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = j.resume_queue(pb::ResumeQueueRequest { queue: "pq".into() }).await.expect("resume").into_inner();
    assert!(!r.paused);
    let got: Vec<String> = parked.await.expect("join").into_iter().map(|t| t.id).collect();
    assert_eq!(got, vec![first, second], "FIFO after the resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_tasks_filters_by_queue_state_and_time_a_page_at_a_time() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let mut j = jobs_client(&n).await;
    let mut ids = Vec::new();
    for i in 0..25 {
        ids.push(c.enqueue(enq("lq", &i.to_string())).await.expect("enqueue").into_inner().task_id);
    }
    c.enqueue(enq("other", "x")).await.expect("enqueue");
    let claimed = claim_now(&mut c, "lq", 5).await;
    for t in &claimed {
        let done = pb::AckRequest {
            task_id: t.id.clone(),
            token: token(t),
            action: Some(Action::Complete(Default::default())),
        };
        c.ack(done).await.expect("complete");
    }
    let mut seen = Vec::new();
    let mut token_ = String::new();
    let mut pages = 0;
    loop {
        let req = pb::ListTasksRequest {
            queue: "lq".into(),
            page_size: 10,
            page_token: token_.clone(),
            ..Default::default()
        };
        let page = j.list_tasks(req).await.expect("list").into_inner();
        pages += 1;
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token_ = page.next_page_token;
    }
    assert_eq!(pages, 3);
    let mut want = ids.clone();
    want.sort();
    assert_eq!(seen, want, "every task of the queue once, in id order");

    let req = pb::ListTasksRequest { state: pb::TaskState::Completed as i32, ..Default::default() };
    let done = j.list_tasks(req).await.expect("list").into_inner().tasks;
    let mut want: Vec<String> = claimed.iter().map(|t| t.id.clone()).collect();
    want.sort();
    assert_eq!(done.iter().map(|t| t.id.clone()).collect::<Vec<_>>(), want);

    // A time range: before the first task nothing, from the 11th task's creation on 15 of them.
    let all = j.list_tasks(pb::ListTasksRequest { queue: "lq".into(), page_size: 100, ..Default::default() });
    let all = all.await.expect("list").into_inner().tasks;
    let t0 = all[0].created_at_ms;
    let req = pb::ListTasksRequest { queue: "lq".into(), created_to_ms: t0, ..Default::default() };
    assert!(j.list_tasks(req).await.expect("list").into_inner().tasks.is_empty());
    let cut = all[10].created_at_ms;
    let req = pb::ListTasksRequest { queue: "lq".into(), created_from_ms: cut, page_size: 100, ..Default::default() };
    let from = j.list_tasks(req).await.expect("list").into_inner().tasks;
    assert_eq!(from.len(), all.iter().filter(|t| t.created_at_ms >= cut).count());
    assert!(from.iter().all(|t| t.created_at_ms >= cut));
    let bad = pb::ListTasksRequest { page_token: "nonsense".into(), ..Default::default() };
    assert_eq!(reason(&j.list_tasks(bad).await.expect_err("bad token")), "INVALID_ARGUMENT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_figures_match_a_known_workload() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let mut j = jobs_client(&n).await;
    for i in 0..12 {
        c.enqueue(enq("cap", &i.to_string())).await.expect("enqueue");
    }
    // Two workers complete 6 tasks (3 each); 6 stay pending.
    for w in ["w1", "w2"] {
        let req = pb::ClaimRequest {
            worker_id: w.into(),
            queues: vec!["cap".into()],
            count: 3,
            lease_ms: 30_000,
            wait_ms: 0,
        };
        for t in c.claim(req).await.expect("claim").into_inner().tasks {
            let done = pb::AckRequest {
                task_id: t.id.clone(),
                token: token(&t),
                action: Some(Action::Complete(Default::default())),
            };
            c.ack(done).await.expect("complete");
        }
    }
    let cap = j.queue_capacity(pb::QueueCapacityRequest { queues: vec!["cap".into()] }).await.expect("capacity");
    let q = cap.into_inner().queues.remove(0);
    assert_eq!((q.pending, q.ready, q.running, q.active_workers), (6, 6, 0, 2));
    assert_eq!((q.completed_1m, q.completed_5m, q.completed_15m), (6, 6, 6));
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(q.rate_5m, 6.0 / 300.0), "{}", q.rate_5m);
    assert!(close(q.rate_1m, 6.0 / 60.0), "{}", q.rate_1m);
    // 6 pending at 6 per 5 minutes: 300 s. Per worker 1 per 100 s: 36 per hour, so 1 worker drains in 1 h.
    assert!(close(q.drain_seconds, 300.0), "{}", q.drain_seconds);
    assert!(close(q.per_worker_rate, 0.01), "{}", q.per_worker_rate);
    assert_eq!((q.workers_needed_1h, q.workers_needed_4h, q.workers_needed_8h), (1, 1, 1));
    // An unknown queue asked for by name reports zeros.
    let empty = j.queue_capacity(pb::QueueCapacityRequest { queues: vec!["none".into()] }).await.expect("capacity");
    let e = empty.into_inner().queues.remove(0);
    assert_eq!((e.pending, e.drain_seconds, e.workers_needed_1h), (0, 0.0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_and_sdk_pause_list_and_capacity() {
    use raftq_client::{NewTask, Producer, ProducerConfig, TaskQuery, TaskState};
    let n = TestNode::start_with(fast).await;
    let a = n.node().http_addr;
    let p = Producer::connect(ProducerConfig { addrs: vec![n.node().grpc_addr.to_string()], ..Default::default() })
        .await
        .expect("producer");
    for i in 0..3 {
        p.enqueue(NewTask::new("rq", i.to_string())).await.expect("enqueue");
    }
    let (code, _, b) = http(a, "POST", "/v1/queues/rq/pause", None).await;
    assert_eq!((code, b["paused"].as_bool()), (200, Some(true)), "{b}");
    let (_, _, qs) = http(a, "GET", "/v1/queues", None).await;
    assert_eq!(qs["queues"][0]["paused"].as_bool(), Some(true), "{qs}");
    let claim = json!({"worker_id": "w", "queues": ["rq"], "wait_ms": 100});
    let (_, _, cl) = http(a, "POST", "/v1/claim", Some(claim)).await;
    assert_eq!(cl["tasks"].as_array().map(|v| v.len()), Some(0), "paused");
    assert!(!p.resume_queue("rq").await.expect("resume"), "the SDK resumes it");
    assert!(p.pause_queue("rq").await.expect("pause again"));
    let (code, _, b) = http(a, "POST", "/v1/queues/rq/resume", None).await;
    assert_eq!((code, b["paused"].as_bool()), (200, Some(false)));

    let (code, _, l) = http(a, "GET", "/v1/tasks?queue=rq&state=pending&page_size=2", None).await;
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["tasks"].as_array().map(|v| v.len()), Some(2));
    let next = l["next_page_token"].as_str().expect("more").to_string();
    let (_, _, l2) = http(a, "GET", &format!("/v1/tasks?queue=rq&page_size=2&page_token={next}"), None).await;
    assert_eq!((l2["tasks"].as_array().map(|v| v.len()), l2["next_page_token"].is_null()), (Some(1), true));
    let (code, _, bad) = http(a, "GET", "/v1/tasks?state=sleeping", None).await;
    assert_eq!((code, bad["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")));

    let page = p
        .list_tasks(&TaskQuery {
            queue: Some("rq".into()),
            state: Some(TaskState::Pending),
            page_size: 2,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(page.tasks.len(), 2);
    let rest = p
        .list_tasks(&TaskQuery { queue: Some("rq".into()), page_token: page.next_page_token, ..Default::default() })
        .await
        .expect("list");
    assert_eq!((rest.tasks.len(), rest.next_page_token), (1, None));

    let (code, _, cap) = http(a, "GET", "/v1/queues/rq/capacity", None).await;
    assert_eq!((code, cap["pending"].as_u64(), cap["drain_seconds"].is_null()), (200, Some(3), true), "{cap}");
    let sdk = p.capacity(&["rq"]).await.expect("capacity");
    assert_eq!((sdk[0].pending, sdk[0].drain, sdk[0].workers_needed), (3, None, [None; 3]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_keys_limit_running_tasks_without_blocking_others() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let keyed = |key: &str, limit: u32, p: &str| pb::EnqueueRequest {
        concurrency_key: key.into(),
        concurrency_limit: limit,
        ..enq("ck", p)
    };
    let mut s1 = Vec::new();
    for i in 0..3 {
        s1.push(c.enqueue(keyed("store-1", 1, &format!("s1-{i}"))).await.expect("enqueue").into_inner().task_id);
    }
    let s2 = c.enqueue(keyed("store-2", 2, "s2")).await.expect("enqueue").into_inner().task_id;
    let plain = c.enqueue(enq("ck", "plain")).await.expect("enqueue").into_inner().task_id;
    let bad = pb::EnqueueRequest { concurrency_limit: 2, ..enq("ck", "x") };
    assert_eq!(reason(&c.enqueue(bad).await.expect_err("limit without key")), "INVALID_ARGUMENT");

    let claim = |wait_ms| pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec!["ck".into()],
        count: 10,
        lease_ms: 30_000,
        wait_ms,
    };
    let got = c.claim(claim(0)).await.expect("claim").into_inner().tasks;
    let mut ids: Vec<String> = got.iter().map(|t| t.id.clone()).collect();
    ids.sort();
    let mut want = vec![s1[0].clone(), s2.clone(), plain.clone()];
    want.sort();
    assert_eq!(ids, want, "one of store-1 (limit 1), and everything not blocked");
    let first = got.iter().find(|t| t.id == s1[0]).expect("store-1's first").clone();
    assert_eq!((first.concurrency_key.as_str(), first.concurrency_limit), ("store-1", 1));

    // A claim parked while store-1 is full is served as soon as its running task ends.
    let mut c2 = n.client().await;
    let parked = tokio::spawn(async move { c2.claim(claim(10_000)).await.expect("claim").into_inner().tasks });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let done = pb::AckRequest {
        task_id: first.id.clone(),
        token: token(&first),
        action: Some(Action::Complete(Default::default())),
    };
    c.ack(done).await.expect("complete");
    let next: Vec<String> = parked.await.expect("join").into_iter().map(|t| t.id).collect();
    assert_eq!(next, vec![s1[1].clone()]);

    // REST carries the key too.
    let a = n.node().http_addr;
    let body = json!({"queue": "ck-rest", "payload": "p", "concurrency_key": "k", "concurrency_limit": 1});
    let (code, _, b) = http(a, "POST", "/v1/tasks", Some(body)).await;
    assert_eq!(code, 201, "{b}");
    let (_, _, t) = http(a, "GET", &format!("/v1/tasks/{}", b["task_id"].as_str().expect("id")), None).await;
    assert_eq!((t["concurrency_key"].as_str(), t["concurrency_limit"].as_u64()), (Some("k"), Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_workers_never_run_more_than_a_keys_limit_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use raftq_client::{NewTask, Outcome, Producer, ProducerConfig, Worker, WorkerConfig};
    let n = TestNode::start_with(fast).await;
    let addr = n.node().grpc_addr.to_string();
    let p = Producer::connect(ProducerConfig { addrs: vec![addr.clone()], ..Default::default() }).await.expect("p");
    let mut ids = Vec::new();
    for i in 0..6 {
        let t = NewTask::new("sdk-ck", format!("a{i}")).concurrency("tenant-a", 2);
        ids.push(p.enqueue(t).await.expect("enqueue").task_id);
    }
    for i in 0..4 {
        ids.push(
            p.enqueue(NewTask::new("sdk-ck", format!("b{i}")).concurrency("tenant-b", 1)).await.expect("e").task_id,
        );
    }
    // Two workers of 4 slots each: 8 slots for keys allowing 2 + 1 at once.
    let running = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let peak = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let stop = raftq_client::CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..2 {
        let worker = Worker::new(WorkerConfig {
            addrs: vec![addr.clone()],
            queues: vec!["sdk-ck".into()],
            worker_id: format!("w{w}"),
            concurrency: 4,
            ..Default::default()
        })
        .expect("worker");
        let (running, peak, stop) = (running.clone(), peak.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            worker
                .run(
                    move |t| {
                        let (running, peak) = (running.clone(), peak.clone());
                        async move {
                            let k = usize::from(t.payload.starts_with(b"b"));
                            let now = running[k].fetch_add(1, Ordering::SeqCst) + 1;
                            peak[k].fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(60)).await;
                            running[k].fetch_sub(1, Ordering::SeqCst);
                            Outcome::Completed(t.payload)
                        }
                    },
                    stop,
                )
                .await
        }));
    }
    for id in &ids {
        assert!(p.result(id, Duration::from_secs(20)).await.expect("result").done);
    }
    stop.cancel();
    for w in workers {
        w.await.expect("join").expect("worker");
    }
    assert!((1..=2).contains(&peak[0].load(Ordering::SeqCst)), "tenant-a ran at most its limit of 2");
    assert_eq!(peak[1].load(Ordering::SeqCst), 1, "tenant-b ran one at a time");
}

fn chained(follow_ups: Vec<pb::EnqueueRequest>) -> Action {
    Action::Complete(pb::Complete { result: b"done".to_vec().into(), follow_ups })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_completion_creates_follow_ups_with_it_or_not_at_all() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let parent = c.enqueue(enq("step1", "p")).await.expect("enqueue").into_inner().task_id;
    let t = claim_one(&mut c, "step1", "w").await;
    let next = vec![enq("step2", "a"), pb::EnqueueRequest { priority: 5, ..enq("step2", "b") }];
    // Refused with a stale token: nothing is created.
    let stale = pb::AckRequest { task_id: parent.clone(), token: token(&t) + 1, action: Some(chained(next.clone())) };
    assert_eq!(reason(&c.ack(stale).await.expect_err("stale")), "LEASE_LOST");
    let mut j = jobs_client(&n).await;
    let listed = j.list_tasks(pb::ListTasksRequest { queue: "step2".into(), ..Default::default() }).await;
    assert!(listed.expect("list").into_inner().tasks.is_empty());
    // Keys are refused on follow-ups.
    let keyed = vec![pb::EnqueueRequest { idempotency_key: "k".into(), ..enq("step2", "x") }];
    assert_eq!(reason(&ack(&mut c, &t, chained(keyed)).await.expect_err("keyed")), "INVALID_ARGUMENT");

    let r = ack(&mut c, &t, chained(next)).await.expect("applied");
    assert_eq!(r.state, pb::TaskState::Completed as i32);
    assert_eq!(r.follow_up_ids.len(), 2);
    let p = get(&mut c, &parent).await;
    assert_eq!(p.follow_up_ids, r.follow_up_ids);
    for id in &r.follow_up_ids {
        let f = get(&mut c, id).await;
        assert_eq!(
            (f.parent_id.as_str(), f.state, f.tenant.as_str()),
            (parent.as_str(), pb::TaskState::Pending as i32, "default")
        );
    }
    // Sent again (an unknown outcome retried): applied once, the same follow-ups.
    let again = ack(&mut c, &t, chained(vec![enq("step2", "c")])).await.expect("replay");
    assert_eq!(again.follow_up_ids, r.follow_up_ids);
    let listed = j.list_tasks(pb::ListTasksRequest { queue: "step2".into(), ..Default::default() }).await;
    assert_eq!(listed.expect("list").into_inner().tasks.len(), 2);
    let next = claim_one(&mut c, "step2", "w").await;
    assert_eq!(&next.payload[..], b"b", "priorities of follow-ups are kept");

    // REST: follow_ups on /complete.
    let a = n.node().http_addr;
    let (_, _, e) = http(a, "POST", "/v1/tasks", Some(json!({"queue": "r1", "payload": "x"}))).await;
    let id = e["task_id"].as_str().expect("id").to_string();
    let (_, _, cl) = http(a, "POST", "/v1/claim", Some(json!({"worker_id": "w", "queues": ["r1"]}))).await;
    let tok = cl["tasks"][0]["lease"]["token"].as_str().expect("token").to_string();
    let body = json!({"token": tok, "result": "ok", "follow_ups": [{"queue": "r2", "payload": "next"}]});
    let (code, _, done) = http(a, "POST", &format!("/v1/tasks/{id}/complete"), Some(body)).await;
    assert_eq!((code, done["state"].as_str()), (200, Some("COMPLETED")), "{done}");
    let fid = done["follow_up_ids"][0].as_str().expect("follow-up id");
    let (_, _, f) = http(a, "GET", &format!("/v1/tasks/{fid}"), None).await;
    assert_eq!((f["queue"].as_str(), f["parent_id"].as_str()), (Some("r2"), Some(id.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_worker_chains_a_follow_up() {
    use raftq_client::{NewTask, Outcome, Producer, ProducerConfig, Worker, WorkerConfig};
    let n = TestNode::start_with(fast).await;
    let addr = n.node().grpc_addr.to_string();
    let p = Producer::connect(ProducerConfig { addrs: vec![addr.clone()], ..Default::default() }).await.expect("p");
    let first = p.enqueue(NewTask::new("sdk-a", "1")).await.expect("enqueue").task_id;
    let w = Worker::new(WorkerConfig {
        addrs: vec![addr],
        queues: vec!["sdk-a".into(), "sdk-b".into()],
        worker_id: "chain".into(),
        ..Default::default()
    })
    .expect("worker");
    let stop = raftq_client::CancellationToken::new();
    let run = {
        let stop = stop.clone();
        tokio::spawn(async move {
            w.run(
                |t| async move {
                    if t.queue == "sdk-a" {
                        Outcome::CompletedWith {
                            result: "a".into(),
                            follow_ups: vec![NewTask::new("sdk-b", format!("after {}", t.id))],
                        }
                    } else {
                        Outcome::Completed(t.payload)
                    }
                },
                stop,
            )
            .await
        })
    };
    assert!(p.result(&first, Duration::from_secs(10)).await.expect("result").done);
    let parent = p.get(&first).await.expect("get");
    assert_eq!(parent.follow_up_ids.len(), 1);
    let child = p.result(&parent.follow_up_ids[0], Duration::from_secs(10)).await.expect("result");
    assert!(child.done);
    assert_eq!(child.result, format!("after {first}").into_bytes());
    stop.cancel();
    let s = run.await.expect("join").expect("worker");
    assert_eq!(s.completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_in_both_rules_with_cancellation_through_grpc_rest_and_sdk() {
    let n = TestNode::start_with(fast).await;
    let mut c = n.client().await;
    let a = c.enqueue(enq("dep", "a")).await.expect("enqueue").into_inner().task_id;
    let b = c.enqueue(enq("dep", "b")).await.expect("enqueue").into_inner().task_id;
    let after = |deps: &[&String], rule: pb::DependencyRule, q: &str| pb::EnqueueRequest {
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        dependency_rule: rule as i32,
        ..enq(q, "waits")
    };
    let all_done = c.enqueue(after(&[&a, &b], pb::DependencyRule::AllCompleted, "next")).await.expect("e");
    let all_done = all_done.into_inner().task_id;
    let all_ended = c.enqueue(after(&[&a, &b], pb::DependencyRule::AllResolved, "next")).await.expect("e");
    let all_ended = all_ended.into_inner().task_id;
    // Cancelled in turn when all_done is cancelled.
    let grandchild = c.enqueue(after(&[&all_done], pb::DependencyRule::AllCompleted, "next")).await.expect("e");
    let grandchild = grandchild.into_inner().task_id;
    let unknown = "0".repeat(32);
    let bad = c.enqueue(after(&[&unknown], pb::DependencyRule::AllCompleted, "next")).await.expect_err("unknown");
    assert_eq!(reason(&bad), "INVALID_ARGUMENT");
    let shown = get(&mut c, &all_done).await;
    assert_eq!((shown.state, shown.waiting_on.len()), (pb::TaskState::Pending as i32, 2));

    let next = |wait_ms| pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec!["next".into()],
        count: 10,
        lease_ms: 30_000,
        wait_ms,
    };
    assert!(c.claim(next(100)).await.expect("claim").into_inner().tasks.is_empty(), "all wait");
    let ta = claim_one(&mut c, "dep", "w").await;
    let tb = claim_one(&mut c, "dep", "w").await;
    let (ta, tb) = if ta.id == a { (ta, tb) } else { (tb, ta) };
    ack(&mut c, &ta, Action::Complete(pb::Complete::default())).await.expect("a completes");
    ack(&mut c, &tb, Action::Fail(pb::Fail { error: "no".into(), retryable: false })).await.expect("b fails");

    for id in [&all_done, &grandchild] {
        let r = c.get_result(pb::GetResultRequest { id: id.clone(), wait_ms: 5_000 }).await.expect("result");
        let r = r.into_inner();
        assert_eq!(r.state, pb::TaskState::Cancelled as i32, "{id}: all-completed can no longer be met");
        assert!(r.error.contains("dependency"), "{}", r.error);
    }
    let got = c.claim(next(5_000)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.iter().map(|t| t.id.clone()).collect::<Vec<_>>(), vec![all_ended], "all-resolved is ready");

    // REST and the SDK carry dependencies too.
    use raftq_client::{NewTask, Producer, ProducerConfig};
    let p = Producer::connect(ProducerConfig { addrs: vec![n.node().grpc_addr.to_string()], ..Default::default() })
        .await
        .expect("producer");
    let x = p.enqueue(NewTask::new("sdk-dep", "x")).await.expect("enqueue").task_id;
    let y = p.enqueue(NewTask::new("sdk-dep", "y").after_all_completed([x.clone()])).await.expect("e").task_id;
    let yt = p.get(&y).await.expect("get");
    assert_eq!((yt.depends_on.clone(), yt.waiting_on.len(), yt.all_resolved), (vec![x.clone()], 1, false));
    let a_http = n.node().http_addr;
    let body = json!({"queue": "rest-dep", "payload": "z", "depends_on": [x], "dependency_rule": "all_resolved"});
    let (code, _, z) = http(a_http, "POST", "/v1/tasks", Some(body)).await;
    assert_eq!(code, 201, "{z}");
    let (_, _, zt) = http(a_http, "GET", &format!("/v1/tasks/{}", z["task_id"].as_str().expect("id")), None).await;
    assert_eq!(
        (zt["dependency_rule"].as_str(), zt["waiting_on"][0].as_str()),
        (Some("all_resolved"), Some(x.as_str()))
    );
    assert_eq!(p.cancel(&x).await.expect("cancel"), raftq_client::TaskState::Cancelled);
    let r = p.result(&y, Duration::from_secs(5)).await.expect("result");
    assert_eq!(r.state, raftq_client::TaskState::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_fire_each_occurrence_once_pause_resume_and_delete() {
    let n = TestNode::start_with(fast).await;
    let mut j = jobs_client(&n).await;
    let req = pb::CreateScheduleRequest {
        name: "tick".into(),
        task: Some(enq("sched", "beat")),
        interval_ms: 200,
        ..Default::default()
    };
    let s = j.create_schedule(req).await.expect("create").into_inner();
    assert!(s.next_occurrence_ms > s.created_at_ms);
    let bad = pb::CreateScheduleRequest {
        name: "x".into(),
        task: Some(enq("q", "")),
        cron: "61 * * * *".into(),
        ..Default::default()
    };
    assert_eq!(reason(&j.create_schedule(bad).await.expect_err("bad cron")), "INVALID_ARGUMENT");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let paused = j.pause_schedule(pb::ScheduleRef { id: s.id.clone() }).await.expect("pause").into_inner();
    assert!(paused.paused);
    let fired = paused.fired;
    assert!(fired >= 3, "fired {fired} times in 1.1 s at 200 ms");
    let list = |j: &mut raftq_proto::v1::jobs_client::JobsClient<tonic::transport::Channel>| {
        let mut j = j.clone();
        async move {
            let req = pb::ListTasksRequest { queue: "sched".into(), page_size: 1000, ..Default::default() };
            j.list_tasks(req).await.expect("list").into_inner().tasks
        }
    };
    let tasks = list(&mut j).await;
    assert_eq!(tasks.len() as u64, fired);
    let mut occ: Vec<i64> = tasks.iter().map(|t| t.scheduled_for_ms).collect();
    occ.sort();
    let want: Vec<i64> = (1..=fired as i64).map(|k| s.created_at_ms + 200 * k).collect();
    assert_eq!(occ, want, "every occurrence exactly once, in order");
    assert!(tasks.iter().all(|t| t.schedule_id == s.id));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(list(&mut j).await.len() as u64, fired, "a paused schedule fires nothing");
    let resumed = j.resume_schedule(pb::ScheduleRef { id: s.id.clone() }).await.expect("resume").into_inner();
    assert!(!resumed.paused);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let listed = j.list_schedules(pb::ListSchedulesRequest {}).await.expect("list").into_inner().schedules;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].fired > fired, "resumed");
    j.delete_schedule(pb::ScheduleRef { id: s.id.clone() }).await.expect("delete");
    assert!(j.list_schedules(pb::ListSchedulesRequest {}).await.expect("list").into_inner().schedules.is_empty());

    // REST and the SDK: a cron schedule in a time zone.
    let a = n.node().http_addr;
    let body = json!({"name": "nightly", "task": {"queue": "night", "payload": "p"}, "cron": "0 3 * * *",
        "time_zone": "Europe/Paris", "missed_policy": "run_once"});
    let (code, _, c) = http(a, "POST", "/v1/schedules", Some(body)).await;
    assert_eq!((code, c["missed_policy"].as_str()), (201, Some("run_once")), "{c}");
    let id = c["id"].as_str().expect("id").to_string();
    let (code, _, p) = http(a, "POST", &format!("/v1/schedules/{id}/pause"), None).await;
    assert_eq!((code, p["paused"].as_bool()), (200, Some(true)));
    use raftq_client::{NewTask, Producer, ProducerConfig, Recurrence};
    let prod = Producer::connect(ProducerConfig { addrs: vec![n.node().grpc_addr.to_string()], ..Default::default() })
        .await
        .expect("producer");
    let every = prod
        .create_schedule("sdk", NewTask::new("sdk-sched", "x"), Recurrence::Every(Duration::from_secs(3600)), false)
        .await
        .expect("create");
    let all = prod.schedules().await.expect("list");
    assert_eq!(all.len(), 2);
    assert!(all.iter().any(|s| s.id == every.id && s.interval_ms == 3_600_000));
    prod.delete_schedule(&every.id).await.expect("delete");
    let (code, _, _) = http(a, "DELETE", &format!("/v1/schedules/{id}"), None).await;
    assert_eq!(code, 200);
}
