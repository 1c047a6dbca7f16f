//! The web console on the HTTP port (`/ui/`): its files, their headers, and the API only the console needed
//! (dead letters grouped by last error), with tenants and scopes enforced by the server, not by the page.

use std::net::SocketAddr;

use raftq::auth::Scope;
use serde_json::{json, Value};

use crate::rest::{http_with, raw};
use crate::support::*;

const SECRET: &str = "an-hs256-secret-for-the-console-test-0123456789";

fn token(tenant: &str, scopes: &[raftq::auth::Scope]) -> String {
    hs256_token(SECRET, tenant, scopes)
}

async fn start() -> TestNode {
    TestNode::start_with(|c| {
        c.auth = raftq::config::AuthMode::Jwt;
        c.auth_hs256_secret = Some(raftq::config::Secret(SECRET.into()));
    })
    .await
}

async fn call(a: SocketAddr, tok: &str, method: &str, path: &str, body: Value) -> (u16, Value) {
    let bearer = format!("Bearer {tok}");
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (status, _, v) = http_with(a, method, path, &[("authorization", &bearer)], body).await;
    (status, v)
}

/// A task of `queue` that dies on its only attempt with `error`; returns its id.
async fn dead_letter(a: SocketAddr, tok: &str, queue: &str, error: &str) -> String {
    let (s, e) = call(a, tok, "POST", "/v1/tasks", json!({"queue": queue, "payload": "p", "max_attempts": 1})).await;
    assert_eq!(s, 201, "{e}");
    let id = e["task_id"].as_str().expect("task_id").to_string();
    let (s, c) = call(a, tok, "POST", "/v1/claim", json!({"worker_id": "w", "queues": [queue]})).await;
    assert_eq!(s, 200, "{c}");
    let t = c["tasks"].as_array().expect("tasks").iter().find(|t| t["id"] == json!(id)).expect("claimed").clone();
    let body = json!({"token": t["lease"]["token"], "error": error, "retryable": true});
    let (s, f) = call(a, tok, "POST", &format!("/v1/tasks/{id}/fail"), body).await;
    assert_eq!(s, 200, "{f}");
    id
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_files_are_served_with_their_types_and_a_strict_csp() {
    let n = start().await;
    let a = n.node().http_addr;
    for (path, ty) in [
        ("/ui/", "text/html"),
        ("/ui", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
        ("/ui/icon.svg", "image/svg+xml"),
    ] {
        // No token: the page is public, the API it calls is not.
        let (status, headers, body) = raw(a, "GET", path, &[], String::new()).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(header(&headers, "content-type").starts_with(ty), "{path}: {headers:?}");
        let csp = header(&headers, "content-security-policy");
        assert!(csp.contains("default-src 'self'") && csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{path}: {csp}");
        assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
        if ty == "text/html" {
            assert!(body.contains("/ui/app.js") && !body.contains("<script>"), "{body}");
        }
    }
    let (status, _, body) = raw(a, "GET", "/ui/missing.js", &[], String::new()).await;
    assert_eq!(status, 404, "{body}");
    let e: Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(e["error"]["code"], "NOT_FOUND");
    let (status, _, _) = raw(a, "POST", "/ui/", &[], String::new()).await;
    assert_eq!(status, 405);
    let (status, _, body) = raw(a, "GET", "/v1/queues", &[], String::new()).await;
    assert_eq!(status, 401, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_group_by_error_and_a_group_is_redriven_or_purged_within_its_tenant() {
    let n = start().await;
    let a = n.node().http_addr;
    let ta = token("tenant-a", &Scope::ALL);
    let tb = token("tenant-b", &Scope::ALL);
    let mut boom = Vec::new();
    for _ in 0..3 {
        boom.push(dead_letter(a, &ta, "mail", "smtp: connection refused").await);
    }
    for _ in 0..2 {
        dead_letter(a, &ta, "mail", "bad address").await;
    }
    let secret = dead_letter(a, &tb, "mail", "tenant b's secret error").await;

    let groups = "/v1/queues/mail/dead-letters/groups";
    let (s, g) = call(a, &ta, "GET", groups, Value::Null).await;
    assert_eq!(s, 200, "{g}");
    assert_eq!(g["scanned"], 5);
    assert_eq!(g["truncated"], false);
    let gs = g["groups"].as_array().expect("groups");
    assert_eq!(gs.len(), 2, "{g}");
    assert_eq!((gs[0]["error"].as_str(), gs[0]["count"].as_u64()), (Some("smtp: connection refused"), Some(3)));
    assert_eq!((gs[1]["error"].as_str(), gs[1]["count"].as_u64()), (Some("bad address"), Some(2)));
    let mut examples: Vec<String> =
        gs[0]["example_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_string()).collect();
    examples.sort();
    boom.sort();
    assert_eq!(examples, boom);
    assert!(!g.to_string().contains("secret"), "tenant A sees tenant B's dead letters: {g}");

    // Tenant A cannot reach tenant B's group, even naming its error text exactly.
    let body = json!({"error": "tenant b's secret error"});
    let (s, r) = call(a, &ta, "POST", &format!("{groups}/redrive"), body.clone()).await;
    assert_eq!((s, r["redriven"].as_array().map(Vec::len)), (200, Some(0)), "{r}");
    let (s, r) = call(a, &ta, "POST", &format!("{groups}/purge"), body).await;
    assert_eq!((s, r["purged"].as_array().map(Vec::len)), (200, Some(0)), "{r}");
    let (s, t) = call(a, &tb, "GET", &format!("/v1/tasks/{secret}"), Value::Null).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("DEAD_LETTERED")), "{t}");

    // Redrive one group: its tasks are pending again, the other group stays.
    let (s, r) = call(a, &ta, "POST", &format!("{groups}/redrive"), json!({"error": "smtp: connection refused"})).await;
    assert_eq!(s, 200, "{r}");
    let mut redriven: Vec<String> =
        r["redriven"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_string()).collect();
    redriven.sort();
    assert_eq!(redriven, boom);
    for id in &boom {
        let (_, t) = call(a, &ta, "GET", &format!("/v1/tasks/{id}"), Value::Null).await;
        assert_eq!(t["state"], "PENDING", "{t}");
    }
    let (_, g) = call(a, &ta, "GET", groups, Value::Null).await;
    assert_eq!(g["groups"].as_array().map(Vec::len), Some(1), "{g}");
    assert_eq!(g["groups"][0]["error"], "bad address");

    // Purge the other: gone for tenant A, tenant B's dead letter untouched.
    let (s, r) = call(a, &ta, "POST", &format!("{groups}/purge"), json!({"error": "bad address"})).await;
    assert_eq!((s, r["purged"].as_array().map(Vec::len)), (200, Some(2)), "{r}");
    let (_, g) = call(a, &ta, "GET", groups, Value::Null).await;
    assert_eq!(g["groups"], json!([]));
    let (_, g) = call(a, &tb, "GET", groups, Value::Null).await;
    assert_eq!(g["groups"][0]["count"], 1, "{g}");

    // Bad input is a JSON error, not a panic.
    let (s, e) = call(a, &ta, "POST", &format!("{groups}/redrive"), json!({"errors": "x"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{e}");
    let (s, e) = call(a, &ta, "GET", "/v1/queues/%20bad%20queue%20/dead-letters/groups", Value::Null).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_reads_what_the_console_shows_and_every_change_is_refused() {
    let n = start().await;
    let a = n.node().http_addr;
    let full = token("t", &Scope::ALL);
    let read = token("t", &[Scope::Read]);
    let id = dead_letter(a, &full, "q", "boom").await;

    for path in ["/v1/queues", "/v1/capacity", "/v1/tasks?queue=q", "/v1/queues/q/dead-letters/groups", "/v1/schedules"]
    {
        let (s, v) = call(a, &read, "GET", path, Value::Null).await;
        assert_eq!(s, 200, "{path}: {v}");
    }
    for (path, body) in [
        ("/v1/queues/q/dead-letters/groups/redrive", json!({"error": "boom"})),
        ("/v1/queues/q/dead-letters/groups/purge", json!({"error": "boom"})),
        ("/v1/queues/q/dead-letters/redrive", json!({"all": true})),
        ("/v1/queues/q/pause", Value::Null),
        (&format!("/v1/tasks/{id}/cancel"), Value::Null),
        ("/v1/cluster/transfer-leader", json!({})),
    ] {
        let (s, e) = call(a, &read, "POST", path, body).await;
        assert_eq!((s, e["error"]["code"].as_str()), (403, Some("SCOPE_REQUIRED")), "{path}: {e}");
    }
    let (_, t) = call(a, &full, "GET", &format!("/v1/tasks/{id}"), Value::Null).await;
    assert_eq!(t["state"], "DEAD_LETTERED", "nothing changed: {t}");
}
