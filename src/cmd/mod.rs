//! The subcommands of the `raftq` binary, one file per family. Client commands share `client` (flags,
//! connection through the `raftq-client` SDK, output); `serve` runs a node; `bench` speaks the wire protocol
//! itself to measure the server; `bench-suite` runs the README's benchmark scenarios through the SDK.

pub mod backup;
pub mod bench;
mod bench_fairness;
pub mod bench_suite;
pub mod client;
pub mod cluster;
pub mod data;
pub mod dlq;
pub mod jobs;
pub mod queues;
pub mod serve;
pub mod task;
pub mod token;
pub mod worker;

use std::io::IsTerminal;

use raftq::config::{Config, LogFormat};

/// Logs to stderr, filtered by `RAFTQ_LOG`; `json` writes one object per line with the current span's fields
/// (task spans carry `trace_id`, `parent_span_id` and `span_id`). Text is coloured only on a terminal (and not
/// with `NO_COLOR` set), so a log redirected to a file carries no escape codes. With `otlp_endpoint`, trace
/// spans are also exported, whatever `RAFTQ_LOG` lets through to the log. `cfg` is the server's configuration;
/// client commands log text.
pub fn init_logging(cfg: Option<&Config>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAFTQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colour);
    let fmt = match cfg.map(|c| c.log_format).unwrap_or_default() {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_current_span(true).with_span_list(true).with_filter(filter).boxed(),
    };
    let otlp = cfg
        .and_then(|c| Some((c.otlp_endpoint.as_deref()?, c.node_id)))
        .map(|(endpoint, node_id)| raftq::otlp::layer(endpoint, node_id).with_filter(raftq::otlp::filter()));
    tracing_subscriber::registry().with(fmt).with(otlp).init();
}

/// Takes over SIGTERM and SIGINT at once (from this call on, either one ends the returned future instead of
/// killing the process) and returns a future that resolves on the first of them. Call it before any slow start-up,
/// so a signal that arrives meanwhile still shuts down cleanly.
pub fn on_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
