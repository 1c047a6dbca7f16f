//! `raftq worker --queue Q -- CMD ARGS...`: runs a command per task, through the client SDK's worker.
//!
//! The task's payload is the command's standard input. Exit status 0 completes the task with the command's
//! standard output as the result; any other exit (or a timeout, or a command that cannot be started) fails it,
//! retryably, with the standard error as the error, so the task is retried while attempts remain and then
//! dead-lettered. The command also sees `RAFTQ_TASK_ID`, `RAFTQ_QUEUE`, `RAFTQ_ATTEMPT` and
//! `RAFTQ_MAX_ATTEMPTS` in its environment.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use raftq_client::{CancellationToken, Outcome, Task, Worker, WorkerConfig};
use tokio::io::AsyncWriteExt;

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Queues to take tasks from (repeat for several).
    #[arg(long = "queue", required = true)]
    pub queues: Vec<String>,
    /// Nodes to connect to, tried in order (repeat, or comma-separated).
    #[arg(long = "addr", env = "RAFTQ_ADDR", value_delimiter = ',', default_value = "http://127.0.0.1:9091")]
    pub addrs: Vec<String>,
    #[arg(long, env = "RAFTQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to verify TLS servers with.
    #[arg(long, env = "RAFTQ_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Commands running at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Lease per task; it is extended while the command runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub lease: Duration,
    /// Kill a command that runs longer than this and fail its task.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub task_timeout: Duration,
    /// On SIGINT/SIGTERM, how long running commands may take before their tasks are given back.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub shutdown_grace: Duration,
    #[arg(long)]
    pub worker_id: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Error texts stored with a task are bounded; keep the end of stderr, where the reason usually is.
const MAX_ERROR_BYTES: usize = 4000;

fn tail(b: &[u8]) -> String {
    let start = b.len().saturating_sub(MAX_ERROR_BYTES);
    String::from_utf8_lossy(&b[start..]).trim().to_string()
}

async fn run_one(command: Arc<Vec<String>>, timeout: Duration, task: Task) -> Outcome {
    let fail = |error: String| Outcome::Failed { error, retryable: true };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("RAFTQ_TASK_ID", &task.id)
        .env("RAFTQ_QUEUE", &task.queue)
        .env("RAFTQ_ATTEMPT", task.attempts.to_string())
        .env("RAFTQ_MAX_ATTEMPTS", task.max_attempts.to_string());
    // The task's trace context, as OpenTelemetry's environment carrier names it, so the command's own spans join
    // the producer's trace.
    match &task.trace {
        Some(trace) => cmd.env("TRACEPARENT", &trace.traceparent).env("TRACESTATE", &trace.tracestate),
        None => cmd.env_remove("TRACEPARENT").env_remove("TRACESTATE"),
    };
    let mut child =
        match cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn() {
            Ok(c) => c,
            Err(e) => return fail(format!("cannot start {}: {e}", command[0])),
        };
    if let Some(mut stdin) = child.stdin.take() {
        let payload = task.payload.clone();
        // A command that does not read its input must not block the worker: write in the background.
        tokio::spawn(async move {
            let _ = stdin.write_all(&payload).await;
        });
    }
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => fail(format!("timed out after {timeout:?}")),
        Ok(Err(e)) => fail(format!("waiting for the command: {e}")),
        Ok(Ok(out)) if out.status.success() => Outcome::Completed(out.stdout.into()),
        Ok(Ok(out)) => {
            let err = tail(&out.stderr);
            fail(if err.is_empty() { format!("exited with {}", out.status) } else { err })
        }
    }
}

pub async fn run(a: WorkerArgs, shutdown: CancellationToken) -> Result<()> {
    if a.command.is_empty() {
        bail!("give the command to run after --");
    }
    let mut cfg = WorkerConfig {
        addrs: a.addrs.clone(),
        tls_ca_pem: a.ca_file.as_ref().map(std::fs::read).transpose()?,
        // Without a token: one minted from the local node's secret, when readable (as the other commands do).
        token: match &a.token {
            Some(t) => Some(t.clone()),
            None => {
                let dir = std::env::var_os("RAFTQ_DATA_DIR").map(std::path::PathBuf::from);
                raftq::auth::local_cli_token(&dir.unwrap_or_else(|| "./raftq-data".into()))
                    .map_err(|e| anyhow::anyhow!(e))?
            }
        },
        queues: a.queues.clone(),
        concurrency: a.concurrency.max(1),
        lease: a.lease,
        heartbeat: Some(a.lease / 3),
        shutdown_grace: a.shutdown_grace,
        ..WorkerConfig::default()
    };
    if let Some(id) = &a.worker_id {
        cfg.worker_id = id.clone();
    }
    let worker = Worker::new(cfg)?;
    let mut rejections = worker.rejections();
    tokio::spawn(async move {
        while let Ok(r) = rejections.recv().await {
            eprintln!("raftq worker: the server refused a result: {r:?}");
        }
    });
    let command = Arc::new(a.command.clone());
    let timeout = a.task_timeout;
    eprintln!("raftq worker: running `{}` for queues {:?}", a.command.join(" "), a.queues);
    let summary = worker.run(move |task| run_one(command.clone(), timeout, task), shutdown).await?;
    eprintln!("raftq worker: stopped: {summary:?}");
    Ok(())
}
