//! `raftq jobs ...`: the job features of the `Jobs` service from the command line: pause and resume queues, list
//! tasks with filters, the capacity view.

use std::time::Duration;

use anyhow::{Context, Result};
use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;

#[derive(clap::Subcommand)]
pub enum JobsCmd {
    /// Pause a queue: it keeps accepting enqueues and serves no claims.
    Pause {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// Resume a paused queue.
    Resume {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// List the paused queues.
    Paused {
        #[command(flatten)]
        client: JobsClientArgs,
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
        client: JobsClientArgs,
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
        client: JobsClientArgs,
    },
    /// List the schedules.
    Schedules {
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// Pause a schedule.
    SchedulePause {
        id: String,
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// Resume a schedule.
    ScheduleResume {
        id: String,
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// Delete a schedule.
    ScheduleDelete {
        id: String,
        #[command(flatten)]
        client: JobsClientArgs,
    },
    /// Backlog, throughput, time to drain and workers needed, per queue.
    Capacity {
        #[arg(long = "queue")]
        queues: Vec<String>,
        #[command(flatten)]
        client: JobsClientArgs,
    },
}

#[derive(clap::Args, Clone)]
pub struct JobsClientArgs {
    #[arg(long, env = "RAFTQ_ADDR", default_value = "http://127.0.0.1:9091")]
    addr: String,
    /// Bearer token (a JWT); without one, minted from the local secret as the other commands do.
    #[arg(long = "auth-token", env = "RAFTQ_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// CA certificate (PEM) to verify a TLS server with.
    #[arg(long, env = "RAFTQ_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    #[arg(long = "local-data-dir", env = "RAFTQ_DATA_DIR", default_value = "./raftq-data")]
    local_data_dir: std::path::PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

async fn connect(c: &JobsClientArgs) -> Result<JobsClient<crate::Authed>> {
    let ch = crate::channel_to(&c.addr, c.ca_file.as_ref(), None).await?;
    let token = match &c.auth_token {
        Some(t) => Some(t.trim().to_string()),
        None => raftq::auth::local_cli_token(&c.local_data_dir).map_err(|e| anyhow::anyhow!(e))?,
    };
    let bearer =
        token.map(|t| format!("Bearer {t}").parse().context("the token must be printable ASCII")).transpose()?;
    Ok(JobsClient::with_interceptor(ch, crate::Bearer(bearer)).max_decoding_message_size(64 * 1024 * 1024))
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}

fn state_name(s: i32) -> &'static str {
    pb::TaskState::try_from(s).map(|s| s.as_str_name()).unwrap_or("UNKNOWN").trim_start_matches("TASK_STATE_")
}

fn known(v: f64) -> Option<f64> {
    (v >= 0.0).then_some(v)
}

fn capacity_json(c: &pb::QueueCapacity) -> serde_json::Value {
    serde_json::json!({
        "queue": c.queue, "paused": c.paused, "pending": c.pending, "ready": c.ready, "delayed": c.delayed,
        "running": c.running, "active_workers": c.active_workers, "completed_5m": c.completed_5m,
        "rate_1m": c.rate_1m, "rate_5m": c.rate_5m, "rate_15m": c.rate_15m,
        "drain_seconds": known(c.drain_seconds), "per_worker_rate": known(c.per_worker_rate),
        "workers_needed": {"1h": c.workers_needed_1h, "4h": c.workers_needed_4h, "8h": c.workers_needed_8h},
    })
}

pub async fn run(cmd: JobsCmd) -> Result<()> {
    match cmd {
        JobsCmd::Pause { queue, client } => {
            let r = connect(&client).await?.pause_queue(pb::PauseQueueRequest { queue }).await;
            let r = r.map_err(status_err)?.into_inner();
            println!("{}\tpaused={}", r.queue, r.paused);
        }
        JobsCmd::Resume { queue, client } => {
            let r = connect(&client).await?.resume_queue(pb::ResumeQueueRequest { queue }).await;
            let r = r.map_err(status_err)?.into_inner();
            println!("{}\tpaused={}", r.queue, r.paused);
        }
        JobsCmd::Paused { client } => {
            let r = connect(&client).await?.list_paused_queues(pb::ListPausedQueuesRequest {}).await;
            for q in r.map_err(status_err)?.into_inner().queues {
                println!("{q}");
            }
        }
        JobsCmd::List { queue, state, from_ms, to_ms, page_size, page_token, client } => {
            let state = match state {
                None => pb::TaskState::Unspecified,
                Some(s) => pb::TaskState::from_str_name(&format!("TASK_STATE_{}", s.to_ascii_uppercase()))
                    .with_context(|| format!("unknown state {s:?}"))?,
            };
            let req = pb::ListTasksRequest {
                queue: queue.unwrap_or_default(),
                state: state as i32,
                created_from_ms: from_ms.unwrap_or(0),
                created_to_ms: to_ms.unwrap_or(0),
                page_size,
                page_token: page_token.unwrap_or_default(),
            };
            let r = connect(&client).await?.list_tasks(req).await.map_err(status_err)?.into_inner();
            if client.json {
                let tasks: Vec<_> = r
                    .tasks
                    .iter()
                    .map(|t| {
                        serde_json::json!({"id": t.id, "queue": t.queue, "state": state_name(t.state),
                            "attempts": t.attempts, "created_at_ms": t.created_at_ms})
                    })
                    .collect();
                println!("{}", serde_json::json!({"tasks": tasks, "next_page_token": r.next_page_token}));
            } else {
                for t in &r.tasks {
                    println!("{}\t{}\t{}\t{}", t.id, t.queue, state_name(t.state), t.created_at_ms);
                }
                if !r.next_page_token.is_empty() {
                    println!("next_page_token {}", r.next_page_token);
                }
            }
        }
        JobsCmd::ScheduleCreate { name, queue, payload, cron, time_zone, every, run_missed_once, client } => {
            let req = pb::CreateScheduleRequest {
                name,
                task: Some(pb::EnqueueRequest { queue, payload: payload.into_bytes().into(), ..Default::default() }),
                cron: cron.unwrap_or_default(),
                time_zone: time_zone.unwrap_or_default(),
                interval_ms: every.map(|d| d.as_millis() as u64).unwrap_or(0),
                missed_policy: if run_missed_once { pb::MissedPolicy::RunOnce } else { pb::MissedPolicy::Skip } as i32,
            };
            let s = connect(&client).await?.create_schedule(req).await.map_err(status_err)?.into_inner();
            print_schedule(&s, client.json);
        }
        JobsCmd::Schedules { client } => {
            let r = connect(&client).await?.list_schedules(pb::ListSchedulesRequest {}).await;
            for s in r.map_err(status_err)?.into_inner().schedules {
                print_schedule(&s, client.json);
            }
        }
        JobsCmd::SchedulePause { id, client } => {
            let s = connect(&client).await?.pause_schedule(pb::ScheduleRef { id }).await;
            print_schedule(&s.map_err(status_err)?.into_inner(), client.json);
        }
        JobsCmd::ScheduleResume { id, client } => {
            let s = connect(&client).await?.resume_schedule(pb::ScheduleRef { id }).await;
            print_schedule(&s.map_err(status_err)?.into_inner(), client.json);
        }
        JobsCmd::ScheduleDelete { id, client } => {
            connect(&client).await?.delete_schedule(pb::ScheduleRef { id }).await.map_err(status_err)?;
            println!("deleted");
        }
        JobsCmd::Capacity { queues, client } => {
            let r = connect(&client).await?.queue_capacity(pb::QueueCapacityRequest { queues }).await;
            let r = r.map_err(status_err)?.into_inner();
            if client.json {
                println!("{}", serde_json::json!(r.queues.iter().map(capacity_json).collect::<Vec<_>>()));
            } else {
                println!("queue\tpending\trunning\tworkers\trate/s(5m)\tdrain_s\tneed_1h\tneed_4h\tneed_8h\tpaused");
                for c in &r.queues {
                    println!(
                        "{}\t{}\t{}\t{}\t{:.3}\t{}\t{}\t{}\t{}\t{}",
                        c.queue,
                        c.pending,
                        c.running,
                        c.active_workers,
                        c.rate_5m,
                        known(c.drain_seconds).map_or("?".into(), |d| format!("{d:.0}")),
                        c.workers_needed_1h,
                        c.workers_needed_4h,
                        c.workers_needed_8h,
                        c.paused
                    );
                }
            }
        }
    }
    Ok(())
}

fn print_schedule(s: &pb::Schedule, json: bool) {
    if json {
        let v = serde_json::json!({"id": s.id, "name": s.name, "queue": s.queue, "cron": s.cron,
            "time_zone": s.time_zone, "interval_ms": s.interval_ms, "paused": s.paused, "fired": s.fired,
            "last_occurrence_ms": s.last_occurrence_ms, "next_occurrence_ms": s.next_occurrence_ms});
        println!("{v}");
    } else {
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
