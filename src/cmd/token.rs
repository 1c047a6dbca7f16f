//! `raftq token issue`: mints a JWT from an HS256 secret file: `--secret-file` (or the file
//! `RAFTQ_AUTH_HS256_SECRET_FILE` names, as it names it to a node and to the other client commands), else the
//! local node's own secret.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

#[derive(clap::Subcommand)]
pub enum TokenCmd {
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
        #[arg(long, env = "RAFTQ_AUTH_HS256_SECRET_FILE")]
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

pub fn run(cmd: TokenCmd) -> Result<()> {
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
