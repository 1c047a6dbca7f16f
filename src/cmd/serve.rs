//! `raftq serve`: loads the configuration (defaults < `--config` file < `RAFTQ_*` environment < flags, see
//! `Config::load`), binds, runs a node until SIGTERM or SIGINT.

use std::path::PathBuf;

use anyhow::Result;
use raftq::config::{Config, Overrides};
use raftq::node::{Listeners, Node};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file; RAFTQ_* variables and flags override it.
    #[arg(long, env = "RAFTQ_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub overrides: Overrides,
}

impl ServeArgs {
    /// The effective configuration, validated.
    pub fn load(&self) -> Result<Config> {
        Ok(Config::load(self.config.as_deref(), &self.overrides)?)
    }
}

pub async fn run(cfg: Config) -> Result<()> {
    tracing::info!(config = ?cfg, "effective configuration");
    // Before the listeners open: a SIGTERM while the node starts (it may already answer) still stops it cleanly.
    let signalled = super::on_signal();
    let shutdown = CancellationToken::new();
    let listeners = Listeners::bind(&cfg).await?;
    let node = Node::start(cfg, listeners, shutdown.clone()).await?;
    tokio::spawn(async move {
        signalled.await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    node.run_until_shutdown().await;
    Ok(())
}
