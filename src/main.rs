//! The `raftq` binary: `raftq serve` runs a node; the other subcommands are the operator and user CLI.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use raftq::config::Config;
use raftq::node::{Listeners, Node};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

mod cmd;

#[derive(Parser)]
#[command(name = "raftq", version, about = "A Raft-replicated task queue")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node (with no flags: a one-node cluster in ./raftq-data).
    Serve(ServeArgs),
    /// Enqueue, inspect, cancel and work tasks.
    Task {
        #[command(subcommand)]
        cmd: TaskCmd,
    },
    /// Tasks per state in each queue.
    Queues {
        /// Only these queues (default: all).
        #[arg(long = "queue")]
        queues: Vec<String>,
        /// Read this node's replica without asking the leader.
        #[arg(long)]
        stale: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Inspect, redrive and purge dead-lettered tasks.
    Dlq {
        #[command(subcommand)]
        cmd: DlqCmd,
    },
    /// Job features: pause and resume queues, list tasks, the capacity view.
    Jobs {
        #[command(subcommand)]
        cmd: cmd::jobs::JobsCmd,
    },
    /// Load a node or cluster (an embedded node unless --addr is given): full cycles or enqueues only.
    Bench(cmd::bench::BenchArgs),
    /// Run a command per task: payload on stdin; exit 0 completes with stdout, another exit fails with stderr.
    Worker(cmd::worker::WorkerArgs),
    /// Cluster operations: status, leadership transfer, membership, state digests.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Tokens: mint one from an HS256 secret (by default the local node's).
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Print a signed JWT for a tenant with the given scopes.
    Issue {
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Comma separated: enqueue, work, read, admin.
        #[arg(long, value_delimiter = ',', default_value = "enqueue,work,read")]
        scopes: Vec<String>,
        /// Queue name patterns the token may use (`*` matches anything); default: every queue.
        #[arg(long = "queue", value_delimiter = ',')]
        queues: Vec<String>,
        /// Who the token is for (`sub`).
        #[arg(long, default_value = "raftq-cli")]
        subject: String,
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// The HS256 secret file (default: the local node's, under --data-dir).
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Key id to put in the token header (default: `local` for the local secret, else none: the server then
        /// tries each of its HS256 keys).
        #[arg(long)]
        kid: Option<String>,
        #[arg(long, env = "RAFTQ_DATA_DIR", default_value = "./raftq-data")]
        data_dir: PathBuf,
        #[arg(long)]
        issuer: Option<String>,
        #[arg(long)]
        audience: Option<String>,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Every node's role, term, log and applied index, replication lag and reachability.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move the leadership to node N (or to any other voter); returns when it leads.
    TransferLeader {
        #[arg(long)]
        to: Option<u64>,
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Add a node: it joins as a learner, catches up, then becomes a voter.
    AddNode {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        raft_addr: String,
        #[arg(long)]
        api_addr: String,
        #[arg(long)]
        learner: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a node from the cluster (refused while too few other voters answer, unless --force).
    RemoveNode {
        #[arg(long)]
        id: u64,
        /// Remove it even if the change may not commit (the cluster may stop until missing voters return).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Each node's applied index and state digest; replicas at the same index must agree.
    Digest {
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file; flags and RAFTQ_* variables override it.
    #[arg(long, env = "RAFTQ_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long, env = "RAFTQ_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[arg(long, env = "RAFTQ_GRPC_ADDR")]
    grpc_addr: Option<String>,
    #[arg(long, env = "RAFTQ_RAFT_ADDR")]
    raft_addr: Option<String>,
    #[arg(long, env = "RAFTQ_HTTP_ADDR")]
    http_addr: Option<String>,
    #[arg(long, env = "RAFTQ_NODE_ID")]
    node_id: Option<u64>,
    #[arg(long, env = "RAFTQ_SHARDS")]
    shards: Option<usize>,
    /// A cluster member, `ID=RAFT_ADDR,API_ADDR` (repeat for each; RAFTQ_PEERS separates them with ';').
    #[arg(long = "peer", env = "RAFTQ_PEERS", value_delimiter = ';')]
    peers: Vec<raftq::config::Peer>,
    /// Initialise a new cluster from this node (default: the lowest id of the peers does).
    #[arg(long, env = "RAFTQ_BOOTSTRAP", conflicts_with = "join")]
    bootstrap: bool,
    /// Never initialise: wait to be added with `raftq cluster add-node`.
    #[arg(long, env = "RAFTQ_JOIN")]
    join: bool,
    /// Address peers and clients use for this node's Raft port, when it differs from --raft-addr.
    #[arg(long, env = "RAFTQ_ADVERTISE_RAFT_ADDR")]
    advertise_raft_addr: Option<String>,
    /// Address clients use for this node's gRPC port, when it differs from --grpc-addr.
    #[arg(long, env = "RAFTQ_ADVERTISE_GRPC_ADDR")]
    advertise_grpc_addr: Option<String>,
    /// `jwt` (default): every call needs a token. `none`: no authentication, every caller is tenant `default`.
    #[arg(long, env = "RAFTQ_AUTH", value_enum)]
    auth: Option<raftq::config::AuthMode>,
    /// Verification keys, named `<kid>.<hs256|rs256|es256|eddsa>[.pem]`.
    #[arg(long, env = "RAFTQ_AUTH_KEYS_DIR")]
    auth_keys_dir: Option<PathBuf>,
    /// An HS256 secret file (tokens and, unless a cluster secret is set, the Raft port).
    #[arg(long, env = "RAFTQ_AUTH_HS256_SECRET_FILE")]
    auth_hs256_secret_file: Option<PathBuf>,
    #[arg(long, env = "RAFTQ_AUTH_ISSUER")]
    auth_issuer: Option<String>,
    #[arg(long, env = "RAFTQ_AUTH_AUDIENCE")]
    auth_audience: Option<String>,
    /// Create the --auth-hs256-secret-file with a random secret when it does not exist.
    #[arg(long, env = "RAFTQ_AUTH_HS256_SECRET_CREATE")]
    auth_hs256_secret_create: bool,
    /// The secret peers prove on the Raft port.
    #[arg(long, env = "RAFTQ_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// TLS on every port: certificate chain (PEM).
    #[arg(long, env = "RAFTQ_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, env = "RAFTQ_TLS_KEY_FILE")]
    tls_key_file: Option<PathBuf>,
    /// CA that peers' certificates are verified with (mutual TLS on the Raft port).
    #[arg(long, env = "RAFTQ_TLS_CA_FILE")]
    tls_ca_file: Option<PathBuf>,
    /// Log format: text or json (one object per line).
    #[arg(long, env = "RAFTQ_LOG_FORMAT", value_parser = parse_log_format)]
    log_format: Option<raftq::config::LogFormat>,
}

#[derive(Args, Clone)]
struct ClientArgs {
    /// The node's public gRPC address.
    #[arg(long, env = "RAFTQ_ADDR", default_value = "http://127.0.0.1:9091", global = true)]
    addr: String,
    /// Bearer token (a JWT). Without one, a token is minted from the local node's secret when this user can
    /// read it (`<data dir>/auth/local.hs256`).
    #[arg(long = "auth-token", env = "RAFTQ_TOKEN", hide_env_values = true, global = true)]
    auth_token: Option<String>,
    /// CA certificate (PEM) to verify a TLS server with; addresses without a scheme then use https.
    #[arg(long, env = "RAFTQ_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// Data directory of the local node, for the fallback token (default ./raftq-data).
    #[arg(long = "local-data-dir", env = "RAFTQ_DATA_DIR", default_value = "./raftq-data", global = true)]
    local_data_dir: PathBuf,
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
pub enum Output {
    Json,
    Table,
}

#[derive(Subcommand)]
enum TaskCmd {
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

#[derive(Subcommand)]
enum DlqCmd {
    List {
        #[arg(long)]
        queue: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move dead-lettered tasks back to pending with their attempts reset.
    Redrive {
        #[arg(long)]
        queue: String,
        #[arg(long)]
        all: bool,
        ids: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete dead-lettered tasks.
    Purge {
        #[arg(long)]
        queue: String,
        #[arg(long)]
        all: bool,
        ids: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

fn main() -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    // The server's log format is part of its configuration; every other command logs text.
    let serve_cfg = match &cli.cmd {
        Cmd::Serve(a) => Some(load_config(a)?),
        _ => None,
    };
    init_logging(serve_cfg.as_ref());
    match cli.cmd {
        Cmd::Serve(_) => serve(serve_cfg.expect("loaded above")).await,
        Cmd::Task { cmd } => task_cmd(cmd).await,
        Cmd::Dlq { cmd } => dlq_cmd(cmd).await,
        Cmd::Queues { queues, stale, client } => queues_cmd(queues, stale, client).await,
        Cmd::Bench(a) => cmd::bench::run(a).await,
        Cmd::Jobs { cmd } => cmd::jobs::run(cmd).await,
        Cmd::Cluster { cmd } => cluster_cmd(cmd).await,
        Cmd::Token { cmd } => token_cmd(cmd),
        Cmd::Worker(a) => {
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                stop.cancel();
            });
            cmd::worker::run(a, shutdown).await
        }
    }
}

/// Logs to stderr, filtered by `RAFTQ_LOG`; `json` writes one object per line with the current span's fields
/// (task spans carry `trace_id`, `parent_span_id` and `span_id`). With `otlp_endpoint`, trace spans are also
/// exported, whatever `RAFTQ_LOG` lets through to the log.
fn init_logging(cfg: Option<&Config>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAFTQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match cfg.map(|c| c.log_format).unwrap_or_default() {
        raftq::config::LogFormat::Text => fmt.with_filter(filter).boxed(),
        raftq::config::LogFormat::Json => {
            fmt.json().with_current_span(true).with_span_list(true).with_filter(filter).boxed()
        }
    };
    let otlp = cfg
        .and_then(|c| Some((c.otlp_endpoint.as_deref()?, c.node_id)))
        .map(|(endpoint, node_id)| raftq::otlp::layer(endpoint, node_id).with_filter(raftq::otlp::filter()));
    tracing_subscriber::registry().with(fmt).with(otlp).init();
}

fn parse_log_format(s: &str) -> Result<raftq::config::LogFormat, String> {
    match s {
        "text" => Ok(raftq::config::LogFormat::Text),
        "json" => Ok(raftq::config::LogFormat::Json),
        _ => Err(format!("log format {s:?} is not text or json")),
    }
}

fn load_config(a: &ServeArgs) -> Result<Config> {
    let mut cfg = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str::<Config>(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => Config::default(),
    };
    if let Some(v) = &a.data_dir {
        cfg.data_dir = v.clone();
    }
    if let Some(v) = &a.grpc_addr {
        cfg.grpc_addr = v.clone();
    }
    if let Some(v) = &a.raft_addr {
        cfg.raft_addr = v.clone();
    }
    if let Some(v) = &a.http_addr {
        cfg.http_addr = v.clone();
    }
    if let Some(v) = a.node_id {
        cfg.node_id = v;
    }
    if let Some(v) = a.shards {
        cfg.shards = v;
    }
    if !a.peers.is_empty() {
        cfg.peers = a.peers.clone();
    }
    if a.bootstrap {
        cfg.bootstrap = Some(true);
    }
    if a.join {
        cfg.bootstrap = Some(false);
    }
    if let Some(v) = &a.advertise_raft_addr {
        cfg.advertise_raft_addr = Some(v.clone());
    }
    if let Some(v) = &a.advertise_grpc_addr {
        cfg.advertise_grpc_addr = Some(v.clone());
    }
    if let Some(v) = a.auth {
        cfg.auth = v;
    }
    let set = |to: &mut Option<PathBuf>, v: &Option<PathBuf>| {
        if v.is_some() {
            *to = v.clone();
        }
    };
    set(&mut cfg.auth_keys_dir, &a.auth_keys_dir);
    set(&mut cfg.auth_hs256_secret_file, &a.auth_hs256_secret_file);
    set(&mut cfg.cluster_secret_file, &a.cluster_secret_file);
    set(&mut cfg.tls_cert_file, &a.tls_cert_file);
    set(&mut cfg.tls_key_file, &a.tls_key_file);
    set(&mut cfg.tls_ca_file, &a.tls_ca_file);
    if a.auth_hs256_secret_create {
        cfg.auth_hs256_secret_create = true;
    }
    if a.auth_issuer.is_some() {
        cfg.auth_issuer = a.auth_issuer.clone();
    }
    if a.auth_audience.is_some() {
        cfg.auth_audience = a.auth_audience.clone();
    }
    // Secrets by value come from the environment only (a flag would show in `ps`).
    if let Ok(v) = std::env::var("RAFTQ_AUTH_HS256_SECRET") {
        cfg.auth_hs256_secret = Some(raftq::config::Secret(v));
    }
    if let Ok(v) = std::env::var("RAFTQ_CLUSTER_SECRET") {
        cfg.cluster_secret = Some(raftq::config::Secret(v));
    }
    if let Some(v) = a.log_format {
        cfg.log_format = v;
    }
    // A secret comes from the environment or a file, never a flag.
    if let Ok(v) = std::env::var("RAFTQ_WEBHOOK_SECRET") {
        cfg.webhook_secret = Some(raftq::config::Secret(v));
        cfg.webhook_secret_file = None;
    }
    if let Err(errs) = cfg.validate() {
        bail!("invalid configuration:\n  {}", errs.join("\n  "));
    }
    Ok(cfg)
}

async fn serve(cfg: Config) -> Result<()> {
    tracing::info!(config = ?cfg, "effective configuration");
    let shutdown = CancellationToken::new();
    let listeners = Listeners::bind(&cfg).await?;
    let node = Node::start(cfg, listeners, shutdown.clone()).await?;
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    node.run_until_shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Adds the bearer token to every call.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// The token a client command sends: `--token`/`RAFTQ_TOKEN`, else one minted (for an hour, every scope,
/// tenant `default`) from the local node's secret when it can be read, else none.
fn client_token(c: &ClientArgs) -> Result<Option<String>> {
    if let Some(t) = &c.auth_token {
        return Ok(Some(t.trim().to_string()));
    }
    raftq::auth::local_cli_token(&c.local_data_dir).map_err(|e| anyhow::anyhow!(e))
}

fn bearer(c: &ClientArgs) -> Result<Bearer> {
    let v = client_token(c)?
        .map(|t| format!("Bearer {t}").parse().context("the token must be printable ASCII"))
        .transpose()?;
    Ok(Bearer(v))
}

async fn channel_to(addr: &str, ca: Option<&PathBuf>, timeout: Option<Duration>) -> Result<Channel> {
    let url = raftq::tls::url(addr, ca.is_some());
    let mut ep =
        tonic::transport::Endpoint::from_shared(url.clone())?.connect_timeout(Duration::from_secs(5)).tcp_nodelay(true);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(pem));
        ep = ep.tls_config(tls)?;
    }
    if let Some(t) = timeout {
        ep = ep.timeout(t);
    }
    ep.connect().await.with_context(|| format!("connecting to {url}"))
}

async fn connect(c: &ClientArgs) -> Result<TaskServiceClient<Authed>> {
    let ch = channel_to(&c.addr, c.ca_file.as_ref(), None).await?;
    Ok(TaskServiceClient::with_interceptor(ch, bearer(c)?).max_decoding_message_size(64 * 1024 * 1024))
}

fn token_cmd(cmd: TokenCmd) -> Result<()> {
    let TokenCmd::Issue { tenant, scopes, queues, subject, ttl, secret_file, kid, data_dir, issuer, audience } = cmd;
    let scopes = scopes
        .iter()
        .map(|s| {
            raftq::auth::Scope::parse(s.trim())
                .with_context(|| format!("unknown scope {s:?}: enqueue, work, read, admin"))
        })
        .collect::<Result<Vec<_>>>()?;
    let (path, default_kid) = match secret_file {
        Some(p) => (p, None),
        None => (data_dir.join(raftq::auth::LOCAL_SECRET_FILE), Some(raftq::auth::LOCAL_KID.to_string())),
    };
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "reading the secret {} (start the node once with authentication on, or pass --secret-file)",
            path.display()
        )
    })?;
    let spec = raftq::auth::TokenSpec {
        subject: &subject,
        tenant: &tenant,
        scopes: &scopes,
        queues: (!queues.is_empty()).then_some(queues),
        ttl_s: ttl.as_secs().max(1),
        issuer: issuer.as_deref(),
        audience: audience.as_deref(),
    };
    let kid = kid.or(default_kid);
    let token = raftq::auth::issue(raftq::auth::trim_secret(&bytes), kid.as_deref(), &spec);
    println!("{}", token.map_err(|e| anyhow::anyhow!(e))?);
    Ok(())
}

fn state_name(s: i32) -> &'static str {
    pb::TaskState::try_from(s).map(|s| s.as_str_name()).unwrap_or("UNKNOWN").trim_start_matches("TASK_STATE_")
}

fn print_task(out: Output, t: &pb::Task) {
    if out == Output::Json {
        println!("{}", task_json(t));
        return;
    }
    println!("id           {}", t.id);
    println!("queue        {}", t.queue);
    println!("state        {}", state_name(t.state));
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

fn task_json(t: &pb::Task) -> serde_json::Value {
    serde_json::json!({
        "id": t.id, "queue": t.queue, "state": state_name(t.state), "priority": t.priority,
        "attempts": t.attempts, "max_attempts": t.max_attempts, "tenant": t.tenant,
        "payload": String::from_utf8_lossy(&t.payload),
        "lease": t.lease.as_ref().map(|l| serde_json::json!({"worker_id": l.worker_id, "token": l.token, "deadline_ms": l.deadline_ms})),
        "created_at_ms": t.created_at_ms, "visible_at_ms": t.visible_at_ms, "ended_at_ms": t.ended_at_ms,
        "last_error": t.last_error, "idempotency_key": t.idempotency_key, "deadline_ms": t.deadline_ms,
        "progress": t.progress.as_ref().map(|p| serde_json::json!({"percent": p.percent, "message": p.message})),
        "runs": t.runs.iter().map(|r| serde_json::json!({"worker_id": r.worker_id, "started_at_ms": r.started_at_ms,
            "ended_at_ms": r.ended_at_ms, "outcome": r.outcome, "reason": r.reason})).collect::<Vec<_>>(),
    })
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}

async fn task_cmd(cmd: TaskCmd) -> Result<()> {
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
            client,
        } => {
            let mut c = connect(&client).await?;
            let r = c
                .enqueue(pb::EnqueueRequest {
                    queue,
                    payload: payload.into_bytes().into(),
                    priority,
                    delay_ms: delay.map(|d| d.as_millis() as u64).unwrap_or(0),
                    max_attempts,
                    idempotency_key: idempotency_key.unwrap_or_default(),
                    webhook_url: webhook_url.unwrap_or_default(),
                    deadline_in_ms: deadline.map(|d| d.as_millis() as u64).unwrap_or(0),
                    concurrency_key: concurrency_key.unwrap_or_default(),
                    concurrency_limit,
                    depends_on,
                    dependency_rule: if all_resolved {
                        pb::DependencyRule::AllResolved as i32
                    } else {
                        pb::DependencyRule::AllCompleted as i32
                    },
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            match client.output {
                Output::Json => println!("{}", serde_json::json!({"task_id": r.task_id, "duplicate": r.duplicate})),
                Output::Table => println!("{}", r.task_id),
            }
        }
        TaskCmd::Get { id, client } => {
            let t = connect(&client).await?.get_task(pb::GetTaskRequest { id }).await.map_err(status_err)?;
            print_task(client.output, t.get_ref());
        }
        TaskCmd::Result { id, wait, client } => {
            let wait_ms = wait.map(|d| d.as_millis() as u64).unwrap_or(0);
            let r = connect(&client)
                .await?
                .get_result(pb::GetResultRequest { id, wait_ms })
                .await
                .map_err(status_err)?
                .into_inner();
            match client.output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({"id": r.id, "state": state_name(r.state), "done": r.done,
                        "result": String::from_utf8_lossy(&r.result), "error": r.error, "attempts": r.attempts,
                        "created_at_ms": r.created_at_ms, "ended_at_ms": r.ended_at_ms})
                ),
                Output::Table => {
                    println!("state    {}", state_name(r.state));
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
            let r = connect(&client).await?.cancel(pb::CancelRequest { id }).await.map_err(status_err)?;
            println!("{}", state_name(r.get_ref().state));
        }
        TaskCmd::Claim { queue, worker, count, lease, wait, client } => {
            let r = connect(&client)
                .await?
                .claim(pb::ClaimRequest {
                    worker_id: worker,
                    queues: queue,
                    count,
                    lease_ms: lease.map(|d| d.as_millis() as u64).unwrap_or(0),
                    wait_ms: wait.map(|d| d.as_millis() as u64).unwrap_or(0),
                })
                .await
                .map_err(status_err)?
                .into_inner();
            if client.output == Output::Json {
                println!("{}", serde_json::Value::Array(r.tasks.iter().map(task_json).collect()));
            } else {
                for t in &r.tasks {
                    let token = t.lease.as_ref().map(|l| l.token).unwrap_or(0);
                    println!("{}\t{}\ttoken={}\t{}", t.id, t.queue, token, String::from_utf8_lossy(&t.payload));
                }
            }
        }
        TaskCmd::Complete { id, token, result, then, client } => {
            let follow_ups = then
                .into_iter()
                .map(|t| match t.split_once(':') {
                    Some((queue, payload)) => Ok(pb::EnqueueRequest {
                        queue: queue.to_string(),
                        payload: payload.as_bytes().to_vec().into(),
                        ..Default::default()
                    }),
                    None => bail!("--then takes QUEUE:PAYLOAD, not {t:?}"),
                })
                .collect::<Result<Vec<_>>>()?;
            let action =
                pb::ack_request::Action::Complete(pb::Complete { result: result.into_bytes().into(), follow_ups });
            ack(&client, id, token, action).await?;
        }
        TaskCmd::Fail { id, token, error, retryable, client } => {
            let action = pb::ack_request::Action::Fail(pb::Fail { error, retryable });
            ack(&client, id, token, action).await?;
        }
        TaskCmd::Exception { id, token, reason, message, client } => {
            let action = pb::ack_request::Action::Exception(pb::Exception { reason, message });
            ack(&client, id, token, action).await?;
        }
        TaskCmd::Heartbeat { id, token, extend, percent, message, client } => {
            let action = pb::ack_request::Action::Heartbeat(pb::Heartbeat {
                extend_ms: extend.map(|d| d.as_millis() as u64).unwrap_or(0),
                progress: percent.map(|percent| pb::Progress { percent, message, at_ms: 0 }),
            });
            ack(&client, id, token, action).await?;
        }
    }
    Ok(())
}

async fn ack(client: &ClientArgs, task_id: String, token: u64, action: pb::ack_request::Action) -> Result<()> {
    let r = connect(client)
        .await?
        .ack(pb::AckRequest { task_id, token, action: Some(action) })
        .await
        .map_err(status_err)?;
    println!("{}", state_name(r.get_ref().state));
    for id in &r.get_ref().follow_up_ids {
        println!("follow-up {id}");
    }
    Ok(())
}

async fn queues_cmd(queues: Vec<String>, stale: bool, client: ClientArgs) -> Result<()> {
    let mut req = tonic::Request::new(pb::QueueStatsRequest { queues });
    if stale {
        req.metadata_mut().insert("x-raftq-read", "stale".parse()?);
    }
    let r = connect(&client).await?.queue_stats(req).await.map_err(status_err)?.into_inner();
    if client.output == Output::Json {
        let v: Vec<serde_json::Value> = r
            .queues
            .iter()
            .map(|q| {
                serde_json::json!({"queue": q.queue, "pending": q.pending, "delayed": q.delayed,
                    "in_progress": q.in_progress, "completed": q.completed, "failed": q.failed,
                    "cancelled": q.cancelled, "dead_lettered": q.dead_lettered})
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        println!(
            "{:<24} {:>9} {:>9} {:>11} {:>10} {:>8} {:>10} {:>8}",
            "queue", "pending", "delayed", "in_progress", "completed", "failed", "cancelled", "dead"
        );
        for q in &r.queues {
            println!(
                "{:<24} {:>9} {:>9} {:>11} {:>10} {:>8} {:>10} {:>8}",
                q.queue, q.pending, q.delayed, q.in_progress, q.completed, q.failed, q.cancelled, q.dead_lettered
            );
        }
    }
    Ok(())
}

async fn dlq_cmd(cmd: DlqCmd) -> Result<()> {
    match cmd {
        DlqCmd::List { queue, limit, client } => {
            let r = connect(&client)
                .await?
                .list_dead_letters(pb::ListDeadLettersRequest { queue, limit })
                .await
                .map_err(status_err)?
                .into_inner();
            if client.output == Output::Json {
                println!("{}", serde_json::Value::Array(r.tasks.iter().map(task_json).collect()));
            } else {
                for t in &r.tasks {
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
        DlqCmd::Redrive { queue, all, ids, client } => {
            let sel = pb::DeadLetterSelection { queue, ids, all };
            let r = connect(&client).await?.redrive(sel).await.map_err(status_err)?.into_inner();
            print_ids(client.output, "redriven", &r.ids);
        }
        DlqCmd::Purge { queue, all, ids, client } => {
            let sel = pb::DeadLetterSelection { queue, ids, all };
            let r = connect(&client).await?.purge_dead_letters(sel).await.map_err(status_err)?.into_inner();
            print_ids(client.output, "purged", &r.ids);
        }
    }
    Ok(())
}

fn print_ids(out: Output, what: &str, ids: &[String]) {
    match out {
        Output::Json => println!("{}", serde_json::json!({ what: ids })),
        Output::Table => {
            for id in ids {
                println!("{id}");
            }
            eprintln!("{} {what}", ids.len());
        }
    }
}

async fn admin(addr: &str, ca: Option<&PathBuf>, bearer: &Bearer) -> Result<AdminClient<Authed>> {
    let ch = channel_to(addr, ca, Some(Duration::from_secs(30))).await?;
    Ok(AdminClient::with_interceptor(ch, bearer.clone()))
}

/// The members the node at `c.addr` knows, each with an Admin client when it can be reached.
async fn members(c: &ClientArgs) -> Result<Vec<(pb::Member, Option<AdminClient<Authed>>)>> {
    let b = bearer(c)?;
    let me = admin(&c.addr, c.ca_file.as_ref(), &b)
        .await?
        .status(pb::NodeStatusRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    let mut out = Vec::new();
    for m in me.members {
        let client = admin(&m.api_addr, c.ca_file.as_ref(), &b).await.ok();
        out.push((m, client));
    }
    Ok(out)
}

async fn cluster_cmd(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Status { client } => {
            let mut rows = Vec::new();
            for (m, c) in members(&client).await? {
                let st = match c {
                    Some(mut c) => c.status(pb::NodeStatusRequest {}).await.ok().map(|r| r.into_inner()),
                    None => None,
                };
                rows.push((m, st));
            }
            let leader = rows.iter().find_map(|(_, s)| s.as_ref().filter(|s| s.role == "LEADER").cloned());
            if client.output == Output::Json {
                let nodes: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|(m, s)| {
                        serde_json::json!({
                            "node_id": m.node_id, "api_addr": m.api_addr, "raft_addr": m.raft_addr, "voter": m.voter,
                            "reachable": s.is_some(),
                            "role": s.as_ref().map(|s| s.role.clone()),
                            "term": s.as_ref().map(|s| s.term),
                            "last_log_index": s.as_ref().map(|s| s.last_log_index),
                            "applied_index": s.as_ref().map(|s| s.applied_index),
                            "replication_lag": leader.as_ref().and_then(|l| l.replication_lag.get(&m.node_id)),
                        })
                    })
                    .collect();
                println!("{}", serde_json::json!({ "leader": leader.as_ref().map(|l| l.node_id), "nodes": nodes }));
            } else {
                println!(
                    "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8}  reachable",
                    "id", "api", "voter", "role", "term", "last_log", "applied", "lag"
                );
                for (m, s) in &rows {
                    let lag = leader
                        .as_ref()
                        .and_then(|l| l.replication_lag.get(&m.node_id))
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "-".into());
                    match s {
                        Some(s) => println!(
                            "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8}  yes",
                            m.node_id, m.api_addr, m.voter, s.role, s.term, s.last_log_index, s.applied_index, lag
                        ),
                        None => println!(
                            "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8}  no",
                            m.node_id, m.api_addr, m.voter, "-", "-", "-", "-", lag
                        ),
                    }
                }
            }
        }
        ClusterCmd::TransferLeader { to, timeout, client } => {
            let r = admin(&client.addr, client.ca_file.as_ref(), &bearer(&client)?)
                .await?
                .transfer_leader(pb::TransferLeaderRequest {
                    to: to.unwrap_or(0),
                    timeout_ms: timeout.map(|d| d.as_millis() as u64).unwrap_or(0),
                })
                .await
                .map_err(status_err)?
                .into_inner();
            match client.output {
                Output::Json => println!("{}", serde_json::json!({"leader": r.leader_id, "took_ms": r.took_ms})),
                Output::Table => println!("node {} leads (took {} ms)", r.leader_id, r.took_ms),
            }
        }
        ClusterCmd::AddNode { id, raft_addr, api_addr, learner, client } => {
            let r = admin(&client.addr, client.ca_file.as_ref(), &bearer(&client)?)
                .await?
                .add_node(pb::AddNodeRequest { node_id: id, raft_addr, api_addr, learner_only: learner })
                .await
                .map_err(status_err)?
                .into_inner();
            print_members(client.output, &r.members);
        }
        ClusterCmd::RemoveNode { id, force, client } => {
            let r = admin(&client.addr, client.ca_file.as_ref(), &bearer(&client)?)
                .await?
                .remove_node(pb::RemoveNodeRequest { node_id: id, force })
                .await
                .map_err(status_err)?
                .into_inner();
            print_members(client.output, &r.members);
        }
        ClusterCmd::Digest { client } => {
            let mut out = Vec::new();
            for (m, c) in members(&client).await? {
                let d = match c {
                    Some(mut c) => c.digest(pb::DigestRequest {}).await.ok().map(|r| r.into_inner()),
                    None => None,
                };
                out.push((m.node_id, d));
            }
            for (id, d) in out {
                match (client.output, d) {
                    (Output::Json, Some(d)) => println!(
                        "{}",
                        serde_json::json!({"node_id": id, "applied_index": d.applied_index, "digest": format!("{:016x}", d.digest), "tasks": d.tasks})
                    ),
                    (Output::Json, None) => println!("{}", serde_json::json!({"node_id": id, "reachable": false})),
                    (Output::Table, Some(d)) => {
                        println!("node {id}: applied {} digest {:016x} tasks {}", d.applied_index, d.digest, d.tasks)
                    }
                    (Output::Table, None) => println!("node {id}: unreachable"),
                }
            }
        }
    }
    Ok(())
}

fn print_members(out: Output, members: &[pb::Member]) {
    for m in members {
        match out {
            Output::Json => println!(
                "{}",
                serde_json::json!({"node_id": m.node_id, "raft_addr": m.raft_addr, "api_addr": m.api_addr, "voter": m.voter})
            ),
            Output::Table => println!(
                "{}\t{}\t{}\t{}",
                m.node_id,
                if m.voter { "voter" } else { "learner" },
                m.raft_addr,
                m.api_addr
            ),
        }
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    /// Every subcommand's arguments are well formed (unique names, no clash with the global client flags).
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
