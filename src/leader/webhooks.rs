//! The webhook sender: leader-only delivery of the outbox records apply writes when a task with a webhook URL
//! ends, and the signature scheme receivers verify.
//!
//! Everything a delivery needs is in replicated state (the outbox record in the task's shard), so whichever node
//! leads sends the due deliveries: a new leader resumes at once, with the retry schedule the old one recorded.
//! Each attempt's outcome goes back into the log as a `WebhookOutcome` command (delivered, retry at a time the
//! leader chose, or given up); apply never does I/O. Delivery is at least once: an attempt whose outcome was not
//! committed (the leader died, lost its leadership) is made again, with the same `x-raftq-delivery` id.
//!
//! This module must not block apply or claims: it runs on its own task, reads the outbox through the shared
//! state's indexes, and sends at most `webhook_concurrency` requests at a time, each under a timeout.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::proposer::{wall_clock_ms, Proposer};
use crate::config::Config;
use crate::queue::{Command, DeliveryId, TimeMs, WebhookDelivery, WebhookOutcome, WebhookReport};
use crate::telemetry::{trace_ids, WebhookEvent};

/// The signature header: `t=<unix ms>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "x-raftq-signature";
/// The delivery id, the same on every attempt of one delivery: receivers deduplicate on it.
pub const DELIVERY_HEADER: &str = "x-raftq-delivery";
/// The tracing target of the `webhook.deliver` spans (this module's path): the OTLP exporter exports them.
pub const SPAN_TARGET: &str = module_path!();
/// How long the sender sleeps at most when nothing is due soon (it is also woken by new deliveries).
const IDLE_SLEEP: Duration = Duration::from_millis(1_000);
/// How soon the sender looks again while due deliveries wait for a free slot or an in-flight outcome.
const BUSY_SLEEP: Duration = Duration::from_millis(100);

/// Pause before proposing outcomes again after a failed proposal.
const PROPOSAL_RETRY: Duration = Duration::from_millis(100);

type HmacSha256 = Hmac<sha2::Sha256>;

/// The signature header's value for `body` sent at `t_ms`.
pub fn sign(key: &[u8], t_ms: u64, body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(t_ms.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let sig: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t_ms},v1={sig}")
}

/// Checks a signature header against `body` (in constant time); returns the signed time when it matches.
pub fn verify(key: &[u8], header: &str, body: &[u8]) -> Option<u64> {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("v1", v)) => v1 = Some(v),
            _ => {}
        }
    }
    let (t, v1) = (t?, v1?);
    if v1.len() % 2 != 0 {
        return None;
    }
    let sig: Vec<u8> =
        (0..v1.len()).step_by(2).map(|i| u8::from_str_radix(v1.get(i..i + 2)?, 16).ok()).collect::<Option<_>>()?;
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&sig).ok().map(|_| t)
}

/// The JSON body of a delivery. Results are bytes: `result` is the UTF-8 text (null when not UTF-8) and
/// `result_base64` always carries them, as in the REST API.
pub fn body(d: &WebhookDelivery) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let result = d.result.as_deref();
    let v = json!({
        "delivery_id": d.id.to_string(),
        "task_id": d.id.task_id.to_string(),
        "tenant": d.tenant,
        "queue": d.queue,
        "state": d.state.as_str(),
        "attempts": d.attempts,
        "result": result.and_then(|r| std::str::from_utf8(r).ok()),
        "result_base64": result.map(|r| b64.encode(r)),
        "error": d.error,
        "created_at_ms": d.created_at,
        "ended_at_ms": d.ended_at,
        "delivery_attempt": d.tries + 1,
        "traceparent": d.traceparent,
    });
    serde_json::to_vec(&v).expect("a JSON value serialises")
}

/// A `traceparent` for an outgoing request: the same trace, a new span id (the delivery's span), same flags.
fn child_traceparent(traceparent: Option<&str>) -> Option<(String, String)> {
    let tp = traceparent?;
    let (Some(trace), Some(_)) = trace_ids(Some(tp)) else { return None };
    let flags = tp.rsplit('-').next().unwrap_or("01");
    let span = format!("{:016x}", rand::random::<u64>().max(1));
    Some((format!("00-{trace}-{span}-{flags}"), span))
}

/// Settings of the sender, read from the config once.
#[derive(Clone)]
struct Settings {
    key: Option<Arc<[u8]>>,
    max_attempts: u32,
    retry_base_ms: u64,
    retry_max_ms: u64,
    timeout: Duration,
    concurrency: usize,
}

impl Settings {
    /// Backoff after the `tries`-th failed attempt: base * 2^(tries-1), capped.
    fn backoff_ms(&self, tries: u32) -> u64 {
        let shift = tries.saturating_sub(1).min(40);
        self.retry_base_ms.saturating_mul(1u64 << shift).min(self.retry_max_ms)
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// The sender: its settings and HTTP client, made once; `lead` is its work for one term.
#[derive(Clone)]
pub struct Sender {
    settings: Settings,
    client: HttpClient,
}

impl Sender {
    pub fn new(cfg: &Config, key: Option<Vec<u8>>) -> Sender {
        let settings = Settings {
            key: key.map(Into::into),
            max_attempts: cfg.webhook_max_attempts,
            retry_base_ms: cfg.webhook_retry_base_ms,
            retry_max_ms: cfg.webhook_retry_max_ms,
            timeout: Duration::from_millis(cfg.webhook_timeout_ms),
            concurrency: cfg.webhook_concurrency,
        };
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(settings.timeout));
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
        Sender { settings, client }
    }

    /// Sends due deliveries and proposes their outcomes while this node leads. When the term ends this future is
    /// dropped with its attempts and proposals (aborted with their `JoinSet`s): whatever was in flight is sent
    /// again by the next leader, its outcome was never committed.
    pub async fn lead(self, proposer: Arc<Proposer>) {
        let Sender { settings, client } = self;
        let shared = proposer.shared.clone();
        let mut added = shared.webhooks.subscribe();
        let mut in_flight: HashSet<DeliveryId> = HashSet::new();
        let mut attempts: JoinSet<WebhookReport> = JoinSet::new();
        // A proposal answers the ids it recorded, or gives its reports back to be proposed again.
        let mut proposals: JoinSet<Result<Vec<DeliveryId>, Vec<WebhookReport>>> = JoinSet::new();
        let mut reports: Vec<WebhookReport> = Vec::new();
        loop {
            let now = wall_clock_ms();
            let free = settings.concurrency.saturating_sub(attempts.len());
            if free > 0 {
                match shared.due_deliveries(now, free, &in_flight) {
                    Ok(due) => {
                        for d in due {
                            in_flight.insert(d.id);
                            attempts.spawn(attempt(client.clone(), settings.clone(), d));
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the webhook outbox"),
                }
            }
            let sleep = match shared.webhook_backlog().0 {
                Some(next) if next > now => Duration::from_millis(next - now).min(IDLE_SLEEP),
                Some(_) => BUSY_SLEEP,
                None => IDLE_SLEEP,
            };
            tokio::select! {
                _ = added.changed() => {}
                Some(done) = attempts.join_next(), if !attempts.is_empty() => {
                    if let Ok(report) = done {
                        let event = match &report.outcome {
                            WebhookOutcome::Delivered => WebhookEvent::Delivered,
                            WebhookOutcome::Retry { .. } => WebhookEvent::Retry,
                            WebhookOutcome::GaveUp { .. } => WebhookEvent::GaveUp,
                        };
                        shared.metrics.webhook(event);
                        reports.push(report);
                    }
                }
                Some(done) = proposals.join_next(), if !proposals.is_empty() => {
                    match done {
                        Ok(Ok(ids)) => {
                            for id in ids {
                                in_flight.remove(&id);
                            }
                        }
                        Ok(Err(again)) => reports.extend(again),
                        Err(_) => {}
                    }
                }
                _ = tokio::time::sleep(sleep) => {}
            }
            // One outcome entry at a time; outcomes that arrive meanwhile share the next one.
            if proposals.is_empty() && !reports.is_empty() {
                let batch = std::mem::take(&mut reports);
                let p = proposer.clone();
                proposals.spawn(async move {
                    let ids = batch.iter().map(|r| r.id).collect();
                    match p.write(Command::WebhookOutcome(batch.clone())).await {
                        Ok(_) => Ok(ids),
                        Err(e) => {
                            // Right after an election the new leader may not accept writes yet. The outcomes are
                            // proposed again (a report already applied changes nothing), not the requests re-sent;
                            // if this node stops leading, the next leader sends them again.
                            tracing::debug!(error = %e, "webhook outcomes not recorded yet");
                            tokio::time::sleep(PROPOSAL_RETRY).await;
                            Err(batch)
                        }
                    }
                });
            }
        }
    }
}

/// One delivery attempt; never fails: its outcome is the report.
async fn attempt(client: HttpClient, s: Settings, d: WebhookDelivery) -> WebhookReport {
    let (trace_id, parent_span_id) = trace_ids(d.traceparent.as_deref());
    let child = child_traceparent(d.traceparent.as_deref());
    let span = tracing::info_span!(
        "webhook.deliver",
        task_id = %d.id.task_id,
        delivery_id = %d.id,
        queue = %d.queue,
        try_no = d.tries + 1,
        trace_id,
        parent_span_id,
        span_id = child.as_ref().map(|c| c.1.as_str()),
    );
    let error = send(&client, &s, &d, child.map(|c| c.0)).instrument(span.clone()).await.err();
    let permanent = matches!(&error, Some(Failure::Permanent(_)));
    let error = error.map(|e| match e {
        Failure::Permanent(e) | Failure::Transient(e) => e,
    });
    let _enter = span.enter();
    let outcome = match error {
        None => {
            tracing::debug!("webhook delivered");
            WebhookOutcome::Delivered
        }
        Some(error) if permanent || d.tries + 1 >= s.max_attempts => {
            tracing::warn!(error = %error, "webhook given up");
            WebhookOutcome::GaveUp { error }
        }
        Some(error) => {
            let at: TimeMs = wall_clock_ms().saturating_add(s.backoff_ms(d.tries + 1));
            tracing::info!(error = %error, retry_at_ms = at, "webhook attempt failed");
            WebhookOutcome::Retry { at, error }
        }
    };
    WebhookReport { id: d.id, tries: d.tries, outcome }
}

/// Why an attempt failed: worth retrying (the receiver may come back), or never deliverable (given up at once).
enum Failure {
    Transient(String),
    Permanent(String),
}

async fn send(
    client: &HttpClient,
    s: &Settings,
    d: &WebhookDelivery,
    traceparent: Option<String>,
) -> Result<(), Failure> {
    let uri: hyper::Uri = d.url.parse().map_err(|e| Failure::Permanent(format!("bad url: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(Failure::Permanent("only http:// webhook URLs are delivered by this server".into()));
    }
    let body = body(d);
    let mut req = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, concat!("raftq/", env!("CARGO_PKG_VERSION")))
        .header(DELIVERY_HEADER, d.id.to_string());
    if let Some(key) = &s.key {
        req = req.header(SIGNATURE_HEADER, sign(key, wall_clock_ms(), &body));
    }
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
        if let Some(ts) = &d.tracestate {
            req = req.header("tracestate", ts.as_str());
        }
    }
    let req = req.body(Full::new(Bytes::from(body))).map_err(|e| Failure::Permanent(format!("request: {e}")))?;
    match tokio::time::timeout(s.timeout, client.request(req)).await {
        Err(_) => Err(Failure::Transient(format!("no answer within {} ms", s.timeout.as_millis()))),
        Ok(Err(e)) => Err(Failure::Transient(format!("{e:?}").chars().take(300).collect())),
        Ok(Ok(resp)) if resp.status().is_success() => Ok(()),
        Ok(Ok(resp)) => Err(Failure::Transient(format!("HTTP {}", resp.status().as_u16()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_with_the_same_key_and_body() {
        let h = sign(b"k1", 1_700_000_000_000, b"{\"a\":1}");
        assert!(h.starts_with("t=1700000000000,v1="), "{h}");
        assert_eq!(verify(b"k1", &h, b"{\"a\":1}"), Some(1_700_000_000_000));
        assert_eq!(verify(b"k2", &h, b"{\"a\":1}"), None);
        assert_eq!(verify(b"k1", &h, b"{\"a\":2}"), None);
        assert_eq!(verify(b"k1", &h.replace("t=1700000000000", "t=1700000000001"), b"{\"a\":1}"), None);
        assert_eq!(verify(b"k1", "v1=zz", b""), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let s = Settings {
            key: None,
            max_attempts: 5,
            retry_base_ms: 100,
            retry_max_ms: 350,
            timeout: Duration::from_secs(1),
            concurrency: 1,
        };
        assert_eq!((1..=4).map(|t| s.backoff_ms(t)).collect::<Vec<_>>(), vec![100, 200, 350, 350]);
    }

    #[test]
    fn outgoing_traceparent_keeps_the_trace_and_flags() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (child, span) = child_traceparent(Some(tp)).expect("child");
        assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{child}");
        assert!(child.ends_with("-01") && !child.contains("00f067aa0ba902b7"), "{child}");
        assert_eq!(span.len(), 16);
        assert_eq!(trace_ids(Some(tp)), (Some("4bf92f3577b34da6a3ce929d0e0e4736"), Some("00f067aa0ba902b7")));
        assert_eq!(child_traceparent(None), None);
    }
}
