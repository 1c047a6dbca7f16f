//! `raftq task ...`: enqueue, inspect and cancel tasks, and work one by hand (claim, then complete, fail, end
//! with an exception or extend its lease), through the SDK.

use std::time::Duration;

use anyhow::{bail, Result};
use raftq_client::{Acked, Claim, NewTask, Outcome};
use serde_json::json;

use super::client::{bytes_json, print_json, print_task, task_json, ClientArgs, Output};

#[derive(clap::Subcommand)]
pub enum TaskCmd {
    /// Enqueue a task and print its id.
    Enqueue {
        #[arg(long)]
        queue: String,
        #[arg(long, default_value = "")]
        payload: String,
        #[arg(long, default_value_t = 0)]
        priority: u32,
        /// e.g. 5s, 10m
        #[arg(long, value_parser = humantime::parse_duration)]
        delay: Option<Duration>,
        #[arg(long, default_value_t = 0)]
        max_attempts: u32,
        #[arg(long)]
        idempotency_key: Option<String>,
        #[arg(long)]
        webhook_url: Option<String>,
        /// The task must end within this long (e.g. 1h), or it fails with reason deadline-exceeded.
        #[arg(long, value_parser = humantime::parse_duration)]
        deadline: Option<Duration>,
        /// At most --concurrency-limit tasks with this key run at once.
        #[arg(long)]
        concurrency_key: Option<String>,
        #[arg(long, default_value_t = 0)]
        concurrency_limit: u32,
        /// Wait for this task (repeat for several): claimable once all completed, cancelled if one fails.
        #[arg(long = "depends-on")]
        depends_on: Vec<String>,
        /// With --depends-on: wait for them to end whatever their outcome.
        #[arg(long)]
        all_resolved: bool,
        /// Debounce by this key: while its task is pending and never claimed, replace that task's payload and
        /// priority and push its start to now + --debounce-delay instead of creating a task.
        #[arg(long, conflicts_with_all = ["delay", "idempotency_key", "singleton_key"])]
        debounce_key: Option<String>,
        /// With --debounce-key: how long after the last enqueue the task starts (e.g. 5s).
        #[arg(long, value_parser = humantime::parse_duration, requires = "debounce_key")]
        debounce_delay: Option<Duration>,
        /// With --debounce-key: the task starts at most this long after its first enqueue (default: no cap).
        #[arg(long, value_parser = humantime::parse_duration, requires = "debounce_key")]
        debounce_max_wait: Option<Duration>,
        /// Singleton by this key: refused (SINGLETON_ACTIVE) while its task is pending or in progress.
        #[arg(long, conflicts_with = "idempotency_key")]
        singleton_key: Option<String>,
        /// With --singleton-key: drop the enqueue (answer the active task as a duplicate) instead of refusing it.
        #[arg(long, requires = "singleton_key")]
        singleton_skip: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a task.
    Get {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a task's result, optionally waiting for it to end.
    Result {
        id: String,
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a pending or running task.
    Cancel {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Claim tasks as a worker (prints them with their lease tokens).
    Claim {
        #[arg(long, required = true)]
        queue: Vec<String>,
        #[arg(long, default_value = "cli")]
        worker: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long, value_parser = humantime::parse_duration)]
        lease: Option<Duration>,
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Complete a claimed task.
    Complete {
        id: String,
        /// The lease's fencing token (from `task claim`).
        #[arg(long)]
        token: u64,
        #[arg(long, default_value = "")]
        result: String,
        /// Chaining: create QUEUE:PAYLOAD with the completion, all or nothing (repeat for several).
        #[arg(long = "then")]
        then: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fail a claimed task (retried while attempts remain when --retryable).
    Fail {
        id: String,
        /// The lease's fencing token.
        #[arg(long)]
        token: u64,
        #[arg(long, default_value = "failed")]
        error: String,
        #[arg(long)]
        retryable: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// End a claimed task's run with an exception: malformed-payload, worker-shutdown, resource-unavailable or
    /// internal-error.
    Exception {
        id: String,
        /// The lease's fencing token.
        #[arg(long)]
        token: u64,
        #[arg(long)]
        reason: String,
        #[arg(long, default_value = "")]
        message: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Extend a claimed task's lease, optionally reporting progress.
    Heartbeat {
        id: String,
        /// The lease's fencing token.
        #[arg(long)]
        token: u64,
        #[arg(long, value_parser = humantime::parse_duration)]
        extend: Option<Duration>,
        /// Progress, 0-100.
        #[arg(long)]
        percent: Option<u32>,
        #[arg(long, default_value = "")]
        message: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cmd: TaskCmd) -> Result<()> {
    match cmd {
        TaskCmd::Enqueue {
            queue,
            payload,
            priority,
            delay,
            max_attempts,
            idempotency_key,
            webhook_url,
            deadline,
            concurrency_key,
            concurrency_limit,
            depends_on,
            all_resolved,
            debounce_key,
            debounce_delay,
            debounce_max_wait,
            singleton_key,
            singleton_skip,
            client,
        } => {
            let mut task = NewTask::new(queue, payload).priority(priority).max_attempts(max_attempts);
            if let Some(d) = delay {
                task = task.delay(d);
            }
            if let Some(k) = idempotency_key {
                task = task.idempotency_key(k);
            }
            if let Some(u) = webhook_url {
                task = task.webhook(u);
            }
            if let Some(d) = deadline {
                task = task.deadline(d);
            }
            match concurrency_key {
                Some(k) => task = task.concurrency(k, concurrency_limit),
                None if concurrency_limit > 0 => bail!("--concurrency-limit needs --concurrency-key"),
                None => {}
            }
            if !depends_on.is_empty() {
                task = if all_resolved {
                    task.after_all_resolved(depends_on)
                } else {
                    task.after_all_completed(depends_on)
                };
            }
            if let Some(k) = debounce_key {
                task = task.debounce(k, debounce_delay.unwrap_or_default(), debounce_max_wait.unwrap_or_default());
            }
            match singleton_key {
                Some(k) if singleton_skip => task = task.singleton_skip(k),
                Some(k) => task = task.singleton(k),
                None => {}
            }
            let r = client.connect().await?.enqueue(task).await?;
            match client.output() {
                Output::Json => {
                    print_json(&json!({"task_id": r.task_id, "duplicate": r.duplicate, "debounced": r.debounced}))
                }
                Output::Table => println!("{}", r.task_id),
            }
        }
        TaskCmd::Get { id, client } => {
            let t = client.connect().await?.get(&id).await?;
            print_task(client.output(), &t);
        }
        TaskCmd::Result { id, wait, client } => {
            let r = client.connect().await?.result(&id, wait.unwrap_or_default()).await?;
            match client.output() {
                Output::Json => {
                    let (result, result_base64) = bytes_json(&r.result);
                    print_json(&json!({
                        "id": r.id, "state": r.state.as_str(), "done": r.done, "result": result,
                        "result_base64": result_base64, "error": r.error, "attempts": r.attempts,
                        "created_at_ms": r.created_at_ms, "ended_at_ms": r.ended_at_ms,
                    }))
                }
                Output::Table => {
                    println!("state    {}", r.state);
                    println!("done     {}", r.done);
                    println!("result   {}", String::from_utf8_lossy(&r.result));
                    if !r.error.is_empty() {
                        println!("error    {}", r.error);
                    }
                    println!("attempts {}", r.attempts);
                }
            }
        }
        TaskCmd::Cancel { id, client } => {
            let state = client.connect().await?.cancel(&id).await?;
            match client.output() {
                Output::Json => print_json(&json!({"state": state.as_str()})),
                Output::Table => println!("{state}"),
            }
        }
        TaskCmd::Claim { queue, worker, count, lease, wait, client } => {
            let claim =
                Claim::new(worker, queue).count(count).lease(lease.unwrap_or_default()).wait(wait.unwrap_or_default());
            let tasks = client.connect().await?.claim(&claim).await?;
            match client.output() {
                Output::Json => print_json(&serde_json::Value::Array(tasks.iter().map(task_json).collect())),
                Output::Table => {
                    for t in &tasks {
                        println!("{}\t{}\ttoken={}\t{}", t.id, t.queue, t.token(), String::from_utf8_lossy(&t.payload));
                    }
                }
            }
        }
        TaskCmd::Complete { id, token, result, then, client } => {
            let follow_ups = then
                .iter()
                .map(|t| match t.split_once(':') {
                    Some((queue, payload)) => Ok(NewTask::new(queue, payload.to_string())),
                    None => bail!("--then takes QUEUE:PAYLOAD, not {t:?}"),
                })
                .collect::<Result<Vec<_>>>()?;
            let outcome = if follow_ups.is_empty() {
                Outcome::Completed(result.into())
            } else {
                Outcome::CompletedWith { result: result.into(), follow_ups }
            };
            let acked = client.connect().await?.report(&id, token, outcome).await?;
            print_acked(client.output(), &acked);
        }
        TaskCmd::Fail { id, token, error, retryable, client } => {
            let acked = client.connect().await?.report(&id, token, Outcome::Failed { error, retryable }).await?;
            print_acked(client.output(), &acked);
        }
        TaskCmd::Exception { id, token, reason, message, client } => {
            let acked = client.connect().await?.report(&id, token, Outcome::Exception { reason, message }).await?;
            print_acked(client.output(), &acked);
        }
        TaskCmd::Heartbeat { id, token, extend, percent, message, client } => {
            let progress = percent.map(|p| (p, message.as_str()));
            let acked = client.connect().await?.extend_lease(&id, token, extend.unwrap_or_default(), progress).await?;
            print_acked(client.output(), &acked);
        }
    }
    Ok(())
}

/// The answer to a report, as REST renders it, or the state and any follow-up ids.
fn print_acked(out: Output, a: &Acked) {
    match out {
        Output::Json => {
            print_json(&json!({"state": a.state.as_str(), "at_ms": a.at_ms, "follow_up_ids": a.follow_up_ids}))
        }
        Output::Table => {
            println!("{}", a.state);
            for id in &a.follow_up_ids {
                println!("follow-up {id}");
            }
        }
    }
}
