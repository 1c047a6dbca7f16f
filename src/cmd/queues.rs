//! `raftq queues`: how many tasks of each queue are in each state; `raftq queues fairness set|list`: the weights
//! of the fairness keys of a queue (fair dispatch); `raftq queues rate-limit set|list`: token buckets per queue
//! and per fairness key; `raftq queues concurrency-override set|clear|list`: an operator's limit for a
//! concurrency key, optionally until an expiry.

use anyhow::Result;
use raftq_client::{ConcurrencyOverride, FairnessKey, RateLimit, RateScope};
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
    /// Rate limits: token buckets per queue and per fairness key; a key or queue out of tokens is passed over.
    #[command(subcommand)]
    RateLimit(RateLimitCmd),
    /// Concurrency key overrides: a limit that replaces the one a key's tasks carry, optionally until an expiry.
    #[command(subcommand)]
    ConcurrencyOverride(OverrideCmd),
}

#[derive(clap::Subcommand)]
enum OverrideCmd {
    /// Override a concurrency key's limit (every queue of the tenant). Needs the admin scope.
    Set {
        /// The concurrency key.
        #[arg(long)]
        key: String,
        /// Running tasks of the key at most (at least 1).
        #[arg(long)]
        limit: u32,
        /// Run out after this long (`90s`, `10m`, `2h`); the tasks' own limits apply again then.
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "until")]
        ttl: Option<std::time::Duration>,
        /// Or run out at this time (RFC 3339, `2026-11-26T12:00:00Z`).
        #[arg(long)]
        until: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a key's override: its tasks' own limits apply again at once. Needs the admin scope.
    Clear {
        #[arg(long)]
        key: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the overrides in force: limit, expiry, the key's running and pending tasks.
    List {
        /// Read this node's replica without asking the leader.
        #[arg(long)]
        stale: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(clap::Subcommand)]
enum RateLimitCmd {
    /// Set a token bucket (rate 0 removes it). Needs the admin scope.
    Set {
        #[arg(long)]
        queue: String,
        /// The concurrency key whose bucket to set (`--key ''`: the queue's tasks without one); leave it out for
        /// the whole queue's bucket.
        #[arg(long)]
        key: Option<String>,
        /// Claims per second (`20`, `0.5`), or per minute or hour (`30/min`, `100/h`); 0 removes the limit.
        #[arg(long, value_parser = parse_rate)]
        rate: f64,
        /// Tokens the bucket holds at most (default: the rate per second, at least 1).
        #[arg(long)]
        burst: Option<u32>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the buckets: rate, burst, tokens now, ready tasks and whether they are throttled.
    List(ListArgs),
}

/// What `fairness list` and `rate-limit list` take.
#[derive(clap::Args)]
struct ListArgs {
    /// Only this queue (default: all).
    #[arg(long)]
    queue: Option<String>,
    /// Read this node's replica without asking the leader.
    #[arg(long)]
    stale: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl ListArgs {
    async fn connect(&self) -> Result<raftq_client::Producer> {
        let producer = self.client.connect().await?;
        Ok(if self.stale { producer.stale_reads() } else { producer })
    }
}

/// A rate in tasks per second from `N`, `N/s`, `N/min` or `N/h`.
fn parse_rate(s: &str) -> std::result::Result<f64, String> {
    let (n, per) = match s.split_once('/') {
        None => (s, 1.0),
        Some((n, "s" | "sec" | "second")) => (n, 1.0),
        Some((n, "m" | "min" | "minute")) => (n, 60.0),
        Some((n, "h" | "hour")) => (n, 3_600.0),
        Some((_, unit)) => return Err(format!("unknown unit {unit:?}: use s, min or h")),
    };
    let n: f64 = n.trim().parse().map_err(|e| format!("{n:?} is not a number: {e}"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{n} is not a rate"));
    }
    Ok(n / per)
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
    /// List the keys with a weight or ready tasks: weight, ready and running tasks, throttled.
    List(ListArgs),
}

pub async fn run(a: QueuesArgs) -> Result<()> {
    match a.command {
        Some(QueuesCmd::Fairness(cmd)) => return fairness(cmd).await,
        Some(QueuesCmd::RateLimit(cmd)) => return rate_limits(cmd).await,
        Some(QueuesCmd::ConcurrencyOverride(cmd)) => return overrides(cmd).await,
        None => {}
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
        FairnessCmd::List(l) => (l.connect().await?.fairness(l.queue.as_deref()).await?, l.client.output()),
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
    json!({"queue": k.queue, "key": k.key, "weight": k.weight, "ready": k.ready, "running": k.running,
        "throttled": k.throttled})
}

async fn rate_limits(cmd: RateLimitCmd) -> Result<()> {
    let (limits, output) = match cmd {
        RateLimitCmd::Set { queue, key, rate, burst, client } => {
            let producer = client.connect().await?;
            let scope = key.map_or(RateScope::Queue, RateScope::Key);
            (vec![producer.set_rate_limit(&queue, scope, rate, burst).await?], client.output())
        }
        RateLimitCmd::List(l) => (l.connect().await?.rate_limits(l.queue.as_deref()).await?, l.client.output()),
    };
    match output {
        // Each bucket as REST renders it under `GET /v1/queues/{queue}/rate-limits`.
        Output::Json => print_json(&serde_json::Value::Array(limits.iter().map(rate_json).collect())),
        Output::Table => {
            println!(
                "{:<24} {:<24} {:>10} {:>7} {:>9} {:>9}  throttled",
                "queue", "key", "per_s", "burst", "tokens", "ready"
            );
            for l in &limits {
                let key = match &l.scope {
                    RateScope::Queue => "(whole queue)",
                    RateScope::Key(k) if k.is_empty() => "(none)",
                    RateScope::Key(k) => k.as_str(),
                };
                println!(
                    "{:<24} {:<24} {:>10} {:>7} {:>9.2} {:>9}  {}",
                    l.queue,
                    key,
                    l.per_second,
                    l.burst,
                    l.tokens,
                    l.ready,
                    if l.throttled { "yes" } else { "no" }
                );
            }
        }
    }
    Ok(())
}

async fn overrides(cmd: OverrideCmd) -> Result<()> {
    let (rows, output) = match cmd {
        OverrideCmd::Set { key, limit, ttl, until, client } => {
            let producer = client.connect().await?;
            let o = match until {
                Some(at) => producer.set_concurrency_override_until(&key, limit, &at).await?,
                None => producer.set_concurrency_override(&key, limit, ttl).await?,
            };
            (vec![o], client.output())
        }
        OverrideCmd::Clear { key, client } => {
            let cleared = client.connect().await?.clear_concurrency_override(&key).await?;
            match client.output() {
                Output::Json => print_json(&json!({"cleared": cleared})),
                Output::Table if cleared => println!("cleared the override of {key}"),
                Output::Table => println!("{key} had no override"),
            }
            return Ok(());
        }
        OverrideCmd::List { stale, client } => {
            let producer = client.connect().await?;
            let producer = if stale { producer.stale_reads() } else { producer };
            (producer.concurrency_overrides(None).await?, client.output())
        }
    };
    match output {
        // Each override as REST renders it under `GET /v1/concurrency-keys`.
        Output::Json => print_json(&serde_json::Value::Array(rows.iter().map(override_json).collect())),
        Output::Table => {
            println!("{:<32} {:>7} {:>9} {:>9}  expires", "key", "limit", "running", "pending");
            for o in &rows {
                let expires = o.expires_at_ms.and_then(rfc3339).unwrap_or_else(|| "never".to_string());
                println!("{:<32} {:>7} {:>9} {:>9}  {expires}", o.key, o.limit, o.running, o.pending);
            }
        }
    }
    Ok(())
}

fn rfc3339(ms: u64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).ok()?).map(|t| t.to_rfc3339())
}

fn override_json(o: &ConcurrencyOverride) -> serde_json::Value {
    json!({"key": o.key, "limit": o.limit, "expires_at": o.expires_at_ms.and_then(rfc3339),
        "expires_at_ms": o.expires_at_ms, "running": o.running, "pending": o.pending})
}

fn rate_json(l: &RateLimit) -> serde_json::Value {
    let key = match &l.scope {
        RateScope::Queue => None,
        RateScope::Key(k) => Some(k),
    };
    json!({"queue": l.queue, "key": key, "per_second": l.per_second, "burst": l.burst, "tokens": l.tokens,
        "ready": l.ready, "throttled": l.throttled})
}

#[cfg(test)]
mod tests {
    #[test]
    fn rates_parse_per_second_minute_and_hour() {
        assert_eq!(super::parse_rate("20"), Ok(20.0));
        assert_eq!(super::parse_rate("0.5/s"), Ok(0.5));
        assert_eq!(super::parse_rate("30/min"), Ok(0.5));
        assert_eq!(super::parse_rate("36/h"), Ok(0.01));
        assert!(super::parse_rate("3/day").is_err());
        assert!(super::parse_rate("-1").is_err());
    }
}
