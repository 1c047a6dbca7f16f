//! REST/JSON under `/v1`, on the HTTP port.
//!
//! Every route calls the same service operations as gRPC (in process), so validation, forwarding to the leader,
//! read consistency and error reasons are identical: every non-2xx answer, including a query string or body that
//! does not parse, an unknown route (404) and a wrong method (405), is `{"error": {"code": REASON, "message":
//! ...}}` with the HTTP status of its reason (`error.rs`). The headers `authorization`, `x-raftq-redirect` and
//! `x-raftq-read` mean what they mean on gRPC. Payloads and results are bytes: JSON carries them as UTF-8 text
//! (`payload`) or base64 (`payload_base64`); tasks come back with both (`payload` is null when not UTF-8).
//! Fencing tokens are decimal strings (a JSON number cannot hold every u64); numbers are accepted too.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use base64::Engine;
use raftq_proto::reason::header;
use raftq_proto::v1 as pb;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::AdminApi;
use super::error::{invalid, not_found, ApiError};
use super::grpc::TaskApi;

#[derive(Clone)]
pub struct Rest {
    pub tasks: Arc<TaskApi>,
    pub admin: Arc<AdminApi>,
    pub jobs: Arc<super::jobs::JobsApi>,
}

/// Declares the REST routes once: the router is built from this list, and so is `ROUTES`, which the OpenAPI
/// document (`openapi.rs`) is generated from. A route cannot be served without being documented.
macro_rules! rest_routes {
    ($($method:ident $path:literal => $handler:expr;)*) => {
        /// Every REST route: (method, path), in axum's path syntax.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        pub fn routes(rest: Rest) -> Router {
            Router::new()
                $(.route($path, axum::routing::$method($handler)))*
                .with_state(rest)
                .fallback(no_route)
                .method_not_allowed_fallback(method_not_allowed)
        }
    };
}

rest_routes! {
    post "/v1/tasks" => enqueue;
    get "/v1/tasks" => list_tasks;
    post "/v1/tasks/batch" => enqueue_batch;
    get "/v1/tasks/{id}" => get_task;
    get "/v1/tasks/{id}/result" => get_result;
    post "/v1/tasks/{id}/cancel" => cancel;
    post "/v1/tasks/{id}/complete" => ack_as(AckKind::Complete);
    post "/v1/tasks/{id}/fail" => ack_as(AckKind::Fail);
    post "/v1/tasks/{id}/nack" => ack_as(AckKind::Nack);
    post "/v1/tasks/{id}/abandon" => ack_as(AckKind::Abandon);
    post "/v1/tasks/{id}/heartbeat" => ack_as(AckKind::Heartbeat);
    post "/v1/tasks/{id}/exception" => ack_as(AckKind::Exception);
    post "/v1/claim" => claim;
    get "/v1/queues" => queues;
    get "/v1/queues/{queue}/dead-letters" => dead_letters;
    post "/v1/queues/{queue}/dead-letters/redrive" => redrive;
    post "/v1/queues/{queue}/dead-letters/purge" => purge;
    get "/v1/queues/{queue}/dead-letters/groups" => dead_letter_groups;
    post "/v1/queues/{queue}/dead-letters/groups/redrive" => group_as(GroupAction::Redrive);
    post "/v1/queues/{queue}/dead-letters/groups/purge" => group_as(GroupAction::Purge);
    post "/v1/queues/{queue}/pause" => pause_queue;
    post "/v1/queues/{queue}/resume" => resume_queue;
    put "/v1/queues/{queue}/limits" => set_queue_limits;
    get "/v1/limits" => list_limits;
    put "/v1/limits" => set_tenant_limits;
    get "/v1/queues/{queue}/fairness" => list_fairness;
    put "/v1/queues/{queue}/fairness" => set_unkeyed_weight;
    put "/v1/queues/{queue}/fairness/{key}" => set_fairness_weight;
    get "/v1/queues/{queue}/rate-limits" => list_rates;
    put "/v1/queues/{queue}/rate-limits" => set_queue_rate;
    put "/v1/queues/{queue}/rate-limits/unkeyed" => set_unkeyed_rate;
    put "/v1/queues/{queue}/rate-limits/keys/{key}" => set_key_rate;
    get "/v1/concurrency-keys" => list_key_limits;
    get "/v1/concurrency-keys/{key}" => get_key_limit;
    put "/v1/concurrency-keys/{key}" => set_key_limit;
    delete "/v1/concurrency-keys/{key}" => clear_key_limit;
    get "/v1/queues/{queue}/capacity" => queue_capacity;
    get "/v1/capacity" => capacity;
    post "/v1/schedules" => create_schedule;
    get "/v1/schedules" => list_schedules;
    delete "/v1/schedules/{id}" => delete_schedule;
    post "/v1/schedules/{id}/pause" => pause_schedule;
    post "/v1/schedules/{id}/resume" => resume_schedule;
    get "/v1/cluster/status" => cluster_status;
    post "/v1/cluster/transfer-leader" => transfer_leader;
    get "/v1/admin/backup" => backup;
    get "/v1/openapi.json" => openapi;
}

/// The message of the 404 for a path no route serves (a handler's own 404 says what it did not find).
pub const NO_ROUTE: &str = "no such route";

async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> RestError {
    RestError(ApiError::NotFound(format!("{NO_ROUTE}: {method} {}", uri.path())))
}

/// The 405 of a path served with other methods (axum adds the `Allow` header).
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> RestError {
    RestError(ApiError::MethodNotAllowed(format!("{} is not served with {method}", uri.path())))
}

async fn openapi() -> Json<Value> {
    Json(super::openapi::document())
}

/// A REST error: `{"error": {"code": REASON, "message": ..., "retry_after_ms"?: ...}}` with the HTTP status of
/// its reason, the leader's address in `x-raftq-leader` (NOT_LEADER) and `Retry-After` (overload).
pub struct RestError(pub ApiError);

impl RestError {
    fn bad(msg: impl Into<String>) -> RestError {
        RestError(invalid(msg))
    }
}

impl From<ApiError> for RestError {
    fn from(e: ApiError) -> RestError {
        RestError(e)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut body = json!({"error": {"code": e.reason().as_str(), "message": e.to_string()}});
        if let Some(ms) = e.retry_after_ms() {
            body["error"]["retry_after_ms"] = json!(ms);
        }
        let mut r = (e.http_status(), Json(body)).into_response();
        if let Some(l) = e.leader_addr().and_then(|l| l.parse().ok()) {
            r.headers_mut().insert(header::LEADER, l);
        }
        if let Some(ms) = e.retry_after_ms() {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, ms.div_ceil(1000).max(1).into());
        }
        r
    }
}

/// Query parameters, with a JSON error (not axum's text) when they do not parse.
struct Query<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = RestError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(q)) => Ok(Query(q)),
            Err(e) => Err(RestError::bad(e.body_text())),
        }
    }
}

/// A path parameter, with a JSON error when it does not decode.
struct Path<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = RestError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(p)) => Ok(Path(p)),
            Err(e) => Err(RestError::bad(e.body_text())),
        }
    }
}

type Res = Result<Response, RestError>;

/// The same request as gRPC would carry it: the headers that matter become metadata, and the bearer token is
/// authenticated as the gRPC interceptor does it.
fn request<T>(rest: &Rest, headers: &HeaderMap, msg: T) -> Result<tonic::Request<T>, RestError> {
    let mut r = tonic::Request::new(msg);
    for name in ["authorization", header::REDIRECT, header::READ] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()) {
            r.metadata_mut().insert(name, v);
        }
    }
    super::grpc::authenticate_request(&rest.tasks.auth, &mut r)?;
    Ok(r)
}

fn ok(v: Value) -> Res {
    Ok(Json(v).into_response())
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Bytes from a JSON body: `text` (UTF-8) or `base64`, not both.
fn bytes_of(text: Option<String>, base64: Option<String>, field: &str) -> Result<bytes::Bytes, RestError> {
    match (text, base64) {
        (Some(_), Some(_)) => Err(RestError::bad(format!("give {field} or {field}_base64, not both"))),
        (Some(t), None) => Ok(t.into_bytes().into()),
        (None, Some(b)) => b64().decode(b).map(Into::into).map_err(|e| RestError::bad(format!("{field}_base64: {e}"))),
        (None, None) => Ok(bytes::Bytes::new()),
    }
}

fn bytes_json(b: &[u8]) -> (Value, Value) {
    (std::str::from_utf8(b).map(|s| json!(s)).unwrap_or(Value::Null), json!(b64().encode(b)))
}

fn state_name(s: i32) -> &'static str {
    pb::TaskState::try_from(s).map(|s| s.as_str_name()).unwrap_or("UNKNOWN").trim_start_matches("TASK_STATE_")
}

pub fn task_json(t: &pb::Task) -> Value {
    let (payload, payload_base64) = bytes_json(&t.payload);
    json!({
        "id": t.id, "queue": t.queue, "tenant": t.tenant, "state": state_name(t.state), "priority": t.priority,
        "attempts": t.attempts, "max_attempts": t.max_attempts,
        "payload": payload, "payload_base64": payload_base64,
        "lease": t.lease.as_ref().map(|l| json!({
            "worker_id": l.worker_id, "token": l.token.to_string(), "claimed_at_ms": l.claimed_at_ms,
            "deadline_ms": l.deadline_ms})),
        "trace": t.trace.as_ref().map(|c| json!({"traceparent": c.traceparent, "tracestate": c.tracestate})),
        "created_at_ms": t.created_at_ms, "updated_at_ms": t.updated_at_ms, "visible_at_ms": t.visible_at_ms,
        "ended_at_ms": t.ended_at_ms, "dead_lettered_at_ms": t.dead_lettered_at_ms,
        "idempotency_key": t.idempotency_key, "webhook_url": t.webhook_url, "last_error": t.last_error,
        "deadline_ms": t.deadline_ms, "concurrency_key": t.concurrency_key, "concurrency_limit": t.concurrency_limit,
        "follow_up_ids": t.follow_up_ids, "parent_id": t.parent_id, "depends_on": t.depends_on,
        "waiting_on": t.waiting_on,
        "dependency_rule": if t.dependency_rule == pb::DependencyRule::AllResolved as i32 { "all_resolved" } else { "all_completed" },
        "progress": t.progress.as_ref().map(|p| json!({"percent": p.percent, "message": p.message, "at_ms": p.at_ms})),
        "runs": t.runs.iter().map(|r| json!({
            "worker_id": r.worker_id, "token": r.token.to_string(), "started_at_ms": r.started_at_ms,
            "ended_at_ms": r.ended_at_ms, "outcome": r.outcome, "reason": r.reason})).collect::<Vec<_>>(),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTaskBody {
    queue: String,
    payload: Option<String>,
    payload_base64: Option<String>,
    #[serde(default)]
    priority: u32,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    run_at_ms: i64,
    #[serde(default)]
    max_attempts: u32,
    #[serde(default)]
    idempotency_key: String,
    #[serde(default)]
    webhook_url: String,
    traceparent: Option<String>,
    tracestate: Option<String>,
    #[serde(default)]
    deadline_in_ms: u64,
    #[serde(default)]
    concurrency_key: String,
    #[serde(default)]
    concurrency_limit: u32,
    #[serde(default)]
    depends_on: Vec<String>,
    /// `all_completed` (default) or `all_resolved`.
    dependency_rule: Option<String>,
    debounce: Option<DebounceBody>,
    singleton: Option<SingletonBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DebounceBody {
    key: String,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    max_wait_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SingletonBody {
    key: String,
    /// `refuse` (default) or `skip`.
    mode: Option<String>,
}

impl NewTaskBody {
    fn into_pb(self) -> Result<pb::EnqueueRequest, RestError> {
        let NewTaskBody {
            queue,
            payload,
            payload_base64,
            priority,
            delay_ms,
            run_at_ms,
            max_attempts,
            idempotency_key,
            webhook_url,
            traceparent,
            tracestate,
            deadline_in_ms,
            concurrency_key,
            concurrency_limit,
            depends_on,
            dependency_rule,
            debounce,
            singleton,
        } = self;
        let trace = (traceparent.is_some() || tracestate.is_some()).then(|| pb::TraceContext {
            traceparent: traceparent.unwrap_or_default(),
            tracestate: tracestate.unwrap_or_default(),
        });
        Ok(pb::EnqueueRequest {
            queue,
            payload: bytes_of(payload, payload_base64, "payload")?,
            priority,
            delay_ms,
            run_at_ms,
            max_attempts,
            idempotency_key,
            webhook_url,
            trace,
            deadline_in_ms,
            concurrency_key,
            concurrency_limit,
            depends_on,
            dependency_rule: match dependency_rule.as_deref() {
                None | Some("all_completed") => pb::DependencyRule::AllCompleted as i32,
                Some("all_resolved") => pb::DependencyRule::AllResolved as i32,
                Some(other) => {
                    return Err(RestError::bad(format!("dependency_rule {other:?}: all_completed or all_resolved")))
                }
            },
            debounce: debounce.map(|DebounceBody { key, delay_ms, max_wait_ms }| pb::Debounce {
                key,
                delay_ms,
                max_wait_ms,
            }),
            singleton: match singleton {
                None => None,
                Some(SingletonBody { key, mode }) => Some(pb::Singleton {
                    key,
                    mode: match mode.as_deref() {
                        None | Some("refuse") => pb::SingletonMode::Refuse as i32,
                        Some("skip") => pb::SingletonMode::Skip as i32,
                        Some(other) => return Err(RestError::bad(format!("singleton.mode {other:?}: refuse or skip"))),
                    },
                }),
            },
        })
    }
}

/// A JSON body, with a JSON error (not axum's text) when it does not parse. The content type is not insisted on:
/// `curl -d '{...}'` sends a form content type, and the body is JSON all the same.
struct Body<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = RestError;
    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| RestError::bad(format!("request body: {}", e.body_text())))?;
        serde_json::from_slice(&bytes).map(Body).map_err(|e| RestError::bad(format!("request body: {e}")))
    }
}

async fn enqueue(State(r): State<Rest>, headers: HeaderMap, Body(body): Body<NewTaskBody>) -> Res {
    let resp = r.tasks.enqueue(request(&r, &headers, body.into_pb()?)?).await?;
    Ok((StatusCode::CREATED, Json(enqueued_json(&resp))).into_response())
}

fn enqueued_json(o: &pb::EnqueueResponse) -> Value {
    json!({"task_id": o.task_id, "duplicate": o.duplicate, "debounced": o.debounced})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    items: Vec<NewTaskBody>,
}

async fn enqueue_batch(State(r): State<Rest>, headers: HeaderMap, Body(body): Body<BatchBody>) -> Res {
    let items = body.items.into_iter().map(NewTaskBody::into_pb).collect::<Result<Vec<_>, _>>()?;
    let resp = r.tasks.enqueue_batch(request(&r, &headers, pb::EnqueueBatchRequest { items })?).await?;
    let results: Vec<Value> = resp
        .results
        .into_iter()
        .map(|x| match x.result {
            Some(pb::enqueue_result::Result::Ok(o)) => enqueued_json(&o),
            Some(pb::enqueue_result::Result::Error(e)) => json!({"error": {"code": e.code, "message": e.message}}),
            None => json!({"error": {"code": "INTERNAL", "message": "empty result"}}),
        })
        .collect();
    ok(json!({ "results": results }))
}

async fn get_task(State(r): State<Rest>, headers: HeaderMap, Path(id): Path<String>) -> Res {
    let t = r.tasks.get_task(request(&r, &headers, pb::GetTaskRequest { id })?).await?;
    ok(task_json(&t))
}

#[derive(Deserialize)]
struct WaitQuery {
    #[serde(default)]
    wait_ms: u64,
}

async fn get_result(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Res {
    let t = r.tasks.get_result(request(&r, &headers, pb::GetResultRequest { id, wait_ms: q.wait_ms })?).await?;
    let (result, result_base64) = bytes_json(&t.result);
    ok(json!({
        "id": t.id, "state": state_name(t.state), "done": t.done, "result": result, "result_base64": result_base64,
        "error": t.error, "attempts": t.attempts, "created_at_ms": t.created_at_ms, "ended_at_ms": t.ended_at_ms,
    }))
}

async fn cancel(State(r): State<Rest>, headers: HeaderMap, Path(id): Path<String>) -> Res {
    let c = r.tasks.cancel(request(&r, &headers, pb::CancelRequest { id })?).await?;
    ok(json!({"state": state_name(c.state)}))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TokenJson {
    Text(String),
    Number(u64),
}

impl TokenJson {
    fn value(&self) -> Result<u64, RestError> {
        match self {
            TokenJson::Number(n) => Ok(*n),
            TokenJson::Text(s) => s.parse().map_err(|_| RestError::bad("token must be a decimal number")),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    token: TokenJson,
    result: Option<String>,
    result_base64: Option<String>,
    error: Option<String>,
    #[serde(default)]
    retryable: bool,
    #[serde(default)]
    delay_ms: u64,
    reason: Option<String>,
    #[serde(default)]
    extend_ms: u64,
    /// Heartbeat progress, 0-100 (with `message`).
    progress_percent: Option<u32>,
    message: Option<String>,
    /// Complete: tasks created with the completion, all or nothing.
    #[serde(default)]
    follow_ups: Vec<NewTaskBody>,
}

/// What an ack route does to the task.
#[derive(Debug, Clone, Copy)]
enum AckKind {
    Complete,
    Fail,
    Nack,
    Abandon,
    Heartbeat,
    Exception,
}

/// The future of a handler built for one variant of a route family (`ack_as`, `group_as`).
type AckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Res> + Send>>;

/// The handler of one ack route.
fn ack_as(
    action: AckKind,
) -> impl Fn(State<Rest>, HeaderMap, Path<String>, Body<AckBody>) -> AckFuture + Clone + Send + Sync + 'static {
    move |State(r), headers, Path(id), Body(b)| Box::pin(ack(r, headers, id, action, b))
}

/// `complete`, `fail`, `nack`, `abandon` or `heartbeat` a claimed task, naming its fencing token.
async fn ack(r: Rest, headers: HeaderMap, id: String, kind: AckKind, b: AckBody) -> Res {
    use pb::ack_request::Action;
    let action = match kind {
        AckKind::Complete => Action::Complete(pb::Complete {
            result: bytes_of(b.result, b.result_base64, "result")?,
            follow_ups: b.follow_ups.into_iter().map(NewTaskBody::into_pb).collect::<Result<_, _>>()?,
        }),
        AckKind::Fail => Action::Fail(pb::Fail { error: b.error.unwrap_or_default(), retryable: b.retryable }),
        AckKind::Nack => Action::Nack(pb::Nack { delay_ms: b.delay_ms, reason: b.reason.unwrap_or_default() }),
        AckKind::Abandon => Action::Abandon(pb::Abandon {}),
        AckKind::Heartbeat => Action::Heartbeat(pb::Heartbeat {
            extend_ms: b.extend_ms,
            progress: b.progress_percent.map(|percent| pb::Progress {
                percent,
                message: b.message.unwrap_or_default(),
                at_ms: 0,
            }),
        }),
        AckKind::Exception => Action::Exception(pb::Exception {
            reason: b.reason.unwrap_or_default(),
            message: b.message.unwrap_or_default(),
        }),
    };
    let req = pb::AckRequest { task_id: id, token: b.token.value()?, action: Some(action) };
    let a = r.tasks.ack(request(&r, &headers, req)?).await?;
    ok(json!({"state": state_name(a.state), "at_ms": a.at_ms, "follow_up_ids": a.follow_up_ids}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    worker_id: String,
    queues: Vec<String>,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    lease_ms: u64,
    #[serde(default)]
    wait_ms: u64,
}

fn one() -> u32 {
    1
}

async fn claim(State(r): State<Rest>, headers: HeaderMap, Body(b): Body<ClaimBody>) -> Res {
    let ClaimBody { worker_id, queues, count, lease_ms, wait_ms } = b;
    let req = pb::ClaimRequest { worker_id, queues, count, lease_ms, wait_ms };
    let c = r.tasks.claim(request(&r, &headers, req)?).await?;
    ok(json!({"tasks": c.tasks.iter().map(task_json).collect::<Vec<_>>()}))
}

async fn queues(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let s = r.tasks.queue_stats(request(&r, &headers, pb::QueueStatsRequest { queues: vec![] })?).await?;
    let v: Vec<Value> = s
        .queues
        .iter()
        .map(|q| {
            json!({"queue": q.queue, "pending": q.pending, "delayed": q.delayed, "in_progress": q.in_progress,
                "completed": q.completed, "failed": q.failed, "cancelled": q.cancelled, "dead_lettered": q.dead_lettered,
                "paused": q.paused})
        })
        .collect();
    ok(json!({ "queues": v }))
}

#[derive(Deserialize)]
struct LimitQuery {
    #[serde(default)]
    limit: u32,
}

async fn dead_letters(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Query(q): Query<LimitQuery>,
) -> Res {
    let req = pb::ListDeadLettersRequest { queue, limit: q.limit };
    let d = r.tasks.list_dead_letters(request(&r, &headers, req)?).await?;
    ok(json!({"tasks": d.tasks.iter().map(task_json).collect::<Vec<_>>()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectBody {
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    all: bool,
}

async fn redrive(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Body(b): Body<SelectBody>,
) -> Res {
    let sel = pb::DeadLetterSelection { queue, ids: b.ids, all: b.all };
    let d = r.tasks.redrive(request(&r, &headers, sel)?).await?;
    ok(json!({"redriven": d.ids}))
}

async fn purge(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>, Body(b): Body<SelectBody>) -> Res {
    let sel = pb::DeadLetterSelection { queue, ids: b.ids, all: b.all };
    let d = r.tasks.purge_dead_letters(request(&r, &headers, sel)?).await?;
    ok(json!({"purged": d.ids}))
}

/// How many dead letters of a queue the groups are computed over (the oldest first): the most one listing
/// returns (`list_dead_letters`), so a group's redrive or purge takes at most this many; repeat it for more.
const GROUP_SCAN: u32 = 10_000;

/// Example task ids kept per group: enough to open one, small enough for a page of many groups.
const GROUP_EXAMPLES: usize = 5;

/// The last error a dead letter is grouped by.
fn group_key(t: &pb::Task) -> &str {
    &t.last_error
}

/// The oldest `GROUP_SCAN` dead letters of a queue, read through the same operation as `ListDeadLetters`.
async fn scan_dead_letters(r: &Rest, headers: &HeaderMap, queue: String) -> Result<Vec<pb::Task>, RestError> {
    let req = pb::ListDeadLettersRequest { queue, limit: GROUP_SCAN };
    Ok(r.tasks.list_dead_letters(request(r, headers, req)?).await?.tasks)
}

/// `GET /v1/queues/{queue}/dead-letters/groups`: the queue's dead letters grouped by last error, the largest
/// group first, each with its count, a few example ids and when its first and last task died.
async fn dead_letter_groups(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let tasks = scan_dead_letters(&r, &headers, queue).await?;
    let mut groups: Vec<(&str, u64, Vec<&str>, i64, i64)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for t in &tasks {
        let at = t.dead_lettered_at_ms;
        let i = *index.entry(group_key(t)).or_insert_with(|| {
            groups.push((group_key(t), 0, Vec::new(), at, at));
            groups.len() - 1
        });
        let g = &mut groups[i];
        g.1 += 1;
        if g.2.len() < GROUP_EXAMPLES {
            g.2.push(&t.id);
        }
        g.3 = g.3.min(at);
        g.4 = g.4.max(at);
    }
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(error, count, examples, first, last)| {
            json!({"error": error, "count": count, "example_ids": examples,
                "first_dead_lettered_at_ms": first, "last_dead_lettered_at_ms": last})
        })
        .collect();
    ok(json!({"groups": groups, "scanned": tasks.len(), "truncated": tasks.len() as u32 >= GROUP_SCAN}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupBody {
    /// The last error text of the group, exactly as the groups list gives it ("" is the group without one).
    error: String,
}

/// The selection of one group's dead letters (by id: what the group listed), or `None` when it has none.
async fn group_selection(
    r: &Rest,
    headers: &HeaderMap,
    queue: String,
    error: &str,
) -> Result<Option<pb::DeadLetterSelection>, RestError> {
    let tasks = scan_dead_letters(r, headers, queue.clone()).await?;
    let ids: Vec<String> = tasks.into_iter().filter(|t| group_key(t) == error).map(|t| t.id).collect();
    Ok((!ids.is_empty()).then_some(pb::DeadLetterSelection { queue, ids, all: false }))
}

/// What a group route does to every dead letter of the group.
#[derive(Debug, Clone, Copy)]
enum GroupAction {
    Redrive,
    Purge,
}

/// The handler of one group route: `POST /v1/queues/{queue}/dead-letters/groups/{redrive|purge} {"error"}`.
fn group_as(
    action: GroupAction,
) -> impl Fn(State<Rest>, HeaderMap, Path<String>, Body<GroupBody>) -> AckFuture + Clone + Send + Sync + 'static {
    move |State(r), headers, Path(queue), Body(b)| Box::pin(act_on_group(r, headers, queue, b.error, action))
}

/// Redrives (scope `enqueue`) or purges (`admin`) every dead letter of the group with this last error.
async fn act_on_group(r: Rest, headers: HeaderMap, queue: String, error: String, action: GroupAction) -> Res {
    let (scope, key) = match action {
        GroupAction::Redrive => (crate::auth::Scope::Enqueue, "redriven"),
        GroupAction::Purge => (crate::auth::Scope::Admin, "purged"),
    };
    // The scope is checked before the listing, so a token that may not act learns nothing from trying.
    super::grpc::caller_with(&request(&r, &headers, ())?, scope)?;
    let ids = match group_selection(&r, &headers, queue, &error).await? {
        None => vec![],
        Some(sel) => match action {
            GroupAction::Redrive => r.tasks.redrive(request(&r, &headers, sel)?).await?.ids,
            GroupAction::Purge => r.tasks.purge_dead_letters(request(&r, &headers, sel)?).await?.ids,
        },
    };
    ok(json!({ key: ids }))
}

fn node_status_json(s: &pb::NodeStatus) -> Value {
    json!({
        "node_id": s.node_id, "role": s.role, "term": s.term, "leader_id": s.has_leader.then_some(s.leader_id),
        "last_log_index": s.last_log_index, "applied_index": s.applied_index, "committed_index": s.committed_index,
        "replication_lag": s.replication_lag, "version": s.version, "cluster_version": s.cluster_version,
    })
}

/// This node's status, its members, and in `nodes` every member's own status (`reachable: false` and the
/// `error` when it did not answer).
async fn cluster_status(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let nodes = r.admin.cluster(request(&r, &headers, pb::NodeStatusRequest {})?).await?;
    let own = nodes
        .iter()
        .find_map(|n| n.status.as_ref().ok().filter(|s| s.node_id == r.admin.node_id))
        .ok_or_else(|| RestError(ApiError::Internal("this node is not among its members".into())))?;
    let mut v = node_status_json(own);
    // `version` is the cluster version this node's binary applies (each node's own, in `nodes`), `release` the
    // build's package version.
    v["release"] = json!(env!("CARGO_PKG_VERSION"));
    v["members"] = json!(own
        .members
        .iter()
        .map(|m| json!({"node_id": m.node_id, "raft_addr": m.raft_addr, "api_addr": m.api_addr, "voter": m.voter}))
        .collect::<Vec<_>>());
    v["nodes"] = json!(nodes
        .iter()
        .map(|n| {
            let mut j = match &n.status {
                Ok(s) => node_status_json(s),
                Err(e) => json!({"node_id": n.member.node_id, "error": {"code": e.reason().as_str(), "message": e.to_string()}}),
            };
            j["api_addr"] = json!(n.member.api_addr);
            j["voter"] = json!(n.member.voter);
            j["reachable"] = json!(n.status.is_ok());
            j
        })
        .collect::<Vec<_>>());
    ok(v)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    #[serde(default)]
    to: u64,
    #[serde(default)]
    timeout_ms: u64,
}

async fn transfer_leader(State(r): State<Rest>, headers: HeaderMap, Body(b): Body<TransferBody>) -> Res {
    let req = pb::TransferLeaderRequest { to: b.to, timeout_ms: b.timeout_ms };
    let t = r.admin.transfer_leader(request(&r, &headers, req)?).await?;
    ok(json!({"leader_id": t.leader_id, "took_ms": t.took_ms}))
}

/// The backup file as the body, streamed chunk by chunk as gRPC streams it. Refusals before the first byte are
/// JSON errors; a failure after it cuts the body short (a file without its trailer, which no restore accepts).
async fn backup(State(r): State<Rest>, headers: HeaderMap) -> Res {
    use futures::StreamExt;
    let chunks = r.admin.backup(request(&r, &headers, pb::BackupRequest {})?).await?;
    let body = axum::body::Body::from_stream(
        chunks.map(|c| c.map(|c| c.data).map_err(|s| std::io::Error::other(s.message().to_string()))),
    );
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/octet-stream"),
        (axum::http::header::CONTENT_DISPOSITION, "attachment; filename=\"raftq.backup\""),
    ];
    Ok((headers, body).into_response())
}

async fn pause_queue(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let p = r.jobs.pause_queue(request(&r, &headers, pb::PauseQueueRequest { queue })?).await?;
    ok(json!({"queue": p.queue, "paused": p.paused}))
}

async fn resume_queue(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let p = r.jobs.resume_queue(request(&r, &headers, pb::ResumeQueueRequest { queue })?).await?;
    ok(json!({"queue": p.queue, "paused": p.paused}))
}

/// Flow-control limits: a missing or null limit is no limit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsBody {
    #[serde(default)]
    max_running: Option<u32>,
    #[serde(default)]
    max_depth: Option<u64>,
}

fn limits_json(l: &pb::QueueLimits) -> Value {
    let some = |n: u64| (n > 0).then_some(n);
    json!({"queue": l.queue, "max_running": some(l.max_running.into()), "max_depth": some(l.max_depth)})
}

async fn set_limits(r: &Rest, headers: &HeaderMap, queue: String, b: LimitsBody) -> Res {
    if b.max_running == Some(0) || b.max_depth == Some(0) {
        return Err(RestError::bad("a limit is at least 1 (null or absent: no limit)"));
    }
    let msg = pb::QueueLimits { queue, max_running: b.max_running.unwrap_or(0), max_depth: b.max_depth.unwrap_or(0) };
    let l = r.jobs.set_queue_limits(request(r, headers, msg)?).await?;
    ok(limits_json(&l))
}

async fn set_queue_limits(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Body(b): Body<LimitsBody>,
) -> Res {
    set_limits(&r, &headers, queue, b).await
}

async fn set_tenant_limits(State(r): State<Rest>, headers: HeaderMap, Body(b): Body<LimitsBody>) -> Res {
    set_limits(&r, &headers, String::new(), b).await
}

async fn list_limits(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let l = r.jobs.list_queue_limits(request(&r, &headers, pb::ListQueueLimitsRequest {})?).await?;
    ok(json!({"limits": l.limits.iter().map(limits_json).collect::<Vec<_>>()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightBody {
    weight: u32,
}

fn fairness_json(k: &pb::FairnessKey) -> Value {
    json!({
        "queue": k.queue, "key": k.key, "weight": k.weight, "ready": k.ready, "running": k.running,
        "throttled": k.throttled,
    })
}

async fn put_weight(r: Rest, headers: HeaderMap, queue: String, key: String, weight: u32) -> Res {
    let req = pb::SetFairnessWeightRequest { queue, key, weight };
    ok(fairness_json(&r.jobs.set_fairness_weight(request(&r, &headers, req)?).await?))
}

/// `PUT /v1/queues/{queue}/fairness/{key}` `{"weight": N}`: a concurrency key's weight in the queue.
async fn set_fairness_weight(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path((queue, key)): Path<(String, String)>,
    Body(b): Body<WeightBody>,
) -> Res {
    put_weight(r, headers, queue, key, b.weight).await
}

/// `PUT /v1/queues/{queue}/fairness` `{"weight": N}`: the weight of the queue's tasks without a concurrency key
/// (the empty key, which a path segment cannot name).
async fn set_unkeyed_weight(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Body(b): Body<WeightBody>,
) -> Res {
    put_weight(r, headers, queue, String::new(), b.weight).await
}

async fn list_fairness(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let l = r.jobs.list_fairness(request(&r, &headers, pb::ListFairnessRequest { queue })?).await?;
    ok(json!({"keys": l.keys.iter().map(fairness_json).collect::<Vec<_>>()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateBody {
    per_second: f64,
    #[serde(default)]
    burst: u32,
}

/// A bucket as JSON: `key` is absent for the whole queue's.
fn rate_json(l: &pb::RateLimit) -> Value {
    json!({
        "queue": l.queue, "key": (!l.whole_queue).then_some(&l.key), "per_second": l.per_second,
        "burst": l.burst, "tokens": l.tokens, "ready": l.ready, "throttled": l.throttled,
    })
}

async fn put_rate(r: Rest, headers: HeaderMap, queue: String, key: Option<String>, b: RateBody) -> Res {
    let whole_queue = key.is_none();
    let key = key.unwrap_or_default();
    let req = pb::SetRateLimitRequest { queue, key, whole_queue, per_second: b.per_second, burst: b.burst };
    ok(rate_json(&r.jobs.set_rate_limit(request(&r, &headers, req)?).await?))
}

/// `PUT /v1/queues/{queue}/rate-limits` `{"per_second": R, "burst": B}`: the whole queue's bucket.
async fn set_queue_rate(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Body(b): Body<RateBody>,
) -> Res {
    put_rate(r, headers, queue, None, b).await
}

/// `PUT /v1/queues/{queue}/rate-limits/keys/{key}`: a concurrency key's bucket.
async fn set_key_rate(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path((queue, key)): Path<(String, String)>,
    Body(b): Body<RateBody>,
) -> Res {
    put_rate(r, headers, queue, Some(key), b).await
}

/// `PUT /v1/queues/{queue}/rate-limits/unkeyed`: the bucket of the queue's tasks without a concurrency key (the
/// empty key, which a path segment cannot name).
async fn set_unkeyed_rate(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Body(b): Body<RateBody>,
) -> Res {
    put_rate(r, headers, queue, Some(String::new()), b).await
}

async fn list_rates(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let l = r.jobs.list_rate_limits(request(&r, &headers, pb::ListRateLimitsRequest { queue })?).await?;
    ok(json!({"limits": l.limits.iter().map(rate_json).collect::<Vec<_>>()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyLimitBody {
    limit: u32,
    /// Seconds from now; signed so a negative one gets a clear refusal.
    #[serde(default)]
    ttl_s: Option<i64>,
    /// Or an RFC 3339 time.
    #[serde(default)]
    expires_at: Option<String>,
}

/// An override as JSON: `expires_at` (RFC 3339) and `expires_at_ms` are null without an expiry.
fn key_limit_json(o: &pb::ConcurrencyOverride) -> Value {
    let at = (o.expires_at_ms > 0).then_some(o.expires_at_ms);
    let rfc3339 = at.and_then(|ms| chrono::DateTime::from_timestamp_millis(ms as i64)).map(|t| t.to_rfc3339());
    json!({
        "key": o.key, "limit": o.limit, "expires_at": rfc3339, "expires_at_ms": at,
        "running": o.running, "pending": o.pending,
    })
}

/// `PUT /v1/concurrency-keys/{key}` `{"limit": N, "ttl_s": S}` (or `"expires_at": "<RFC 3339>"`, or neither).
async fn set_key_limit(
    State(r): State<Rest>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Body(b): Body<KeyLimitBody>,
) -> Res {
    let ttl_ms = match b.ttl_s {
        None => 0,
        Some(s) if s <= 0 => return Err(invalid(format!("ttl_s must be a positive number of seconds, got {s}")).into()),
        Some(s) => (s as u64).saturating_mul(1000),
    };
    let req =
        pb::SetConcurrencyOverrideRequest { key, limit: b.limit, ttl_ms, expires_at: b.expires_at.unwrap_or_default() };
    ok(key_limit_json(&r.jobs.set_concurrency_override(request(&r, &headers, req)?).await?))
}

/// `DELETE /v1/concurrency-keys/{key}`: the tasks' own limits apply again at once.
async fn clear_key_limit(State(r): State<Rest>, headers: HeaderMap, Path(key): Path<String>) -> Res {
    let req = pb::ClearConcurrencyOverrideRequest { key };
    let out = r.jobs.clear_concurrency_override(request(&r, &headers, req)?).await?;
    ok(json!({"cleared": out.cleared}))
}

async fn list_key_limits(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let req = pb::ListConcurrencyOverridesRequest { key: String::new() };
    let l = r.jobs.list_concurrency_overrides(request(&r, &headers, req)?).await?;
    ok(json!({"overrides": l.overrides.iter().map(key_limit_json).collect::<Vec<_>>()}))
}

/// `GET /v1/concurrency-keys/{key}`: the key's override, 404 without one.
async fn get_key_limit(State(r): State<Rest>, headers: HeaderMap, Path(key): Path<String>) -> Res {
    let req = pb::ListConcurrencyOverridesRequest { key: key.clone() };
    let l = r.jobs.list_concurrency_overrides(request(&r, &headers, req)?).await?;
    match l.overrides.first() {
        Some(o) => ok(key_limit_json(o)),
        None => Err(not_found(&format!("concurrency override for key {key:?}")).into()),
    }
}

fn capacity_json(c: &pb::QueueCapacity) -> Value {
    json!({
        "queue": c.queue, "paused": c.paused, "pending": c.pending, "ready": c.ready, "delayed": c.delayed,
        "running": c.running, "active_workers": c.active_workers,
        "completed_1m": c.completed_1m, "completed_5m": c.completed_5m, "completed_15m": c.completed_15m,
        "rate_1m": c.rate_1m, "rate_5m": c.rate_5m, "rate_15m": c.rate_15m,
        "drain_seconds": (c.drain_seconds >= 0.0).then_some(c.drain_seconds),
        "per_worker_rate": (c.per_worker_rate >= 0.0).then_some(c.per_worker_rate),
        "max_running": (c.max_running > 0).then_some(c.max_running),
        "max_depth": (c.max_depth > 0).then_some(c.max_depth),
        "keys": c.keys.iter().map(fairness_json).collect::<Vec<_>>(),
        "workers_needed": {
            "1h": (c.workers_needed_1h >= 0).then_some(c.workers_needed_1h),
            "4h": (c.workers_needed_4h >= 0).then_some(c.workers_needed_4h),
            "8h": (c.workers_needed_8h >= 0).then_some(c.workers_needed_8h),
        },
    })
}

async fn queue_capacity(State(r): State<Rest>, headers: HeaderMap, Path(queue): Path<String>) -> Res {
    let c = r.jobs.queue_capacity(request(&r, &headers, pb::QueueCapacityRequest { queues: vec![queue] })?).await?;
    match c.queues.first() {
        Some(q) => ok(capacity_json(q)),
        None => Err(RestError(super::error::not_found("queue"))),
    }
}

async fn capacity(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let c = r.jobs.queue_capacity(request(&r, &headers, pb::QueueCapacityRequest { queues: vec![] })?).await?;
    ok(json!({"queues": c.queues.iter().map(capacity_json).collect::<Vec<_>>()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    queue: Option<String>,
    /// PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED or DEAD_LETTERED.
    state: Option<String>,
    #[serde(default)]
    created_from_ms: i64,
    #[serde(default)]
    created_to_ms: i64,
    #[serde(default)]
    page_size: u32,
    page_token: Option<String>,
}

/// `GET /v1/tasks?queue=&state=&created_from_ms=&created_to_ms=&page_size=&page_token=`
async fn list_tasks(State(r): State<Rest>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Res {
    let state = match q.state.as_deref() {
        None | Some("") => pb::TaskState::Unspecified,
        Some(s) => pb::TaskState::from_str_name(&format!("TASK_STATE_{}", s.to_ascii_uppercase()))
            .ok_or_else(|| RestError::bad(format!("unknown state {s:?}")))?,
    };
    let req = pb::ListTasksRequest {
        queue: q.queue.unwrap_or_default(),
        state: state as i32,
        created_from_ms: q.created_from_ms,
        created_to_ms: q.created_to_ms,
        page_size: q.page_size,
        page_token: q.page_token.unwrap_or_default(),
    };
    let l = r.jobs.list_tasks(request(&r, &headers, req)?).await?;
    let next = (!l.next_page_token.is_empty()).then_some(l.next_page_token);
    ok(json!({"tasks": l.tasks.iter().map(task_json).collect::<Vec<_>>(), "next_page_token": next}))
}

fn schedule_json(s: &pb::Schedule) -> Value {
    json!({
        "id": s.id, "name": s.name, "queue": s.queue, "cron": s.cron, "time_zone": s.time_zone,
        "interval_ms": s.interval_ms, "paused": s.paused, "created_at_ms": s.created_at_ms,
        "missed_policy": if s.missed_policy == pb::MissedPolicy::RunOnce as i32 { "run_once" } else { "skip" },
        "last_occurrence_ms": s.last_occurrence_ms, "next_occurrence_ms": s.next_occurrence_ms, "fired": s.fired,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleBody {
    name: String,
    task: NewTaskBody,
    #[serde(default)]
    cron: String,
    #[serde(default)]
    time_zone: String,
    #[serde(default)]
    interval_ms: u64,
    /// `skip` (default) or `run_once`.
    missed_policy: Option<String>,
}

async fn create_schedule(State(r): State<Rest>, headers: HeaderMap, Body(b): Body<ScheduleBody>) -> Res {
    let missed_policy = match b.missed_policy.as_deref() {
        None | Some("skip") => pb::MissedPolicy::Skip,
        Some("run_once") => pb::MissedPolicy::RunOnce,
        Some(other) => return Err(RestError::bad(format!("missed_policy {other:?}: skip or run_once"))),
    } as i32;
    let req = pb::CreateScheduleRequest {
        name: b.name,
        task: Some(b.task.into_pb()?),
        cron: b.cron,
        time_zone: b.time_zone,
        interval_ms: b.interval_ms,
        missed_policy,
    };
    let s = r.jobs.create_schedule(request(&r, &headers, req)?).await?;
    Ok((StatusCode::CREATED, Json(schedule_json(&s))).into_response())
}

async fn list_schedules(State(r): State<Rest>, headers: HeaderMap) -> Res {
    let l = r.jobs.list_schedules(request(&r, &headers, pb::ListSchedulesRequest {})?).await?;
    ok(json!({"schedules": l.schedules.iter().map(schedule_json).collect::<Vec<_>>()}))
}

async fn pause_schedule(State(r): State<Rest>, headers: HeaderMap, Path(id): Path<String>) -> Res {
    let s = r.jobs.pause_schedule(request(&r, &headers, pb::ScheduleRef { id })?).await?;
    ok(schedule_json(&s))
}

async fn resume_schedule(State(r): State<Rest>, headers: HeaderMap, Path(id): Path<String>) -> Res {
    let s = r.jobs.resume_schedule(request(&r, &headers, pb::ScheduleRef { id })?).await?;
    ok(schedule_json(&s))
}

async fn delete_schedule(State(r): State<Rest>, headers: HeaderMap, Path(id): Path<String>) -> Res {
    r.jobs.delete_schedule(request(&r, &headers, pb::ScheduleRef { id })?).await?;
    ok(json!({"deleted": true}))
}

#[cfg(test)]
mod tests {
    use serde::de::{Deserializer, Error as _, Visitor};

    use super::*;

    /// The field names a type's `Deserialize` accepts (what `deny_unknown_fields` checks against), read by
    /// asking it to deserialize from a deserializer that records them.
    fn field_names<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
        struct Probe<'a>(&'a mut Vec<&'static str>);
        impl<'de> Deserializer<'de> for Probe<'_> {
            type Error = serde::de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
                Err(Self::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                self.0.extend_from_slice(fields);
                Err(Self::Error::custom("probed"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
                unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
            }
        }
        let mut out = Vec::new();
        let _ = T::deserialize(Probe(&mut out));
        out.sort();
        out
    }

    fn documented(schema: &str) -> Vec<String> {
        let schemas = crate::api::openapi::schemas();
        let mut v: Vec<String> =
            schemas[schema]["properties"].as_object().expect("properties").keys().cloned().collect();
        v.sort();
        v
    }

    #[test]
    fn request_schemas_name_exactly_the_fields_the_routes_accept() {
        let cases: [(&str, Vec<&str>); 11] = [
            ("Limits", field_names::<LimitsBody>()),
            ("ConcurrencyOverrideBody", field_names::<KeyLimitBody>()),
            ("Weight", field_names::<WeightBody>()),
            ("Group", field_names::<GroupBody>()),
            ("Schedule", field_names::<ScheduleBody>()),
            ("NewTask", field_names::<NewTaskBody>()),
            ("NewTaskBatch", field_names::<BatchBody>()),
            ("Ack", field_names::<AckBody>()),
            ("Claim", field_names::<ClaimBody>()),
            ("Selection", field_names::<SelectBody>()),
            ("Transfer", field_names::<TransferBody>()),
        ];
        for (schema, fields) in cases {
            assert!(!fields.is_empty(), "{schema}: no fields probed");
            assert_eq!(documented(schema), fields, "{schema}");
        }
        use crate::api::openapi::describe;
        let query = |m, p| describe(m, p).expect("described").query.iter().map(|q| q.0).collect::<Vec<_>>();
        assert_eq!(query("get", "/v1/tasks/{id}/result"), field_names::<WaitQuery>());
        assert_eq!(query("get", "/v1/queues/{queue}/dead-letters"), field_names::<LimitQuery>());
        let mut listed = query("get", "/v1/tasks");
        listed.sort();
        assert_eq!(listed, field_names::<ListQuery>());
    }
}
