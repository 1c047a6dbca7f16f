//! The HTTP port: `/healthz` (the process serves) and `/readyz` (the node knows a leader and has applied what
//! it knows to be committed), and the REST API (`rest.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::raft::proposer::Proposer;

/// How far applied may lag behind committed for the node to count as ready.
const READY_MAX_LAG_ENTRIES: u64 = 1_000;

pub fn router(proposer: Arc<Proposer>, rest: super::rest::Rest) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(proposer)
        .merge(super::rest::routes(rest))
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(p): State<Arc<Proposer>>) -> (StatusCode, Json<serde_json::Value>) {
    let m = crate::raft::metrics(&p.raft);
    let applied = m.last_applied.as_ref().map(|l| l.index).unwrap_or(0);
    let committed = m.local_committed.as_ref().map(|l| l.index).unwrap_or(0);
    let ready = m.current_leader.is_some() && committed.saturating_sub(applied) <= READY_MAX_LAG_ENTRIES;
    let body = json!({
        "ready": ready,
        "node_id": m.id,
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "applied_index": applied,
    });
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body))
}
