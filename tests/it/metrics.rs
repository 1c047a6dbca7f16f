//! `/metrics` scraped while load runs, parsed with a Prometheus text-format parser.

use std::collections::HashMap;
use std::time::Duration;

use raftq_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

async fn scrape(addr: std::net::SocketAddr) -> prometheus_parse::Scrape {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain"), "{head}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text format")
}

fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found = s.samples.iter().find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
    match found.map(|x| &x.value) {
        Some(prometheus_parse::Value::Counter(v)) | Some(prometheus_parse::Value::Gauge(v)) => *v,
        Some(prometheus_parse::Value::Untyped(v)) => *v,
        Some(prometheus_parse::Value::Histogram(h)) => h.iter().map(|b| b.count).fold(0.0, f64::max),
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_during_load_and_parse() {
    let n = TestNode::start().await;
    let http = n.node().http_addr;
    let mut c = n.client().await;
    // Load in the background while we scrape.
    let mut load = c.clone();
    let producer = tokio::spawn(async move {
        for i in 0..30 {
            let items = (0..10).map(|k| enq("m", &format!("{i}-{k}"))).collect();
            load.enqueue_batch(pb::EnqueueBatchRequest { items }).await.expect("batch");
        }
    });
    let during = scrape(http).await;
    assert!(value(&during, "raftq_raft_is_leader", &[]) == 1.0);
    producer.await.expect("join");

    let claimed = claim_now(&mut c, "m", 50).await;
    assert_eq!(claimed.len(), 50);
    for t in &claimed[..20] {
        let token = t.lease.as_ref().expect("lease").token;
        let action = pb::ack_request::Action::Complete(pb::Complete::default());
        c.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(action) }).await.expect("complete");
    }
    let fail = pb::ack_request::Action::Fail(pb::Fail { error: "x".into(), retryable: false });
    let t = &claimed[20];
    c.ack(pb::AckRequest { task_id: t.id.clone(), token: t.lease.as_ref().expect("lease").token, action: Some(fail) })
        .await
        .expect("fail");
    tokio::time::sleep(Duration::from_millis(50)).await;

    let s = scrape(http).await;
    let ev = |e: &str| value(&s, "raftq_tasks_total", &[("event", e)]);
    assert_eq!(ev("enqueued"), 300.0);
    assert_eq!(ev("claimed"), 50.0);
    assert_eq!(ev("completed"), 20.0);
    assert_eq!(ev("failed"), 1.0);
    assert_eq!(value(&s, "raftq_enqueue_to_claim_seconds_count", &[]), 50.0);
    assert_eq!(value(&s, "raftq_claim_to_end_seconds_count", &[]), 21.0);
    let depth: HashMap<&str, f64> = ["pending", "in_progress", "completed", "failed"]
        .into_iter()
        .map(|st| (st, value(&s, "raftq_queue_tasks", &[("queue", "m"), ("state", st)])))
        .collect();
    assert_eq!(depth["pending"], 250.0);
    assert_eq!(depth["in_progress"], 29.0);
    assert_eq!(depth["completed"], 20.0);
    assert_eq!(depth["failed"], 1.0);
    assert!(value(&s, "raftq_log_fsyncs_total", &[]) > 0.0);
    // Every applied entry went through an fsync first.
    assert!(value(&s, "raftq_log_synced_entries_total", &[]) >= value(&s, "raftq_raft_applied_index", &[]) - 1.0);
    assert!(value(&s, "raftq_raft_applied_index", &[]) > 0.0);
    // Entries by kind: every create, claim and ack above was carried by an entry of its kind, each entry by at
    // least one item; every applied entry is of one kind, and batches hold at least one entry each.
    let kind = |name: &str, k: &str| value(&s, name, &[("kind", k)]);
    for (k, items) in [("enqueue", 300.0), ("claim", 50.0), ("ack", 21.0)] {
        assert_eq!(kind("raftq_applied_items_total", k), items, "{k} items");
        let entries = kind("raftq_applied_entries_total", k);
        assert!(entries >= 1.0 && entries <= items, "{k}: {entries} entries for {items} items");
    }
    assert_eq!(kind("raftq_applied_entries_total", "enqueue"), 30.0, "one entry per batch enqueued one at a time");
    let all: f64 =
        ["enqueue", "claim", "ack", "other", "raft"].iter().map(|k| kind("raftq_applied_entries_total", k)).sum();
    // The log starts at index 0 (the first membership).
    let applied = value(&s, "raftq_raft_applied_index", &[]);
    assert_eq!(all, applied + 1.0, "entries by kind add up to the entries up to the applied index");
    let batches = value(&s, "raftq_apply_batches_total", &[]);
    assert!(batches >= 1.0 && batches <= all, "{batches} batches for {all} entries");
}

const SECRET: &str = "an-hs256-secret-for-the-metrics-test-0123456789";

/// A REST call as `tenant` with every scope, which must succeed.
async fn as_tenant(a: std::net::SocketAddr, tenant: &str, method: &str, path: &str, body: serde_json::Value) {
    let tok = hs256_token(SECRET, tenant, &raftq::auth::Scope::ALL);
    let bearer = format!("Bearer {tok}");
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (status, _, v) = crate::rest::http_with(a, method, path, &[("authorization", &bearer)], body).await;
    assert!(status < 300, "{method} {path}: {status} {v}");
}

fn absent(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> bool {
    !s.samples.iter().any(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tenants_load_and_key_overrides_show_side_by_side() {
    let n = TestNode::start_with(|c| {
        c.auth = raftq::config::AuthMode::Jwt;
        c.auth_hs256_secret = Some(raftq::config::Secret(SECRET.into()));
    })
    .await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
    let a = n.node().http_addr;
    let task = |queue: &str, key: &str| serde_json::json!({"queue": queue, "payload": "p", "concurrency_key": key});
    // acme: three tasks in one queue (two under key k1), two in another; globex: one task, claimed.
    for (q, k) in [("q1", "k1"), ("q1", "k1"), ("q1", ""), ("q2", ""), ("q2", "")] {
        as_tenant(a, "acme", "POST", "/v1/tasks", task(q, k)).await;
    }
    as_tenant(a, "globex", "POST", "/v1/tasks", task("q1", "k1")).await;
    let claim = serde_json::json!({"worker_id": "w", "queues": ["q1"], "wait_ms": 0});
    as_tenant(a, "globex", "POST", "/v1/claim", claim).await;
    as_tenant(a, "acme", "PUT", "/v1/concurrency-keys/k1", serde_json::json!({"limit": 2})).await;

    let s = scrape(a).await;
    let tenant =
        |t: &'static str, state: &'static str| value(&s, "raftq_tenant_tasks", &[("tenant", t), ("state", state)]);
    assert_eq!((tenant("acme", "pending"), tenant("acme", "in_progress")), (5.0, 0.0), "over both of acme's queues");
    assert_eq!((tenant("globex", "pending"), tenant("globex", "in_progress")), (0.0, 1.0));
    let at = [("tenant", "acme"), ("key", "k1")];
    assert_eq!(value(&s, "raftq_concurrency_key_limit", &at), 2.0);
    let key = |state: &'static str| value(&s, "raftq_concurrency_key_tasks", &[at[0], at[1], ("state", state)]);
    assert_eq!((key("pending"), key("running")), (2.0, 0.0));
    assert!(absent(&s, "raftq_concurrency_key_limit", &[("tenant", "globex")]), "globex set no override");

    // Cleared: its series go.
    as_tenant(a, "acme", "DELETE", "/v1/concurrency-keys/k1", serde_json::Value::Null).await;
    let s = scrape(a).await;
    assert!(absent(&s, "raftq_concurrency_key_limit", &at) && absent(&s, "raftq_concurrency_key_tasks", &at));
}
