//! The REST API over real HTTP/1.1 connections against a real server: a full worker cycle and the error bodies.

use std::net::SocketAddr;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// One HTTP/1.1 exchange (Connection: close): status, headers (lower-case names), JSON body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Vec<(String, String)>, Value) {
    let (status, headers, body) = exchange(addr, method, path, body.as_ref()).await;
    (status, headers, to_json(&body))
}

/// The same with extra request headers and a raw body.
pub async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, Vec<(String, String)>, Value) {
    let (status, headers, body) = raw(addr, method, path, headers, body).await;
    (status, headers, to_json(&body))
}

fn to_json(body: &str) -> Value {
    if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not a JSON body ({e}): {body}"))
    }
}

/// One HTTP/1.1 exchange (Connection: close): status, headers (lower-case names), body text.
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Vec<(String, String)>, String) {
    raw(addr, method, path, &[], body.map(|b| b.to_string()).unwrap_or_default()).await
}

/// One HTTP/1.1 exchange with extra request headers and a raw body: status, headers, body text.
pub async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, Vec<(String, String)>, String) {
    let (status, headers, body) = raw_bytes(addr, method, path, headers, body).await;
    (status, headers, String::from_utf8(body).expect("utf-8 response body"))
}

/// [`raw`] with the body as bytes (a backup).
pub async fn raw_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: raftq\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8(raw[..split].to_vec()).expect("utf-8 response head");
    let body = &raw[split + 4..];
    let mut lines = head.lines();
    let status: u16 = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    (status, headers, if chunked { dechunk(body) } else { body.to_vec() })
}

fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = s.windows(2).position(|w| w == b"\r\n") {
        let len = std::str::from_utf8(&s[..eol]).unwrap_or("0");
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        let rest = &s[eol + 2..];
        out.extend_from_slice(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_full_worker_cycle() {
    let n = TestNode::start().await;
    let a = n.node().http_addr;
    let (code, _, body) =
        http(a, "POST", "/v1/tasks", Some(json!({"queue": "web", "payload": "hi", "priority": 3}))).await;
    assert_eq!(code, 201, "{body}");
    let id = body["task_id"].as_str().expect("task id").to_string();
    let (code, _, t) = http(a, "GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!((code, t["state"].as_str(), t["payload"].as_str()), (200, Some("PENDING"), Some("hi")));

    let claim = json!({"worker_id": "web-worker", "queues": ["web"], "count": 5, "lease_ms": 30000});
    let (code, _, c) = http(a, "POST", "/v1/claim", Some(claim)).await;
    assert_eq!(code, 200, "{c}");
    let task = &c["tasks"][0];
    assert_eq!(task["id"].as_str(), Some(id.as_str()));
    assert_eq!(task["payload_base64"].as_str(), Some("aGk="));
    let token = task["lease"]["token"].as_str().expect("token as a string").to_string();

    let (code, _, h) =
        http(a, "POST", &format!("/v1/tasks/{id}/heartbeat"), Some(json!({"token": token, "extend_ms": 60000}))).await;
    assert_eq!((code, h["state"].as_str()), (200, Some("IN_PROGRESS")), "{h}");
    let done = json!({"token": token.parse::<u64>().expect("number"), "result_base64": "AAEC"});
    let (code, _, d) = http(a, "POST", &format!("/v1/tasks/{id}/complete"), Some(done)).await;
    assert_eq!((code, d["state"].as_str()), (200, Some("COMPLETED")), "{d}");
    let (code, _, r) = http(a, "GET", &format!("/v1/tasks/{id}/result?wait_ms=1000"), None).await;
    assert_eq!(code, 200);
    assert_eq!((r["done"].as_bool(), r["result_base64"].as_str()), (Some(true), Some("AAEC")));
    assert!(r["result"].is_string(), "bytes 0,1,2 are valid UTF-8: {r}");

    let (code, _, q) = http(a, "GET", "/v1/queues", None).await;
    assert_eq!(
        (code, q["queues"][0]["queue"].as_str(), q["queues"][0]["completed"].as_u64()),
        (200, Some("web"), Some(1))
    );
    let (code, _, s) = http(a, "GET", "/v1/cluster/status", None).await;
    assert_eq!((code, s["role"].as_str()), (200, Some("LEADER")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_errors_are_json_with_stable_codes() {
    let n = TestNode::start().await;
    let a = n.node().http_addr;
    let cases = [
        ("POST", "/v1/tasks".to_string(), Some(json!({"queue": "bad queue", "payload": "x"})), 400, "INVALID_ARGUMENT"),
        (
            "POST",
            "/v1/tasks".to_string(),
            Some(json!({"queue": "q", "payload": "x", "priority": 12})),
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/v1/tasks".to_string(),
            Some(json!({"queue": "q", "payload": "x", "payload_base64": "eA=="})),
            400,
            "INVALID_ARGUMENT",
        ),
        ("POST", "/v1/tasks".to_string(), Some(json!({"queue": "q", "unknown_field": 1})), 400, "INVALID_ARGUMENT"),
        ("GET", format!("/v1/tasks/{}", "0".repeat(32)), None, 404, "NOT_FOUND"),
        ("GET", "/v1/tasks/not-an-id".to_string(), None, 400, "INVALID_ARGUMENT"),
        ("POST", format!("/v1/tasks/{}/complete", "0".repeat(32)), Some(json!({"token": "1"})), 404, "NOT_FOUND"),
        ("POST", format!("/v1/tasks/{}/explode", "0".repeat(32)), Some(json!({"token": "1"})), 404, "NOT_FOUND"),
        ("POST", "/v1/claim".to_string(), Some(json!({"worker_id": "w", "queues": []})), 400, "INVALID_ARGUMENT"),
    ];
    for (method, path, body, want_status, want_code) in cases {
        let (status, _, b) = http(a, method, &path, body.clone()).await;
        assert_eq!(status, want_status, "{method} {path} {body:?}: {b}");
        assert_eq!(b["error"]["code"].as_str(), Some(want_code), "{method} {path}: {b}");
        assert!(b["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{b}");
    }
    // A stale token on a real task: 409 with LEASE_LOST.
    let (_, _, e) = http(a, "POST", "/v1/tasks", Some(json!({"queue": "q", "payload": "x"}))).await;
    let id = e["task_id"].as_str().expect("id").to_string();
    let (_, _, c) = http(a, "POST", "/v1/claim", Some(json!({"worker_id": "w", "queues": ["q"]}))).await;
    let token: u64 = c["tasks"][0]["lease"]["token"].as_str().expect("token").parse().expect("number");
    let (status, _, b) = http(a, "POST", &format!("/v1/tasks/{id}/complete"), Some(json!({"token": token + 1}))).await;
    assert_eq!((status, b["error"]["code"].as_str()), (409, Some("LEASE_LOST")), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_non_2xx_answer_is_a_json_error_with_a_stable_code() {
    let n = TestNode::start().await;
    let a = n.node().http_addr;
    let id = "0".repeat(32);
    let bad = "INVALID_ARGUMENT";
    let cases: Vec<(&str, String, &str, u16, &str)> = vec![
        // Query strings that do not parse.
        ("GET", "/v1/tasks?page_size=-1".into(), "", 400, bad),
        ("GET", "/v1/tasks?created_from_ms=yesterday".into(), "", 400, bad),
        ("GET", "/v1/tasks?page_size=10&what=1".into(), "", 400, bad),
        ("GET", format!("/v1/tasks/{id}/result?wait_ms=abc"), "", 400, bad),
        ("GET", "/v1/queues/q/dead-letters?limit=-1".into(), "", 400, bad),
        // Bodies that are not the JSON a route takes.
        ("POST", "/v1/tasks".into(), "{not json", 400, bad),
        ("POST", "/v1/tasks".into(), "[1, 2]", 400, bad),
        ("POST", "/v1/claim".into(), "", 400, bad),
        ("POST", "/v1/schedules".into(), r#"{"name": 5}"#, 400, bad),
        ("POST", format!("/v1/tasks/{id}/complete"), r#"{"token": "x1"}"#, 400, bad),
        // A path parameter that does not decode.
        ("GET", "/v1/tasks/%FF%FE".into(), "", 400, bad),
        // Paths served with other methods.
        ("DELETE", "/v1/tasks".into(), "", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/v1/claim".into(), "", 405, "METHOD_NOT_ALLOWED"),
        ("PUT", format!("/v1/tasks/{id}"), "", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/healthz".into(), "", 405, "METHOD_NOT_ALLOWED"),
        // Paths served by nothing.
        ("GET", "/v1/nothing-here".into(), "", 404, "NOT_FOUND"),
    ];
    for (method, path, body, want_status, want_code) in cases {
        let what = format!("{method} {path} {body}");
        let (status, headers, b) = http_with(a, method, &path, &[], body.to_string()).await;
        assert_eq!(status, want_status, "{what}: {b}");
        let content_type = headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.as_str());
        assert_eq!(content_type, Some("application/json"), "{what}");
        assert_eq!(b["error"]["code"].as_str(), Some(want_code), "{what}: {b}");
        assert!(b["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {b}");
        if status == 405 {
            assert!(headers.iter().any(|(k, _)| k == "allow"), "{what}: a 405 names the allowed methods");
        }
    }
}
