//! `raftq backup` and `raftq restore`: a backup file streamed from any node to a local file (checked before it
//! is given its name), and a data directory initialised from one, offline (`raftq::storage::backup`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use raftq::config::{Config, Overrides};
use raftq::raft::types::NodeInfo;
use raftq::storage::backup::{self, RestoreTarget};
use serde_json::json;

use super::client::{print_json, ClientArgs, Output};

/// How often the progress line on a terminal is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct BackupArgs {
    /// The backup file to write (written as FILE.part, checked, then renamed).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup file.
    pub file: PathBuf,
    /// Replace a data directory that already holds data (its contents are deleted once the restore is in place).
    #[arg(long)]
    pub force: bool,
    /// The node's configuration, as `raftq serve` takes it: the restored node is this node (its id, addresses,
    /// data directory and shard count), the only member of a new cluster.
    #[arg(long, env = "RAFTQ_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub overrides: Overrides,
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

pub async fn backup(a: BackupArgs) -> Result<()> {
    let started = Instant::now();
    let mut stream = a.client.connect().await?.admin().backup().await.context("starting the backup")?;
    let part = a.out.with_extension("part");
    let file = std::fs::File::create(&part).with_context(|| format!("creating {}", part.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let tty = std::io::stderr().is_terminal();
    let (mut bytes, mut records, mut applied) = (0u64, 0u64, 0u64);
    let mut shown = Instant::now();
    let received = async {
        while let Some(c) = stream.next().await? {
            w.write_all(&c.data)?;
            bytes += c.data.len() as u64;
            (records, applied) = (c.records, c.applied_index);
            if tty && shown.elapsed() >= PROGRESS_EVERY {
                shown = Instant::now();
                eprint!("\rbackup at index {applied}: {:.1} MB, {records} records", mb(bytes));
            }
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        anyhow::Ok(())
    };
    let r = received.await;
    if tty {
        eprintln!();
    }
    if let Err(e) = r {
        let _ = std::fs::remove_file(&part);
        return Err(e.context("the backup stream broke; nothing was written to the output file"));
    }
    // The file is checked as a restore would check it before it takes its name: a stream cut short or damaged
    // on the way never becomes a backup.
    let checked = {
        let part = part.clone();
        tokio::task::spawn_blocking(move || backup::verify(&part)).await?
    };
    let info = match checked {
        Ok(i) => i,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            bail!("the received backup does not check out ({e}); nothing was written to the output file");
        }
    };
    std::fs::rename(&part, &a.out)?;
    sync_parent(&a.out)?;
    let secs = started.elapsed().as_secs_f64();
    let applied_index = info.header.applied.map(|l| l.index).unwrap_or(0);
    match a.client.output() {
        Output::Json => print_json(&json!({
            "file": a.out, "bytes": info.bytes, "records": info.trailer.records, "tasks": info.trailer.tasks,
            "applied_index": applied_index, "node_id": info.header.node_id,
            "state_digest": format!("{:016x}", info.trailer.state_digest), "seconds": secs,
        })),
        Output::Table => println!(
            "backup {}: index {applied_index} from node {}, {} tasks, {} records, {:.1} MB in {secs:.1} s \
             ({:.1} MB/s), state digest {:016x}",
            a.out.display(),
            info.header.node_id,
            info.trailer.tasks,
            info.trailer.records,
            mb(info.bytes),
            mb(info.bytes) / secs.max(1e-9),
            info.trailer.state_digest
        ),
    }
    Ok(())
}

fn sync_parent(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)?.sync_all()?;
    Ok(())
}

pub async fn restore(a: RestoreArgs) -> Result<()> {
    let cfg = Config::load(a.config.as_deref(), &a.overrides)?;
    let target = RestoreTarget {
        data_dir: cfg.data_dir.clone(),
        node_id: cfg.node_id,
        node: NodeInfo { raft_addr: cfg.public_raft_addr(), api_addr: cfg.public_grpc_addr() },
        shards: cfg.shards,
        force: a.force,
    };
    let started = Instant::now();
    let file = a.file.clone();
    let t = target.clone();
    let restored = tokio::task::spawn_blocking(move || backup::restore(&file, &t))
        .await?
        .with_context(|| format!("restoring {} into {}", a.file.display(), target.data_dir.display()))?;
    let secs = started.elapsed().as_secs_f64();
    let info = &restored.info;
    println!(
        "restored {} into {}: node {} ({}) alone in a new cluster, at index {} of the backup from node {}; {} tasks, \
         {} records, {:.1} MB in {secs:.1} s ({:.1} MB/s, {:.0} tasks/s); state digest {:016x} (matches the backup)",
        a.file.display(),
        target.data_dir.display(),
        target.node_id,
        target.node,
        info.header.applied.map(|l| l.index).unwrap_or(0),
        info.header.node_id,
        info.trailer.tasks,
        info.trailer.records,
        mb(info.bytes),
        mb(info.bytes) / secs.max(1e-9),
        info.trailer.tasks as f64 / secs.max(1e-9),
        restored.state_digest,
    );
    Ok(())
}
