//! `raftq jobs ...`: the job features of the `Jobs` service from the command line, through the SDK: pause and
//! resume queues, list tasks with filters, schedules, the capacity view.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use raftq_client::{NewTask, QueueCapacity, QueueLimits, Recurrence, Schedule, TaskQuery, TaskState};
use serde_json::json;

use super::client::{print_json, task_json, ClientArgs, Output};

#[derive(clap::Subcommand)]
pub enum JobsCmd {
    /// Pause a queue: it keeps accepting enqueues and serves no claims.
    Pause {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused queue.
    Resume {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the paused queues.
    Paused {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set flow-control limits: a queue's (--queue) running cap and depth limit, or without --queue the
    /// tenant's depth limit over all its queues. A limit not given is removed.
    Limits {
        #[arg(long)]
        queue: Option<String>,
        /// Running tasks at most; claims past it wait.
        #[arg(long)]
        max_running: Option<u32>,
        /// Waiting tasks at most; enqueues past it are refused with QUEUE_FULL.
        #[arg(long)]
        max_depth: Option<u64>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the limits set (the tenant's own is the queue "").
    LimitsList {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List tasks by queue, state and creation time, a page at a time.
    List {
        #[arg(long)]
        queue: Option<String>,
        /// PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED or DEAD_LETTERED.
        #[arg(long)]
        state: Option<String>,
        /// Created at or after (ms since the Unix epoch).
        #[arg(long)]
        from_ms: Option<i64>,
        /// Created before (ms since the Unix epoch).
        #[arg(long)]
        to_ms: Option<i64>,
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// The next_page_token a previous page printed.
        #[arg(long)]
        page_token: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create a recurring task: --cron "*/5 * * * *" [--time-zone Europe/Paris] or --every 30s.
    ScheduleCreate {
        #[arg(long)]
        name: String,
        #[arg(long)]
        queue: String,
        #[arg(long, default_value = "")]
        payload: String,
        #[arg(long)]
        cron: Option<String>,
        #[arg(long)]
        time_zone: Option<String>,
        #[arg(long, value_parser = humantime::parse_duration)]
        every: Option<Duration>,
        /// Missed occurrences (cluster down): skip them, or run the latest once.
        #[arg(long)]
        run_missed_once: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the schedules.
    Schedules {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause a schedule.
    SchedulePause {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a schedule.
    ScheduleResume {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a schedule.
    ScheduleDelete {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Backlog, throughput, time to drain and workers needed, per queue.
    Capacity {
        #[arg(long = "queue")]
        queues: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// A queue's capacity view as REST renders it.
fn capacity_json(c: &QueueCapacity) -> serde_json::Value {
    let [completed_1m, completed_5m, completed_15m] = c.completed;
    let [rate_1m, rate_5m, rate_15m] = c.rate;
    let [need_1h, need_4h, need_8h] = c.workers_needed;
    json!({
        "queue": c.queue, "paused": c.paused, "pending": c.pending, "ready": c.ready, "delayed": c.delayed,
        "running": c.running, "active_workers": c.active_workers,
        "completed_1m": completed_1m, "completed_5m": completed_5m, "completed_15m": completed_15m,
        "rate_1m": rate_1m, "rate_5m": rate_5m, "rate_15m": rate_15m,
        "drain_seconds": c.drain.map(|d| d.as_secs_f64()), "per_worker_rate": c.per_worker_rate,
        "max_running": c.max_running, "max_depth": c.max_depth,
        "keys": c.keys.iter().map(|k| json!({
            "queue": k.queue, "key": k.key, "weight": k.weight, "ready": k.ready, "running": k.running,
            "throttled": k.throttled,
        })).collect::<Vec<_>>(),
        "workers_needed": {"1h": need_1h, "4h": need_4h, "8h": need_8h},
    })
}

/// A schedule as REST renders it.
fn schedule_json(s: &Schedule) -> serde_json::Value {
    json!({
        "id": s.id, "name": s.name, "queue": s.queue, "cron": s.cron, "time_zone": s.time_zone,
        "interval_ms": s.interval_ms, "paused": s.paused, "created_at_ms": s.created_at_ms,
        "missed_policy": if s.run_missed_once { "run_once" } else { "skip" },
        "last_occurrence_ms": s.last_occurrence_ms, "next_occurrence_ms": s.next_occurrence_ms, "fired": s.fired,
    })
}

fn print_limits(out: Output, limits: &[QueueLimits]) {
    match out {
        // As REST answers `GET /v1/limits`.
        Output::Json => print_json(&json!({"limits": limits.iter().map(|l| json!({
            "queue": l.queue, "max_running": l.max_running, "max_depth": l.max_depth,
        })).collect::<Vec<_>>()})),
        Output::Table => {
            let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            println!("{:<24} {:>12} {:>12}", "queue", "max_running", "max_depth");
            for l in limits {
                let q = if l.queue.is_empty() { "(tenant)" } else { &l.queue };
                println!("{q:<24} {:>12} {:>12}", n(l.max_running.map(u64::from)), n(l.max_depth));
            }
        }
    }
}

fn print_pause(out: Output, queue: &str, paused: bool) {
    match out {
        Output::Json => print_json(&json!({"queue": queue, "paused": paused})),
        Output::Table => println!("{queue}\tpaused={paused}"),
    }
}

pub async fn run(cmd: JobsCmd) -> Result<()> {
    match cmd {
        JobsCmd::Pause { queue, client } => {
            let paused = client.connect().await?.pause_queue(&queue).await?;
            print_pause(client.output(), &queue, paused);
        }
        JobsCmd::Resume { queue, client } => {
            let paused = client.connect().await?.resume_queue(&queue).await?;
            print_pause(client.output(), &queue, paused);
        }
        JobsCmd::Paused { client } => {
            let queues = client.connect().await?.paused_queues().await?;
            match client.output() {
                Output::Json => print_json(&json!({ "queues": queues })),
                Output::Table => queues.iter().for_each(|q| println!("{q}")),
            }
        }
        JobsCmd::Limits { queue, max_running, max_depth, client } => {
            let p = client.connect().await?;
            let l = match queue {
                Some(q) => p.set_queue_limits(&q, max_running, max_depth).await?,
                None if max_running.is_some() => bail!("--max-running caps one queue: give --queue"),
                None => p.set_tenant_max_depth(max_depth).await?,
            };
            print_limits(client.output(), &[l]);
        }
        JobsCmd::LimitsList { client } => {
            let limits = client.connect().await?.queue_limits().await?;
            print_limits(client.output(), &limits);
        }
        JobsCmd::List { queue, state, from_ms, to_ms, page_size, page_token, client } => {
            let state = match state {
                None => None,
                Some(s) => Some(TaskState::parse(&s).with_context(|| {
                    format!("unknown state {s:?}: PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED or DEAD_LETTERED")
                })?),
            };
            let query =
                TaskQuery { queue, state, created_from_ms: from_ms, created_to_ms: to_ms, page_size, page_token };
            let page = client.connect().await?.list_tasks(&query).await?;
            match client.output() {
                // As REST answers `GET /v1/tasks`.
                Output::Json => print_json(&json!({
                    "tasks": page.tasks.iter().map(task_json).collect::<Vec<_>>(),
                    "next_page_token": page.next_page_token,
                })),
                Output::Table => {
                    for t in &page.tasks {
                        println!("{}\t{}\t{}\t{}", t.id, t.queue, t.state, t.created_at_ms);
                    }
                    if let Some(next) = &page.next_page_token {
                        println!("next_page_token {next}");
                    }
                }
            }
        }
        JobsCmd::ScheduleCreate { name, queue, payload, cron, time_zone, every, run_missed_once, client } => {
            let when = match (cron, every) {
                (Some(expr), None) => Recurrence::Cron { expr, time_zone: time_zone.unwrap_or_default() },
                (None, Some(d)) => Recurrence::Every(d),
                _ => bail!("give --cron or --every (one of them)"),
            };
            let task = NewTask::new(queue, payload);
            let s = client.connect().await?.create_schedule(&name, task, when, run_missed_once).await?;
            print_schedule(client.output(), &s);
        }
        JobsCmd::Schedules { client } => {
            for s in client.connect().await?.schedules().await? {
                print_schedule(client.output(), &s);
            }
        }
        JobsCmd::SchedulePause { id, client } => {
            let s = client.connect().await?.pause_schedule(&id, true).await?;
            print_schedule(client.output(), &s);
        }
        JobsCmd::ScheduleResume { id, client } => {
            let s = client.connect().await?.pause_schedule(&id, false).await?;
            print_schedule(client.output(), &s);
        }
        JobsCmd::ScheduleDelete { id, client } => {
            client.connect().await?.delete_schedule(&id).await?;
            match client.output() {
                Output::Json => print_json(&json!({"deleted": id})),
                Output::Table => println!("deleted"),
            }
        }
        JobsCmd::Capacity { queues, client } => {
            let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
            let view = client.connect().await?.capacity(&queues).await?;
            match client.output() {
                Output::Json => print_json(&json!(view.iter().map(capacity_json).collect::<Vec<_>>())),
                Output::Table => {
                    println!(
                        "queue\tpending\trunning\tworkers\trate/s(5m)\tdrain_s\tneed_1h\tneed_4h\tneed_8h\tpaused"
                    );
                    let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
                    for c in &view {
                        println!(
                            "{}\t{}\t{}\t{}\t{:.3}\t{}\t{}\t{}\t{}\t{}",
                            c.queue,
                            c.pending,
                            c.running,
                            c.active_workers,
                            c.rate[1],
                            c.drain.map_or("?".into(), |d| format!("{:.0}", d.as_secs_f64())),
                            n(c.workers_needed[0]),
                            n(c.workers_needed[1]),
                            n(c.workers_needed[2]),
                            c.paused
                        );
                        for k in &c.keys {
                            let key = if k.key.is_empty() { "(no key)" } else { &k.key };
                            let throttled = if k.throttled { " throttled" } else { "" };
                            println!(
                                "  key {key}	weight={}	ready={}	running={}{throttled}",
                                k.weight, k.ready, k.running
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn print_schedule(out: Output, s: &Schedule) {
    match out {
        Output::Json => print_json(&schedule_json(s)),
        Output::Table => {
            let when = if s.cron.is_empty() {
                format!("every {} ms", s.interval_ms)
            } else {
                format!("{} {}", s.cron, s.time_zone)
            };
            println!(
                "{}\t{}\t{}\t{when}\tpaused={}\tfired={}\tnext_ms={}",
                s.id, s.name, s.queue, s.paused, s.fired, s.next_occurrence_ms
            );
        }
    }
}
