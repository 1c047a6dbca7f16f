//! `raftq queues`: how many tasks of each queue are in each state.

use anyhow::Result;
use serde_json::json;

use super::client::{print_json, ClientArgs, Output};

#[derive(clap::Args)]
pub struct QueuesArgs {
    /// Only these queues (default: all).
    #[arg(long = "queue")]
    queues: Vec<String>,
    /// Read this node's replica without asking the leader.
    #[arg(long)]
    stale: bool,
    #[command(flatten)]
    client: ClientArgs,
}

pub async fn run(a: QueuesArgs) -> Result<()> {
    let mut producer = a.client.connect().await?;
    if a.stale {
        producer = producer.stale_reads();
    }
    let queues: Vec<&str> = a.queues.iter().map(String::as_str).collect();
    let stats = producer.queue_stats(&queues).await?;
    match a.client.output() {
        // Each queue as REST renders it under `GET /v1/queues`.
        Output::Json => print_json(&serde_json::Value::Array(
            stats
                .iter()
                .map(|q| {
                    json!({"queue": q.queue, "pending": q.pending, "delayed": q.delayed, "in_progress": q.in_progress,
                        "completed": q.completed, "failed": q.failed, "cancelled": q.cancelled,
                        "dead_lettered": q.dead_lettered, "paused": q.paused})
                })
                .collect(),
        )),
        Output::Table => {
            println!(
                "{:<24} {:>9} {:>9} {:>11} {:>10} {:>8} {:>10} {:>8}  paused",
                "queue", "pending", "delayed", "in_progress", "completed", "failed", "cancelled", "dead"
            );
            for q in &stats {
                println!(
                    "{:<24} {:>9} {:>9} {:>11} {:>10} {:>8} {:>10} {:>8}  {}",
                    q.queue,
                    q.pending,
                    q.delayed,
                    q.in_progress,
                    q.completed,
                    q.failed,
                    q.cancelled,
                    q.dead_lettered,
                    if q.paused { "yes" } else { "no" }
                );
            }
        }
    }
    Ok(())
}
