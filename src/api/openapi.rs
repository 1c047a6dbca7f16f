//! The OpenAPI 3 document of the HTTP port, served at `/v1/openapi.json`.
//!
//! Generated from the routes the server really serves: its paths are `rest::ROUTES` (the list the REST router is
//! built from) and the health and metrics routes of `http.rs`; what this file adds is the description of each
//! operation and the JSON schemas. A route without a description here fails the unit tests, request schemas are
//! checked against the fields the request types accept, and an integration test calls every documented operation
//! on a real server. Nothing here serves or validates requests.

use serde_json::{json, Map, Value};

use super::rest;

/// The routes of `http.rs` (health, readiness, metrics): (method, path).
pub const HTTP_ROUTES: &[(&str, &str)] = &[("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")];

/// The web console's routes (`ui.rs`): its page and the files the page loads, served without a token (the
/// page asks for one and sends it to the API).
pub const UI_ROUTES: &[(&str, &str)] =
    &[("get", "/ui"), ("get", "/ui/"), ("get", "/ui/app.js"), ("get", "/ui/app.css"), ("get", "/ui/icon.svg")];

/// What the document says about one operation.
pub struct Operation {
    pub id: &'static str,
    pub summary: &'static str,
    /// Schema name of the JSON request body, if any.
    pub request: Option<&'static str>,
    /// Success status and the schema name of its body (`None`: not JSON).
    pub ok: (u16, Option<&'static str>),
    /// Query parameters: name and description (all integers).
    pub query: &'static [(&'static str, &'static str)],
}

const fn op(
    id: &'static str,
    summary: &'static str,
    request: Option<&'static str>,
    ok: (u16, Option<&'static str>),
) -> Operation {
    Operation { id, summary, request, ok, query: &[] }
}

/// The description of one route; `None` for a route nobody described (a unit test forbids that).
pub fn describe(method: &str, path: &str) -> Option<Operation> {
    let o = match (method, path) {
        ("post", "/v1/tasks") => op("enqueue", "Enqueue a task", Some("NewTask"), (201, Some("Enqueued"))),
        ("post", "/v1/tasks/batch") => op(
            "enqueueBatch",
            "Enqueue tasks; each succeeds or fails alone",
            Some("NewTaskBatch"),
            (200, Some("EnqueuedBatch")),
        ),
        ("get", "/v1/tasks/{id}") => op("getTask", "Read a task", None, (200, Some("Task"))),
        ("get", "/v1/tasks/{id}/result") => Operation {
            query: &[("wait_ms", "Wait up to this long for the task to end")],
            ..op("getResult", "A task's result, optionally waiting for it to end", None, (200, Some("TaskResult")))
        },
        ("post", "/v1/tasks/{id}/cancel") => op("cancel", "Cancel a task", None, (200, Some("StateAnswer"))),
        ("post", "/v1/tasks/{id}/complete") => {
            op("complete", "Complete a claimed task with its result", Some("Ack"), (200, Some("AckAnswer")))
        }
        ("post", "/v1/tasks/{id}/fail") => {
            op("fail", "Fail a claimed task (retryable or not)", Some("Ack"), (200, Some("AckAnswer")))
        }
        ("post", "/v1/tasks/{id}/nack") => {
            op("nack", "Give a claimed task back for a retry after a delay", Some("Ack"), (200, Some("AckAnswer")))
        }
        ("post", "/v1/tasks/{id}/abandon") => {
            op("abandon", "Give a claimed task back without using an attempt", Some("Ack"), (200, Some("AckAnswer")))
        }
        ("post", "/v1/tasks/{id}/heartbeat") => {
            op("heartbeat", "Extend a claimed task's lease", Some("Ack"), (200, Some("AckAnswer")))
        }
        ("get", "/v1/tasks") => Operation {
            query: &[
                ("queue", "Only this queue"),
                ("state", "Only this state: PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED, DEAD_LETTERED"),
                ("created_from_ms", "Created at or after (ms since the epoch)"),
                ("created_to_ms", "Created before (ms since the epoch)"),
                ("page_size", "At most this many tasks (default 100)"),
                ("page_token", "The next_page_token of the previous page"),
            ],
            ..op(
                "listTasks",
                "Tasks with filters, a page at a time, in id (creation) order",
                None,
                (200, Some("TaskPage")),
            )
        },
        ("post", "/v1/tasks/{id}/exception") => op(
            "exception",
            "End a claimed task's run with an exception reason (malformed-payload, worker-shutdown, ...)",
            Some("Ack"),
            (200, Some("AckAnswer")),
        ),
        ("post", "/v1/queues/{queue}/pause") => {
            op("pauseQueue", "Pause a queue: it accepts enqueues and serves no claims", None, (200, Some("QueuePause")))
        }
        ("post", "/v1/queues/{queue}/resume") => {
            op("resumeQueue", "Resume a paused queue", None, (200, Some("QueuePause")))
        }
        ("put", "/v1/queues/{queue}/limits") => op(
            "setQueueLimits",
            "Set a queue's flow-control limits: max_running (claims past it wait) and max_depth (enqueues past it \
             wait up to depth_hold_ms for room, then are refused with 429 QUEUE_FULL and Retry-After); null or \
             absent: no limit",
            Some("Limits"),
            (200, Some("QueueLimits")),
        ),
        ("put", "/v1/limits") => op(
            "setTenantLimits",
            "Set the tenant's max_depth over all its queues (null or absent: no limit)",
            Some("Limits"),
            (200, Some("QueueLimits")),
        ),
        ("get", "/v1/limits") => op(
            "listLimits",
            "The tenant's limits: each queue's, and the tenant's own (queue \"\")",
            None,
            (200, Some("LimitsList")),
        ),
        ("get", "/v1/queues/{queue}/fairness") => op(
            "listFairness",
            "A queue's fairness keys: weight (default 1), ready and running tasks",
            None,
            (200, Some("FairnessList")),
        ),
        ("put", "/v1/queues/{queue}/fairness/{key}") => op(
            "setFairnessWeight",
            "Set a concurrency key's weight (1-1000) in the queue's fair dispatch; 1 is the default",
            Some("Weight"),
            (200, Some("FairnessKey")),
        ),
        ("put", "/v1/queues/{queue}/fairness") => op(
            "setUnkeyedWeight",
            "Set the weight (1-1000) of the queue's tasks without a concurrency key",
            Some("Weight"),
            (200, Some("FairnessKey")),
        ),
        ("get", "/v1/queues/{queue}/rate-limits") => op(
            "listRateLimits",
            "A queue's token buckets (the whole queue's, then its keys'): rate, burst, tokens now, throttled",
            None,
            (200, Some("RateLimitList")),
        ),
        ("put", "/v1/queues/{queue}/rate-limits") => op(
            "setQueueRateLimit",
            "Set the whole queue's token bucket (per_second 0 removes it)",
            Some("RateBody"),
            (200, Some("RateLimit")),
        ),
        ("put", "/v1/queues/{queue}/rate-limits/unkeyed") => op(
            "setUnkeyedRateLimit",
            "Set the token bucket of the queue's tasks without a concurrency key (per_second 0 removes it)",
            Some("RateBody"),
            (200, Some("RateLimit")),
        ),
        ("put", "/v1/queues/{queue}/rate-limits/keys/{key}") => op(
            "setKeyRateLimit",
            "Set a concurrency key's token bucket in the queue (per_second 0 removes it)",
            Some("RateBody"),
            (200, Some("RateLimit")),
        ),
        ("get", "/v1/concurrency-keys") => op(
            "listConcurrencyOverrides",
            "The tenant's concurrency key overrides in force: limit, expiry, the key's running and pending tasks",
            None,
            (200, Some("ConcurrencyOverrideList")),
        ),
        ("get", "/v1/concurrency-keys/{key}") => op(
            "getConcurrencyOverride",
            "One concurrency key's override (404 without one)",
            None,
            (200, Some("ConcurrencyOverride")),
        ),
        ("put", "/v1/concurrency-keys/{key}") => op(
            "setConcurrencyOverride",
            "Override a concurrency key's limit (replacing the limit its tasks carry), optionally until an expiry",
            Some("ConcurrencyOverrideBody"),
            (200, Some("ConcurrencyOverride")),
        ),
        ("delete", "/v1/concurrency-keys/{key}") => op(
            "clearConcurrencyOverride",
            "Remove a concurrency key's override: its tasks' own limits apply again at once",
            None,
            (200, Some("Cleared")),
        ),
        ("get", "/v1/queues/{queue}/capacity") => {
            op("queueCapacity", "A queue's backlog, throughput and workers needed", None, (200, Some("Capacity")))
        }
        ("get", "/v1/capacity") => {
            op("capacity", "The capacity view of every queue", None, (200, Some("CapacityList")))
        }
        ("post", "/v1/schedules") => op(
            "createSchedule",
            "A recurring task, by cron (with time zone) or interval",
            Some("Schedule"),
            (201, Some("ScheduleInfo")),
        ),
        ("get", "/v1/schedules") => op("listSchedules", "The tenant's schedules", None, (200, Some("ScheduleList"))),
        ("delete", "/v1/schedules/{id}") => op("deleteSchedule", "Delete a schedule", None, (200, Some("Deleted"))),
        ("post", "/v1/schedules/{id}/pause") => {
            op("pauseSchedule", "Stop firing a schedule", None, (200, Some("ScheduleInfo")))
        }
        ("post", "/v1/schedules/{id}/resume") => {
            op("resumeSchedule", "Fire a paused schedule again", None, (200, Some("ScheduleInfo")))
        }
        ("post", "/v1/claim") => op("claim", "Claim ready tasks under a lease", Some("Claim"), (200, Some("Claimed"))),
        ("get", "/v1/queues") => op("queues", "Task counts per state of every queue", None, (200, Some("Queues"))),
        ("get", "/v1/queues/{queue}/dead-letters") => Operation {
            query: &[("limit", "At most this many tasks (default 100)")],
            ..op("deadLetters", "Dead-lettered tasks of a queue, oldest first", None, (200, Some("TaskList")))
        },
        ("post", "/v1/queues/{queue}/dead-letters/redrive") => {
            op("redrive", "Make dead-lettered tasks pending again", Some("Selection"), (200, Some("Redriven")))
        }
        ("post", "/v1/queues/{queue}/dead-letters/purge") => {
            op("purge", "Delete dead-lettered tasks", Some("Selection"), (200, Some("Purged")))
        }
        ("get", "/v1/queues/{queue}/dead-letters/groups") => op(
            "deadLetterGroups",
            "A queue's dead letters grouped by last error, with counts and example ids (over the oldest 10000)",
            None,
            (200, Some("DeadLetterGroups")),
        ),
        ("post", "/v1/queues/{queue}/dead-letters/groups/redrive") => op(
            "redriveGroup",
            "Make every dead letter with this last error pending again",
            Some("Group"),
            (200, Some("Redriven")),
        ),
        ("post", "/v1/queues/{queue}/dead-letters/groups/purge") => {
            op("purgeGroup", "Delete every dead letter with this last error", Some("Group"), (200, Some("Purged")))
        }
        ("get", "/v1/cluster/status") => op(
            "clusterStatus",
            "This node's Raft status, and every member's own (reachable or not)",
            None,
            (200, Some("ClusterStatus")),
        ),
        ("get", "/ui") => op("consoleAlias", "The web console (HTML), as at /ui/", None, (200, None)),
        ("get", "/ui/") => op("console", "The web console (HTML)", None, (200, None)),
        ("get", "/ui/app.js") => op("consoleScript", "The web console's script", None, (200, None)),
        ("get", "/ui/app.css") => op("consoleStyle", "The web console's style sheet", None, (200, None)),
        ("get", "/ui/icon.svg") => op("consoleIcon", "The web console's icon", None, (200, None)),
        ("post", "/v1/cluster/transfer-leader") => {
            op("transferLeader", "Hand the leadership to another voter", Some("Transfer"), (200, Some("Transferred")))
        }
        ("get", "/v1/admin/backup") => op(
            "backup",
            "A consistent backup of the cluster's state (application/octet-stream, streamed; see docs/design.md, \
             Backup files)",
            None,
            (200, None),
        ),
        ("get", "/v1/openapi.json") => op("openapi", "This document", None, (200, None)),
        ("get", "/healthz") => op("healthz", "The process serves", None, (200, Some("Health"))),
        ("get", "/readyz") => op(
            "readyz",
            "A leader is known, this node has caught up and is not cut off from the cluster (503 if not)",
            None,
            (200, Some("Ready")),
        ),
        ("get", "/metrics") => op("metrics", "Prometheus text exposition", None, (200, None)),
        _ => return None,
    };
    Some(o)
}

fn string() -> Value {
    json!({"type": "string"})
}
fn nstring() -> Value {
    json!({"type": ["string", "null"]})
}
fn number() -> Value {
    json!({"type": "number"})
}
fn nint() -> Value {
    json!({"type": ["integer", "null"]})
}
fn int() -> Value {
    json!({"type": "integer"})
}
fn boolean() -> Value {
    json!({"type": "boolean"})
}
fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}
fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}
fn object(props: &[(&str, Value)], required: &[&str]) -> Value {
    let p: Map<String, Value> = props.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    json!({"type": "object", "properties": p, "required": required})
}

/// Every schema of the document, by name.
pub fn schemas() -> Map<String, Value> {
    let task_state = json!({"type": "string", "enum":
        ["PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "DEAD_LETTERED"]});
    let token = json!({"type": "string", "description": "Fencing token, a decimal u64 (numbers are accepted too)"});
    let all = [
        (
            "Error",
            object(
                &[(
                    "error",
                    object(
                        &[
                            ("code", json!({"type": "string", "description": "The stable reason code"})),
                            ("message", string()),
                            ("retry_after_ms", json!({"type": "integer", "description": "With 429: when to retry"})),
                        ],
                        &["code", "message"],
                    ),
                )],
                &["error"],
            ),
        ),
        (
            "NewTask",
            object(
                &[
                    ("queue", string()),
                    ("payload", json!({"type": "string", "description": "UTF-8 payload (or payload_base64)"})),
                    ("payload_base64", string()),
                    ("priority", json!({"type": "integer", "minimum": 0, "maximum": 9})),
                    ("delay_ms", int()),
                    ("run_at_ms", int()),
                    ("max_attempts", int()),
                    ("idempotency_key", string()),
                    (
                        "webhook_url",
                        json!({"type": "string", "description": "POSTed a signed JSON body when the task ends"}),
                    ),
                    ("traceparent", json!({"type": "string", "description": "W3C trace context"})),
                    ("tracestate", string()),
                    (
                        "deadline_in_ms",
                        json!({"type": "integer", "description": "Fails as deadline-exceeded if not done by then"}),
                    ),
                    (
                        "concurrency_key",
                        json!({"type": "string", "description": "At most concurrency_limit such tasks run at once"}),
                    ),
                    ("concurrency_limit", int()),
                    ("depends_on", array(string())),
                    ("dependency_rule", json!({"type": "string", "enum": ["all_completed", "all_resolved"]})),
                    ("debounce", reference("Debounce")),
                    ("singleton", reference("Singleton")),
                ],
                &["queue"],
            ),
        ),
        (
            "Debounce",
            json!({
                "type": "object",
                "description": "While the key's task is pending and never claimed, an enqueue replaces its payload and \
                    priority and moves its start to min(now + delay_ms, first enqueue + max_wait_ms) (answered with \
                    duplicate and debounced); otherwise it creates a task starting at now + delay_ms. Cluster version 3.",
                "properties": {"key": string(), "delay_ms": int(), "max_wait_ms": int()},
                "required": ["key"],
            }),
        ),
        (
            "Singleton",
            json!({
                "type": "object",
                "description": "While the key's task is pending or in progress, an enqueue is refused (409, \
                    SINGLETON_ACTIVE) or, with mode skip, answered with that task as a duplicate. Cluster version 3.",
                "properties": {"key": string(), "mode": {"type": "string", "enum": ["refuse", "skip"]}},
                "required": ["key"],
            }),
        ),
        (
            "Schedule",
            object(
                &[
                    ("name", string()),
                    ("task", reference("NewTask")),
                    ("cron", json!({"type": "string", "description": "Five fields: minute hour day month weekday"})),
                    (
                        "time_zone",
                        json!({"type": "string", "description": "IANA name, e.g. Europe/Paris (default UTC)"}),
                    ),
                    ("interval_ms", int()),
                    ("missed_policy", json!({"type": "string", "enum": ["skip", "run_once"]})),
                ],
                &["name", "task"],
            ),
        ),
        (
            "TaskPage",
            json!({"type": "object", "properties": {"tasks": array(reference("Task")), "next_page_token": nstring()}}),
        ),
        ("Weight", object(&[("weight", int())], &["weight"])),
        (
            "FairnessKey",
            object(
                &[
                    ("queue", string()),
                    ("key", json!({"type": "string", "description": "A concurrency key; empty: tasks without one"})),
                    ("weight", int()),
                    ("ready", int()),
                    ("running", int()),
                    ("throttled", boolean()),
                ],
                &[],
            ),
        ),
        (
            "RateBody",
            object(
                &[
                    (
                        "per_second",
                        json!({"type": "number", "description": "Tokens per second, to a thousandth; 0 removes the limit"}),
                    ),
                    (
                        "burst",
                        json!({"type": "integer", "description": "Tokens at most; absent or 0: the rate, at least 1"}),
                    ),
                ],
                &["per_second"],
            ),
        ),
        (
            "RateLimit",
            object(
                &[
                    ("queue", string()),
                    (
                        "key",
                        json!({"type": ["string", "null"], "description": "Absent or null: the whole queue's bucket"}),
                    ),
                    ("per_second", number()),
                    ("burst", int()),
                    ("tokens", json!({"type": "number", "description": "The level now; negative: a debt"})),
                    ("ready", int()),
                    ("throttled", boolean()),
                ],
                &[],
            ),
        ),
        (
            "ConcurrencyOverrideBody",
            object(
                &[
                    (
                        "limit",
                        json!({"type": "integer", "description": "Running tasks of the key at most, at least 1"}),
                    ),
                    (
                        "ttl_s",
                        json!({"type": "integer", "description": "Seconds until the override runs out (at most 366 days)"}),
                    ),
                    (
                        "expires_at",
                        json!({"type": "string", "format": "date-time", "description": "Or when it runs out (RFC 3339)"}),
                    ),
                ],
                &["limit"],
            ),
        ),
        (
            "ConcurrencyOverride",
            object(
                &[
                    ("key", string()),
                    ("limit", int()),
                    (
                        "expires_at",
                        json!({"type": ["string", "null"], "format": "date-time", "description": "Null: until removed"}),
                    ),
                    ("expires_at_ms", json!({"type": ["integer", "null"]})),
                    ("running", int()),
                    ("pending", int()),
                ],
                &[],
            ),
        ),
        (
            "ConcurrencyOverrideList",
            json!({"type": "object", "properties": {"overrides": array(reference("ConcurrencyOverride"))}}),
        ),
        ("Cleared", json!({"type": "object", "properties": {"cleared": boolean()}})),
        ("RateLimitList", json!({"type": "object", "properties": {"limits": array(reference("RateLimit"))}})),
        ("FairnessList", json!({"type": "object", "properties": {"keys": array(reference("FairnessKey"))}})),
        ("QueuePause", json!({"type": "object", "properties": {"queue": string(), "paused": boolean()}})),
        (
            "Capacity",
            object(
                &[
                    ("queue", string()),
                    ("paused", boolean()),
                    ("pending", int()),
                    ("ready", int()),
                    ("delayed", int()),
                    ("running", int()),
                    ("active_workers", int()),
                    ("completed_1m", int()),
                    ("completed_5m", int()),
                    ("completed_15m", int()),
                    ("rate_1m", number()),
                    ("rate_5m", number()),
                    ("rate_15m", number()),
                    (
                        "drain_seconds",
                        json!({"type": ["number", "null"], "description": "null: no completions to go by"}),
                    ),
                    ("per_worker_rate", json!({"type": ["number", "null"]})),
                    ("max_running", nint()),
                    ("max_depth", nint()),
                    ("keys", array(reference("FairnessKey"))),
                    ("workers_needed", object(&[("1h", nint()), ("4h", nint()), ("8h", nint())], &[])),
                ],
                &["queue"],
            ),
        ),
        ("CapacityList", json!({"type": "object", "properties": {"queues": array(reference("Capacity"))}})),
        (
            "ScheduleInfo",
            object(
                &[
                    ("id", string()),
                    ("name", string()),
                    ("queue", string()),
                    ("cron", string()),
                    ("time_zone", string()),
                    ("interval_ms", int()),
                    ("paused", boolean()),
                    ("created_at_ms", int()),
                    ("missed_policy", string()),
                    ("last_occurrence_ms", nint()),
                    ("next_occurrence_ms", nint()),
                    ("fired", int()),
                ],
                &["id", "name"],
            ),
        ),
        ("ScheduleList", json!({"type": "object", "properties": {"schedules": array(reference("ScheduleInfo"))}})),
        ("Deleted", json!({"type": "object", "properties": {"deleted": boolean()}})),
        ("NewTaskBatch", object(&[("items", array(reference("NewTask")))], &["items"])),
        (
            "Enqueued",
            object(
                &[("task_id", string()), ("duplicate", boolean()), ("debounced", boolean())],
                &["task_id", "duplicate"],
            ),
        ),
        (
            "EnqueuedBatch",
            object(&[("results", array(json!({"oneOf": [reference("Enqueued"), reference("Error")]})))], &["results"]),
        ),
        (
            "Task",
            object(
                &[
                    ("id", string()),
                    ("queue", string()),
                    ("tenant", string()),
                    ("state", task_state.clone()),
                    ("priority", int()),
                    ("attempts", int()),
                    ("max_attempts", int()),
                    ("payload", nstring()),
                    ("payload_base64", string()),
                    (
                        "lease",
                        json!({"oneOf": [{"type": "null"}, object(&[("worker_id", string()), ("token", token.clone()),
                            ("claimed_at_ms", int()), ("deadline_ms", int())], &[])]}),
                    ),
                    (
                        "trace",
                        json!({"oneOf": [{"type": "null"}, object(&[("traceparent", string()), ("tracestate", string())], &[])]}),
                    ),
                    ("created_at_ms", int()),
                    ("updated_at_ms", int()),
                    ("visible_at_ms", int()),
                    ("ended_at_ms", int()),
                    ("dead_lettered_at_ms", int()),
                    ("idempotency_key", string()),
                    ("webhook_url", string()),
                    ("last_error", string()),
                    (
                        "runs",
                        array(object(
                            &[
                                ("worker_id", string()),
                                ("started_at_ms", int()),
                                ("ended_at_ms", int()),
                                ("outcome", string()),
                                ("reason", string()),
                            ],
                            &[],
                        )),
                    ),
                    ("deadline_ms", int()),
                    (
                        "progress",
                        json!({"oneOf": [{"type": "null"}, object(&[("percent", int()), ("message", string()), ("at_ms", int())], &[])]}),
                    ),
                    ("concurrency_key", string()),
                    ("concurrency_limit", int()),
                    ("follow_up_ids", array(string())),
                    ("parent_id", string()),
                    ("depends_on", array(string())),
                    ("dependency_rule", string()),
                    ("waiting_on", array(string())),
                ],
                &["id", "queue", "state"],
            ),
        ),
        ("TaskList", object(&[("tasks", array(reference("Task")))], &["tasks"])),
        (
            "TaskResult",
            object(
                &[
                    ("id", string()),
                    ("state", task_state.clone()),
                    ("done", boolean()),
                    ("result", nstring()),
                    ("result_base64", string()),
                    ("error", string()),
                    ("attempts", int()),
                    ("created_at_ms", int()),
                    ("ended_at_ms", int()),
                ],
                &["id", "state", "done"],
            ),
        ),
        ("StateAnswer", object(&[("state", task_state.clone())], &["state"])),
        (
            "AckAnswer",
            object(&[("state", task_state), ("at_ms", int()), ("follow_up_ids", array(string()))], &["state"]),
        ),
        (
            "Ack",
            object(
                &[
                    ("token", token),
                    ("result", string()),
                    ("result_base64", string()),
                    ("error", string()),
                    ("retryable", boolean()),
                    ("delay_ms", int()),
                    ("reason", string()),
                    ("extend_ms", int()),
                    ("progress_percent", int()),
                    ("message", string()),
                    ("follow_ups", array(reference("NewTask"))),
                ],
                &["token"],
            ),
        ),
        (
            "Claim",
            object(
                &[
                    ("worker_id", string()),
                    ("queues", array(string())),
                    ("count", int()),
                    ("lease_ms", int()),
                    ("wait_ms", int()),
                ],
                &["worker_id", "queues"],
            ),
        ),
        ("Claimed", object(&[("tasks", array(reference("Task")))], &["tasks"])),
        (
            "Queues",
            object(
                &[(
                    "queues",
                    array(object(
                        &[
                            ("queue", string()),
                            ("pending", int()),
                            ("delayed", int()),
                            ("in_progress", int()),
                            ("completed", int()),
                            ("failed", int()),
                            ("cancelled", int()),
                            ("paused", boolean()),
                            ("dead_lettered", int()),
                        ],
                        &["queue"],
                    )),
                )],
                &["queues"],
            ),
        ),
        ("Selection", object(&[("ids", array(string())), ("all", boolean())], &[])),
        ("Group", object(&[("error", string())], &["error"])),
        (
            "DeadLetterGroups",
            object(
                &[
                    (
                        "groups",
                        array(object(
                            &[
                                ("error", string()),
                                ("count", int()),
                                ("example_ids", array(string())),
                                ("first_dead_lettered_at_ms", int()),
                                ("last_dead_lettered_at_ms", int()),
                            ],
                            &["error", "count", "example_ids"],
                        )),
                    ),
                    ("scanned", int()),
                    ("truncated", boolean()),
                ],
                &["groups", "scanned", "truncated"],
            ),
        ),
        ("Redriven", object(&[("redriven", array(string()))], &["redriven"])),
        ("Purged", object(&[("purged", array(string()))], &["purged"])),
        (
            "ClusterStatus",
            object(
                &[
                    ("node_id", int()),
                    ("role", string()),
                    ("term", int()),
                    ("leader_id", json!({"type": ["integer", "null"]})),
                    ("last_log_index", int()),
                    ("applied_index", int()),
                    ("committed_index", int()),
                    ("replication_lag", json!({"type": "object"})),
                    ("version", int()),
                    ("cluster_version", int()),
                    ("release", string()),
                    (
                        "nodes",
                        array(object(
                            &[
                                ("node_id", int()),
                                ("api_addr", string()),
                                ("voter", boolean()),
                                ("reachable", boolean()),
                                ("role", string()),
                                ("term", int()),
                                ("leader_id", json!({"type": ["integer", "null"]})),
                                ("last_log_index", int()),
                                ("applied_index", int()),
                                ("committed_index", int()),
                                ("replication_lag", json!({"type": "object"})),
                                ("version", int()),
                                ("cluster_version", int()),
                                ("error", object(&[("code", string()), ("message", string())], &["code", "message"])),
                            ],
                            &["node_id", "reachable"],
                        )),
                    ),
                    (
                        "members",
                        array(object(
                            &[
                                ("node_id", int()),
                                ("raft_addr", string()),
                                ("api_addr", string()),
                                ("voter", boolean()),
                            ],
                            &[],
                        )),
                    ),
                ],
                &["node_id", "role"],
            ),
        ),
        ("Transfer", object(&[("to", int()), ("timeout_ms", int())], &[])),
        ("Limits", object(&[("max_running", nint()), ("max_depth", nint())], &[])),
        ("QueueLimits", object(&[("queue", string()), ("max_running", nint()), ("max_depth", nint())], &["queue"])),
        ("LimitsList", object(&[("limits", array(reference("QueueLimits")))], &["limits"])),
        ("Transferred", object(&[("leader_id", int()), ("took_ms", int())], &["leader_id"])),
        ("Health", object(&[("status", string())], &["status"])),
        (
            "Ready",
            object(
                &[
                    ("ready", boolean()),
                    ("reason", nstring()),
                    ("node_id", int()),
                    ("leader", json!({"type": ["integer", "null"]})),
                    ("term", int()),
                    ("last_log_index", json!({"type": ["integer", "null"]})),
                    ("applied_index", int()),
                ],
                &["ready"],
            ),
        ),
    ];
    all.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Every route the HTTP port serves: the REST routes, then health and metrics, then the console.
pub fn all_routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    rest::ROUTES.iter().chain(HTTP_ROUTES).chain(UI_ROUTES).copied()
}

/// The OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path) in all_routes() {
        let Some(o) = describe(method, path) else { continue };
        let mut params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": string()}))
            .collect();
        params.extend(o.query.iter().map(|(name, desc)| {
            let schema = if ["queue", "state", "page_token"].contains(name) { string() } else { int() };
            json!({"name": name, "in": "query", "required": false, "description": desc, "schema": schema})
        }));
        let ok_body = match o.ok.1 {
            Some(schema) => {
                json!({"description": "OK", "content": {"application/json": {"schema": reference(schema)}}})
            }
            None => json!({"description": "OK"}),
        };
        let error = json!({"description": "Error, with a stable reason code",
            "content": {"application/json": {"schema": reference("Error")}}});
        let mut responses = Map::new();
        responses.insert(o.ok.0.to_string(), ok_body);
        for (status, description) in error_statuses(method, path, &o) {
            let mut e = error.clone();
            e["description"] = json!(description);
            responses.insert(status.to_string(), e);
        }
        if path == "/readyz" {
            responses.insert(
                "503".into(),
                json!({"description": "Not ready", "content": {"application/json": {"schema": reference("Ready")}}}),
            );
        }
        responses.insert("default".into(), error);
        let mut operation = json!({
            "operationId": o.id,
            "summary": o.summary,
            "parameters": params,
            "responses": responses,
        });
        match scope_of(o.id) {
            // Served without a token.
            None => operation["security"] = json!([]),
            Some(scope) => {
                operation["x-raftq-scope"] = json!(scope);
                operation["description"] = json!(format!("Needs a token with the '{scope}' scope."));
            }
        }
        if let Some(schema) = o.request {
            operation["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": reference(schema)}}});
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "raftq",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "REST/JSON API of raftq, a Raft-replicated task queue. The same service as gRPC: same \
                validation, forwarding to the leader and error reasons. Headers: authorization, \
                x-raftq-redirect: 1 (answer NOT_LEADER instead of forwarding), x-raftq-read: stale.",
        },
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "schemas": schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                "description": "A JWT with `tid` (tenant) and scopes (enqueue, work, read, admin); see the README."}},
        },
    })
}

/// The error statuses an operation answers, each with the `Error` body (`error.rs` maps every reason to one
/// status). An integration test drives every operation and checks that each status it answers is declared.
fn error_statuses(method: &str, path: &str, o: &Operation) -> Vec<(u16, &'static str)> {
    if scope_of(o.id).is_none() {
        return vec![];
    }
    let mut v = vec![
        (400, "INVALID_ARGUMENT: a parameter, the query string or the body is not acceptable"),
        (401, "TOKEN_*: no token, or one that is not acceptable"),
        (403, "SCOPE_REQUIRED, QUEUE_NOT_ALLOWED: the token does not allow this"),
    ];
    if path.contains('{') {
        v.push((404, "NOT_FOUND: no such task, schedule or queue (another tenant's are not found either)"));
    }
    let conflicts = matches!(
        o.id,
        "cancel"
            | "complete"
            | "fail"
            | "nack"
            | "abandon"
            | "heartbeat"
            | "exception"
            | "createSchedule"
            | "pauseSchedule"
            | "resumeSchedule"
            | "deleteSchedule"
            | "setFairnessWeight"
            | "setUnkeyedWeight"
            | "setQueueRateLimit"
            | "setUnkeyedRateLimit"
            | "setKeyRateLimit"
    );
    if conflicts {
        v.push((409, "LEASE_LOST, NOT_IN_PROGRESS, ALREADY_ENDED, FEATURE_NOT_ACTIVE, ...: the state refuses this"));
    }
    if matches!(o.id, "setQueueLimits" | "setTenantLimits") {
        v.push((409, "FEATURE_NOT_ACTIVE: a node still runs a release without limits (cluster version 2)"));
    }
    if method == "post" && matches!(o.id, "enqueue" | "enqueueBatch" | "claim") {
        v.push((
            429,
            "RATE_LIMITED: over the tenant's rate; QUEUE_FULL (enqueues): the queue or tenant is at its depth limit; \
             nothing was applied; see Retry-After",
        ));
    }
    v.extend([
        (500, "INTERNAL"),
        (503, "NOT_LEADER, UNAVAILABLE: nothing was applied; try again (x-raftq-leader names the leader)"),
        (504, "UNKNOWN_OUTCOME: a write that may or may not have been applied"),
    ]);
    v
}

/// The scope an operation needs (as the service checks it), or None for the public ones.
fn scope_of(id: &str) -> Option<&'static str> {
    Some(match id {
        "enqueue" | "enqueueBatch" | "cancel" | "redrive" => "enqueue",
        "getTask" | "getResult" | "queues" | "deadLetters" | "deadLetterGroups" => "read",
        "redriveGroup" => "enqueue",
        "purgeGroup" => "admin",
        "claim" | "complete" | "fail" | "nack" | "abandon" | "heartbeat" => "work",
        "purge" | "clusterStatus" | "transferLeader" | "pauseQueue" | "resumeQueue" | "backup" => "admin",
        "setQueueLimits" | "setTenantLimits" => "admin",
        "listLimits" => "read",
        "listTasks" | "queueCapacity" | "capacity" | "listSchedules" | "listFairness" => "read",
        "setFairnessWeight" | "setUnkeyedWeight" => "admin",
        "setQueueRateLimit" | "setUnkeyedRateLimit" | "setKeyRateLimit" => "admin",
        "listRateLimits" => "read",
        "setConcurrencyOverride" | "clearConcurrencyOverride" => "admin",
        "listConcurrencyOverrides" | "getConcurrencyOverride" => "read",
        "exception" => "work",
        "createSchedule" | "deleteSchedule" | "pauseSchedule" | "resumeSchedule" => "enqueue",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_operation_but_the_probes_needs_a_token_with_a_scope() {
        let doc = super::document();
        let mut public = Vec::new();
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for (method, op) in ops.as_object().expect("ops") {
                match op.get("x-raftq-scope").and_then(|s| s.as_str()) {
                    Some(s) => assert!(["enqueue", "work", "read", "admin"].contains(&s), "{method} {path}: {s}"),
                    None => {
                        assert_eq!(op["security"], serde_json::json!([]), "{method} {path}");
                        public.push(path.clone());
                    }
                }
            }
        }
        public.sort();
        assert_eq!(
            public,
            [
                "/healthz",
                "/metrics",
                "/readyz",
                "/ui",
                "/ui/",
                "/ui/app.css",
                "/ui/app.js",
                "/ui/icon.svg",
                "/v1/openapi.json"
            ]
        );
    }

    use super::*;

    #[test]
    fn every_route_is_described_once_and_every_schema_reference_resolves() {
        let mut seen = std::collections::HashSet::new();
        for (method, path) in all_routes() {
            assert!(describe(method, path).is_some(), "{method} {path} has no description");
            assert!(seen.insert((method, path)), "{method} {path} listed twice");
        }
        let doc = document();
        let schemas = schemas();
        let text = doc.to_string();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "no schema {name}");
        }
        let ops: usize =
            doc["paths"].as_object().expect("paths").values().map(|p| p.as_object().expect("ops").len()).sum();
        assert_eq!(ops, seen.len());
    }
}
