//! Authentication, scopes, queue patterns, tenant isolation, limits and hostile input, against real servers:
//! tokens signed with HS256, RS256, ES256 and EdDSA keys (fixtures in tests/it/keys), every refusal checked by
//! its stable reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use raftq::config::{AuthMode, Config, Secret};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::producer_stream_client::ProducerStreamClient;
use raftq_proto::v1::raft_service_client::RaftServiceClient;
use raftq_proto::v1::worker_stream_client::WorkerStreamClient;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;

use crate::procs::*;
use crate::rest::http_with;
use crate::support::*;

const SECRET: &str = "an-hs256-secret-for-the-tests-0123456789abcdef";
const ISS: &str = "raftq-tests";
const AUD: &str = "raftq";
const ALL: &str = "enqueue work read admin";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/keys").join(name)
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

/// Fills `dir` with exactly these verification keys: `hs` (HS256), `rsa1`, `rsa2` (RS256), `ec1` (ES256),
/// `ed1` (EdDSA), each under its name as key id.
fn write_keys(dir: &Path, keys: &[&str]) {
    for e in std::fs::read_dir(dir).expect("read keys dir") {
        std::fs::remove_file(e.expect("entry").path()).expect("remove key");
    }
    for k in keys {
        match *k {
            "hs" => std::fs::write(dir.join("hs.hs256"), SECRET).expect("write"),
            "rsa1" | "rsa2" => std::fs::copy(fixture(&format!("{k}.pub")), dir.join(format!("{k}.rs256.pem")))
                .map(|_| ())
                .expect("copy"),
            "ec1" => std::fs::copy(fixture("ec1.pub"), dir.join("ec1.es256.pem")).map(|_| ()).expect("copy"),
            "ed1" => std::fs::copy(fixture("ed1.pub"), dir.join("ed1.eddsa.pem")).map(|_| ()).expect("copy"),
            other => panic!("no key {other}"),
        }
    }
}

/// A JWT signed with `signer`'s private key (or the HS256 secret), with `kid` in its header.
fn sign(signer: &str, kid: Option<&str>, claims: &Value) -> String {
    let (alg, key) = match signer {
        "hs" => (Algorithm::HS256, EncodingKey::from_secret(SECRET.as_bytes())),
        "rsa1" | "rsa2" => (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&std::fs::read(fixture(&format!("{signer}.key"))).expect("key")).expect("rsa"),
        ),
        "ec1" => {
            (Algorithm::ES256, EncodingKey::from_ec_pem(&std::fs::read(fixture("ec1.key")).expect("key")).expect("ec"))
        }
        "ed1" => {
            (Algorithm::EdDSA, EncodingKey::from_ed_pem(&std::fs::read(fixture("ed1.key")).expect("key")).expect("ed"))
        }
        other => panic!("no signer {other}"),
    };
    let mut h = Header::new(alg);
    h.kid = kid.map(String::from);
    jsonwebtoken::encode(&h, claims, &key).expect("sign")
}

fn claims(tenant: &str, scopes: &str) -> Value {
    json!({"sub": "tester", "tid": tenant, "scope": scopes, "iss": ISS, "aud": AUD, "exp": now() + 600, "nbf": now() - 1})
}

/// A valid HS256 token for `tenant` with `scopes`.
fn token(tenant: &str, scopes: &str) -> String {
    sign("hs", Some("hs"), &claims(tenant, scopes))
}

fn with<T>(msg: T, tok: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {tok}").parse().expect("ascii"));
    r
}

/// A node with authentication on: keys in a directory of their own (kept alive with the node).
async fn auth_node(keys: &[&str], f: impl FnOnce(&mut Config)) -> (TestNode, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("keys dir");
    write_keys(dir.path(), keys);
    let path = dir.path().to_path_buf();
    let n = TestNode::start_with(move |c| {
        c.auth = AuthMode::Jwt;
        c.auth_keys_dir = Some(path);
        c.auth_issuer = Some(ISS.into());
        c.auth_audience = Some(AUD.into());
        f(c);
    })
    .await;
    (n, dir)
}

/// The reason a read with this token gets ("" when it is served).
async fn read_reason(c: &mut Client, tok: Option<&str>) -> String {
    let msg = pb::QueueStatsRequest { queues: vec![] };
    let req = match tok {
        Some(t) => with(msg, t),
        None => Request::new(msg),
    };
    match c.queue_stats(req).await {
        Ok(_) => String::new(),
        Err(s) => reason(&s),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_checked_for_signature_expiry_validity_issuer_and_audience() {
    let (n, _keys) = auth_node(&["hs", "rsa1", "ec1", "ed1"], |_| {}).await;
    let mut c = n.client().await;
    let at = |f: &dyn Fn(&mut Value)| {
        let mut v = claims("t1", "read");
        f(&mut v);
        sign("hs", Some("hs"), &v)
    };
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "TOKEN_MISSING"),
        ("not a JWT", Some("garbage".into()), "TOKEN_INVALID"),
        ("expired beyond the leeway", Some(at(&|v| v["exp"] = json!(now() - 120))), "TOKEN_EXPIRED"),
        ("expired within the leeway", Some(at(&|v| v["exp"] = json!(now() - 5))), ""),
        ("not yet valid", Some(at(&|v| v["nbf"] = json!(now() + 300))), "TOKEN_NOT_YET_VALID"),
        ("wrong issuer", Some(at(&|v| v["iss"] = json!("someone-else"))), "TOKEN_WRONG_ISSUER"),
        ("wrong audience", Some(at(&|v| v["aud"] = json!("another-service"))), "TOKEN_WRONG_AUDIENCE"),
        ("no exp", Some(at(&|v| _ = v.as_object_mut().expect("object").remove("exp"))), "TOKEN_INVALID"),
        ("no tenant", Some(at(&|v| _ = v.as_object_mut().expect("object").remove("tid"))), "TOKEN_INVALID"),
        ("signed by another RSA key", Some(sign("rsa2", Some("rsa1"), &claims("t1", "read"))), "TOKEN_BAD_SIGNATURE"),
        ("unknown key id", Some(sign("hs", Some("nope"), &claims("t1", "read"))), "TOKEN_UNKNOWN_KEY"),
        ("HS256", Some(token("t1", "read")), ""),
        ("HS256 without a key id", Some(sign("hs", None, &claims("t1", "read"))), ""),
        ("RS256", Some(sign("rsa1", Some("rsa1"), &claims("t1", "read"))), ""),
        ("ES256", Some(sign("ec1", Some("ec1"), &claims("t1", "read"))), ""),
        ("EdDSA", Some(sign("ed1", Some("ed1"), &claims("t1", "read"))), ""),
    ];
    for (what, tok, want) in cases {
        assert_eq!(read_reason(&mut c, tok.as_deref()).await, want, "{what}");
    }
    let e = c.queue_stats(pb::QueueStatsRequest { queues: vec![] }).await.expect_err("no token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // REST: the same refusal as a JSON body with 401, and the same token accepted.
    let a = n.node().http_addr;
    let (code, _, body) = http_with(a, "GET", "/v1/queues", &[], String::new()).await;
    assert_eq!((code, body["error"]["code"].as_str()), (401, Some("TOKEN_MISSING")), "{body}");
    let bearer = format!("Bearer {}", token("t1", "read"));
    let (code, _, body) = http_with(a, "GET", "/v1/queues", &[("authorization", &bearer)], String::new()).await;
    assert_eq!(code, 200, "{body}");
}

/// What a REST read with `authorization: <value>` is refused with ("" when served).
async fn rest_reason(a: std::net::SocketAddr, authorization: &str) -> String {
    let (code, _, body) = http_with(a, "GET", "/v1/queues", &[("authorization", authorization)], String::new()).await;
    match code {
        200 => String::new(),
        _ => body["error"]["code"].as_str().unwrap_or_default().to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_issuer_and_audience_are_required_for_every_algorithm() {
    let (n, _keys) = auth_node(&["hs", "rsa1", "ec1", "ed1"], |_| {}).await;
    let mut c = n.client().await;
    let a = n.node().http_addr;
    let without = |claim: &str| {
        let mut v = claims("t1", "read");
        v.as_object_mut().expect("object").remove(claim);
        v
    };
    for signer in ["hs", "rsa1", "ec1", "ed1"] {
        let cases = [
            ("all claims", sign(signer, Some(signer), &claims("t1", "read")), ""),
            ("no iss", sign(signer, Some(signer), &without("iss")), "TOKEN_WRONG_ISSUER"),
            ("no aud", sign(signer, Some(signer), &without("aud")), "TOKEN_WRONG_AUDIENCE"),
            ("null iss", sign(signer, Some(signer), &at_claim("iss", Value::Null)), "TOKEN_WRONG_ISSUER"),
            ("empty aud list", sign(signer, Some(signer), &at_claim("aud", json!([]))), "TOKEN_WRONG_AUDIENCE"),
        ];
        for (what, tok, want) in cases {
            assert_eq!(read_reason(&mut c, Some(&tok)).await, want, "gRPC, {signer}: {what}");
            assert_eq!(rest_reason(a, &format!("Bearer {tok}")).await, want, "REST, {signer}: {what}");
        }
    }
    // Without an issuer or audience configured, neither claim is needed.
    let (open, _keys) = auth_node(&["hs"], |c| {
        c.auth_issuer = None;
        c.auth_audience = None;
    })
    .await;
    let mut c = open.client().await;
    let bare = sign("hs", Some("hs"), &json!({"tid": "t1", "scope": "read", "exp": now() + 600}));
    assert_eq!(read_reason(&mut c, Some(&bare)).await, "");
    assert_eq!(rest_reason(open.node().http_addr, &format!("Bearer {bare}")).await, "");
}

fn at_claim(claim: &str, value: Value) -> Value {
    let mut v = claims("t1", "read");
    v[claim] = value;
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_accepted_in_any_case() {
    let (n, _keys) = auth_node(&["hs"], |_| {}).await;
    let mut c = n.client().await;
    let a = n.node().http_addr;
    let tok = token("t1", "read");
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let value = format!("{scheme} {tok}");
        let mut req = Request::new(pb::QueueStatsRequest { queues: vec![] });
        req.metadata_mut().insert("authorization", value.parse().expect("ascii"));
        let r = c.queue_stats(req).await;
        assert!(r.is_ok(), "gRPC with {scheme:?}: {:?}", r.err());
        assert_eq!(rest_reason(a, &value).await, "", "REST with {scheme:?}");
    }
    // Another scheme is not a bearer token.
    assert_eq!(rest_reason(a, &format!("Basic {tok}")).await, "TOKEN_INVALID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_by_key_id() {
    let (mut n, keys) = auth_node(&["hs", "rsa1"], |_| {}).await;
    let old = sign("rsa1", Some("rsa1"), &claims("t1", "read"));
    let new = sign("rsa2", Some("rsa2"), &claims("t1", "read"));
    let mut c = n.client().await;
    assert_eq!(read_reason(&mut c, Some(&old)).await, "");
    assert_eq!(read_reason(&mut c, Some(&new)).await, "TOKEN_UNKNOWN_KEY");

    // Rotation: the new key is added beside the old one, then the old one is retired.
    n.stop().await;
    write_keys(keys.path(), &["hs", "rsa1", "rsa2"]);
    n.restart().await;
    let mut c = n.client().await;
    assert_eq!(read_reason(&mut c, Some(&old)).await, "");
    assert_eq!(read_reason(&mut c, Some(&new)).await, "");

    n.stop().await;
    write_keys(keys.path(), &["hs", "rsa2"]);
    n.restart().await;
    let mut c = n.client().await;
    assert_eq!(read_reason(&mut c, Some(&old)).await, "TOKEN_UNKNOWN_KEY");
    assert_eq!(read_reason(&mut c, Some(&new)).await, "");
}

const SOME_ID: &str = "0123456789abcdef0123456789abcdef";

fn jobs(ch: &tonic::transport::Channel) -> raftq_proto::v1::jobs_client::JobsClient<tonic::transport::Channel> {
    raftq_proto::v1::jobs_client::JobsClient::new(ch.clone())
}

/// Runs operation `op` with `tok`; the reason it is refused with, or "" when it is served.
async fn run_op(
    c: &mut Client,
    a: &mut AdminClient<tonic::transport::Channel>,
    ch: &tonic::transport::Channel,
    op: &str,
    tok: &str,
) -> String {
    let sel = || pb::DeadLetterSelection { queue: "q".into(), ids: vec![SOME_ID.into()], all: false };
    let ack = || pb::AckRequest {
        task_id: SOME_ID.into(),
        token: 1,
        action: Some(pb::ack_request::Action::Abandon(pb::Abandon {})),
    };
    let r: Result<(), tonic::Status> = match op {
        "enqueue" => c.enqueue(with(enq("q", "x"), tok)).await.map(drop),
        "enqueue_batch" => {
            c.enqueue_batch(with(pb::EnqueueBatchRequest { items: vec![enq("q", "x")] }, tok)).await.map(drop)
        }
        "get_task" => c.get_task(with(pb::GetTaskRequest { id: SOME_ID.into() }, tok)).await.map(drop),
        "get_result" => {
            c.get_result(with(pb::GetResultRequest { id: SOME_ID.into(), wait_ms: 0 }, tok)).await.map(drop)
        }
        "cancel" => c.cancel(with(pb::CancelRequest { id: SOME_ID.into() }, tok)).await.map(drop),
        "list_dead_letters" => {
            c.list_dead_letters(with(pb::ListDeadLettersRequest { queue: "q".into(), limit: 10 }, tok)).await.map(drop)
        }
        "redrive" => c.redrive(with(sel(), tok)).await.map(drop),
        "purge" => c.purge_dead_letters(with(sel(), tok)).await.map(drop),
        "claim" => c
            .claim(with(
                pb::ClaimRequest {
                    worker_id: "w".into(),
                    queues: vec!["q".into()],
                    count: 1,
                    lease_ms: 5000,
                    wait_ms: 0,
                },
                tok,
            ))
            .await
            .map(drop),
        "ack" => c.ack(with(ack(), tok)).await.map(drop),
        "ack_batch" => c.ack_batch(with(pb::AckBatchRequest { items: vec![ack()] }, tok)).await.map(drop),
        "queue_stats" => c.queue_stats(with(pb::QueueStatsRequest { queues: vec![] }, tok)).await.map(drop),
        "status" => a.status(with(pb::NodeStatusRequest {}, tok)).await.map(drop),
        "digest" => a.digest(with(pb::DigestRequest {}, tok)).await.map(drop),
        "backup" => match a.backup(with(pb::BackupRequest {}, tok)).await {
            Ok(s) => s.into_inner().message().await.map(drop),
            Err(e) => Err(e),
        },
        "transfer_leader" => {
            a.transfer_leader(with(pb::TransferLeaderRequest { to: 9, timeout_ms: 100 }, tok)).await.map(drop)
        }
        "pause_queue" => jobs(ch).pause_queue(with(pb::PauseQueueRequest { queue: "q".into() }, tok)).await.map(drop),
        "list_tasks" => jobs(ch).list_tasks(with(pb::ListTasksRequest::default(), tok)).await.map(drop),
        "capacity" => jobs(ch).queue_capacity(with(pb::QueueCapacityRequest { queues: vec![] }, tok)).await.map(drop),
        "create_schedule" => {
            let req = pb::CreateScheduleRequest {
                name: "s".into(),
                task: Some(enq("q", "x")),
                interval_ms: 3_600_000,
                ..Default::default()
            };
            jobs(ch).create_schedule(with(req, tok)).await.map(drop)
        }
        "remove_node" => a.remove_node(with(pb::RemoveNodeRequest { node_id: 9, force: false }, tok)).await.map(drop),
        "worker_stream" => {
            let (tx, rx) = mpsc::channel(2);
            let hello = pb::Hello { token: tok.into(), worker_id: "w".into() };
            tx.send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Hello(hello)) }).await.expect("send");
            let r = WorkerStreamClient::new(ch.clone()).stream(ReceiverStream::new(rx)).await.map(drop);
            drop(tx);
            r
        }
        "producer_stream" => {
            let (tx, rx) = mpsc::channel(2);
            let hello = pb::Hello { token: tok.into(), worker_id: "p".into() };
            tx.send(pb::ProducerEvent { event: Some(pb::producer_event::Event::Hello(hello)) }).await.expect("send");
            let r = ProducerStreamClient::new(ch.clone()).stream(ReceiverStream::new(rx)).await.map(drop);
            drop(tx);
            r
        }
        other => panic!("no operation {other}"),
    };
    match r {
        Ok(()) => String::new(),
        Err(s) => reason(&s),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_needs_its_scope() {
    let (n, _keys) = auth_node(&["hs"], |_| {}).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", n.node().grpc_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut c = Client::new(ch.clone());
    let mut a = AdminClient::new(ch.clone());
    let table = [
        ("enqueue", "enqueue"),
        ("enqueue_batch", "enqueue"),
        ("producer_stream", "enqueue"),
        ("cancel", "enqueue"),
        ("redrive", "enqueue"),
        ("get_task", "read"),
        ("get_result", "read"),
        ("list_dead_letters", "read"),
        ("queue_stats", "read"),
        ("claim", "work"),
        ("ack", "work"),
        ("ack_batch", "work"),
        ("worker_stream", "work"),
        ("purge", "admin"),
        ("status", "admin"),
        ("digest", "admin"),
        ("backup", "admin"),
        ("transfer_leader", "admin"),
        ("remove_node", "admin"),
        ("pause_queue", "admin"),
        ("list_tasks", "read"),
        ("capacity", "read"),
        ("create_schedule", "enqueue"),
    ];
    for (op, scope) in table {
        let others: Vec<&str> = ALL.split(' ').filter(|s| *s != scope).collect();
        let without = token("t1", &others.join(" "));
        assert_eq!(run_op(&mut c, &mut a, &ch, op, &without).await, "SCOPE_REQUIRED", "{op} without '{scope}'");
        let only = token("t1", scope);
        let r = run_op(&mut c, &mut a, &ch, op, &only).await;
        assert!(
            !["SCOPE_REQUIRED", "TOKEN_INVALID", "TOKEN_MISSING"].contains(&r.as_str()),
            "{op} with '{scope}': {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limited_to_queue_patterns_cannot_use_other_queues() {
    let (n, _keys) = auth_node(&["hs"], |_| {}).await;
    let mut c = n.client().await;
    let mut limited = claims("t1", ALL);
    limited["queues"] = json!(["emails.*", "reports"]);
    let lt = sign("hs", Some("hs"), &limited);
    let full = token("t1", ALL);

    c.enqueue(with(enq("emails.welcome", "a"), &lt)).await.expect("allowed queue");
    c.enqueue(with(enq("reports", "b"), &lt)).await.expect("allowed queue");
    let e = c.enqueue(with(enq("billing", "c"), &lt)).await.expect_err("other queue");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::PermissionDenied, "QUEUE_NOT_ALLOWED"));
    // A batch answers per item: the allowed one is enqueued, the other refused.
    let b = c
        .enqueue_batch(with(pb::EnqueueBatchRequest { items: vec![enq("emails.x", "d"), enq("billing", "e")] }, &lt))
        .await
        .expect("batch")
        .into_inner();
    assert!(matches!(b.results[0].result, Some(pb::enqueue_result::Result::Ok(_))));
    match &b.results[1].result {
        Some(pb::enqueue_result::Result::Error(e)) => assert_eq!(e.code, "QUEUE_NOT_ALLOWED"),
        other => panic!("{other:?}"),
    }
    // Claims naming another queue, reads and cancels of a task in another queue are refused.
    let claim = |q: &str| pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec![q.into()],
        count: 1,
        lease_ms: 5000,
        wait_ms: 0,
    };
    let e = c.claim(with(claim("billing"), &lt)).await.expect_err("claim other queue");
    assert_eq!(reason(&e), "QUEUE_NOT_ALLOWED");
    let other = c.enqueue(with(enq("billing", "f"), &full)).await.expect("full token").into_inner().task_id;
    let e = c.get_task(with(pb::GetTaskRequest { id: other.clone() }, &lt)).await.expect_err("read other queue");
    assert_eq!(reason(&e), "QUEUE_NOT_ALLOWED");
    let e = c.cancel(with(pb::CancelRequest { id: other.clone() }, &lt)).await.expect_err("cancel other queue");
    assert_eq!(reason(&e), "QUEUE_NOT_ALLOWED");
    assert_eq!(
        c.get_task(with(pb::GetTaskRequest { id: other }, &full)).await.expect("still there").into_inner().state,
        pb::TaskState::Pending as i32
    );
    // Queue stats show only the allowed queues.
    let s = c.queue_stats(with(pb::QueueStatsRequest { queues: vec![] }, &lt)).await.expect("stats").into_inner();
    let mut names: Vec<String> = s.queues.into_iter().map(|q| q.queue).collect();
    names.sort();
    assert_eq!(names, ["emails.welcome", "emails.x", "reports"]);
    let got = c.claim(with(claim("reports"), &lt)).await.expect("claim allowed").into_inner();
    assert_eq!(got.tasks.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_or_touch_each_others_tasks() {
    let (n, _keys) = auth_node(&["hs"], |c| {
        c.retry_base_ms = 10;
        c.retry_max_ms = 10;
    })
    .await;
    let mut c = n.client().await;
    let (ta, tb) = (token("alpha", ALL), token("beta", ALL));
    let keyed = |p: &str| pb::EnqueueRequest { idempotency_key: "order-1".into(), ..enq("shared", p) };

    let a1 = c.enqueue(with(keyed("a"), &ta)).await.expect("a").into_inner();
    // The same idempotency key is another tenant's own: a new task, not a duplicate.
    let b1 = c.enqueue(with(keyed("b"), &tb)).await.expect("b").into_inner();
    assert!(!b1.duplicate && b1.task_id != a1.task_id);
    let again = c.enqueue(with(keyed("a2"), &ta)).await.expect("a again").into_inner();
    assert!(again.duplicate && again.task_id == a1.task_id);

    let nf = |r: Result<(), tonic::Status>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::NotFound, "NOT_FOUND"), "{what}");
    };
    let id = a1.task_id.clone();
    nf(c.get_task(with(pb::GetTaskRequest { id: id.clone() }, &tb)).await.map(drop), "get");
    nf(c.get_result(with(pb::GetResultRequest { id: id.clone(), wait_ms: 0 }, &tb)).await.map(drop), "result");
    nf(c.cancel(with(pb::CancelRequest { id: id.clone() }, &tb)).await.map(drop), "cancel");

    // Beta's claim on the same queue name gets beta's task only.
    let claim = |w: &str| pb::ClaimRequest {
        worker_id: w.into(),
        queues: vec!["shared".into()],
        count: 10,
        lease_ms: 5000,
        wait_ms: 0,
    };
    let got_b = c.claim(with(claim("wb"), &tb)).await.expect("claim b").into_inner().tasks;
    assert_eq!(got_b.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [b1.task_id.as_str()]);
    assert!(got_b.iter().all(|t| t.tenant == "beta"));
    let got_a = c.claim(with(claim("wa"), &ta)).await.expect("claim a").into_inner().tasks;
    assert_eq!(got_a.len(), 1);
    let a_token = got_a[0].lease.as_ref().expect("lease").token;

    // Beta cannot report on alpha's task, even with its fencing token.
    let act = |a| pb::AckRequest { task_id: id.clone(), token: a_token, action: Some(a) };
    for (what, action) in [
        ("nack", pb::ack_request::Action::Nack(pb::Nack { delay_ms: 0, reason: "x".into() })),
        (
            "complete",
            pb::ack_request::Action::Complete(pb::Complete { result: b"stolen".to_vec().into(), ..Default::default() }),
        ),
        ("heartbeat", pb::ack_request::Action::Heartbeat(pb::Heartbeat { extend_ms: 1000, ..Default::default() })),
    ] {
        nf(c.ack(with(act(action), &tb)).await.map(drop), what);
    }
    // Alpha fails it for good: a dead letter that beta can neither list, redrive nor purge.
    let fail = pb::ack_request::Action::Fail(pb::Fail { error: "boom".into(), retryable: false });
    c.ack(with(act(fail), &ta)).await.expect("fail");
    let failed = c.get_task(with(pb::GetTaskRequest { id: id.clone() }, &ta)).await.expect("get").into_inner();
    assert!(failed.state == pb::TaskState::Failed as i32 || failed.state == pb::TaskState::DeadLettered as i32);

    // A dead letter of alpha's (max_attempts 1, retryable failure).
    let dl = c
        .enqueue(with(pb::EnqueueRequest { max_attempts: 1, ..enq("dlq", "d") }, &ta))
        .await
        .expect("enqueue")
        .into_inner()
        .task_id;
    let t = c
        .claim(with(
            pb::ClaimRequest {
                worker_id: "wa".into(),
                queues: vec!["dlq".into()],
                count: 1,
                lease_ms: 5000,
                wait_ms: 1000,
            },
            &ta,
        ))
        .await
        .expect("claim")
        .into_inner()
        .tasks;
    let tok = t[0].lease.as_ref().expect("lease").token;
    let fail = pb::ack_request::Action::Fail(pb::Fail { error: "again".into(), retryable: true });
    c.ack(with(pb::AckRequest { task_id: dl.clone(), token: tok, action: Some(fail) }, &ta)).await.expect("fail");
    let list = |tok: &str| with(pb::ListDeadLettersRequest { queue: "dlq".into(), limit: 10 }, tok);
    assert_eq!(c.list_dead_letters(list(&ta)).await.expect("list a").into_inner().tasks.len(), 1);
    assert!(c.list_dead_letters(list(&tb)).await.expect("list b").into_inner().tasks.is_empty());
    let sel = || pb::DeadLetterSelection { queue: "dlq".into(), ids: vec![dl.clone()], all: false };
    nf(c.redrive(with(sel(), &tb)).await.map(drop), "redrive");
    nf(c.purge_dead_letters(with(sel(), &tb)).await.map(drop), "purge");
    let all = pb::DeadLetterSelection { queue: "dlq".into(), ids: vec![], all: true };
    assert!(c.purge_dead_letters(with(all, &tb)).await.expect("purge all b").into_inner().ids.is_empty());
    assert_eq!(
        c.list_dead_letters(list(&ta)).await.expect("list a").into_inner().tasks.len(),
        1,
        "alpha's dead letter is intact"
    );

    // Counts are per tenant.
    let stats = |tok: &str| with(pb::QueueStatsRequest { queues: vec![] }, tok);
    let sb = c.queue_stats(stats(&tb)).await.expect("stats b").into_inner();
    assert_eq!(sb.queues.iter().map(|q| q.queue.as_str()).collect::<Vec<_>>(), ["shared"]);

    // REST: the same answers.
    let a = n.node().http_addr;
    let bearer = format!("Bearer {tb}");
    let (code, _, body) =
        http_with(a, "GET", &format!("/v1/tasks/{id}"), &[("authorization", &bearer)], String::new()).await;
    assert_eq!((code, body["error"]["code"].as_str()), (404, Some("NOT_FOUND")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_closed_when_its_token_expires_and_the_sdk_reopens_it_with_a_new_token() {
    let (n, _keys) = auth_node(&["hs"], |c| c.auth_leeway_s = 0).await;
    let short = |secs: u64| {
        let mut v = claims("t1", ALL);
        v["exp"] = json!(now() + secs);
        sign("hs", Some("hs"), &v)
    };
    // A raw stream: served until the token's expiry, then ended with UNAUTHENTICATED / TOKEN_EXPIRED.
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", n.node().grpc_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(4);
    let hello = pb::Hello { token: short(2), worker_id: "raw".into() };
    tx.send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Hello(hello)) }).await.expect("send");
    let mut inbound = WorkerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await.expect("open").into_inner();
    assert!(matches!(
        inbound.message().await.expect("ack").and_then(|m| m.event),
        Some(pb::server_event::Event::HelloAck(_))
    ));
    let started = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends");
    let e = end.expect_err("ended with a status");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::Unauthenticated, "TOKEN_EXPIRED"));
    assert!(started.elapsed() < Duration::from_secs(4), "closed at expiry, not later");
    drop(tx);

    // The SDK worker asks its provider for a token on every open and outlives several expiries.
    let minted = Arc::new(AtomicUsize::new(0));
    let m = minted.clone();
    let cfg = raftq_client::WorkerConfig {
        addrs: vec![format!("http://{}", n.node().grpc_addr)],
        token_provider: Some(Arc::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
            let mut v = claims("t1", ALL);
            v["exp"] = json!(now() + 2);
            Some(sign("hs", Some("hs"), &v))
        })),
        queues: vec!["expiring".into()],
        lease: Duration::from_secs(10),
        heartbeat: None,
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_millis(200),
        ..Default::default()
    };
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let worker = Arc::new(raftq_client::Worker::new(cfg).expect("config"));
    let stop = raftq_client::CancellationToken::new();
    let (w, s) = (worker.clone(), stop.clone());
    let run = tokio::spawn(async move {
        w.run(
            move |_t| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    raftq_client::Outcome::Completed(bytes::Bytes::from_static(b"ok"))
                }
            },
            s,
        )
        .await
    });
    let mut c = n.client().await;
    let full = token("t1", ALL);
    for round in 0..3 {
        for i in 0..3 {
            c.enqueue(with(enq("expiring", &format!("{round}-{i}")), &full)).await.expect("enqueue");
        }
        let want = (round + 1) * 3;
        let deadline = Instant::now() + Duration::from_secs(15);
        while done.load(Ordering::SeqCst) < want {
            assert!(Instant::now() < deadline, "round {round}: {} of {want} done", done.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Past this token's expiry before the next round.
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("stops")
        .expect("no panic")
        .expect("no fatal error");
    assert!(minted.load(Ordering::SeqCst) >= 3, "a new token per stream: {}", minted.load(Ordering::SeqCst));
    assert!(summary.reconnects >= 2, "{summary:?}");
    assert_eq!(done.load(Ordering::SeqCst), 9);

    // A producer with a provider outlives its tokens too; one with a fixed short token does not.
    let fixed = short(1);
    let provided = raftq_client::Producer::connect(raftq_client::ProducerConfig {
        addrs: vec![format!("http://{}", n.node().grpc_addr)],
        token_provider: Some(Arc::new(move || Some(short(1)))),
        ..Default::default()
    })
    .await
    .expect("producer");
    let stuck = raftq_client::Producer::connect(raftq_client::ProducerConfig {
        addrs: vec![format!("http://{}", n.node().grpc_addr)],
        token: Some(fixed),
        ..Default::default()
    })
    .await
    .expect("producer");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    provided.enqueue(raftq_client::NewTask::new("expiring", "later")).await.expect("a fresh token per request");
    let e = stuck.enqueue(raftq_client::NewTask::new("expiring", "later")).await.expect_err("expired");
    assert_eq!(e.reason(), Some("TOKEN_EXPIRED"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raft_port_takes_only_the_cluster_credential() {
    let (n, _keys) = auth_node(&["hs"], |c| c.cluster_secret = Some(Secret("the-right-cluster-secret".into()))).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", n.node().raft_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut raft = RaftServiceClient::new(ch);
    let msg = || pb::RaftMessage { from: 7, to: 1, data: vec![1, 2, 3].into(), ..Default::default() };
    let call = |mut r: Request<pb::RaftMessage>, header: Option<(&'static str, String)>| {
        if let Some((k, v)) = header {
            r.metadata_mut().insert(k, v.parse().expect("ascii"));
        }
        r
    };
    // A client's valid token is not a peer credential.
    let e = raft.vote(with(msg(), &token("t1", ALL))).await.expect_err("client token");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::Unauthenticated, "CLUSTER_AUTH"));
    let e = raft.append_entries(Request::new(msg())).await.expect_err("nothing");
    assert_eq!(reason(&e), "CLUSTER_AUTH");
    let wrong = raftq::auth::cluster_credential(b"a-wrong-cluster-secret");
    let e =
        raft.vote(call(Request::new(msg()), Some((raftq::auth::CLUSTER_AUTH_HEADER, wrong)))).await.expect_err("wrong");
    assert_eq!(reason(&e), "CLUSTER_AUTH");
    // The right credential passes the gate (this message is then refused for what it says, not who sent it).
    let right = raftq::auth::cluster_credential(b"the-right-cluster-secret");
    let r = raft.vote(call(Request::new(msg()), Some((raftq::auth::CLUSTER_AUTH_HEADER, right)))).await;
    if let Err(e) = r {
        assert_ne!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_wrong_cluster_secret_cannot_join_or_disturb_the_cluster() {
    let root = tempfile::tempdir().expect("dir");
    let secret_file = root.path().join("tokens.hs256");
    std::fs::write(&secret_file, SECRET).expect("write secret");
    let mut nodes: Vec<ProcNode> = (1..=3).map(|id| ProcNode::new(root.path(), id, "")).collect();
    let peers: Vec<String> = nodes
        .iter()
        .map(|n| format!("{{ id = {}, raft_addr = {:?}, api_addr = {:?} }}", n.id, n.raft, n.grpc))
        .collect();
    for n in nodes.iter_mut() {
        let cluster = if n.id == 3 { "an-impostor-secret" } else { "the-cluster-secret" };
        let extra = format!(
            "auth = \"jwt\"\nauth_hs256_secret_file = {:?}\ncluster_secret = {cluster:?}\n{FAST}peers = [{}]\n",
            secret_file.display().to_string(),
            peers.join(", ")
        );
        n.config = write_config(root.path(), n.id, &n.grpc, &n.raft, &n.http, &extra);
        n.start();
    }
    let tok = sign("hs", None, &json!({"sub": "t", "tid": "t1", "scope": ALL, "exp": now() + 600}));
    // Nodes 1 and 2 form a quorum and serve writes.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = loop {
        let url = format!("http://{}", nodes[0].grpc);
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(url).expect("url").connect().await {
            let mut c = Client::new(ch);
            if c.enqueue(with(enq("q", "x"), &tok)).await.is_ok() {
                break c;
            }
        }
        assert!(Instant::now() < deadline, "nodes 1 and 2 did not form a cluster");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let term0 = nodes[0].metric("raftq_raft_term").await.expect("term");
    // Node 3 hears nothing it accepts and nobody accepts it: it never learns a leader nor applies an entry, and
    // its elections do not drive the others' term.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..5 {
        c.enqueue(with(enq("q", &format!("y{i}")), &tok)).await.expect("writes go on");
    }
    assert_eq!(nodes[2].metric("raftq_raft_leader_id").await, Some(0.0), "node 3 knows no leader");
    assert_eq!(nodes[2].metric("raftq_raft_applied_index").await, Some(0.0), "node 3 applied nothing");
    let term = nodes[0].metric("raftq_raft_term").await.expect("term");
    assert!(term <= term0 + 1.0, "node 3's elections did not drive the cluster's term: {term0} -> {term}");
    assert!(nodes[1].metric("raftq_raft_applied_index").await.expect("applied") >= 6.0);
    for n in nodes.iter_mut() {
        n.kill9();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_without_keys_requires_tokens_minted_from_its_own_secret() {
    let root = tempfile::tempdir().expect("dir");
    let mut node = ProcNode::new(root.path(), 1, "auth = \"jwt\"\n");
    node.start();
    let bin = env!("CARGO_BIN_EXE_raftq");
    let secret = node.dir.join("auth/local.hs256");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !secret.exists() {
        assert!(Instant::now() < deadline, "no secret created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&secret).expect("meta").permissions().mode() & 0o777, 0o600);
    }
    let mut c = node.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.queue_stats(pb::QueueStatsRequest { queues: vec![] }).await {
            Err(e) if reason(&e) == "TOKEN_MISSING" => break,
            other => assert!(Instant::now() < deadline, "anonymous call: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // `raftq token issue` mints from the node's secret, with the scopes asked for.
    let out = Command::new(bin)
        .args(["token", "issue", "--tenant", "t9", "--scopes", "enqueue,read", "--data-dir"])
        .arg(&node.dir)
        .output()
        .expect("token issue");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tok = String::from_utf8(out.stdout).expect("utf-8").trim().to_string();
    let id = c.enqueue(with(enq("cli", "p"), &tok)).await.expect("enqueue with the minted token").into_inner().task_id;
    let e = c
        .claim(with(
            pb::ClaimRequest {
                worker_id: "w".into(),
                queues: vec!["cli".into()],
                count: 1,
                lease_ms: 5000,
                wait_ms: 0,
            },
            &tok,
        ))
        .await
        .expect_err("no work scope");
    assert_eq!(reason(&e), "SCOPE_REQUIRED");
    let t = c.get_task(with(pb::GetTaskRequest { id: id.clone() }, &tok)).await.expect("get").into_inner();
    assert_eq!(t.tenant, "t9");

    // The CLI with RAFTQ_TOKEN, and without one: a token minted from the local secret (tenant default).
    let cli = |args: &[&str], token: Option<&str>| {
        let mut cmd = Command::new(bin);
        cmd.args(args).args(["--addr", &node.grpc]).env("RAFTQ_DATA_DIR", &node.dir).env_remove("RAFTQ_TOKEN");
        if let Some(t) = token {
            cmd.env("RAFTQ_TOKEN", t);
        }
        cmd.output().expect("cli")
    };
    let out = cli(&["task", "get", &id], Some(&tok));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&id), "{out:?}");
    let out = cli(&["task", "enqueue", "--queue", "local", "--payload", "x"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local_id = String::from_utf8(out.stdout).expect("utf-8").trim().to_string();
    let out = cli(&["task", "get", &local_id, "--output", "json"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"tenant\":\"default\""), "{out:?}");
    let out = cli(&["queues"], Some("not-a-jwt"));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("TOKEN_INVALID"), "{out:?}");
    node.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_held_to_their_rates_and_stream_counts() {
    let (n, _keys) = auth_node(&["hs"], |c| {
        c.max_batch_items = 10;
        c.tenant_enqueue_per_s = 0.5;
        c.tenant_enqueue_burst = 10;
        c.tenant_claim_per_s = 1.0;
        c.tenant_claim_burst = 3;
        c.tenant_max_streams = 1;
    })
    .await;
    let mut c = n.client().await;
    let (ta, tb) = (token("alpha", ALL), token("beta", ALL));
    let batch = |k: usize| pb::EnqueueBatchRequest { items: (0..k).map(|i| enq("limited", &i.to_string())).collect() };
    c.enqueue_batch(with(batch(10), &ta)).await.expect("the burst");
    let e = c.enqueue_batch(with(batch(1), &ta)).await.expect_err("over the rate");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::ResourceExhausted, "RATE_LIMITED"));
    let hint: u64 =
        e.metadata().get("x-raftq-retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok()).expect("retry hint");
    assert!((1..=2000).contains(&hint), "{hint}");
    // Nothing of the refused batch was applied; another tenant is not held back.
    let stats = c.queue_stats(with(pb::QueueStatsRequest { queues: vec![] }, &ta)).await.expect("stats").into_inner();
    assert_eq!(stats.queues[0].pending, 10);
    c.enqueue(with(enq("limited", "b"), &tb)).await.expect("beta has its own bucket");
    // REST: 429 with Retry-After and the hint in the body.
    let a = n.node().http_addr;
    let bearer = format!("Bearer {ta}");
    let (code, headers, body) = http_with(
        a,
        "POST",
        "/v1/tasks",
        &[("authorization", &bearer)],
        json!({"queue": "limited", "payload": "r"}).to_string(),
    )
    .await;
    assert_eq!((code, body["error"]["code"].as_str()), (429, Some("RATE_LIMITED")), "{body}");
    assert!(headers.iter().any(|(k, _)| k == "retry-after") && body["error"]["retry_after_ms"].as_u64().is_some());

    // Claims: at most the bucket's tokens now, then refused until it refills.
    let claim = pb::ClaimRequest {
        worker_id: "w".into(),
        queues: vec!["limited".into()],
        count: 10,
        lease_ms: 5000,
        wait_ms: 0,
    };
    let got = c.claim(with(claim.clone(), &ta)).await.expect("claim").into_inner().tasks;
    assert_eq!(got.len(), 3);
    let e = c.claim(with(claim.clone(), &ta)).await.expect_err("over the claim rate");
    assert_eq!(reason(&e), "RATE_LIMITED");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(c.claim(with(claim, &ta)).await.expect("refilled").into_inner().tasks.len(), 1);

    // One stream per tenant on this node.
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", n.node().grpc_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let open = |tok: String| {
        let ch = ch.clone();
        async move {
            let (tx, rx) = mpsc::channel(2);
            let hello = pb::Hello { token: tok, worker_id: "s".into() };
            tx.send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Hello(hello)) }).await.expect("send");
            (WorkerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await, tx)
        }
    };
    let (first, tx1) = open(ta.clone()).await;
    let first = first.expect("first stream");
    let (second, _tx2) = open(ta.clone()).await;
    let e = second.expect_err("second stream");
    assert_eq!((e.code(), reason(&e).as_str()), (tonic::Code::ResourceExhausted, "TOO_MANY_STREAMS"));
    let (other, _tx3) = open(tb.clone()).await;
    other.expect("beta's stream");
    drop(tx1);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (again, _tx) = open(ta.clone()).await;
        if again.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the slot is freed when the stream ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_rest_bodies_get_json_errors_and_store_nothing() {
    use rand::{Rng, SeedableRng};
    let (n, _keys) = auth_node(&["hs"], |_| {}).await;
    let a = n.node().http_addr;
    let bearer = format!("Bearer {}", token("fuzz", ALL));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let fields = [
        "queue",
        "payload",
        "payload_base64",
        "priority",
        "delay_ms",
        "max_attempts",
        "idempotency_key",
        "token",
        "worker_id",
        "queues",
        "count",
        "lease_ms",
        "items",
        "result",
        "error",
        "ids",
        "all",
    ];
    let values = [
        json!(null),
        json!(-1),
        json!(1e308),
        json!(u64::MAX),
        json!(""),
        json!("x".repeat(5000)),
        json!([]),
        json!({}),
        json!(true),
        json!("%%%"),
        json!("\u{0}"),
        json!([1, "a", null]),
        json!(12),
    ];
    let paths = [
        "/v1/tasks",
        "/v1/tasks/batch",
        "/v1/claim",
        "/v1/tasks/0123456789abcdef0123456789abcdef/complete",
        "/v1/tasks/zz/fail",
        "/v1/queues/q/dead-letters/redrive",
        "/v1/queues/q/dead-letters/purge",
        "/v1/cluster/transfer-leader",
    ];
    let mut accepted = 0;
    for i in 0..400 {
        let body = match i % 4 {
            0 => (0..rng.random_range(0..200)).map(|_| rng.random::<u8>() as char).collect::<String>(),
            1 => {
                let mut o = serde_json::Map::new();
                for _ in 0..rng.random_range(0..6) {
                    o.insert(fields[rng.random_range(0..fields.len())].into(), values[rng.random_range(0..values.len())].clone());
                }
                Value::Object(o).to_string()
            }
            2 => json!({"queue": "fz", "payload": "p", "priority": rng.random_range(-5..20), "delay_ms": rng.random::<u32>(), "max_attempts": rng.random_range(0..3000)}).to_string(),
            _ => json!({"items": (0..rng.random_range(0..4)).map(|_| json!({"queue": values[rng.random_range(0..values.len())].clone()})).collect::<Vec<_>>()}).to_string(),
        };
        let path = paths[rng.random_range(0..paths.len())];
        let (code, _, v) = http_with(a, "POST", path, &[("authorization", &bearer)], body.clone()).await;
        assert_ne!(code, 500, "{path} {body:?} -> {v}");
        if code >= 400 {
            assert!(v["error"]["code"].as_str().is_some_and(|c| !c.is_empty()), "{path} {body:?} -> {code} {v}");
        } else {
            accepted += 1;
        }
    }
    // What was accepted is stored whole and readable; the node still serves.
    let mut c = n.client().await;
    let stats = c
        .queue_stats(with(pb::QueueStatsRequest { queues: vec![] }, &token("fuzz", ALL)))
        .await
        .expect("stats")
        .into_inner();
    for q in &stats.queues {
        let total = q.pending + q.delayed + q.in_progress + q.completed + q.failed + q.cancelled + q.dead_lettered;
        assert!(total > 0 && q.queue.len() <= 128, "{q:?}");
    }
    assert!(accepted > 0, "some generated bodies are valid");
}

/// A channel to `addr` over TLS, verifying the server with the CA fixture `ca` (and presenting the node
/// certificate when `client_cert`).
async fn tls_channel(
    addr: &str,
    ca: &str,
    client_cert: bool,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(fixture(ca)).expect("ca")));
    if client_cert {
        let (c, k) = (
            std::fs::read(fixture("tls-node.pem")).expect("cert"),
            std::fs::read(fixture("tls-node.key")).expect("key"),
        );
        tls = tls.identity(Identity::from_pem(c, k));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("url")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_tls_serves_grpc_and_http_over_tls_only() {
    let n = TestNode::start_with(|c| {
        c.tls_cert_file = Some(fixture("tls-node.pem"));
        c.tls_key_file = Some(fixture("tls-node.key"));
    })
    .await;
    let port = n.node().grpc_addr.port();
    let ca = std::fs::read(fixture("tls-ca.pem")).expect("ca");
    let p = raftq_client::Producer::connect(raftq_client::ProducerConfig {
        addrs: vec![format!("localhost:{port}")],
        tls_ca_pem: Some(ca.clone()),
        ..Default::default()
    })
    .await
    .expect("producer over TLS");
    let id = p.enqueue(raftq_client::NewTask::new("tls", "secret payload")).await.expect("enqueue over TLS").task_id;
    assert_eq!(p.get(&id).await.expect("get").state, raftq_client::TaskState::Pending);

    // Plain HTTP/2 to the TLS port fails, and so does TLS verified with another CA.
    let plain =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).expect("url").connect().await;
    let refused = match plain {
        Err(_) => true,
        Ok(ch) => Client::new(ch).get_task(pb::GetTaskRequest { id: id.clone() }).await.is_err(),
    };
    assert!(refused, "a plain-text client is not served");
    let wrong = match tls_channel(&format!("localhost:{port}"), "tls-other-ca.pem", false).await {
        Err(_) => true,
        Ok(ch) => Client::new(ch).get_task(pb::GetTaskRequest { id: id.clone() }).await.is_err(),
    };
    assert!(wrong, "a server certificate from another CA is not trusted");

    // The HTTP port speaks HTTPS (curl is the client).
    let url = format!("https://localhost:{}/v1/tasks/{id}", n.node().http_addr.port());
    let out =
        Command::new("curl").args(["-s", "--cacert"]).arg(fixture("tls-ca.pem")).arg(&url).output().expect("curl");
    let body: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(body["payload"].as_str(), Some("secret payload"), "{body}");
    let insecure = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(url.replace("https", "http"))
        .output()
        .expect("curl");
    assert_ne!(String::from_utf8_lossy(&insecure.stdout), "200", "plain HTTP is not served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_replicates_over_mutual_tls_and_refuses_peers_without_a_certificate() {
    let root = tempfile::tempdir().expect("dir");
    let mut nodes: Vec<ProcNode> = (1..=3).map(|id| ProcNode::new(root.path(), id, "")).collect();
    let peers: Vec<String> = nodes
        .iter()
        .map(|n| format!("{{ id = {}, raft_addr = {:?}, api_addr = {:?} }}", n.id, n.raft, n.grpc))
        .collect();
    let f = |n: &str| fixture(n).display().to_string();
    for n in nodes.iter_mut() {
        let extra = format!(
            "tls_cert_file = {:?}\ntls_key_file = {:?}\ntls_ca_file = {:?}\ncluster_secret = \"tls-cluster\"\n{FAST}peers = [{}]\n",
            f("tls-node.pem"),
            f("tls-node.key"),
            f("tls-ca.pem"),
            peers.join(", ")
        );
        n.config = write_config(root.path(), n.id, &n.grpc, &n.raft, &n.http, &extra);
        n.start();
    }
    // Writes through every node (followers forward to the leader over TLS).
    let ca = std::fs::read(fixture("tls-ca.pem")).expect("ca");
    let deadline = Instant::now() + Duration::from_secs(30);
    // The processes may not listen yet.
    let p = loop {
        let cfg = raftq_client::ProducerConfig {
            addrs: nodes.iter().map(|n| n.grpc.clone()).collect(),
            tls_ca_pem: Some(ca.clone()),
            ..Default::default()
        };
        match raftq_client::Producer::connect(cfg).await {
            Ok(p) => break p,
            Err(e) => assert!(Instant::now() < deadline, "producer: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut done = 0;
    while done < 10 {
        match p.enqueue(raftq_client::NewTask::new("tls-cluster", format!("{done}"))).await {
            Ok(_) => done += 1,
            Err(e) => {
                assert!(Instant::now() < deadline, "no TLS cluster: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    for n in &nodes {
        let mut c = Client::new(tls_channel(&n.grpc, "tls-ca.pem", false).await.expect("tls"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut r = Request::new(pb::QueueStatsRequest { queues: vec![] });
            r.metadata_mut().insert("x-raftq-read", "stale".parse().expect("ascii"));
            let s = c.queue_stats(r).await.expect("stats").into_inner();
            if s.queues.first().is_some_and(|q| q.pending == 10) {
                break;
            }
            assert!(Instant::now() < deadline, "node {} has {:?}", n.id, s.queues);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The Raft port: a TLS client trusting the CA but without a certificate is refused, even with the cluster
    // credential; with the node certificate it gets through the TLS and credential gates.
    let msg = || {
        let mut r = Request::new(pb::RaftMessage { from: 9, to: 1, data: vec![0].into(), ..Default::default() });
        let cred = raftq::auth::cluster_credential(b"tls-cluster");
        r.metadata_mut().insert(raftq::auth::CLUSTER_AUTH_HEADER, cred.parse().expect("ascii"));
        r
    };
    let no_cert = match tls_channel(&nodes[0].raft, "tls-ca.pem", false).await {
        Err(_) => true,
        // Served, this message would be refused as malformed (INVALID_ARGUMENT): any other error is the gate.
        Ok(ch) => RaftServiceClient::new(ch).vote(msg()).await.is_err_and(|e| e.code() != tonic::Code::InvalidArgument),
    };
    assert!(no_cert, "a peer without a certificate is refused");
    let with_cert = tls_channel(&nodes[0].raft, "tls-ca.pem", true).await.expect("mutual TLS");
    let e = RaftServiceClient::new(with_cert).vote(msg()).await.expect_err("a malformed vote");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "past the TLS and credential gates: {e:?}");
    for n in nodes.iter_mut() {
        n.kill9();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_over_rest_needs_the_admin_scope() {
    let (n, _keys) = auth_node(&["hs"], |_| {}).await;
    let a = n.node().http_addr;
    let get = |tok: Option<String>| async move {
        let auth = tok.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|v| ("authorization", v.as_str())).collect();
        crate::rest::raw_bytes(a, "GET", "/v1/admin/backup", &headers, String::new()).await
    };
    for (tok, status, code) in
        [(None, 401, "TOKEN_MISSING"), (Some(token("t1", "enqueue work read")), 403, "SCOPE_REQUIRED")]
    {
        let (s, _, body) = get(tok).await;
        let body: Value = serde_json::from_slice(&body).expect("a JSON error body");
        assert_eq!((s, body["error"]["code"].as_str()), (status, Some(code)), "{body}");
    }
    let (s, headers, body) = get(Some(token("t1", "admin"))).await;
    assert_eq!(s, 200);
    assert!(headers.contains(&("content-type".into(), "application/octet-stream".into())), "{headers:?}");
    assert!(body.starts_with(raftq::storage::format::BACKUP_MAGIC), "a backup file");
}
