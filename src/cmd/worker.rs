//! `raftq worker --queue Q -- CMD ARGS...`: runs a command per task, through the client SDK's worker.
//!
//! The task's payload is the command's standard input. Exit status 0 completes the task with the command's
//! standard output as the result; any other exit (or a timeout, or a command that cannot be started) fails it,
//! retryably, with the standard error as the error, so the task is retried while attempts remain and then
//! dead-lettered. The command also sees `RAFTQ_TASK_ID`, `RAFTQ_QUEUE`, `RAFTQ_ATTEMPT`, `RAFTQ_MAX_ATTEMPTS`
//! and `RAFTQ_FENCING_TOKEN` (the delivery's token, for writes to stores that refuse older tokens) in its
//! environment. When the task is cancelled, its deadline passes or its lease is lost while the command runs (the
//! server tells the worker at once), or the command outlives `--task-timeout`, it gets SIGTERM, then SIGKILL after
//! `--kill-grace`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use raftq_client::{Applied, CancellationToken, Outcome, Rejection, Task, Worker, WorkerConfig};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::client::{print_json, ClientArgs, Output};

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Queues to take tasks from (repeat for several).
    #[arg(long = "queue", required = true)]
    pub queues: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
    /// The old spelling of --auth-token.
    #[arg(long = "token", hide = true)]
    pub legacy_token: Option<String>,
    /// Commands running at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Lease per task; it is extended while the command runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub lease: Duration,
    /// Stop a command that runs longer than this (SIGTERM, then SIGKILL) and fail its task.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub task_timeout: Duration,
    /// How long a command may take to exit after SIGTERM (its task was cancelled, its deadline passed, its lease
    /// was lost, or it timed out) before it gets SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub kill_grace: Duration,
    /// On SIGINT/SIGTERM, how long running commands may take before their tasks are given back.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub shutdown_grace: Duration,
    #[arg(long)]
    pub worker_id: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// How long the last outcomes may take to be printed once the worker stopped (they are already in memory).
const REPORT_DRAIN: Duration = Duration::from_secs(2);

/// Error texts stored with a task are bounded; keep the end of stderr, where the reason usually is.
const MAX_ERROR_BYTES: usize = 4000;

fn tail(b: &[u8]) -> String {
    let start = b.len().saturating_sub(MAX_ERROR_BYTES);
    String::from_utf8_lossy(&b[start..]).trim().to_string()
}

/// How a command's run ended.
enum Ended {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    /// The delivery ended under it: the reason (`CANCELLED`, `DEADLINE_EXCEEDED`, `LEASE_EXPIRED`, ...).
    Revoked(String),
}

/// SIGTERM, then SIGKILL when the command has not exited within `grace`.
async fn stop(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

async fn read_all<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut r) = r {
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut r, &mut buf).await;
    }
    buf
}

async fn run_one(command: Arc<Vec<String>>, timeout: Duration, kill_grace: Duration, task: Task) -> Outcome {
    let fail = |error: String| Outcome::Failed { error, retryable: true };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("RAFTQ_TASK_ID", &task.id)
        .env("RAFTQ_QUEUE", &task.queue)
        .env("RAFTQ_ATTEMPT", task.attempts.to_string())
        .env("RAFTQ_MAX_ATTEMPTS", task.max_attempts.to_string())
        .env("RAFTQ_FENCING_TOKEN", task.fencing_token().to_string());
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
    let outputs = futures::future::join(read_all(child.stdout.take()), read_all(child.stderr.take()));
    let cancel = task.cancellation();
    let supervise = async {
        tokio::select! {
            s = child.wait() => Ended::Exited(s),
            _ = tokio::time::sleep(timeout) => {
                stop(&mut child, kill_grace).await;
                Ended::TimedOut
            }
            _ = cancel.cancelled() => {
                stop(&mut child, kill_grace).await;
                Ended::Revoked(task.revocation().unwrap_or("CANCELLED").to_string())
            }
        }
    };
    let (ended, (stdout, stderr)) = futures::future::join(supervise, outputs).await;
    match ended {
        Ended::TimedOut => fail(format!("timed out after {timeout:?}")),
        Ended::Revoked(why) => {
            eprintln!("raftq worker: task {}: its delivery ended ({why}); the command was stopped", task.id);
            Outcome::Abandon
        }
        Ended::Exited(Err(e)) => fail(format!("waiting for the command: {e}")),
        Ended::Exited(Ok(status)) if status.success() => Outcome::Completed(stdout.into()),
        Ended::Exited(Ok(status)) => {
            let err = tail(&stderr);
            fail(if err.is_empty() { format!("exited with {status}") } else { err })
        }
    }
}

pub async fn run(mut a: WorkerArgs, shutdown: CancellationToken) -> Result<()> {
    if a.command.is_empty() {
        bail!("give the command to run after --");
    }
    if a.client.auth_token.is_none() {
        a.client.auth_token = a.legacy_token.take();
    }
    let mut cfg = WorkerConfig {
        addrs: a.client.addrs.clone(),
        tls_ca_pem: a.client.ca_pem()?,
        token: a.client.token()?,
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
    let out = a.client.output();
    let reports = report(out, &worker);
    let command = Arc::new(a.command.clone());
    let (timeout, kill_grace) = (a.task_timeout, a.kill_grace);
    eprintln!("raftq worker: running `{}` for queues {:?}", a.command.join(" "), a.queues);
    let summary = worker.run(move |task| run_one(command.clone(), timeout, kill_grace, task), shutdown).await;
    // Without the worker its event channels close: the reporter prints what is still queued, then ends.
    drop(worker);
    if tokio::time::timeout(REPORT_DRAIN, reports).await.is_err() {
        eprintln!("raftq worker: some outcomes were not reported");
    }
    let summary = summary?;
    match out {
        Output::Json => print_json(&json!({"event": "stopped", "claimed": summary.claimed,
            "completed": summary.completed, "failed": summary.failed, "nacked": summary.nacked,
            "abandoned": summary.abandoned, "exceptions": summary.exceptions, "rejected": summary.rejected,
            "unconfirmed": summary.unconfirmed, "reconnects": summary.reconnects})),
        Output::Table => eprintln!("raftq worker: stopped: {summary:?}"),
    }
    Ok(())
}

/// What happens to each task's outcome: with `--output json`, one line per applied and refused outcome on
/// stdout; else refusals on stderr.
fn report(out: Output, worker: &Worker) -> tokio::task::JoinHandle<()> {
    let mut applied = worker.applied();
    let mut rejections = worker.rejections();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        let (mut applied_open, mut rejections_open) = (out == Output::Json, true);
        while applied_open || rejections_open {
            tokio::select! {
                a = applied.recv(), if applied_open => match a {
                    Ok(a) => print_json(&applied_json(&a)),
                    Err(RecvError::Lagged(n)) => eprintln!("raftq worker: {n} applied outcomes not shown"),
                    Err(RecvError::Closed) => applied_open = false,
                },
                r = rejections.recv(), if rejections_open => match r {
                    Ok(r) if out == Output::Json => print_json(&rejected_json(&r)),
                    Ok(r) => eprintln!("raftq worker: the server refused a result: {r:?}"),
                    Err(RecvError::Lagged(n)) => eprintln!("raftq worker: {n} refused outcomes not shown"),
                    Err(RecvError::Closed) => rejections_open = false,
                },
            }
        }
    })
}

/// The kind of an outcome, as the server names the action.
fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Completed(_) | Outcome::CompletedWith { .. } => "complete",
        Outcome::Failed { .. } => "fail",
        Outcome::Nack { .. } => "nack",
        Outcome::Abandon => "abandon",
        Outcome::Exception { .. } => "exception",
    }
}

fn applied_json(a: &Applied) -> serde_json::Value {
    json!({"event": "applied", "task_id": a.task_id, "outcome": outcome_name(&a.outcome), "state": a.state.as_str(),
        "at_ms": a.at_ms})
}

fn rejected_json(r: &Rejection) -> serde_json::Value {
    json!({"event": "rejected", "task_id": r.task_id, "outcome": outcome_name(&r.outcome), "reason": r.reason,
        "message": r.message, "maybe_applied": r.maybe_applied})
}
