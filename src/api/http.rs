//! The HTTP port: `/healthz` (the process serves) and `/readyz` (the node knows a leader, has applied what it
//! knows to be committed and is not cut off from the cluster), and the REST API (`rest.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::forward::Forwarder;
use crate::leader::proposer::Proposer;
use crate::storage::log_store::LogStats;

/// How far applied may lag behind committed for the node to count as ready.
const READY_MAX_LAG_ENTRIES: u64 = 1_000;

pub fn router(proposer: Arc<Proposer>, log: Arc<LogStats>, rest: super::rest::Rest) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state((proposer.clone(), rest.tasks.fwd.clone()))
        .route("/metrics", get(metrics))
        .with_state((proposer, log))
        .merge(super::ui::routes())
        .merge(super::rest::routes(rest))
        .method_not_allowed_fallback(super::rest::method_not_allowed)
}

/// Prometheus text exposition: task events and latencies, queue depths, Raft state, the log's fsyncs.
async fn metrics(State((p, log)): State<(Arc<Proposer>, Arc<LogStats>)>) -> impl IntoResponse {
    use crate::telemetry::{self as t, gauge, label};
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::with_capacity(8 * 1024);
    p.shared.metrics.render(&mut out);

    // The busiest queues by tasks waiting or running, all their states.
    let mut counts = p.shared.counts(None);
    counts.sort_by_key(|(_, c)| std::cmp::Reverse(c.pending + c.delayed + c.in_progress));
    let mut series = Vec::new();
    for (qk, c) in counts.iter().take(t::MAX_QUEUE_SERIES) {
        let (tenant, queue) = (label(&qk.tenant), label(&qk.queue));
        for (state, v) in [
            ("pending", c.pending),
            ("delayed", c.delayed),
            ("in_progress", c.in_progress),
            ("completed", c.completed),
            ("failed", c.failed),
            ("cancelled", c.cancelled),
            ("dead_lettered", c.dead_lettered),
        ] {
            series.push((format!("tenant=\"{tenant}\",queue=\"{queue}\",state=\"{state}\""), v as f64));
        }
    }
    gauge(&mut out, t::QUEUE_TASKS, "Tasks per state in the busiest queues.", &series);
    let tenants = tenant_series(&counts);
    gauge(&mut out, t::TENANT_TASKS, "Tasks waiting, running and dead-lettered per tenant (the busiest).", &tenants);

    let (limits, key_tasks) = key_limit_series(&p.shared.all_key_limits(crate::leader::proposer::wall_clock_ms()));
    gauge(&mut out, t::KEY_LIMIT, "Concurrency key overrides in force: the key's limit.", &limits);
    gauge(&mut out, t::KEY_TASKS, "Running and pending tasks under a concurrency key override.", &key_tasks);
    let pending = p.shared.webhook_backlog().1 as f64;
    gauge(
        &mut out,
        t::WEBHOOKS_PENDING,
        "Webhook deliveries waiting in the replicated outbox.",
        &[(String::new(), pending)],
    );

    let m = crate::raft::control::status(&p.raft);
    gauge(&mut out, "raftq_raft_term", "Current Raft term.", &[(String::new(), m.term as f64)]);
    gauge(
        &mut out,
        "raftq_raft_leader_id",
        "The leader this node knows (0: none).",
        &[(String::new(), m.leader.unwrap_or(0) as f64)],
    );
    gauge(&mut out, "raftq_raft_is_leader", "1 on the leader.", &[(String::new(), m.leading() as u8 as f64)]);
    gauge(&mut out, "raftq_raft_last_log_index", "Last log index.", &[(String::new(), m.last_log_index as f64)]);
    gauge(&mut out, "raftq_raft_committed_index", "Committed index.", &[(String::new(), m.committed_index as f64)]);
    gauge(&mut out, "raftq_raft_applied_index", "Applied index.", &[(String::new(), m.applied_index as f64)]);
    let lag: Vec<(String, f64)> = m
        .replication
        .iter()
        .map(|(id, matched)| (format!("peer=\"{id}\""), m.last_log_index.saturating_sub(*matched) as f64))
        .collect();
    gauge(&mut out, "raftq_raft_replication_lag_entries", "Entries each follower is behind (on the leader).", &lag);

    log.fsync_latency.render(&mut out, t::FSYNC_SECONDS, "Raft log fsync latency.");
    let _ = std::fmt::Write::write_fmt(
        &mut out,
        format_args!(
            "# HELP {f} Raft log fsyncs.\n# TYPE {f} counter\n{f} {}\n# HELP {e} Raft log entries made durable (divided by fsyncs: entries per fsync).\n# TYPE {e} counter\n{e} {}\n",
            log.fsyncs.load(Relaxed),
            log.entries.load(Relaxed),
            f = t::FSYNCS_TOTAL,
            e = t::SYNCED_ENTRIES_TOTAL,
        ),
    );
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// Per tenant, over all its queues: tasks pending, delayed, in progress and dead-lettered, for the tenants with
/// the most waiting or running (`MAX_QUEUE_SERIES` of them). With many queues per tenant, the queue series show
/// only the busiest queues; these show every tenant's whole load side by side.
fn tenant_series(counts: &[(crate::queue::QueueKey, crate::queue::StateCounts)]) -> Series {
    use crate::telemetry::{label, MAX_QUEUE_SERIES};
    let mut per: std::collections::BTreeMap<&str, crate::queue::StateCounts> = Default::default();
    for (qk, c) in counts {
        per.entry(qk.tenant.as_str()).or_default().add(c);
    }
    let mut per: Vec<_> = per.into_iter().collect();
    per.sort_by_key(|(_, c)| std::cmp::Reverse(c.pending + c.delayed + c.in_progress));
    let mut series = Vec::new();
    for (tenant, c) in per.into_iter().take(MAX_QUEUE_SERIES) {
        let tenant = label(tenant);
        for (state, v) in [
            ("pending", c.pending),
            ("delayed", c.delayed),
            ("in_progress", c.in_progress),
            ("dead_lettered", c.dead_lettered),
        ] {
            series.push((format!("tenant=\"{tenant}\",state=\"{state}\""), v as f64));
        }
    }
    series
}

/// A gauge's samples: labels and value.
type Series = Vec<(String, f64)>;

/// Every tenant's concurrency key overrides in force, the busiest keys (`MAX_QUEUE_SERIES` of them): each one's
/// limit, and its running and pending tasks.
fn key_limit_series(keys: &[(String, crate::storage::KeyLimitRow)]) -> (Series, Series) {
    use crate::telemetry::{label, MAX_QUEUE_SERIES};
    let mut keys: Vec<_> = keys.iter().collect();
    keys.sort_by_key(|(_, r)| std::cmp::Reverse(r.running + r.pending));
    let (mut limits, mut tasks) = (Vec::new(), Vec::new());
    for (tenant, r) in keys.into_iter().take(MAX_QUEUE_SERIES) {
        let at = format!("tenant=\"{}\",key=\"{}\"", label(tenant), label(&r.key));
        limits.push((at.clone(), f64::from(r.limit)));
        tasks.push((format!("{at},state=\"running\""), r.running as f64));
        tasks.push((format!("{at},state=\"pending\""), r.pending as f64));
    }
    (limits, tasks)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Ready: the node knows a leader, has applied what it knows to be committed (within a bound), and is not cut off
/// (a follower that has not heard from its leader, or a leader no quorum answers, for the quorum silence limit:
/// [`Forwarder::cut_off`]). The same rule answers `/readyz` and the gRPC health service. `Err` says why not.
pub fn readiness(raft: &crate::storage::Raft, fwd: &Forwarder) -> Result<(), String> {
    use openraft::type_config::async_runtime::watch::WatchReceiver;
    let (has_leader, committed, applied) = {
        let m = raft.metrics();
        let m = m.borrow_watched();
        let index = |l: &Option<crate::raft::types::LogId>| l.as_ref().map_or(0, |l| l.index);
        (m.current_leader.is_some(), index(&m.local_committed), index(&m.last_applied))
    };
    caught_up(has_leader, committed, applied)?;
    fwd.cut_off().map_or(Ok(()), Err)
}

/// The readiness rule's first part: a leader is known and apply is at most `READY_MAX_LAG_ENTRIES` behind the
/// commit.
fn caught_up(has_leader: bool, committed: u64, applied: u64) -> Result<(), String> {
    if !has_leader {
        return Err("no leader known".into());
    }
    let lag = committed.saturating_sub(applied);
    if lag > READY_MAX_LAG_ENTRIES {
        return Err(format!("applying: {lag} committed entries not yet applied"));
    }
    Ok(())
}

async fn readyz(State((p, fwd)): State<(Arc<Proposer>, Arc<Forwarder>)>) -> (StatusCode, Json<serde_json::Value>) {
    let m = crate::raft::control::status(&p.raft);
    let why = readiness(&p.raft, &fwd).err();
    let ready = why.is_none();
    let body = json!({
        "ready": ready,
        "reason": why,
        "node_id": m.node_id,
        "leader": m.leader,
        "term": m.term,
        "last_log_index": m.last_log_index,
        "applied_index": m.applied_index,
    });
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body))
}
