//! `raftq data ...`: offline operations on a stopped node's data directory.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Subcommand)]
pub enum DataCmd {
    /// Rewrite a stopped node's data directory for the previous release (v0 files at cluster version 0, v1 files
    /// at 1 to 3), before the cluster version is raised past it; refused, with nothing changed, once the node has
    /// applied or logged that switch.
    Downgrade {
        #[arg(long, env = "RAFTQ_DATA_DIR", default_value = "raftq-data")]
        data_dir: PathBuf,
    },
}

pub fn run(cmd: DataCmd) -> Result<()> {
    match cmd {
        DataCmd::Downgrade { data_dir } => {
            let what = format!("downgrading {}", data_dir.display());
            match raftq::storage::downgrade::downgrade_data_dir(&data_dir).context(what)? {
                None => println!("{} is already in the previous release's format", data_dir.display()),
                Some(d) => println!(
                    "{}: {} files ({} values) rewritten as v{}; start the previous release on it",
                    data_dir.display(),
                    d.files,
                    d.values,
                    d.to
                ),
            }
            Ok(())
        }
    }
}
