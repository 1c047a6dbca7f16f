//! Server configuration: every default in one `impl Default`, `validate()` reporting every violated invariant
//! before any socket is bound, and the layering of its sources in [`Config::load`]: defaults < TOML file <
//! `RAFTQ_*` environment < flags ([`Overrides`] lists the flags, each with its variable). Secrets come from the
//! environment or files, never flags.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::queue::RetryPolicy;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub node_id: u64,
    pub data_dir: PathBuf,
    /// Public gRPC (task API).
    pub grpc_addr: String,
    /// Internal Raft gRPC, peers only.
    pub raft_addr: String,
    /// HTTP: health now, REST later.
    pub http_addr: String,
    /// Addresses peers and clients should use for this node, when they differ from the bind addresses.
    pub advertise_raft_addr: Option<String>,
    pub advertise_grpc_addr: Option<String>,
    /// Number of redb shard files of the state machine. Fixed for a data directory once created.
    pub shards: usize,
    /// The cluster's voters at first start (this node may be listed too). Empty: a one-node cluster.
    pub peers: Vec<Peer>,
    /// Who initialises a new cluster: `Some(true)` this node, `Some(false)` never (a node that will be added
    /// with `cluster add-node`), `None` the lowest id of `peers` and this node.
    pub bootstrap: Option<bool>,

    pub heartbeat_interval_ms: u64,
    /// A follower that hears nothing from the leader for the maximum plus a random timeout between these two
    /// starts an election (openraft's leader lease is the maximum).
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot (and purge the log before it) every this many entries.
    pub snapshot_every_entries: u64,
    /// Log entries kept behind a snapshot, so a briefly lagging follower catches up from the log.
    pub snapshot_keep_entries: u64,
    /// The log is purged in steps of at least this many entries.
    pub purge_batch_entries: u64,

    pub max_payload_bytes: usize,
    pub max_batch_items: usize,
    pub max_queue_name_len: usize,
    pub max_idempotency_key_len: usize,
    pub max_webhook_url_len: usize,
    pub max_delay_ms: u64,
    pub lease_min_ms: u64,
    pub lease_max_ms: u64,
    pub lease_default_ms: u64,
    pub max_attempts_default: u32,
    pub max_attempts_limit: u32,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    pub retry_exponential: bool,
    /// How long completed, failed and cancelled tasks are kept after they end.
    pub retention_ms: u64,
    pub idempotency_window_ms: u64,
    /// Longest wait a GetResult or Claim may ask for.
    pub max_wait_ms: u64,
    /// Longest a proposal may take before its outcome is reported unknown.
    pub write_timeout_ms: u64,
    /// Most items one coalesced Raft entry carries.
    pub max_items_per_entry: usize,
    /// How long a worker's Ready waits for work before it is answered with an empty batch.
    pub ready_hold_ms: u64,
    /// Server events buffered per stream before a slow client gets backpressure.
    pub stream_send_buffer: usize,
    /// Requests of one stream being served at once; more wait (backpressure on the client's sends).
    pub stream_max_in_flight: usize,
    /// Producer flow control (`leader::flow`): with more than this many tasks ready and workers waiting on the
    /// server, enqueues are let in as fast as tasks are claimed. 0: never.
    pub flow_backlog: u64,
    /// Longest an enqueue waits for room under flow control before it is refused with `RATE_LIMITED`.
    pub flow_max_wait_ms: u64,
    /// Longest an enqueue that finds its queue (or tenant) at its `max_depth` waits on the leader for room
    /// before it is refused with `QUEUE_FULL` (0: refused at once). A full queue that workers drain then stays
    /// topped up, where producers that all waited out a retry hint let it run dry (`leader::limits`).
    pub depth_hold_ms: u64,

    /// `jwt` (the default): every call needs a valid token. `none`: anyone may call, as tenant `default`.
    pub auth: AuthMode,
    /// A directory of verification keys named `<kid>.<alg>[.pem]` (alg: hs256, rs256, es256, eddsa).
    pub auth_keys_dir: Option<PathBuf>,
    /// A file holding an HS256 secret (at least 32 bytes); also the cluster secret unless one is set.
    pub auth_hs256_secret_file: Option<PathBuf>,
    /// Create `auth_hs256_secret_file` with a random secret when it does not exist (nodes sharing a volume).
    pub auth_hs256_secret_create: bool,
    /// The HS256 secret itself (prefer the file; env RAFTQ_AUTH_HS256_SECRET).
    pub auth_hs256_secret: Option<Secret>,
    /// Required `iss` of tokens, when set.
    pub auth_issuer: Option<String>,
    /// Required `aud` of tokens, when set.
    pub auth_audience: Option<String>,
    /// Clock leeway for `exp` and `nbf`, in seconds.
    pub auth_leeway_s: u64,
    /// The secret peers prove on the Raft port (a file; or `cluster_secret`, env RAFTQ_CLUSTER_SECRET).
    pub cluster_secret_file: Option<PathBuf>,
    pub cluster_secret: Option<Secret>,
    /// Tasks a tenant may enqueue per second, cluster-wide (checked by the leader); 0: no limit.
    pub tenant_enqueue_per_s: f64,
    /// Tasks a tenant may enqueue at once above its rate.
    pub tenant_enqueue_burst: u64,
    /// Tasks a tenant's workers may claim per second, cluster-wide; 0: no limit.
    pub tenant_claim_per_s: f64,
    pub tenant_claim_burst: u64,
    /// Worker and producer streams one tenant may hold open on one node.
    pub tenant_max_streams: usize,
    /// TLS on every port (gRPC, HTTP, Raft) with this certificate chain and key (PEM).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// The CA peers are verified with; the Raft port then also demands a peer certificate it signed.
    pub tls_ca_file: Option<PathBuf>,

    /// HMAC-SHA256 key for the `x-raftq-signature` header of webhook deliveries (or `RAFTQ_WEBHOOK_SECRET`).
    /// Without a secret (here or in `webhook_secret_file`) deliveries are sent unsigned.
    pub webhook_secret: Option<Secret>,
    /// A file holding the webhook secret (trailing whitespace ignored); read at start.
    pub webhook_secret_file: Option<PathBuf>,
    /// Delivery attempts per webhook before it is given up.
    pub webhook_max_attempts: u32,
    /// Backoff between attempts: `webhook_retry_base_ms * 2^(tries-1)`, capped at `webhook_retry_max_ms`.
    pub webhook_retry_base_ms: u64,
    pub webhook_retry_max_ms: u64,
    /// Longest one delivery attempt may take (connect, send, answer).
    pub webhook_timeout_ms: u64,
    /// Deliveries the leader has in flight at once.
    pub webhook_concurrency: usize,
    /// `text` (human-readable) or `json` (one object per line) logs of `raftq serve`.
    pub log_format: LogFormat,
    /// An OTLP/HTTP collector (e.g. `http://127.0.0.1:4318`): raftq's trace spans are posted to `<it>/v1/traces`
    /// (JSON encoding). None: no export.
    pub otlp_endpoint: Option<String>,
    /// A worker counts as active for a queue's capacity view when it asked for that queue's work this recently.
    pub active_worker_window_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Jwt,
    None,
}

/// A secret from the configuration: never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            data_dir: PathBuf::from("./raftq-data"),
            grpc_addr: "127.0.0.1:9091".into(),
            raft_addr: "127.0.0.1:7000".into(),
            http_addr: "127.0.0.1:8080".into(),
            advertise_raft_addr: None,
            advertise_grpc_addr: None,
            shards: 4,
            peers: vec![],
            bootstrap: None,
            // A follower stands for election once it has heard nothing from the leader for openraft's leader
            // lease (the maximum election timeout) plus a random election timeout: 450-600 ms here, so a dead
            // leader is replaced within about 0.6 s. 50 ms heartbeats keep a live leader's followers far from it
            // (9x); appends do not time out with the heartbeat (`raft::network`), so a slow round trip or fsync
            // does not stall replication.
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            snapshot_every_entries: 100_000,
            snapshot_keep_entries: 1_000,
            purge_batch_entries: 256,
            max_payload_bytes: 1024 * 1024,
            max_batch_items: 1000,
            max_queue_name_len: 128,
            max_idempotency_key_len: 256,
            max_webhook_url_len: 2048,
            max_delay_ms: 366 * 24 * 3600 * 1000,
            lease_min_ms: 1_000,
            lease_max_ms: 12 * 3600 * 1000,
            lease_default_ms: 30_000,
            max_attempts_default: 5,
            max_attempts_limit: 1000,
            retry_base_ms: 1_000,
            retry_max_ms: 300_000,
            retry_exponential: true,
            retention_ms: 24 * 3600 * 1000,
            idempotency_window_ms: 24 * 3600 * 1000,
            max_wait_ms: 60_000,
            write_timeout_ms: 10_000,
            max_items_per_entry: 4096,
            ready_hold_ms: 30_000,
            stream_send_buffer: 256,
            stream_max_in_flight: 1024,
            flow_backlog: 5_000,
            flow_max_wait_ms: 2_000,
            depth_hold_ms: 250,
            auth: AuthMode::Jwt,
            auth_keys_dir: None,
            auth_hs256_secret_file: None,
            auth_hs256_secret_create: false,
            auth_hs256_secret: None,
            auth_issuer: None,
            auth_audience: None,
            auth_leeway_s: 30,
            cluster_secret_file: None,
            cluster_secret: None,
            tenant_enqueue_per_s: 0.0,
            tenant_enqueue_burst: 10_000,
            tenant_claim_per_s: 0.0,
            tenant_claim_burst: 10_000,
            tenant_max_streams: 1_000,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            webhook_secret: None,
            webhook_secret_file: None,
            // About 4.5 hours of retries with the backoff below (1 s doubling to 30 min): a receiver that is down
            // for a deploy or an incident still gets its events.
            webhook_max_attempts: 15,
            webhook_retry_base_ms: 1_000,
            webhook_retry_max_ms: 30 * 60 * 1000,
            // Receivers should answer quickly and queue their own work; a slow one only costs a sender slot.
            webhook_timeout_ms: 10_000,
            // Enough parallel deliveries for a busy queue; each is one HTTP request.
            webhook_concurrency: 16,
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            // Twice the Ready hold: an idle worker re-arms its Ready at least once per hold time.
            active_worker_window_ms: 60_000,
        }
    }
}

/// A cluster member: its node id and where peers and clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: u64,
    pub raft_addr: String,
    pub api_addr: String,
}

impl std::str::FromStr for Peer {
    type Err = String;
    /// `ID=RAFT_ADDR,API_ADDR`, e.g. `2=node2:7000,node2:9091`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("peer {s:?} is not ID=RAFT_ADDR,API_ADDR");
        let (id, addrs) = s.split_once('=').ok_or_else(bad)?;
        let (raft, api) = addrs.split_once(',').ok_or_else(bad)?;
        let id = id.trim().parse().map_err(|_| bad())?;
        if raft.trim().is_empty() || api.trim().is_empty() {
            return Err(bad());
        }
        Ok(Peer { id, raft_addr: raft.trim().to_string(), api_addr: api.trim().to_string() })
    }
}

impl Config {
    /// Whether this node initialises the cluster on its first start.
    pub fn bootstraps(&self) -> bool {
        match self.bootstrap {
            Some(b) => b,
            None => self.peers.iter().map(|p| p.id).chain([self.node_id]).min() == Some(self.node_id),
        }
    }

    /// Every violated invariant, one line each.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut e = Vec::new();
        let mut check = |ok: bool, msg: &str| {
            if !ok {
                e.push(msg.to_string());
            }
        };
        check(self.node_id > 0, "node_id must be > 0");
        check(self.shards >= 1 && self.shards <= 256, "shards must be 1..=256");
        check(self.heartbeat_interval_ms > 0, "heartbeat_interval_ms must be > 0");
        check(
            self.heartbeat_interval_ms < self.election_timeout_min_ms,
            "heartbeat_interval_ms must be < election_timeout_min_ms",
        );
        check(
            self.election_timeout_min_ms < self.election_timeout_max_ms,
            "election_timeout_min_ms must be < election_timeout_max_ms",
        );
        check(self.snapshot_every_entries >= 10, "snapshot_every_entries must be >= 10");
        check(self.max_payload_bytes >= 1, "max_payload_bytes must be >= 1");
        check(
            self.max_payload_bytes <= 32 * 1024 * 1024,
            "max_payload_bytes must be <= 32 MiB (it travels in one Raft entry)",
        );
        check(self.max_batch_items >= 1, "max_batch_items must be >= 1");
        check(
            self.max_items_per_entry >= 1 && (self.max_items_per_entry as u64) < crate::queue::MAX_ITEMS_PER_COMMAND,
            "max_items_per_entry must be 1..65536",
        );
        check(self.max_batch_items <= self.max_items_per_entry, "max_batch_items must be <= max_items_per_entry");
        check((1..=1024).contains(&self.max_queue_name_len), "max_queue_name_len must be 1..=1024");
        check(
            self.lease_min_ms >= 1 && self.lease_min_ms <= self.lease_max_ms,
            "lease_min_ms must be 1..=lease_max_ms",
        );
        check(
            (self.lease_min_ms..=self.lease_max_ms).contains(&self.lease_default_ms),
            "lease_default_ms must be within lease_min_ms..=lease_max_ms",
        );
        check(
            self.max_attempts_default >= 1 && self.max_attempts_default <= self.max_attempts_limit,
            "max_attempts_default must be 1..=max_attempts_limit",
        );
        check(self.retry_base_ms <= self.retry_max_ms, "retry_base_ms must be <= retry_max_ms");
        check(self.write_timeout_ms >= 100, "write_timeout_ms must be >= 100");
        check(
            (10..self.write_timeout_ms).contains(&self.flow_max_wait_ms),
            "flow_max_wait_ms must be >= 10 and below write_timeout_ms",
        );
        check(self.depth_hold_ms < self.write_timeout_ms, "depth_hold_ms must be below write_timeout_ms");
        check(
            self.tenant_enqueue_per_s >= 0.0 && self.tenant_claim_per_s >= 0.0,
            "tenant_enqueue_per_s and tenant_claim_per_s must be >= 0 (0: no limit)",
        );
        check(
            self.tenant_enqueue_burst >= self.max_batch_items as u64 || self.tenant_enqueue_per_s == 0.0,
            "tenant_enqueue_burst must be >= max_batch_items (a full batch must be able to pass)",
        );
        check(self.tenant_claim_burst >= 1, "tenant_claim_burst must be >= 1");
        check(self.tenant_max_streams >= 1, "tenant_max_streams must be >= 1");
        check(self.auth_leeway_s <= 600, "auth_leeway_s must be <= 600");
        check(
            self.webhook_secret.is_none() || self.webhook_secret_file.is_none(),
            "give webhook_secret or webhook_secret_file, not both",
        );
        check(self.webhook_max_attempts >= 1, "webhook_max_attempts must be >= 1");
        check(self.webhook_retry_base_ms >= 1, "webhook_retry_base_ms must be >= 1");
        check(
            self.webhook_retry_base_ms <= self.webhook_retry_max_ms,
            "webhook_retry_base_ms must be <= webhook_retry_max_ms",
        );
        check(self.webhook_timeout_ms >= 1, "webhook_timeout_ms must be >= 1");
        check(self.webhook_concurrency >= 1, "webhook_concurrency must be >= 1");
        check(
            self.otlp_endpoint.as_deref().is_none_or(|e| e.starts_with("http://")),
            "otlp_endpoint must be an http:// URL",
        );
        if e.is_empty() {
            Ok(())
        } else {
            Err(e)
        }
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy { base_ms: self.retry_base_ms, max_ms: self.retry_max_ms, exponential: self.retry_exponential }
    }

    /// The webhook signing key: `webhook_secret`, or the contents of `webhook_secret_file`.
    pub fn webhook_key(&self) -> std::io::Result<Option<Vec<u8>>> {
        match (&self.webhook_secret, &self.webhook_secret_file) {
            (Some(s), _) => Ok(Some(s.0.as_bytes().to_vec())),
            (None, Some(p)) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("webhook_secret_file {}: {e}", p.display())))?;
                Ok(Some(text.trim_end().as_bytes().to_vec()))
            }
            (None, None) => Ok(None),
        }
    }

    pub fn public_raft_addr(&self) -> String {
        self.advertise_raft_addr.clone().unwrap_or_else(|| self.raft_addr.clone())
    }

    pub fn public_grpc_addr(&self) -> String {
        self.advertise_grpc_addr.clone().unwrap_or_else(|| self.grpc_addr.clone())
    }

    /// How long a leader no quorum acknowledges holds its heartbeats and appends, then sends them, and so on
    /// (openraft's `quorum_loss_probe_interval`; `raft::network::QuorumGate`).
    pub fn quorum_loss_probe_interval_ms(&self) -> u64 {
        self.election_timeout_max_ms.saturating_mul(3)
    }

    pub fn openraft(&self) -> Result<openraft::Config, String> {
        let c = openraft::Config {
            cluster_name: "raftq".into(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            // Snapshots of a large queue take a while to ship and install.
            install_snapshot_timeout: 60_000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.snapshot_keep_entries,
            purge_batch_size: self.purge_batch_entries.max(1),
            max_payload_entries: 1_000,
            // A node that comes back (or was cut off) first asks whether it could win before it disrupts a
            // healthy leader with a higher term.
            enable_pre_vote: Some(true),
            // CheckQuorum: a leader no quorum has acknowledged for a lease (the longest election timeout) holds its
            // heartbeats for three election timeouts, then sends them for as long, and so on (its appends too, in
            // phases starting a lease later: `raft::network::QuorumGate`). A leader that still sends but no longer
            // hears the others (a one-way partition) would otherwise renew their lease for as long as the fault
            // lasts, so no one else would stand, and writes would stop. The followers' lease runs out and their
            // slowest election timer fires within two election timeouts of the last append, inside the phases.
            quorum_loss_probe_interval: Some(self.quorum_loss_probe_interval_ms()),
            ..Default::default()
        };
        c.validate().map_err(|e| e.to_string())
    }
}

/// What can stop a configuration from loading.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The settings `raftq serve` takes as flags, each also read from its `RAFTQ_*` variable (a flag wins over its
/// variable); what is not given keeps the file's value (or the default). Every other setting is in the file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    #[arg(long, env = "RAFTQ_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[arg(long, env = "RAFTQ_GRPC_ADDR")]
    pub grpc_addr: Option<String>,
    #[arg(long, env = "RAFTQ_RAFT_ADDR")]
    pub raft_addr: Option<String>,
    #[arg(long, env = "RAFTQ_HTTP_ADDR")]
    pub http_addr: Option<String>,
    #[arg(long, env = "RAFTQ_NODE_ID")]
    pub node_id: Option<u64>,
    #[arg(long, env = "RAFTQ_SHARDS")]
    pub shards: Option<usize>,
    /// A cluster member, `ID=RAFT_ADDR,API_ADDR` (repeat for each; RAFTQ_PEERS separates them with ';').
    #[arg(long = "peer", env = "RAFTQ_PEERS", value_delimiter = ';')]
    pub peers: Vec<Peer>,
    /// Initialise a new cluster from this node (default: the lowest id of the peers does).
    #[arg(long, env = "RAFTQ_BOOTSTRAP", conflicts_with = "join")]
    pub bootstrap: bool,
    /// Never initialise: wait to be added with `raftq cluster add-node`.
    #[arg(long, env = "RAFTQ_JOIN")]
    pub join: bool,
    /// Address peers and clients use for this node's Raft port, when it differs from --raft-addr.
    #[arg(long, env = "RAFTQ_ADVERTISE_RAFT_ADDR")]
    pub advertise_raft_addr: Option<String>,
    /// Address clients use for this node's gRPC port, when it differs from --grpc-addr.
    #[arg(long, env = "RAFTQ_ADVERTISE_GRPC_ADDR")]
    pub advertise_grpc_addr: Option<String>,
    /// `jwt` (default): every call needs a token. `none`: no authentication, every caller is tenant `default`.
    #[arg(long, env = "RAFTQ_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// Verification keys, named `<kid>.<hs256|rs256|es256|eddsa>[.pem]`.
    #[arg(long, env = "RAFTQ_AUTH_KEYS_DIR")]
    pub auth_keys_dir: Option<PathBuf>,
    /// An HS256 secret file (tokens and, unless a cluster secret is set, the Raft port).
    #[arg(long, env = "RAFTQ_AUTH_HS256_SECRET_FILE")]
    pub auth_hs256_secret_file: Option<PathBuf>,
    #[arg(long, env = "RAFTQ_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,
    #[arg(long, env = "RAFTQ_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,
    /// Create the --auth-hs256-secret-file with a random secret when it does not exist.
    #[arg(long, env = "RAFTQ_AUTH_HS256_SECRET_CREATE")]
    pub auth_hs256_secret_create: bool,
    /// The secret peers prove on the Raft port.
    #[arg(long, env = "RAFTQ_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// TLS on every port: certificate chain (PEM).
    #[arg(long, env = "RAFTQ_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, env = "RAFTQ_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA that peers' certificates are verified with (mutual TLS on the Raft port).
    #[arg(long, env = "RAFTQ_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Log format: text or json (one object per line).
    #[arg(long, env = "RAFTQ_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Raft heartbeat interval (ms), for links or machines slower than the defaults assume.
    #[arg(long, env = "RAFTQ_HEARTBEAT_INTERVAL_MS")]
    pub heartbeat_interval_ms: Option<u64>,
    /// Shortest random election timeout (ms), added to the leader lease (the longest).
    #[arg(long, env = "RAFTQ_ELECTION_TIMEOUT_MIN_MS")]
    pub election_timeout_min_ms: Option<u64>,
    /// Longest random election timeout (ms), also openraft's leader lease.
    #[arg(long, env = "RAFTQ_ELECTION_TIMEOUT_MAX_MS")]
    pub election_timeout_max_ms: Option<u64>,
}

/// Secrets given by value: read from these variables only (a flag would show in `ps`).
const ENV_AUTH_HS256_SECRET: &str = "RAFTQ_AUTH_HS256_SECRET";
const ENV_CLUSTER_SECRET: &str = "RAFTQ_CLUSTER_SECRET";
const ENV_WEBHOOK_SECRET: &str = "RAFTQ_WEBHOOK_SECRET";

impl Overrides {
    /// Sets every field given here on `cfg`.
    fn apply(&self, cfg: &mut Config) {
        let Overrides {
            data_dir,
            grpc_addr,
            raft_addr,
            http_addr,
            node_id,
            shards,
            peers,
            bootstrap,
            join,
            advertise_raft_addr,
            advertise_grpc_addr,
            auth,
            auth_keys_dir,
            auth_hs256_secret_file,
            auth_issuer,
            auth_audience,
            auth_hs256_secret_create,
            cluster_secret_file,
            tls_cert_file,
            tls_key_file,
            tls_ca_file,
            log_format,
            heartbeat_interval_ms,
            election_timeout_min_ms,
            election_timeout_max_ms,
        } = self.clone();
        fn set<T>(to: &mut T, v: Option<T>) {
            if let Some(v) = v {
                *to = v;
            }
        }
        set(&mut cfg.data_dir, data_dir);
        set(&mut cfg.grpc_addr, grpc_addr);
        set(&mut cfg.raft_addr, raft_addr);
        set(&mut cfg.http_addr, http_addr);
        set(&mut cfg.node_id, node_id);
        set(&mut cfg.shards, shards);
        set(&mut cfg.peers, (!peers.is_empty()).then_some(peers));
        set(&mut cfg.bootstrap, bootstrap.then_some(Some(true)));
        set(&mut cfg.bootstrap, join.then_some(Some(false)));
        set(&mut cfg.advertise_raft_addr, advertise_raft_addr.map(Some));
        set(&mut cfg.advertise_grpc_addr, advertise_grpc_addr.map(Some));
        set(&mut cfg.auth, auth);
        set(&mut cfg.auth_keys_dir, auth_keys_dir.map(Some));
        set(&mut cfg.auth_hs256_secret_file, auth_hs256_secret_file.map(Some));
        set(&mut cfg.auth_issuer, auth_issuer.map(Some));
        set(&mut cfg.auth_audience, auth_audience.map(Some));
        set(&mut cfg.auth_hs256_secret_create, auth_hs256_secret_create.then_some(true));
        set(&mut cfg.cluster_secret_file, cluster_secret_file.map(Some));
        set(&mut cfg.tls_cert_file, tls_cert_file.map(Some));
        set(&mut cfg.tls_key_file, tls_key_file.map(Some));
        set(&mut cfg.tls_ca_file, tls_ca_file.map(Some));
        set(&mut cfg.log_format, log_format);
        set(&mut cfg.heartbeat_interval_ms, heartbeat_interval_ms);
        set(&mut cfg.election_timeout_min_ms, election_timeout_min_ms);
        set(&mut cfg.election_timeout_max_ms, election_timeout_max_ms);
    }
}

impl Config {
    /// A TOML file's configuration over the defaults (unknown keys are refused); not validated.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_path_buf(), source: Box::new(e) })
    }

    /// The effective configuration of `raftq serve`, validated: the defaults, then `file`, then `overrides`
    /// (flags and their `RAFTQ_*` variables), then the secrets the environment gives by value
    /// (`RAFTQ_AUTH_HS256_SECRET`, `RAFTQ_CLUSTER_SECRET`, `RAFTQ_WEBHOOK_SECRET`).
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Config::load_with_env(file, overrides, |name| std::env::var(name).ok())
    }

    /// [`Config::load`] with the environment's secrets read through `env`.
    pub fn load_with_env(
        file: Option<&Path>,
        overrides: &Overrides,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = match file {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        overrides.apply(&mut cfg);
        if let Some(v) = env(ENV_AUTH_HS256_SECRET) {
            cfg.auth_hs256_secret = Some(Secret(v));
        }
        if let Some(v) = env(ENV_CLUSTER_SECRET) {
            cfg.cluster_secret = Some(Secret(v));
        }
        // The variable wins over a secret file named in the TOML file (they may not both be set).
        if let Some(v) = env(ENV_WEBHOOK_SECRET) {
            cfg.webhook_secret = Some(Secret(v));
            cfg.webhook_secret_file = None;
        }
        cfg.validate().map_err(ConfigError::Invalid)?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A default as the README's limits table writes it: `1,000`, `1 MiB`, `250 ms`, `30 s`, `12 h`, `366 days`,
    /// `0 (no limit)`.
    fn as_written(key: &str, v: &serde_json::Value) -> String {
        let n = v.as_f64().expect("a number");
        let grouped = |n: u64| {
            let d = n.to_string();
            let mut out = String::new();
            for (i, c) in d.chars().enumerate() {
                if i > 0 && (d.len() - i).is_multiple_of(3) {
                    out.push(',');
                }
                out.push(c);
            }
            out
        };
        if n == 0.0 {
            return "0 (no limit)".into();
        }
        let n = n as u64;
        if key.ends_with("_ms") {
            return match n {
                n if n % 86_400_000 == 0 && n > 86_400_000 => format!("{} days", n / 86_400_000),
                n if n % 3_600_000 == 0 => format!("{} h", n / 3_600_000),
                n if n % 1000 != 0 => format!("{n} ms"),
                n => format!("{} s", n / 1000),
            };
        }
        if key.ends_with("_bytes") && n.is_multiple_of(1 << 20) {
            return format!("{} MiB", n >> 20);
        }
        grouped(n)
    }

    #[test]
    fn the_readme_limits_table_names_real_keys_with_their_defaults() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
        let defaults = serde_json::to_value(Config::default()).expect("config as JSON");
        let table = readme.split("| key | default | what it bounds |").nth(1).expect("the limits table in README.md");
        let mut checked = 0;
        for row in table.lines().skip(2).take_while(|l| l.trim_start().starts_with('|')) {
            let cells: Vec<&str> = row.trim().trim_matches('|').split('|').map(str::trim).collect();
            let keys: Vec<&str> = cells[0].split(" / ").map(|k| k.trim_matches('`')).collect();
            // The default cell may add a remark in brackets after the value, e.g. `1 MiB (at most 32 MiB)`.
            let written: Vec<&str> = cells[1].split(" / ").collect();
            assert_eq!(keys.len(), written.len(), "one default per key: {row}");
            for (key, w) in keys.iter().zip(written) {
                let v = defaults.get(*key).unwrap_or_else(|| panic!("README limits table: no config key {key}"));
                let want = as_written(key, v);
                assert!(
                    w.trim() == want || w.trim().starts_with(&format!("{want} (")),
                    "{key}: README says {w:?}, the default is {want}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} limits checked: has the table's layout changed?");
        // The burst rule the table states is the rule validate() enforces.
        let mut c = Config { tenant_enqueue_per_s: 10.0, tenant_enqueue_burst: 10, ..Config::default() };
        assert!(c.validate().is_err(), "a burst below max_batch_items is refused");
        c.tenant_enqueue_burst = c.max_batch_items as u64;
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Config::default().validate(), Ok(()));
        assert!(Config::default().openraft().is_ok());
    }

    #[test]
    fn validate_reports_every_violation() {
        let c = Config { heartbeat_interval_ms: 1000, lease_default_ms: 1, shards: 0, ..Config::default() };
        let errs = c.validate().expect_err("invalid");
        assert_eq!(errs.len(), 3, "{errs:?}");
    }

    #[test]
    fn lowest_listed_id_bootstraps_unless_told_otherwise() {
        let peers: Vec<Peer> = ["1=a:7000,a:9091", "2=b:7000,b:9091", "3=c:7000,c:9091"]
            .iter()
            .map(|p| p.parse().expect("peer"))
            .collect();
        let at = |id, bootstrap| Config { node_id: id, peers: peers.clone(), bootstrap, ..Config::default() };
        assert!(at(1, None).bootstraps());
        assert!(!at(2, None).bootstraps());
        assert!(at(2, Some(true)).bootstraps());
        assert!(!at(1, Some(false)).bootstraps());
        assert!(Config::default().bootstraps(), "a lone node initialises itself");
        assert!("x=a,b".parse::<Peer>().is_err());
        assert!("1=a".parse::<Peer>().is_err());
    }

    #[test]
    fn secrets_never_show_in_the_logged_config() {
        let c: Config = toml::from_str("webhook_secret = \"hunter2\"\nlog_format = \"json\"").expect("parse");
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.webhook_key().expect("key"), Some(b"hunter2".to_vec()));
        assert!(!format!("{c:?}").contains("hunter2"));
        let both = Config { webhook_secret_file: Some("/x".into()), ..c };
        assert_eq!(both.validate().expect_err("both").len(), 1);

        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("secret");
        std::fs::write(&path, "from-a-file\n").expect("write");
        let from_file = Config { webhook_secret_file: Some(path), ..Config::default() };
        assert_eq!(from_file.webhook_key().expect("key"), Some(b"from-a-file".to_vec()));
        let missing = Config { webhook_secret_file: Some(dir.path().join("nope")), ..Config::default() };
        assert!(missing.webhook_key().is_err(), "a missing secret file stops the start");
    }

    /// `raftq serve`'s flags as clap reads them.
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        o: Overrides,
    }

    fn flags(args: &[&str]) -> Overrides {
        use clap::Parser;
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).expect("flags").o
    }

    #[test]
    fn load_layers_defaults_then_the_file_then_flags_then_secrets_from_the_environment() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "node_id = 2\nshards = 8\ngrpc_addr = \"127.0.0.1:1\"\nwebhook_secret_file = \"/w\"\n")
            .expect("write");
        let o = flags(&["--grpc-addr", "127.0.0.1:2", "--peer", "2=a:1,a:2", "--join", "--log-format", "json"]);
        let env = |name: &str| match name {
            "RAFTQ_AUTH_HS256_SECRET" => Some("s3cret".to_string()),
            "RAFTQ_WEBHOOK_SECRET" => Some("hook".to_string()),
            _ => None,
        };
        let c = Config::load_with_env(Some(&file), &o, env).expect("valid");
        assert_eq!((c.node_id, c.shards), (2, 8), "from the file");
        assert_eq!(c.grpc_addr, "127.0.0.1:2", "a flag wins over the file");
        assert_eq!(c.http_addr, Config::default().http_addr, "neither: the default");
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.bootstrap, Some(false));
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.auth_hs256_secret.as_deref(), Some("s3cret"));
        assert_eq!((c.webhook_secret.as_deref(), c.webhook_secret_file), (Some("hook"), None));
        // Without any source: the defaults.
        assert_eq!(Config::load_with_env(None, &Overrides::default(), |_| None).expect("valid"), Config::default());
    }

    #[test]
    fn a_flag_wins_over_its_variable_and_the_variable_over_the_file() {
        // Only this test sets these variables, and no other test reads the settings they name.
        std::env::set_var("RAFTQ_ADVERTISE_RAFT_ADDR", "from-env:7000");
        std::env::set_var("RAFTQ_AUTH_ISSUER", "env-issuer");
        let from_env = flags(&[]);
        let from_flag = flags(&["--advertise-raft-addr", "from-flag:7000"]);
        std::env::remove_var("RAFTQ_ADVERTISE_RAFT_ADDR");
        std::env::remove_var("RAFTQ_AUTH_ISSUER");
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "advertise_raft_addr = \"from-file:7000\"\nauth_issuer = \"file-issuer\"\n")
            .expect("write");
        let c = Config::load_with_env(Some(&file), &from_env, |_| None).expect("valid");
        assert_eq!(c.advertise_raft_addr.as_deref(), Some("from-env:7000"));
        assert_eq!(c.auth_issuer.as_deref(), Some("env-issuer"));
        let c = Config::load_with_env(Some(&file), &from_flag, |_| None).expect("valid");
        assert_eq!(c.advertise_raft_addr.as_deref(), Some("from-flag:7000"));
        let c = Config::load_with_env(Some(&file), &Overrides::default(), |_| None).expect("valid");
        assert_eq!(c.advertise_raft_addr.as_deref(), Some("from-file:7000"));
    }

    #[test]
    fn load_reports_the_file_and_every_violation() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.toml");
        let e = Config::load_with_env(Some(&missing), &Overrides::default(), |_| None).expect_err("missing");
        assert!(matches!(&e, ConfigError::Read { path, .. } if *path == missing), "{e:?}");
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "shard = 8").expect("write");
        assert!(matches!(
            Config::load_with_env(Some(&bad), &Overrides::default(), |_| None),
            Err(ConfigError::Parse { .. })
        ));
        let o = flags(&["--node-id", "0", "--shards", "0"]);
        match Config::load_with_env(None, &o, |_| None) {
            Err(ConfigError::Invalid(errs)) => assert_eq!(errs.len(), 2, "{errs:?}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn toml_rejects_unknown_fields() {
        let ok: Config = toml::from_str("shards = 8\nlease_default_ms = 5000").expect("parse");
        assert_eq!(ok.shards, 8);
        assert!(toml::from_str::<Config>("shard = 8").is_err());
    }
}
