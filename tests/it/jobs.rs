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
        let stop = stop.clone();
        tokio::spawn(async move {
            w.run(
                |_t| async {
                    Outcome::Exception { reason: "malformed-payload".into(), message: "cannot parse".into() }
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
    assert!(t.deadline_ms > 0);
}
