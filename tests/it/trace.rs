//! W3C trace context: given at enqueue, it comes back on the task every kind of worker receives (gRPC Claim, the
//! worker stream through the SDK, REST), and raftq's own spans for the task's steps name it as their parent, in
//! JSON logs of a real `raftq serve` process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_client::{CancellationToken, Outcome, Task, Worker, WorkerConfig};
use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use serde_json::{json, Value};

use crate::procs::write_config;
use crate::rest::http;
use crate::support::*;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT}-01")
}

fn traced(queue: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        trace: Some(pb::TraceContext { traceparent: traceparent(), tracestate: "congo=t61rcWkgMzE".into() }),
        ..enq(queue, "traced")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_given_at_enqueue_comes_back_on_the_task_the_worker_receives() {
    let n = TestNode::start().await;
    let mut c = n.client().await;

    // gRPC unary Claim.
    c.enqueue(traced("tr-unary")).await.expect("enqueue");
    let claim = claim_one("tr-unary");
    let tasks = c.claim(claim).await.expect("claim").into_inner().tasks;
    let trace = tasks[0].trace.clone().expect("the task carries its trace context");
    assert_eq!((trace.traceparent.as_str(), trace.tracestate.as_str()), (traceparent().as_str(), "congo=t61rcWkgMzE"));

    // REST, enqueued and claimed over HTTP.
    let a = n.node().http_addr;
    let (code, _, e) =
        http(a, "POST", "/v1/tasks", Some(json!({"queue": "tr-rest", "payload": "x", "traceparent": traceparent()})))
            .await;
    assert_eq!(code, 201, "{e}");
    let (code, _, got) = http(a, "POST", "/v1/claim", Some(json!({"worker_id": "w", "queues": ["tr-rest"]}))).await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["tasks"][0]["trace"]["traceparent"].as_str(), Some(traceparent().as_str()), "{got}");

    // The worker stream, through the SDK's worker.
    c.enqueue(traced("tr-stream")).await.expect("enqueue");
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let worker = Worker::new(WorkerConfig {
        addrs: vec![format!("http://{}", n.node().grpc_addr)],
        worker_id: "trace-worker".into(),
        queues: vec!["tr-stream".into()],
        ..Default::default()
    })
    .expect("worker config");
    let stop = CancellationToken::new();
    let (s, st) = (seen.clone(), stop.clone());
    let run = tokio::spawn(async move {
        worker
            .run(
                move |t: Task| {
                    s.lock().expect("lock").push(t.trace.map(|c| c.traceparent));
                    async move { Outcome::Completed(bytes::Bytes::from_static(b"ok")) }
                },
                st,
            )
            .await
    });
    wait_until(Duration::from_secs(10), || !seen.lock().expect("lock").is_empty()).await;
    stop.cancel();
    run.await.expect("join").expect("worker");
    assert_eq!(seen.lock().expect("lock").clone(), vec![Some(traceparent())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_command_gets_the_trace_context_in_its_environment() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let traced_id = c.enqueue(traced("tr-cli")).await.expect("enqueue").into_inner().task_id;
    let plain_id = c.enqueue(enq("tr-cli", "plain")).await.expect("enqueue").into_inner().task_id;
    let mut worker = Command::new(env!("CARGO_BIN_EXE_raftq"))
        .args(["worker", "--addr", &format!("http://{}", n.node().grpc_addr), "--queue", "tr-cli", "--"])
        .args(["sh", "-c", "printf '%s|%s' \"$TRACEPARENT\" \"$TRACESTATE\""])
        // A context of the worker's own is not handed to a task that has none.
        .env("TRACEPARENT", "00-11111111111111111111111111111111-2222222222222222-01")
        .env("RAFTQ_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn raftq worker");
    let mut results = Vec::new();
    for id in [traced_id, plain_id] {
        let r = c.get_result(pb::GetResultRequest { id, wait_ms: 20_000 }).await.expect("result").into_inner();
        results.push((r.done, String::from_utf8_lossy(&r.result).to_string()));
    }
    let _ = worker.kill();
    let _ = worker.wait();
    let want = vec![(true, format!("{}|congo=t61rcWkgMzE", traceparent())), (true, "|".to_string())];
    assert_eq!(results, want);
}

/// A `raftq serve` process whose stderr lines are collected.
struct Server {
    child: std::process::Child,
    grpc: String,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    _root: tempfile::TempDir,
}

impl Server {
    fn start(extra_config: &str, log: &str) -> Server {
        let root = tempfile::tempdir().expect("dir");
        let (g, r, h) = (free_port(), free_port(), free_port());
        let (g, r, h) = (format!("127.0.0.1:{g}"), format!("127.0.0.1:{r}"), format!("127.0.0.1:{h}"));
        let config = write_config(root.path(), 1, &g, &r, &h, extra_config);
        let mut child = Command::new(env!("CARGO_BIN_EXE_raftq"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RAFTQ_LOG", log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn raftq serve");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let stderr = child.stderr.take().expect("piped");
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lock").push(line);
            }
        });
        Server { child, grpc: g, lines, reader: Some(reader), _root: root }
    }

    /// Enqueues a traced task (with `webhook_url` if given), claims it and completes it; returns its id.
    async fn work_traced_task(&self, queue: &str, webhook_url: &str) -> String {
        let mut c = loop_connect(&self.grpc).await;
        let req = pb::EnqueueRequest { webhook_url: webhook_url.into(), ..traced(queue) };
        let id = c.enqueue(req).await.expect("enqueue").into_inner().task_id;
        let t = c.claim(claim_one(queue)).await.expect("claim").into_inner().tasks.remove(0);
        let action = Action::Complete(pb::Complete { result: b"r".to_vec().into(), ..Default::default() });
        let token = t.lease.as_ref().expect("lease").token;
        c.ack(pb::AckRequest { task_id: id.clone(), token, action: Some(action) }).await.expect("complete");
        id
    }

    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            r.join().expect("reader");
        }
        let lines = self.lines.lock().expect("lock").clone();
        lines
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_task_spans_parented_by_the_enqueue_trace_context() {
    let server = Server::start("log_format = \"json\"\n", "info,openraft=warn,raftq::trace=debug");
    let lines = server.lines.clone();
    let id = server.work_traced_task("tr-log", "").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans: Vec<Value> = lines
            .lock()
            .expect("lock")
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
            .filter(|v| v["span"]["task_id"].as_str() == Some(id.as_str()))
            .map(|v| v["span"].clone())
            .collect();
        if spans.len() >= 3 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let all = server.stop();
    let ops: Vec<&str> = spans.iter().filter_map(|s| s["op"].as_str()).collect();
    assert_eq!(ops, vec!["enqueue", "claim", "complete"], "{spans:#?}");
    for s in &spans {
        assert_eq!(s["trace_id"].as_str(), Some(TRACE_ID), "{s}");
        assert_eq!(s["parent_span_id"].as_str(), Some(PARENT), "{s}");
        assert!(s["span_id"].as_str().is_some_and(|id| id.len() == 16 && id != PARENT), "{s}");
    }
    assert!(all.iter().any(|l| l.contains("\"raftq node started\"")), "the startup line is JSON too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_export_sends_the_task_and_webhook_spans_parented_by_the_enqueue_context() {
    // A real HTTP collector (OTLP/HTTP, JSON) that also takes the task's webhook.
    let exported: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = exported.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let sink = sink.clone();
                async move {
                    sink.lock().expect("lock").push(serde_json::from_slice(&body).expect("OTLP JSON"));
                    "{}"
                }
            }),
        )
        .route("/hook", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let collector = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    // Logs filtered down to warnings: export does not depend on what is logged.
    let server = Server::start(&format!("otlp_endpoint = \"http://{addr}\"\n"), "warn");
    let id = server.work_traced_task("tr-otlp", &format!("http://{addr}/hook")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans: Vec<Value> = exported
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|doc| {
                let service = doc["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"].clone();
                assert_eq!(service.as_str(), Some("raftq"), "{doc}");
                doc["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap_or_default()
            })
            .filter(|s| s["attributes"].as_array().is_some_and(|a| a.iter().any(|kv| kv["value"]["stringValue"] == id)))
            .collect();
        let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
        if names.contains(&"raftq.webhook.deliver") || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    server.stop();
    collector.abort();
    let mut names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["raftq.claim", "raftq.complete", "raftq.enqueue", "raftq.webhook.deliver"], "{spans:#?}");
    for s in &spans {
        assert_eq!(s["traceId"].as_str(), Some(TRACE_ID), "{s}");
        assert_eq!(s["parentSpanId"].as_str(), Some(PARENT), "{s}");
        assert!(s["spanId"].as_str().is_some_and(|id| id.len() == 16 && id != PARENT), "{s}");
        let (start, end) = (s["startTimeUnixNano"].as_str(), s["endTimeUnixNano"].as_str());
        let (start, end): (u64, u64) =
            (start.expect("start").parse().expect("ns"), end.expect("end").parse().expect("ns"));
        assert!(start > 0 && end >= start, "{s}");
    }
}

fn claim_one(queue: &str) -> pb::ClaimRequest {
    pb::ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], count: 1, lease_ms: 30_000, wait_ms: 0 }
}

async fn loop_connect(addr: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("url").connect().await
        {
            let mut c = raftq_proto::v1::task_service_client::TaskServiceClient::new(ch);
            match c.get_task(pb::GetTaskRequest { id: "0".repeat(32) }).await {
                Err(e) if reason(&e) == "NOT_FOUND" => return c,
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "the node did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
