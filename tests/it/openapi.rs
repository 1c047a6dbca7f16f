//! The OpenAPI document served by a real server, checked against its real routes: every documented operation is
//! served (not 404 from the router, not 405), every other method on a documented path is refused with 405, an
//! undocumented path is 404 from the router, and what successful calls answer is described by their schemas.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::rest::raw_bytes;
use crate::support::*;

/// One HTTP/1.1 exchange: status and body text (any content type; a backup's bytes are not text).
async fn raw(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let (status, _, body) = raw_bytes(addr, method, path, &[], body.map(|b| b.to_string()).unwrap_or_default()).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A request body for a schema: small, valid where the server can accept it.
fn example(schema: &str) -> Value {
    match schema {
        "NewTask" => json!({"queue": "oa", "payload": "x"}),
        "NewTaskBatch" => json!({"items": [{"queue": "oa", "payload": "y"}]}),
        "Claim" => json!({"worker_id": "w", "queues": ["oa"], "count": 1}),
        "Ack" => json!({"token": "1"}),
        "Selection" => json!({"all": true}),
        "Group" => json!({"error": "boom"}),
        "Transfer" => json!({}),
        "Limits" => json!({"max_depth": 100_000}),
        "Weight" => json!({"weight": 2}),
        "RateBody" => json!({"per_second": 1000, "burst": 1000}),
        "ConcurrencyOverrideBody" => json!({"limit": 1000, "ttl_s": 60}),
        "Schedule" => json!({"name": "oa-s", "task": {"queue": "oa", "payload": "s"}, "interval_ms": 3_600_000}),
        other => panic!("no example for request schema {other}"),
    }
}

fn schema_name(v: &Value) -> Option<String> {
    v["$ref"].as_str()?.rsplit('/').next().map(String::from)
}

/// Every key of an answer is a property of its schema (one level down for arrays of schemas).
fn assert_described(doc: &Value, schema: &str, body: &Value, what: &str) {
    let s = &doc["components"]["schemas"][schema];
    let props = s["properties"].as_object().unwrap_or_else(|| panic!("schema {schema} has properties"));
    for (k, v) in body.as_object().unwrap_or_else(|| panic!("{what}: not an object: {body}")) {
        assert!(props.contains_key(k), "{what}: {k:?} is not in schema {schema}");
        if let (Some(items), Some(inner)) = (v.as_array(), schema_name(&props[k]["items"])) {
            for item in items {
                assert_described(doc, &inner, item, what);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_matches_the_routes_the_server_serves() {
    let n = TestNode::start().await;
    let a = n.node().http_addr;
    let (code, text) = raw(a, "GET", "/v1/openapi.json", None).await;
    assert_eq!(code, 200);
    let doc: Value = serde_json::from_str(&text).expect("JSON document");
    assert_eq!(doc["openapi"].as_str(), Some("3.1.0"));
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 15, "{paths:?}");

    let id = "0".repeat(32);
    let mut served = BTreeSet::new();
    for (path, ops) in paths {
        let concrete = path.replace("{id}", &id).replace("{queue}", "oa").replace("{key}", "k");
        let ops = ops.as_object().expect("operations");
        for (method, op) in ops {
            let body = op["requestBody"]["content"]["application/json"]["schema"]
                .as_object()
                .map(|s| example(&schema_name(&Value::Object(s.clone())).expect("a schema reference")));
            let (status, text) = raw(a, &method.to_uppercase(), &concrete, body.as_ref()).await;
            let what = format!("{method} {path} -> {status} {text}");
            assert_ne!(status, 405, "{what}");
            if status == 404 {
                let err: Value = serde_json::from_str(&text).expect("a JSON error");
                let msg = err["error"]["message"].as_str().unwrap_or_default();
                assert!(!msg.starts_with(raftq::api::rest::NO_ROUTE), "documented but not routed: {what}");
            }
            let (ok, ok_schema) = op["responses"]
                .as_object()
                .expect("responses")
                .iter()
                .find(|(k, _)| k.starts_with('2'))
                .map(|(k, v)| (k.clone(), schema_name(&v["content"]["application/json"]["schema"])))
                .expect("a success response");
            if status.to_string() == ok {
                if let Some(schema) = ok_schema {
                    let body: Value = serde_json::from_str(&text).expect("a JSON answer");
                    assert_described(&doc, &schema, &body, &what);
                }
            }
            served.insert((method.clone(), path.clone()));
            // Every other method on a documented path is refused: the router serves nothing undocumented there.
            for other in ["get", "post", "put", "delete", "patch"] {
                if !ops.contains_key(other) {
                    let (status, text) = raw(a, &other.to_uppercase(), &concrete, None).await;
                    assert_eq!(status, 405, "{other} {path} is not documented but answered {status} {text}");
                }
            }
        }
    }
    // The calls above went through a whole cycle: an enqueue, then a claim that got it.
    assert!(served.contains(&("post".into(), "/v1/claim".into())));
    let (status, text) = raw(a, "POST", &format!("/v1/tasks/{id}/explode"), Some(&json!({"token": "1"}))).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains(raftq::api::rest::NO_ROUTE), "{text}");
}

const SECRET: &str = "an-hs256-secret-for-the-openapi-test-0123456789";

fn token(tenant: &str, scopes: &[raftq::auth::Scope]) -> String {
    hs256_token(SECRET, tenant, scopes)
}

/// One request with an optional bearer token and a raw body: status and body text.
async fn call(a: SocketAddr, method: &str, path: &str, tok: Option<&str>, body: &str) -> (u16, String) {
    let bearer = tok.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    let (status, _, body) = raw_bytes(a, method, path, &headers, body.to_string()).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Drives every documented operation into the answers it can give (success; no token; a token without the
/// scope; a malformed body, query or id; a task or schedule that does not exist; a stale fencing token; the
/// tenant's rate) and checks that each status answered is one the document declares for that operation
/// (`default` does not count: a generated client treats an undeclared status as an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_an_operation_answers_is_declared() {
    use raftq::auth::Scope;
    let n = TestNode::start_with(|c| {
        c.auth = raftq::config::AuthMode::Jwt;
        c.auth_hs256_secret = Some(raftq::config::Secret(SECRET.into()));
        c.max_batch_items = 10;
        c.tenant_enqueue_per_s = 0.5;
        c.tenant_enqueue_burst = 10;
    })
    .await;
    let a = n.node().http_addr;
    let text = call(a, "GET", "/v1/openapi.json", None, "").await.1;
    let doc: Value = serde_json::from_str(&text).expect("JSON document");
    let full = token("main", &Scope::ALL);
    let none = token("main", &[]);

    // A claimed task, for the answers that need one (a stale token is LEASE_LOST).
    let (s, e) = call(a, "POST", "/v1/tasks", Some(&full), r#"{"queue": "oa", "payload": "x"}"#).await;
    assert_eq!(s, 201, "{e}");
    let (s, c) = call(a, "POST", "/v1/claim", Some(&full), r#"{"worker_id": "w", "queues": ["oa"]}"#).await;
    assert_eq!(s, 200, "{c}");
    let c: Value = serde_json::from_str(&c).expect("json");
    let claimed = c["tasks"][0]["id"].as_str().expect("a claimed task").to_string();
    let stale: u64 = c["tasks"][0]["lease"]["token"].as_str().expect("token").parse::<u64>().expect("u64") + 1;

    let missing = "0".repeat(32);
    let mut answered = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let declared: BTreeSet<String> =
                op["responses"].as_object().expect("responses").keys().filter(|k| *k != "default").cloned().collect();
            let schema = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .map(|r| r.rsplit('/').next().expect("a name").to_string());
            let body = schema.as_deref().map(|s| example(s).to_string()).unwrap_or_default();
            let at = |id: &str| path.replace("{id}", id).replace("{queue}", "oa").replace("{key}", "k");
            let ack = ["complete", "fail", "nack", "abandon", "heartbeat", "exception"]
                .iter()
                .any(|k| path.ends_with(&format!("/{k}")));
            let mut tries: Vec<(String, Option<&str>, String)> = vec![
                (at(&missing), Some(&full), body.clone()),
                (at(&missing), None, body.clone()),
                (at(&missing), Some(&none), body.clone()),
                (at("not-an-id"), Some(&full), body.clone()),
            ];
            if schema.is_some() {
                tries.push((at(&missing), Some(&full), "{".into()));
            }
            if op["parameters"].as_array().is_some_and(|p| p.iter().any(|p| p["in"] == "query")) {
                let q = ["page_size=-1", "wait_ms=x", "limit=-1"].join("&");
                tries.push((format!("{}?{q}", at(&missing)), Some(&full), body.clone()));
            }
            if ack {
                tries.push((at(&claimed), Some(&full), json!({"token": stale.to_string()}).to_string()));
            }
            for (concrete, tok, body) in tries {
                let (status, text) = call(a, &method.to_uppercase(), &concrete, tok, &body).await;
                let what = format!("{method} {concrete} (token: {}) -> {status} {text}", tok.is_some());
                assert!(declared.contains(&status.to_string()), "undeclared status: {what}; declared {declared:?}");
                answered.insert((method.clone(), path.clone(), status));
            }
        }
    }
    // The tenant's enqueue rate: 429, declared for the enqueue routes.
    let flood = token("flood", &Scope::ALL);
    let mut limited = None;
    for _ in 0..20 {
        let (status, text) = call(a, "POST", "/v1/tasks", Some(&flood), r#"{"queue": "oa", "payload": "x"}"#).await;
        if status != 201 {
            limited = Some((status, text));
            break;
        }
    }
    let (status, text) = limited.expect("the rate limits the flood");
    assert_eq!(status, 429, "{text}");
    assert!(doc["paths"]["/v1/tasks"]["post"]["responses"].get("429").is_some());

    // The drive went through the answers that matter: successes (201 included), 400, 401, 403, 404 and 409.
    let statuses: BTreeSet<u16> = answered.iter().map(|(_, _, s)| *s).collect();
    for s in [200, 201, 400, 401, 403, 404, 409] {
        assert!(statuses.contains(&s), "no operation answered {s}: {answered:?}");
    }
    assert!(answered.contains(&("post".into(), "/v1/schedules".into(), 201)), "{answered:?}");
}
