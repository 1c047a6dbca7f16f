//! `raftq queues`: how many tasks of each queue are in each state; `raftq queues fairness set|list`: the weights
//! of the fairness keys of a queue (fair dispatch).

use anyhow::Result;
use raftq_client::FairnessKey;
use serde_json::json;

use super::client::{print_json, ClientArgs, Output};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct QueuesArgs {
    #[command(subcommand)]
    command: Option<QueuesCmd>,
    /// Only these queues (default: all).
    #[arg(long = "queue")]
    queues: Vec<String>,
    /// Read this node's replica without asking the leader.
    #[arg(long)]
    stale: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Subcommand)]
enum QueuesCmd {
    /// Fair dispatch: claims serve the fairness keys (concurrency keys) of a queue in proportion to their weights.
    #[command(subcommand)]
    Fairness(FairnessCmd),
}

#[derive(clap::Subcommand)]
enum FairnessCmd {
    /// Set a key's weight in a queue (1 to 1000; 1 is the default). Needs the admin scope.
    Set {
        #[arg(long)]
        queue: String,
        /// The concurrency key; leave it out for the queue's tasks without one.
        #[arg(long, default_value = "")]
        key: String,
        #[arg(long)]
        weight: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the keys with a weight or ready tasks: weight, ready and running tasks.
    List {
        /// Only this queue (default: all).
        #[arg(long)]
        queue: Option<String>,
        /// Read this node's replica without asking the leader.
        #[arg(long)]
        stale: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(a: QueuesArgs) -> Result<()> {
    if let Some(QueuesCmd::Fairness(cmd)) = a.command {
        return fairness(cmd).await;
    }
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

async fn fairness(cmd: FairnessCmd) -> Result<()> {
    let (keys, output) = match cmd {
        FairnessCmd::Set { queue, key, weight, client } => {
            let producer = client.connect().await?;
            (vec![producer.set_fairness_weight(&queue, &key, weight).await?], client.output())
        }
        FairnessCmd::List { queue, stale, client } => {
            let mut producer = client.connect().await?;
            if stale {
                producer = producer.stale_reads();
            }
            (producer.fairness(queue.as_deref()).await?, client.output())
        }
    };
    match output {
        // Each key as REST renders it under `GET /v1/queues/{queue}/fairness`.
        Output::Json => print_json(&serde_json::Value::Array(keys.iter().map(fairness_json).collect())),
        Output::Table => {
            println!("{:<24} {:<24} {:>7} {:>9} {:>9}", "queue", "key", "weight", "ready", "running");
            for k in &keys {
                let key = if k.key.is_empty() { "(none)" } else { k.key.as_str() };
                println!("{:<24} {:<24} {:>7} {:>9} {:>9}", k.queue, key, k.weight, k.ready, k.running);
            }
        }
    }
    Ok(())
}

fn fairness_json(k: &FairnessKey) -> serde_json::Value {
    json!({"queue": k.queue, "key": k.key, "weight": k.weight, "ready": k.ready, "running": k.running})
}
