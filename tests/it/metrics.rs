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
}
