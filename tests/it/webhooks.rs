//! Webhooks against a real HTTP receiver on 127.0.0.1: signed deliveries, retries after the receiver fails, and
//! a delivery that a new leader finishes after the old one is killed mid-retry (three real processes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use serde_json::Value;

use crate::procs::*;
use crate::support::*;

const SECRET: &str = "webhook-test-secret";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
struct Hit {
    headers: HeaderMap,
    body: Vec<u8>,
    answered: u16,
}

impl Hit {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

#[derive(Default)]
struct ReceiverState {
    hits: Mutex<Vec<Hit>>,
    /// Requests still to be answered with 503.
    fail_next: AtomicU32,
}

/// A real HTTP server that records every request; it answers 503 while `fail_next` is above zero.
struct Receiver {
    addr: SocketAddr,
    state: Arc<ReceiverState>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(fail_first: u32) -> Receiver {
        let state = Arc::new(ReceiverState { fail_next: AtomicU32::new(fail_first), ..Default::default() });
        let app = axum::Router::new().route("/hook", axum::routing::post(hook)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, state, server }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("lock").clone()
    }

    async fn wait_for(&self, limit: Duration, f: impl Fn(&[Hit]) -> bool) -> Vec<Hit> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let hits = self.hits();
            if f(&hits) {
                return hits;
            }
            assert!(std::time::Instant::now() < deadline, "receiver: condition not met within {limit:?}: {hits:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn hook(State(s): State<Arc<ReceiverState>>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    let fail = s.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    let code = if fail { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    s.hits.lock().expect("lock").push(Hit { headers, body: body.to_vec(), answered: code.as_u16() });
    code
}

/// The receiver's own check of `x-raftq-signature: t=<ms>,v1=<hex HMAC-SHA256("<t>.<body>")>`.
fn signature_valid(hit: &Hit, secret: &str) -> bool {
    let header = hit.header("x-raftq-signature");
    let Some((t, v1)) = header.split_once(",v1=") else { return false };
    let Some(t) = t.strip_prefix("t=") else { return false };
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{t}.").as_bytes());
    mac.update(&hit.body);
    let want: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    want == v1
}

fn with_webhook(queue: &str, payload: &str, url: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        webhook_url: url.into(),
        trace: Some(pb::TraceContext { traceparent: TRACEPARENT.into(), tracestate: "vendor=1".into() }),
        ..enq(queue, payload)
    }
}

/// Claims one task of `queue` and ends it with `action`; returns its id.
async fn work_one(c: &mut Client, queue: &str, action: Action) -> String {
    let claimed = c
        .claim(pb::ClaimRequest {
            worker_id: "w".into(),
            queues: vec![queue.into()],
            count: 1,
            lease_ms: 30_000,
            wait_ms: 5_000,
        })
        .await
        .expect("claim")
        .into_inner()
        .tasks;
    let t = claimed.first().expect("a task to claim");
    let token = t.lease.as_ref().expect("lease").token;
    c.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(action) }).await.expect("ack");
    t.id.clone()
}

fn complete(result: &str) -> Action {
    Action::Complete(pb::Complete { result: result.as_bytes().to_vec().into(), ..Default::default() })
}

/// Waits until the node's `/metrics` has `name` (with its labels, as exposed) at `want`.
async fn wait_metric(http: SocketAddr, name: &str, want: f64) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_text(http).await;
        if sample(&text, name) == Some(want) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "{name} never reached {want}: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_is_signed_retried_after_the_receiver_fails_and_delivered() {
    let rx = Receiver::start(2).await;
    let n = TestNode::start_with(|c| {
        c.webhook_secret = Some(raftq::config::Secret(SECRET.into()));
        c.webhook_retry_base_ms = 100;
        c.webhook_retry_max_ms = 200;
    })
    .await;
    let mut c = n.client().await;
    c.enqueue(with_webhook("hooks", "job", &rx.url())).await.expect("enqueue");
    let id = work_one(&mut c, "hooks", complete("all done")).await;

    let hits = rx.wait_for(Duration::from_secs(20), |h| h.iter().any(|h| h.answered == 200)).await;
    assert_eq!(hits.iter().map(|h| h.answered).collect::<Vec<_>>(), vec![503, 503, 200], "{hits:#?}");
    let delivery = hits[0].header("x-raftq-delivery").to_string();
    assert!(!delivery.is_empty());
    for (i, h) in hits.iter().enumerate() {
        assert!(signature_valid(h, SECRET), "attempt {i}: bad signature {:?}", h.header("x-raftq-signature"));
        assert!(!signature_valid(h, "another secret"));
        assert_eq!(h.header("x-raftq-delivery"), delivery, "one delivery id across retries");
        assert_eq!(h.header("content-type"), "application/json");
        let body = h.json();
        assert_eq!(body["delivery_attempt"].as_u64(), Some(i as u64 + 1), "{body}");
        // The trace continues: same trace id, a new span (the delivery's).
        let tp = h.header("traceparent");
        assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && !tp.contains("00f067aa0ba902b7"), "{tp}");
        assert_eq!(h.header("tracestate"), "vendor=1");
    }
    let body = hits[2].json();
    assert_eq!(body["task_id"].as_str(), Some(id.as_str()), "{body}");
    assert_eq!(body["queue"].as_str(), Some("hooks"));
    assert_eq!(body["state"].as_str(), Some("COMPLETED"));
    assert_eq!(body["attempts"].as_u64(), Some(1));
    assert_eq!(body["result"].as_str(), Some("all done"));
    assert!(body["error"].is_null());
    let (created, ended) =
        (body["created_at_ms"].as_u64().expect("created"), body["ended_at_ms"].as_u64().expect("end"));
    assert!(created > 0 && ended >= created, "{body}");

    // Delivered means removed from the outbox: nothing more arrives, and the metrics say what happened.
    let m = wait_metric(n.node().http_addr, "raftq_webhooks_pending", 0.0).await;
    assert_eq!(sample(&m, "raftq_webhook_deliveries_total{outcome=\"retry\"}"), Some(2.0), "{m}");
    assert_eq!(sample(&m, "raftq_webhook_deliveries_total{outcome=\"delivered\"}"), Some(1.0), "{m}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.hits().len(), 3, "a delivered webhook is not sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_is_given_up_after_its_attempts_and_failures_carry_the_error() {
    let rx = Receiver::start(u32::MAX).await;
    let n = TestNode::start_with(|c| {
        c.webhook_max_attempts = 2;
        c.webhook_retry_base_ms = 50;
        c.webhook_retry_max_ms = 50;
    })
    .await;
    let mut c = n.client().await;
    c.enqueue(with_webhook("hooks", "job", &rx.url())).await.expect("enqueue");
    work_one(&mut c, "hooks", Action::Fail(pb::Fail { error: "bad input".into(), retryable: false })).await;
    let hits = rx.wait_for(Duration::from_secs(20), |h| h.len() >= 2).await;
    let body = hits[0].json();
    assert_eq!((body["state"].as_str(), body["error"].as_str()), (Some("FAILED"), Some("bad input")), "{body}");
    assert!(hits[0].header("x-raftq-signature").is_empty(), "no secret configured: unsigned");
    wait_metric(n.node().http_addr, "raftq_webhook_deliveries_total{outcome=\"gave_up\"}", 1.0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.hits().len(), 2, "no attempt after the last one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_delivery_resumes_on_a_new_leader_after_kill_9_mid_retry() {
    // The receiver refuses until the test lets it answer: the first leader only ever sees failures.
    let rx = Receiver::start(u32::MAX).await;
    let extra = format!(
        "{FAST}webhook_secret = {SECRET:?}\nwebhook_retry_base_ms = 300\nwebhook_retry_max_ms = 300\nwebhook_max_attempts = 1000\n"
    );
    let mut cluster = ProcCluster::start(3, &extra).await;
    let leader = cluster.wait_leader(Duration::from_secs(30)).await;
    let mut c = cluster.node(leader).ready().await;
    c.enqueue(with_webhook("hooks", "job", &rx.url())).await.expect("enqueue");
    let id = work_one(&mut c, "hooks", complete("done before the crash")).await;

    // Two failed attempts: the first one's retry was recorded in the log, the leader is mid-retry.
    rx.wait_for(Duration::from_secs(30), |h| h.len() >= 2).await;
    cluster.node(leader).kill9();
    let seen_before = rx.hits().len();
    rx.state.fail_next.store(0, Ordering::SeqCst);

    let new_leader = cluster.wait_leader(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    let hits = rx.wait_for(Duration::from_secs(30), |h| h.iter().any(|h| h.answered == 200)).await;
    let ok = hits.iter().find(|h| h.answered == 200).expect("a delivery");
    assert!(hits.len() > seen_before);
    assert!(signature_valid(ok, SECRET), "the new leader signs with the same secret");
    assert_eq!(ok.header("x-raftq-delivery"), hits[0].header("x-raftq-delivery"), "the same delivery, resumed");
    let body = ok.json();
    assert_eq!((body["task_id"].as_str(), body["state"].as_str()), (Some(id.as_str()), Some("COMPLETED")), "{body}");
    assert_eq!(body["result"].as_str(), Some("done before the crash"));
    assert!(body["delivery_attempt"].as_u64().is_some_and(|n| n >= 2), "retried, not started over: {body}");

    // A survivor (the new leader) made that delivery and recorded it: the outbox drains on every survivor.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (mut delivered, mut pending) = (0.0, 0.0);
        for node in cluster.nodes.iter().filter(|n| n.running()) {
            delivered += node.metric("raftq_webhook_deliveries_total{outcome=\"delivered\"}").await.unwrap_or(0.0);
            pending += node.metric("raftq_webhooks_pending").await.unwrap_or(1.0);
        }
        if delivered >= 1.0 && pending == 0.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "delivered {delivered}, pending {pending}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_digests_agree(Duration::from_secs(20)).await;
}

/// The `/metrics` text of a node.
async fn metrics_text(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    raw
}

/// One sample (`name` with its labels, exactly as exposed).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_that_cannot_be_sent_is_given_up_at_once() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let req = pb::EnqueueRequest { webhook_url: "https://127.0.0.1:9/hook".into(), ..enq("hooks", "x") };
    let id = c.enqueue(req).await.expect("enqueue").into_inner().task_id;
    c.cancel(pb::CancelRequest { id }).await.expect("cancel");
    let m = wait_metric(n.node().http_addr, "raftq_webhook_deliveries_total{outcome=\"gave_up\"}", 1.0).await;
    assert_eq!(sample(&m, "raftq_webhook_deliveries_total{outcome=\"retry\"}"), Some(0.0), "{m}");
    wait_metric(n.node().http_addr, "raftq_webhooks_pending", 0.0).await;
}
