//! `raftq dlq ...`: list, redrive and purge a queue's dead-lettered tasks.

use anyhow::{bail, Result};
use raftq_client::DeadLetters;

use super::client::{print_ids, print_json, task_json, ClientArgs, Output};

#[derive(clap::Subcommand)]
pub enum DlqCmd {
    /// List dead-lettered tasks, oldest first.
    List {
        #[arg(long)]
        queue: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move dead-lettered tasks back to pending with their attempts reset.
    Redrive(Selection),
    /// Delete dead-lettered tasks.
    Purge(Selection),
}

/// The dead-lettered tasks of a queue a redrive or purge acts on.
#[derive(clap::Args)]
pub struct Selection {
    #[arg(long)]
    queue: String,
    /// Every dead-lettered task of the queue.
    #[arg(long)]
    all: bool,
    /// These tasks.
    ids: Vec<String>,
    #[command(flatten)]
    client: ClientArgs,
}

impl Selection {
    fn which(&self) -> Result<DeadLetters> {
        match (self.all, self.ids.is_empty()) {
            (true, true) => Ok(DeadLetters::All),
            (false, false) => Ok(DeadLetters::Ids(self.ids.clone())),
            (true, false) => bail!("give --all or task ids, not both"),
            (false, true) => bail!("give task ids, or --all"),
        }
    }
}

pub async fn run(cmd: DlqCmd) -> Result<()> {
    match cmd {
        DlqCmd::List { queue, limit, client } => {
            let tasks = client.connect().await?.dead_letters(&queue, limit).await?;
            match client.output() {
                Output::Json => print_json(&serde_json::Value::Array(tasks.iter().map(task_json).collect())),
                Output::Table => {
                    for t in &tasks {
                        println!(
                            "{}\tattempts={}\t{}\t{}",
                            t.id,
                            t.attempts,
                            t.last_error,
                            String::from_utf8_lossy(&t.payload)
                        );
                    }
                }
            }
        }
        DlqCmd::Redrive(s) => {
            let ids = s.client.connect().await?.redrive(&s.queue, &s.which()?).await?;
            print_ids(s.client.output(), "redriven", &ids);
        }
        DlqCmd::Purge(s) => {
            let ids = s.client.connect().await?.purge_dead_letters(&s.queue, &s.which()?).await?;
            print_ids(s.client.output(), "purged", &ids);
        }
    }
    Ok(())
}
