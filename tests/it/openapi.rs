//! The OpenAPI document served by a real server, checked against its real routes: every documented operation is
//! served (not 404 from the router, not 405), every other method on a documented path is refused with 405, an
//! undocumented path is 404 from the router, and what successful calls answer is described by their schemas.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::rest::exchange;
use crate::support::*;

/// One HTTP/1.1 exchange: status and body text (any content type).
async fn raw(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let (status, _, body) = exchange(addr, method, path, body).await;
    (status, body)
}

/// A request body for a schema: small, valid where the server can accept it.
fn example(schema: &str) -> Value {
    match schema {
        "NewTask" => json!({"queue": "oa", "payload": "x"}),
        "NewTaskBatch" => json!({"items": [{"queue": "oa", "payload": "y"}]}),
        "Claim" => json!({"worker_id": "w", "queues": ["oa"], "count": 1}),
        "Ack" => json!({"token": "1"}),
        "Selection" => json!({"all": true}),
        "Transfer" => json!({}),
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
        let concrete = path.replace("{id}", &id).replace("{queue}", "oa");
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
