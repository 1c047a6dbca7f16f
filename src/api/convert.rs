//! Conversions between the protobuf types and the domain, with the validation of everything a client sends.
//! Conversions destructure every field, so a new proto field breaks the build until it is handled here.

use raftq_proto::v1 as pb;

use super::error::{invalid, ApiError};
use crate::config::Config;
use crate::queue::{
    AckAction, ConcurrencyKey, DependencyRule, ExceptionReason, KeyMode, KeyedTask, NewTask, Task, TaskId, TaskState,
    TimeMs,
};

pub fn parse_id(s: &str) -> Result<TaskId, ApiError> {
    s.parse().map_err(|_| invalid(format!("task id {s:?} is not 32 hex characters")))
}

pub fn validate_queue(cfg: &Config, q: &str) -> Result<(), ApiError> {
    if q.is_empty() || q.len() > cfg.max_queue_name_len {
        return Err(invalid(format!("queue name must be 1 to {} characters", cfg.max_queue_name_len)));
    }
    let ok_first = q.as_bytes()[0].is_ascii_alphanumeric();
    let ok_rest = q.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if !ok_first || !ok_rest {
        return Err(invalid(format!(
            "queue name {q:?} must start with a letter or digit and hold only letters, digits, '.', '_', ':' and '-'"
        )));
    }
    Ok(())
}

/// A fairness key (a concurrency key, "" for tasks without one) and its weight, as `SetFairnessWeight` takes them.
pub fn validate_fairness(cfg: &Config, key: &str, weight: u32) -> Result<(), ApiError> {
    use crate::queue::fair::{DEFAULT_WEIGHT, MAX_WEIGHT};
    if key.len() > cfg.max_idempotency_key_len {
        return Err(invalid(format!("key must be at most {} characters", cfg.max_idempotency_key_len)));
    }
    if !(DEFAULT_WEIGHT..=MAX_WEIGHT).contains(&weight) {
        return Err(invalid(format!("weight must be {DEFAULT_WEIGHT} to {MAX_WEIGHT}, got {weight}")));
    }
    Ok(())
}

/// A token bucket's configuration as `SetRateLimit` takes it: `per_second` to a thousandth (0 removes the
/// limit), `burst` 0 for the default (`RateLimit::new`).
pub fn rate_limit(per_second: f64, burst: u32) -> Result<crate::queue::RateLimit, ApiError> {
    use crate::queue::rate::{MAX_BURST, MAX_MILLI_PER_S};
    use crate::queue::RateLimit;
    let max = MAX_MILLI_PER_S / 1_000;
    if !per_second.is_finite() || !(0.0..=max as f64).contains(&per_second) {
        return Err(invalid(format!("per_second must be 0 to {max}, got {per_second}")));
    }
    let milli_per_s = (per_second * 1_000.0).round() as u64;
    if per_second > 0.0 && milli_per_s == 0 {
        return Err(invalid(format!("per_second must be at least 0.001 (or 0 to remove the limit), got {per_second}")));
    }
    if burst > MAX_BURST {
        return Err(invalid(format!("burst must be at most {MAX_BURST}, got {burst}")));
    }
    if milli_per_s == 0 {
        return Ok(RateLimit::default());
    }
    Ok(RateLimit::new(milli_per_s, Some(burst)))
}

/// The largest concurrency key override: a sanity bound, far past any real worker fleet.
pub const MAX_KEY_LIMIT: u32 = 1_000_000;
/// The longest an override may last when it has an expiry (a year and a day); without one it lasts until cleared.
pub const MAX_KEY_LIMIT_TTL_MS: u64 = 366 * 24 * 3600 * 1000;

/// When a concurrency key override runs out, as the caller gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLimitExpiry {
    Never,
    /// This long after the leader stamps the command (`Proposer::expiry_after` makes it absolute).
    After(u64),
    /// At this absolute time (Unix ms), given as RFC 3339.
    At(TimeMs),
}

/// A concurrency key override as `SetConcurrencyOverride` takes it: the key (not empty), the limit (1 to
/// `MAX_KEY_LIMIT`) and at most one of a TTL and an RFC 3339 expiry, in the future (after `now`) and at most
/// `MAX_KEY_LIMIT_TTL_MS` ahead.
pub fn key_limit(
    cfg: &Config,
    key: &str,
    limit: u32,
    ttl_ms: u64,
    expires_at: &str,
    now: TimeMs,
) -> Result<KeyLimitExpiry, ApiError> {
    if key.is_empty() {
        return Err(invalid("key must not be empty: an override is for one concurrency key"));
    }
    if key.len() > cfg.max_idempotency_key_len {
        return Err(invalid(format!("key must be at most {} characters", cfg.max_idempotency_key_len)));
    }
    if !(1..=MAX_KEY_LIMIT).contains(&limit) {
        return Err(invalid(format!(
            "limit must be 1 to {MAX_KEY_LIMIT}, got {limit} (clear the override instead of 0)"
        )));
    }
    let (expiry, ttl) = match (ttl_ms, expires_at.trim()) {
        (0, "") => return Ok(KeyLimitExpiry::Never),
        (ttl, "") => (KeyLimitExpiry::After(ttl), ttl),
        (0, at) => {
            let parsed = chrono::DateTime::parse_from_rfc3339(at).map_err(|e| {
                invalid(format!("expires_at must be an RFC 3339 time such as 2026-11-26T12:00:00Z: {e}"))
            })?;
            let at_ms = u64::try_from(parsed.timestamp_millis()).unwrap_or(0);
            if at_ms <= now {
                return Err(invalid(format!("expires_at must be in the future, got {at}")));
            }
            (KeyLimitExpiry::At(at_ms), at_ms - now)
        }
        _ => return Err(invalid("give at most one of ttl and expires_at")),
    };
    if ttl > MAX_KEY_LIMIT_TTL_MS {
        return Err(invalid(format!(
            "an override lasts at most {} days (or give no expiry), got {} s",
            MAX_KEY_LIMIT_TTL_MS / 86_400_000,
            ttl / 1000
        )));
    }
    Ok(expiry)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// W3C traceparent: `version-traceid-parentid-flags`, lowercase hex, ids not all zero.
fn validate_traceparent(tp: &str) -> Result<(), ApiError> {
    let parts: Vec<&str> = tp.split('-').collect();
    let ok = parts.len() >= 4
        && is_hex(parts[0], 2)
        && parts[0] != "ff"
        && is_hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && is_hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && is_hex(parts[3], 2);
    if ok {
        Ok(())
    } else {
        Err(invalid("trace.traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"))
    }
}

fn validate_webhook(cfg: &Config, url: &str) -> Result<(), ApiError> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or(""));
    if url.len() > cfg.max_webhook_url_len
        || host.is_none_or(|h| h.is_empty() || h.starts_with(':'))
        || url.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(invalid(format!(
            "webhook_url must be an http:// or https:// URL with a host, at most {} characters",
            cfg.max_webhook_url_len
        )));
    }
    Ok(())
}

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// Validates an enqueue request and decides everything the state machine needs: id, visible time, defaults.
pub fn new_task(cfg: &Config, tenant: &str, req: pb::EnqueueRequest, now: TimeMs) -> Result<NewTask, ApiError> {
    let pb::EnqueueRequest {
        queue,
        payload,
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
        dependency_rule,
        debounce,
        singleton,
    } = req;
    if debounce.is_some() || singleton.is_some() {
        // Taken out by `enqueue_item` for the enqueues that take them; follow-ups and schedules do not.
        return Err(invalid("debounce and singleton are taken by enqueues only"));
    }
    validate_queue(cfg, &queue)?;
    if payload.len() > cfg.max_payload_bytes {
        return Err(invalid(format!(
            "payload is {} bytes, more than the limit of {}",
            payload.len(),
            cfg.max_payload_bytes
        )));
    }
    if priority > 9 {
        return Err(invalid(format!("priority {priority} is outside 0-9")));
    }
    if delay_ms > cfg.max_delay_ms {
        return Err(invalid(format!("delay_ms {delay_ms} is beyond the horizon of {} ms", cfg.max_delay_ms)));
    }
    if run_at_ms < 0 || (run_at_ms as u64) > now.saturating_add(cfg.max_delay_ms) {
        return Err(invalid(format!("run_at_ms {run_at_ms} is negative or beyond the horizon")));
    }
    if max_attempts > cfg.max_attempts_limit {
        return Err(invalid(format!("max_attempts {max_attempts} is above the limit of {}", cfg.max_attempts_limit)));
    }
    if idempotency_key.len() > cfg.max_idempotency_key_len || idempotency_key.contains('\0') {
        return Err(invalid(format!(
            "idempotency_key must be at most {} characters, without NUL",
            cfg.max_idempotency_key_len
        )));
    }
    if !webhook_url.is_empty() {
        validate_webhook(cfg, &webhook_url)?;
    }
    let (traceparent, tracestate) = match trace {
        Some(pb::TraceContext { traceparent, tracestate }) => {
            if !traceparent.is_empty() {
                validate_traceparent(&traceparent)?;
            }
            if tracestate.len() > 512 {
                return Err(invalid("trace.tracestate is longer than 512 characters"));
            }
            (non_empty(traceparent), non_empty(tracestate))
        }
        None => (None, None),
    };
    if deadline_in_ms > cfg.max_delay_ms {
        return Err(invalid(format!(
            "deadline_in_ms {deadline_in_ms} is beyond the horizon of {} ms",
            cfg.max_delay_ms
        )));
    }
    let visible_at = if run_at_ms > 0 { run_at_ms as u64 } else { now.saturating_add(delay_ms) };
    if concurrency_key.len() > cfg.max_idempotency_key_len {
        return Err(invalid(format!("concurrency_key must be at most {} characters", cfg.max_idempotency_key_len)));
    }
    if concurrency_key.is_empty() && concurrency_limit > 0 {
        return Err(invalid("concurrency_limit needs a concurrency_key"));
    }
    let idempotency_key = non_empty(idempotency_key);
    let concurrency = non_empty(concurrency_key).map(|key| ConcurrencyKey { key, limit: concurrency_limit.max(1) });
    // Tasks of one concurrency key share a shard, where their running count lives; an idempotency key then
    // dedupes within it.
    let placement = match (&concurrency, &idempotency_key) {
        (Some(c), _) => TaskId::placement_for_concurrency_key(tenant, &c.key),
        (None, Some(k)) => TaskId::placement_for_key(tenant, k),
        (None, None) => rand::random(),
    };
    Ok(NewTask {
        id: TaskId::new(now, placement, rand::random()),
        tenant: tenant.to_string(),
        queue,
        // A copy of its own: the request's bytes may be a slice of a whole received frame, which the stored
        // task would keep alive.
        payload: bytes::Bytes::copy_from_slice(&payload),
        priority: priority as u8,
        visible_at,
        max_attempts: if max_attempts == 0 { cfg.max_attempts_default } else { max_attempts },
        idempotency_key,
        idempotency_window_ms: cfg.idempotency_window_ms,
        webhook_url: non_empty(webhook_url),
        traceparent,
        tracestate,
        retry: cfg.retry_policy(),
        retention_ms: cfg.retention_ms,
        deadline: (deadline_in_ms > 0).then(|| now.saturating_add(deadline_in_ms)),
        concurrency,
        parent: None,
        depends_on: dependencies(cfg, &depends_on)?,
        dependency_rule: match pb::DependencyRule::try_from(dependency_rule) {
            Ok(pb::DependencyRule::AllCompleted) => DependencyRule::AllCompleted,
            Ok(pb::DependencyRule::AllResolved) => DependencyRule::AllResolved,
            Err(_) => return Err(invalid(format!("unknown dependency_rule {dependency_rule}"))),
        },
    })
}

/// Validates an enqueue request that may carry a debounce or singleton key, and decides everything the state
/// machine needs. A keyed task is placed by its key's record (`KeyMode::record_key`), or by its concurrency key
/// when it has one, so the record and the task it names share a shard; a debounced task starts at
/// `now + delay_ms`.
pub fn enqueue_item(
    cfg: &Config,
    tenant: &str,
    mut req: pb::EnqueueRequest,
    now: TimeMs,
) -> Result<KeyedTask, ApiError> {
    let debounce = req.debounce.take();
    let singleton = req.singleton.take();
    let mode = match (debounce, singleton) {
        (None, None) => None,
        (Some(_), Some(_)) => return Err(invalid("give debounce or singleton, not both")),
        (Some(pb::Debounce { key, delay_ms, max_wait_ms }), None) => {
            if req.delay_ms > 0 || req.run_at_ms > 0 {
                return Err(invalid("a debounced task starts at debounce.delay_ms: give no delay_ms or run_at_ms"));
            }
            if delay_ms > cfg.max_delay_ms || max_wait_ms > cfg.max_delay_ms {
                return Err(invalid(format!(
                    "debounce.delay_ms and debounce.max_wait_ms must be within the horizon of {} ms",
                    cfg.max_delay_ms
                )));
            }
            Some(KeyMode::Debounce { key: mode_key(cfg, "debounce.key", key)?, delay_ms, max_wait_ms })
        }
        (None, Some(pb::Singleton { key, mode })) => {
            let skip = match pb::SingletonMode::try_from(mode) {
                Ok(pb::SingletonMode::Refuse) => false,
                Ok(pb::SingletonMode::Skip) => true,
                Err(_) => return Err(invalid(format!("unknown singleton.mode {mode}"))),
            };
            Some(KeyMode::Singleton { key: mode_key(cfg, "singleton.key", key)?, skip })
        }
    };
    if mode.is_some() && !req.idempotency_key.is_empty() {
        return Err(invalid("an idempotency_key does not go with debounce or singleton"));
    }
    let delay = match &mode {
        Some(KeyMode::Debounce { delay_ms, .. }) => *delay_ms,
        _ => 0,
    };
    let mut task = new_task(cfg, tenant, req, now)?;
    if let Some(m) = &mode {
        task.visible_at = task.visible_at.max(now.saturating_add(delay));
        if task.concurrency.is_none() {
            let placement = TaskId::placement_for_key(tenant, &m.record_key(&task.queue, None));
            task.id = TaskId::new(now, placement, rand::random());
        }
    }
    Ok(KeyedTask { task, mode })
}

/// A debounce or singleton key: 1 to `max_idempotency_key_len` characters, no control characters (the record key
/// separates its parts with NUL).
fn mode_key(cfg: &Config, field: &str, key: String) -> Result<String, ApiError> {
    if key.is_empty() || key.len() > cfg.max_idempotency_key_len || key.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} must be 1 to {} characters, without control characters",
            cfg.max_idempotency_key_len
        )));
    }
    Ok(key)
}

/// Dependency ids: parsed, without repeats, at most `max_batch_items`. That they exist is checked on the leader
/// before proposing (`TaskApi`), and since they must exist first no cycle can form.
fn dependencies(cfg: &Config, ids: &[String]) -> Result<Vec<TaskId>, ApiError> {
    if ids.len() > cfg.max_batch_items {
        return Err(invalid(format!("a task depends on at most {} tasks", cfg.max_batch_items)));
    }
    let mut out: Vec<TaskId> = Vec::with_capacity(ids.len());
    for s in ids {
        let id = parse_id(s)?;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// Follow-up tasks of a completion: validated like enqueues, then placed in the completed task's shard (same
/// placement), so the completion and its follow-ups are one shard's effect.
fn follow_ups(
    cfg: &Config,
    tenant: &str,
    parent: &TaskId,
    reqs: Vec<pb::EnqueueRequest>,
    now: TimeMs,
) -> Result<Vec<NewTask>, ApiError> {
    if reqs.len() > cfg.max_batch_items {
        return Err(invalid(format!("a completion creates at most {} follow-ups", cfg.max_batch_items)));
    }
    reqs.into_iter()
        .map(|r| {
            if !r.idempotency_key.is_empty() || !r.concurrency_key.is_empty() || !r.depends_on.is_empty() {
                return Err(invalid("follow-ups take no idempotency_key, concurrency_key or depends_on"));
            }
            let mut n = new_task(cfg, tenant, r, now)?;
            n.id = TaskId::new(now, parent.placement(), rand::random());
            n.parent = Some(*parent);
            Ok(n)
        })
        .collect()
}

/// A follow-up as an enqueue request again (an ack forwarded to the leader is converted there anew).
fn follow_up_to_pb(n: &NewTask, now: TimeMs) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: n.queue.clone(),
        payload: n.payload.clone(),
        priority: n.priority as u32,
        delay_ms: 0,
        run_at_ms: n.visible_at.min(i64::MAX as u64) as i64,
        max_attempts: n.max_attempts,
        idempotency_key: String::new(),
        webhook_url: n.webhook_url.clone().unwrap_or_default(),
        trace: (n.traceparent.is_some() || n.tracestate.is_some()).then(|| pb::TraceContext {
            traceparent: n.traceparent.clone().unwrap_or_default(),
            tracestate: n.tracestate.clone().unwrap_or_default(),
        }),
        deadline_in_ms: n.deadline.map(|d| d.saturating_sub(now).max(1)).unwrap_or(0),
        concurrency_key: String::new(),
        concurrency_limit: 0,
        depends_on: vec![],
        dependency_rule: 0,
        debounce: None,
        singleton: None,
    }
}

/// An ack's action. `tenant`, `task_id` and `now` place and stamp the follow-ups of a chained completion.
pub fn ack_action(
    cfg: &Config,
    tenant: &str,
    task_id: &TaskId,
    action: Option<pb::ack_request::Action>,
    now: TimeMs,
) -> Result<AckAction, ApiError> {
    use pb::ack_request::Action;
    Ok(match action {
        None => return Err(invalid("ack needs an action: complete, fail, nack, abandon, heartbeat or exception")),
        Some(Action::Complete(pb::Complete { result, follow_ups: chained })) => {
            if result.len() > cfg.max_payload_bytes {
                return Err(invalid(format!("result is larger than {} bytes", cfg.max_payload_bytes)));
            }
            if chained.is_empty() {
                AckAction::Complete { result: result.to_vec() }
            } else {
                let follow_ups = follow_ups(cfg, tenant, task_id, chained, now)?;
                AckAction::CompleteWith { result: result.to_vec(), follow_ups }
            }
        }
        Some(Action::Fail(pb::Fail { error, retryable })) => AckAction::Fail { error: truncate(error), retryable },
        Some(Action::Nack(pb::Nack { delay_ms, reason })) => {
            if delay_ms > cfg.max_delay_ms {
                return Err(invalid("nack delay_ms is beyond the delay horizon"));
            }
            AckAction::Nack { delay_ms: if delay_ms == 0 { None } else { Some(delay_ms) }, reason: truncate(reason) }
        }
        Some(Action::Abandon(pb::Abandon {})) => AckAction::Abandon,
        Some(Action::Heartbeat(pb::Heartbeat { extend_ms, progress: None })) => {
            AckAction::Heartbeat { extend_ms: lease_ms(cfg, extend_ms)? }
        }
        Some(Action::Heartbeat(pb::Heartbeat {
            extend_ms,
            progress: Some(pb::Progress { percent, message, at_ms: _ }),
        })) => {
            if percent > 100 {
                return Err(invalid(format!("progress percent {percent} is above 100")));
            }
            if message.len() > MAX_PROGRESS_MESSAGE_BYTES {
                return Err(invalid(format!("progress message is longer than {MAX_PROGRESS_MESSAGE_BYTES} bytes")));
            }
            AckAction::Progress { extend_ms: lease_ms(cfg, extend_ms)?, percent: percent as u8, message }
        }
        Some(Action::Exception(pb::Exception { reason, message })) => {
            let Some(reason) = ExceptionReason::parse(&reason) else {
                return Err(invalid(format!(
                    "exception reason {reason:?} is not one of malformed-payload, worker-shutdown, \
                     resource-unavailable, internal-error"
                )));
            };
            AckAction::Exception { reason, message: truncate(message) }
        }
    })
}

/// An ack as a request to another node (the leader).
pub fn ack_to_pb(item: &crate::queue::AckItem, now: TimeMs) -> pb::AckRequest {
    use pb::ack_request::Action;
    let action = match &item.action {
        AckAction::Complete { result } => {
            Action::Complete(pb::Complete { result: result.clone().into(), follow_ups: vec![] })
        }
        AckAction::CompleteWith { result, follow_ups } => Action::Complete(pb::Complete {
            result: result.clone().into(),
            follow_ups: follow_ups.iter().map(|n| follow_up_to_pb(n, now)).collect(),
        }),
        AckAction::Fail { error, retryable } => Action::Fail(pb::Fail { error: error.clone(), retryable: *retryable }),
        AckAction::Nack { delay_ms, reason } => {
            Action::Nack(pb::Nack { delay_ms: delay_ms.unwrap_or(0), reason: reason.clone() })
        }
        AckAction::Abandon => Action::Abandon(pb::Abandon {}),
        AckAction::Heartbeat { extend_ms } => {
            Action::Heartbeat(pb::Heartbeat { extend_ms: *extend_ms, progress: None })
        }
        AckAction::Progress { extend_ms, percent, message } => Action::Heartbeat(pb::Heartbeat {
            extend_ms: *extend_ms,
            progress: Some(pb::Progress { percent: *percent as u32, message: message.clone(), at_ms: 0 }),
        }),
        AckAction::Exception { reason, message } => {
            Action::Exception(pb::Exception { reason: reason.as_str().to_string(), message: message.clone() })
        }
    };
    pb::AckRequest { task_id: item.task_id.to_string(), token: item.token, action: Some(action) }
}

/// Progress messages are stored with the task and replaced by each heartbeat: kept short.
const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// Error texts are kept, but bounded: they are stored with the task.
fn truncate(mut s: String) -> String {
    const MAX_ERROR_BYTES: usize = 4096;
    if s.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// A lease length: 0 means the default; otherwise it must lie in the configured range.
pub fn lease_ms(cfg: &Config, ms: u64) -> Result<u64, ApiError> {
    if ms == 0 {
        return Ok(cfg.lease_default_ms);
    }
    if ms < cfg.lease_min_ms || ms > cfg.lease_max_ms {
        return Err(invalid(format!("lease {ms} ms is outside {}..={} ms", cfg.lease_min_ms, cfg.lease_max_ms)));
    }
    Ok(ms)
}

pub fn state(s: TaskState) -> pb::TaskState {
    match s {
        TaskState::Pending => pb::TaskState::Pending,
        TaskState::InProgress => pb::TaskState::InProgress,
        TaskState::Completed => pb::TaskState::Completed,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Cancelled => pb::TaskState::Cancelled,
        TaskState::DeadLettered => pb::TaskState::DeadLettered,
    }
}

fn ms(t: TimeMs) -> i64 {
    t.min(i64::MAX as u64) as i64
}

/// The API's view of a task (read from the stored one: a claim's answer shares the stored task).
pub fn task(t: &Task) -> pb::Task {
    let Task {
        id,
        tenant,
        queue,
        payload,
        priority,
        state: st,
        seq: _,
        created_at,
        updated_at,
        visible_at,
        attempts,
        max_attempts,
        idempotency_key,
        webhook_url,
        traceparent,
        tracestate,
        retry: _,
        retention_ms: _,
        lease,
        result: _,
        last_error,
        ended_at,
        dead_at,
        last_ack: _,
        runs,
        deadline,
        progress,
        concurrency,
        follow_ups,
        parent,
        depends_on,
        dependency_rule,
        waiting_on,
        scheduled,
    } = t;
    pb::Task {
        id: id.to_string(),
        queue: queue.clone(),
        payload: payload.clone(),
        priority: *priority as u32,
        state: state(*st) as i32,
        attempts: *attempts,
        max_attempts: *max_attempts,
        tenant: tenant.clone(),
        trace: if traceparent.is_some() || tracestate.is_some() {
            Some(pb::TraceContext {
                traceparent: traceparent.clone().unwrap_or_default(),
                tracestate: tracestate.clone().unwrap_or_default(),
            })
        } else {
            None
        },
        lease: lease.as_ref().map(|l| pb::Lease {
            worker_id: l.worker_id.to_string(),
            token: l.token,
            claimed_at_ms: ms(l.claimed_at),
            deadline_ms: ms(l.deadline),
        }),
        created_at_ms: ms(*created_at),
        updated_at_ms: ms(*updated_at),
        visible_at_ms: ms(*visible_at),
        idempotency_key: idempotency_key.clone().unwrap_or_default(),
        webhook_url: webhook_url.clone().unwrap_or_default(),
        last_error: last_error.clone().unwrap_or_default(),
        ended_at_ms: ended_at.map(ms).unwrap_or(0),
        dead_lettered_at_ms: dead_at.map(ms).unwrap_or(0),
        runs: runs
            .iter()
            .map(|r| pb::Run {
                worker_id: r.worker_id.to_string(),
                token: r.token,
                started_at_ms: ms(r.started_at),
                ended_at_ms: r.ended_at.map(ms).unwrap_or(0),
                outcome: r.outcome.map(|o| o.as_str().to_string()).unwrap_or_default(),
                reason: r.reason.clone(),
            })
            .collect(),
        deadline_ms: deadline.map(ms).unwrap_or(0),
        progress: progress.as_ref().map(|p| pb::Progress {
            percent: p.percent as u32,
            message: p.message.clone(),
            at_ms: ms(p.at),
        }),
        concurrency_key: concurrency.as_ref().map(|c| c.key.clone()).unwrap_or_default(),
        concurrency_limit: concurrency.as_ref().map(|c| c.limit).unwrap_or(0),
        follow_up_ids: follow_ups.iter().map(|id| id.to_string()).collect(),
        parent_id: parent.map(|p| p.to_string()).unwrap_or_default(),
        depends_on: depends_on.iter().map(|id| id.to_string()).collect(),
        dependency_rule: match *dependency_rule {
            DependencyRule::AllCompleted => pb::DependencyRule::AllCompleted,
            DependencyRule::AllResolved => pb::DependencyRule::AllResolved,
        } as i32,
        waiting_on: waiting_on.iter().map(|id| id.to_string()).collect(),
        schedule_id: scheduled.map(|(id, _)| id.to_string()).unwrap_or_default(),
        scheduled_for_ms: scheduled.map(|(_, at)| ms(at)).unwrap_or(0),
    }
}

pub fn result(t: Task) -> pb::TaskResult {
    pb::TaskResult {
        id: t.id.to_string(),
        state: state(t.state) as i32,
        done: t.state.is_terminal(),
        result: t.result.unwrap_or_default().into(),
        error: if t.state == TaskState::Completed { String::new() } else { t.last_error.unwrap_or_default() },
        attempts: t.attempts,
        created_at_ms: ms(t.created_at),
        ended_at_ms: t.ended_at.map(ms).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(queue: &str) -> pb::EnqueueRequest {
        pb::EnqueueRequest { queue: queue.into(), payload: b"x".to_vec().into(), ..Default::default() }
    }

    #[test]
    fn enqueue_validation_rejects_bad_input_with_reasons() {
        let cfg = Config::default();
        assert!(new_task(&cfg, "t", req("emails.send"), 1).is_ok());
        for bad in ["", "-x", "a b", "é", &"q".repeat(200)] {
            let e = new_task(&cfg, "t", req(bad), 1).expect_err(bad);
            assert_eq!(e.reason(), raftq_proto::reason::Reason::InvalidArgument);
        }
        let mut r = req("q");
        r.priority = 10;
        assert!(new_task(&cfg, "t", r, 1).is_err());
        let mut r = req("q");
        r.payload = vec![0u8; cfg.max_payload_bytes + 1].into();
        assert!(new_task(&cfg, "t", r, 1).is_err());
        let mut r = req("q");
        r.webhook_url = "ftp://x".into();
        assert!(new_task(&cfg, "t", r, 1).is_err());
        let mut r = req("q");
        r.delay_ms = cfg.max_delay_ms + 1;
        assert!(new_task(&cfg, "t", r, 1).is_err());
        let mut r = req("q");
        r.trace = Some(pb::TraceContext { traceparent: "00-abc-def-01".into(), tracestate: String::new() });
        assert!(new_task(&cfg, "t", r, 1).is_err());
        let mut r = req("q");
        r.trace = Some(pb::TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: String::new(),
        });
        assert!(new_task(&cfg, "t", r, 1).is_ok());
    }

    #[test]
    fn idempotent_tasks_share_a_placement_per_tenant_and_key() {
        let cfg = Config::default();
        let mut a = req("q");
        a.idempotency_key = "k1".into();
        let t1 = new_task(&cfg, "t", a.clone(), 1).expect("ok");
        let t2 = new_task(&cfg, "t", a, 2).expect("ok");
        assert_ne!(t1.id, t2.id);
        assert_eq!(t1.id.placement(), t2.id.placement());
    }

    #[test]
    fn keyed_tasks_share_a_placement_per_key_and_bad_combinations_are_refused() {
        let cfg = Config::default();
        let single = |queue: &str, key: &str| pb::EnqueueRequest {
            singleton: Some(pb::Singleton { key: key.into(), mode: pb::SingletonMode::Skip as i32 }),
            ..req(queue)
        };
        let a = enqueue_item(&cfg, "t", single("q", "k"), 1).expect("ok");
        let b = enqueue_item(&cfg, "t", single("q", "k"), 2).expect("ok");
        assert_eq!(a.mode, Some(KeyMode::Singleton { key: "k".into(), skip: true }));
        assert_ne!(a.task.id, b.task.id);
        assert_eq!(a.task.id.placement(), b.task.id.placement(), "record and task share a shard");
        let rkey = a.mode.as_ref().expect("keyed").record_key("q", None);
        assert_eq!(a.task.id.placement(), TaskId::placement_for_key("t", &rkey));
        let with_ck = pb::EnqueueRequest { concurrency_key: "c".into(), ..single("q", "k") };
        let c = enqueue_item(&cfg, "t", with_ck, 1).expect("ok");
        assert_eq!(
            c.task.id.placement(),
            TaskId::placement_for_concurrency_key("t", "c"),
            "the concurrency key's shard"
        );
        let deb = pb::Debounce { key: "d".into(), delay_ms: 500, max_wait_ms: 0 };
        let d = enqueue_item(&cfg, "t", pb::EnqueueRequest { debounce: Some(deb.clone()), ..req("q") }, 1_000);
        assert_eq!(d.expect("ok").task.visible_at, 1_500, "a debounced task starts after the delay");
        assert_eq!(enqueue_item(&cfg, "t", req("q"), 1).expect("plain").mode, None);
        let bad = [
            pb::EnqueueRequest { debounce: Some(deb.clone()), ..single("q", "k") },
            pb::EnqueueRequest { idempotency_key: "i".into(), ..single("q", "k") },
            pb::EnqueueRequest { delay_ms: 1, debounce: Some(deb.clone()), ..req("q") },
            pb::EnqueueRequest { run_at_ms: 5, debounce: Some(deb), ..req("q") },
            single("q", ""),
            single("q", "a\u{0}b"),
            single("q", &"k".repeat(cfg.max_idempotency_key_len + 1)),
            pb::EnqueueRequest { singleton: Some(pb::Singleton { key: "k".into(), mode: 9 }), ..req("q") },
        ];
        for r in bad {
            let e = enqueue_item(&cfg, "t", r.clone(), 1).expect_err("refused");
            assert_eq!(e.reason(), raftq_proto::reason::Reason::InvalidArgument, "{r:?}");
        }
        // Follow-ups and schedule templates (through `new_task`) take neither.
        assert!(new_task(&cfg, "t", single("q", "k"), 1).is_err());
    }

    /// Fuzzing by property: arbitrary bytes decoded as the public requests, then validated, never panic; what
    /// validation accepts is within every limit (so nothing malformed reaches the log); what it refuses has a
    /// reason and a message. `PROPTEST_CASES` sets the number of cases (2,000 by default).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use prost::Message;

        const NOW: TimeMs = 1_700_000_000_000;

        fn cases() -> ProptestConfig {
            let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
            ProptestConfig { cases, ..ProptestConfig::default() }
        }

        fn check_accepted(cfg: &Config, t: &NewTask) {
            assert!(validate_queue(cfg, &t.queue).is_ok(), "{:?}", t.queue);
            assert!(t.payload.len() <= cfg.max_payload_bytes);
            assert!(t.priority <= 9);
            assert!(t.visible_at <= NOW + cfg.max_delay_ms);
            assert!((1..=cfg.max_attempts_limit).contains(&t.max_attempts));
            assert!(t.idempotency_key.as_ref().is_none_or(|k| k.len() <= cfg.max_idempotency_key_len));
        }

        fn check_refused(e: &ApiError) {
            assert_eq!(e.reason(), raftq_proto::reason::Reason::InvalidArgument);
            assert!(!e.to_string().is_empty());
        }

        proptest! {
            #![proptest_config(cases())]

            #[test]
            fn arbitrary_bytes_decode_and_validate_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
                let cfg = Config::default();
                if let Ok(r) = pb::EnqueueRequest::decode(&bytes[..]) {
                    match enqueue_item(&cfg, "t", r, NOW) {
                        Ok(k) => check_accepted(&cfg, &k.task),
                        Err(e) => check_refused(&e),
                    }
                }
                if let Ok(b) = pb::EnqueueBatchRequest::decode(&bytes[..]) {
                    for r in b.items {
                        if let Err(e) = enqueue_item(&cfg, "t", r, NOW) {
                            check_refused(&e);
                        }
                    }
                }
                if let Ok(a) = pb::AckRequest::decode(&bytes[..]) {
                    let _ = parse_id(&a.task_id).map_err(|e| check_refused(&e));
                    let id = TaskId::new(NOW, 1, 1);
                    let _ = ack_action(&cfg, "t", &id, a.action, NOW).map_err(|e| check_refused(&e));
                }
                if let Ok(c) = pb::ClaimRequest::decode(&bytes[..]) {
                    for q in &c.queues {
                        let _ = validate_queue(&cfg, q);
                    }
                    let _ = lease_ms(&cfg, c.lease_ms);
                }
            }

            #[test]
            fn arbitrary_field_values_are_accepted_only_within_limits(
                queue in ".{0,140}",
                payload in proptest::collection::vec(any::<u8>(), 0..64),
                priority in any::<u32>(),
                delay_ms in prop_oneof![any::<u64>(), 0u64..100_000],
                run_at_ms in prop_oneof![any::<i64>(), 0i64..(NOW as i64 + 100_000)],
                max_attempts in prop_oneof![any::<u32>(), 0u32..5],
                key in ".{0,300}",
                webhook in prop_oneof![Just(String::new()), ".{0,40}", "https?://[a-z]{1,10}(:[0-9]{1,6})?/.{0,20}"],
                traceparent in prop_oneof![Just(String::new()), ".{0,60}", "00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]"],
            ) {
                let cfg = Config::default();
                let r = pb::EnqueueRequest {
                    queue, payload: payload.into(), priority, delay_ms, run_at_ms, max_attempts,
                    idempotency_key: key, webhook_url: webhook,
                    trace: Some(pb::TraceContext { traceparent, tracestate: String::new() }),
                    ..Default::default()
                };
                match new_task(&cfg, "t", r, NOW) {
                    Ok(t) => check_accepted(&cfg, &t),
                    Err(e) => check_refused(&e),
                }
            }
        }
    }
}
