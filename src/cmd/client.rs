//! What every client command shares: one set of connection flags ([`ClientArgs`]), the SDK client they build
//! (`raftq-client` owns addresses, leader following, TLS, the token and retries), the token minted from a
//! local secret when none is given, the output format and the JSON shapes (a task is rendered as REST renders
//! it). Commands print; they never speak the wire protocol themselves.

use std::path::PathBuf;

use anyhow::{Context, Result};
use raftq_client::{Producer, ProducerConfig, Task};
use serde_json::{json, Value};

/// The connection flags of every client command.
#[derive(clap::Args, Clone, Debug)]
pub struct ClientArgs {
    /// Nodes to talk to, tried in order (repeat, or comma-separated); any node serves, forwarding to the leader.
    #[arg(long = "addr", env = "RAFTQ_ADDR", value_delimiter = ',', default_value = raftq_client::DEFAULT_ADDR)]
    pub addrs: Vec<String>,
    /// Bearer token (a JWT). Without one, a one-hour token is minted from the secret file named by
    /// RAFTQ_AUTH_HS256_SECRET_FILE, else from the local node's (`<local data dir>/auth/local.hs256`), when
    /// this user can read it.
    #[arg(long = "auth-token", env = "RAFTQ_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// CA certificate (PEM) to verify TLS servers with; addresses without a scheme then use https.
    #[arg(long, env = "RAFTQ_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Data directory of the local node, for the fallback token.
    #[arg(long = "local-data-dir", env = "RAFTQ_DATA_DIR", default_value = "./raftq-data")]
    pub local_data_dir: PathBuf,
    /// How results are printed.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Same as `--output json` (the spelling `raftq jobs` once had).
    #[arg(long, hide = true)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Json,
    Table,
}

impl ClientArgs {
    pub fn output(&self) -> Output {
        if self.json {
            Output::Json
        } else {
            self.output
        }
    }

    /// `--auth-token`, else one minted from a readable local secret, else none.
    pub fn token(&self) -> Result<Option<String>> {
        if let Some(t) = &self.auth_token {
            return Ok(Some(t.trim().to_string()));
        }
        raftq::auth::local_cli_token(&self.local_data_dir).map_err(|e| anyhow::anyhow!(e))
    }

    /// The CA's PEM, read from `--ca-file`.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>> {
        self.ca_file.as_ref().map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display()))).transpose()
    }

    /// A connected SDK client. A command makes a request or two, so the node it reaches forwards them to the
    /// leader (no redirect, no second connection; the leader's advertised address may not even resolve here).
    pub async fn connect(&self) -> Result<Producer> {
        let cfg = ProducerConfig {
            addrs: self.addrs.clone(),
            token: self.token()?,
            tls_ca_pem: self.ca_pem()?,
            follow_leader: false,
            ..ProducerConfig::default()
        };
        Producer::connect(cfg).await.with_context(|| format!("connecting to {}", self.addrs.join(",")))
    }
}

/// Prints one JSON value on a line.
pub fn print_json(v: &Value) {
    println!("{v}");
}

/// A task as the REST API renders it: the one JSON shape of a task.
pub fn task_json(t: &Task) -> Value {
    raftq::api::rest::task_json(&t.clone().into())
}

/// Bytes as REST renders them: the text when it is UTF-8 (else null), and base64.
pub fn bytes_json(b: &[u8]) -> (Value, Value) {
    use base64::Engine;
    let text = std::str::from_utf8(b).map(|s| json!(s)).unwrap_or(Value::Null);
    (text, json!(base64::engine::general_purpose::STANDARD.encode(b)))
}

/// A task: JSON, or one field per line.
pub fn print_task(out: Output, t: &Task) {
    if out == Output::Json {
        print_json(&task_json(t));
        return;
    }
    println!("id           {}", t.id);
    println!("queue        {}", t.queue);
    println!("state        {}", t.state);
    println!("priority     {}", t.priority);
    println!("attempts     {}/{}", t.attempts, t.max_attempts);
    println!("payload      {}", String::from_utf8_lossy(&t.payload));
    if let Some(l) = &t.lease {
        println!("lease        worker={} token={} deadline_ms={}", l.worker_id, l.token, l.deadline_ms);
    }
    if !t.last_error.is_empty() {
        println!("last_error   {}", t.last_error);
    }
    if t.deadline_ms > 0 {
        println!("deadline_ms  {}", t.deadline_ms);
    }
    if let Some(p) = &t.progress {
        println!("progress     {}% {}", p.percent, p.message);
    }
    if !t.depends_on.is_empty() {
        println!("depends_on   {} (waiting on {})", t.depends_on.join(","), t.waiting_on.len());
    }
    for (i, r) in t.runs.iter().enumerate() {
        let outcome = if r.outcome.is_empty() { "RUNNING" } else { &r.outcome };
        println!("run {i:<8} worker={} started_ms={} {outcome} {}", r.worker_id, r.started_at_ms, r.reason);
    }
}

/// Ids a command acted on: `{"<what>": [...]}`, or one per line with a count on stderr.
pub fn print_ids(out: Output, what: &str, ids: &[String]) {
    match out {
        Output::Json => print_json(&json!({ what: ids })),
        Output::Table => {
            for id in ids {
                println!("{id}");
            }
            eprintln!("{} {what}", ids.len());
        }
    }
}
