//! Optional OTLP export of raftq's trace spans (OTLP/HTTP with the JSON encoding, `POST <endpoint>/v1/traces`),
//! on when `otlp_endpoint` is configured.
//!
//! A `tracing` layer takes the spans that carry a W3C trace context (per-task steps on `raftq::trace`, webhook
//! attempts), each with its `trace_id`, `span_id` and `parent_span_id` fields (the parent is the caller's span
//! from the traceparent given at enqueue), and hands them to an exporter task that posts them in batches with the
//! same small HTTP client as the webhook sender. It never blocks the code that made the span: a full buffer drops
//! spans (counted in a warning), a collector that is down loses the batch. No OpenTelemetry SDK is linked.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Spans buffered for export; more are dropped rather than slowing the queue.
const BUFFER_SPANS: usize = 8192;
/// Most spans in one export request.
const BATCH_SPANS: usize = 512;
/// How long spans wait for a batch to fill before they are sent.
const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// Longest one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// One finished span, ready to export.
#[derive(Debug, Clone)]
struct SpanRecord {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    start_ns: u64,
    end_ns: u64,
    attributes: Vec<(String, String)>,
}

/// Fields recorded from a span, kept in its extensions until it closes.
#[derive(Default)]
struct Fields {
    start_ns: u64,
    values: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.values.push((field.name().to_string(), value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        // `%x` fields come through Debug of a Display wrapper: no quotes to strip. `?x` of a string has them.
        let text = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')).map(String::from).unwrap_or(text);
        self.values.push((field.name().to_string(), text));
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// The layer: install it with a filter that lets through `raftq::trace` (debug) and the webhook sender's spans.
pub struct OtlpLayer {
    tx: mpsc::Sender<SpanRecord>,
    dropped: Arc<AtomicU64>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for OtlpLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields { start_ns: now_ns(), values: vec![] };
        attrs.record(&mut f);
        span.extensions_mut().insert(f);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(f) = span.extensions_mut().remove::<Fields>() else { return };
        let get = |k: &str| f.values.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let (Some(trace_id), Some(span_id)) = (get("trace_id"), get("span_id")) else { return };
        let name = match get("op") {
            Some(op) => format!("raftq.{op}"),
            None => format!("raftq.{}", span.name()),
        };
        let skip = ["trace_id", "span_id", "parent_span_id", "op"];
        let record = SpanRecord {
            name,
            trace_id,
            span_id,
            parent_span_id: get("parent_span_id"),
            start_ns: f.start_ns,
            end_ns: now_ns(),
            attributes: f
                .values
                .iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .map(|(k, v)| (format!("raftq.{k}"), v.clone()))
                .collect(),
        };
        if self.tx.try_send(record).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// The filter for the layer: the spans it exports, whatever `RAFTQ_LOG` says.
pub fn filter() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target(crate::telemetry::TRACE_TARGET, tracing::Level::DEBUG)
        .with_target(crate::leader::webhooks::SPAN_TARGET, tracing::Level::INFO)
}

/// The layer and its exporter task (spawned on the current tokio runtime). `endpoint` is the collector's base
/// URL, e.g. `http://127.0.0.1:4318`. The exporter lives as long as the process's subscriber (it is not part of
/// a node's shutdown): spans of the last half second before exit may not be sent.
pub fn layer(endpoint: &str, node_id: u64) -> OtlpLayer {
    let (tx, rx) = mpsc::channel(BUFFER_SPANS);
    let dropped = Arc::new(AtomicU64::new(0));
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    tokio::spawn(export(url, node_id, rx, dropped.clone()));
    OtlpLayer { tx, dropped }
}

fn attribute(k: &str, v: &str) -> Value {
    json!({"key": k, "value": {"stringValue": v}})
}

fn body(node_id: u64, spans: &[SpanRecord]) -> Vec<u8> {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "name": s.name,
                // INTERNAL, or CLIENT for a webhook request.
                "kind": if s.name == "raftq.webhook.deliver" { 3 } else { 1 },
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
            });
            if let Some(p) = &s.parent_span_id {
                v["parentSpanId"] = json!(p);
            }
            v
        })
        .collect();
    let doc = json!({"resourceSpans": [{
        "resource": {"attributes": [attribute("service.name", "raftq"), attribute("raftq.node_id", &node_id.to_string())]},
        "scopeSpans": [{"scope": {"name": "raftq", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]});
    serde_json::to_vec(&doc).expect("a JSON value serialises")
}

async fn export(url: String, node_id: u64, mut rx: mpsc::Receiver<SpanRecord>, dropped: Arc<AtomicU64>) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut batch = Vec::with_capacity(BATCH_SPANS);
    loop {
        let first = match rx.recv().await {
            Some(s) => s,
            None => return,
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
        while batch.len() < BATCH_SPANS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                Ok(None) | Err(_) => break,
            }
        }
        let req = hyper::Request::post(url.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body(node_id, &batch))));
        let sent = match req {
            Ok(req) => match tokio::time::timeout(EXPORT_TIMEOUT, client.request(req)).await {
                Ok(Ok(r)) if r.status().is_success() => Ok(()),
                Ok(Ok(r)) => Err(format!("HTTP {}", r.status().as_u16())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        // Logged on another target than the exported ones, so a failing export does not feed itself.
        if let Err(error) = sent {
            tracing::warn!(target: "raftq::otlp", error = %error, spans = batch.len(), "OTLP export failed");
        }
        let lost = dropped.swap(0, Relaxed);
        if lost > 0 {
            tracing::warn!(target: "raftq::otlp", spans = lost, "OTLP spans dropped: export buffer full");
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_body_is_otlp_json_with_hex_ids_and_the_parent() {
        let s = SpanRecord {
            name: "raftq.claim".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "1111111111111111".into(),
            parent_span_id: Some("00f067aa0ba902b7".into()),
            start_ns: 5,
            end_ns: 7,
            attributes: vec![("raftq.task_id".into(), "ab".into())],
        };
        let v: Value = serde_json::from_slice(&body(3, &[s])).expect("json");
        let span = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!((span["startTimeUnixNano"].as_str(), span["kind"].as_u64()), (Some("5"), Some(1)));
        assert_eq!(span["attributes"][0]["value"]["stringValue"], "ab");
        assert_eq!(v["resourceSpans"][0]["resource"]["attributes"][1]["value"]["stringValue"], "3");
    }
}
