//! `raftq data ...`: offline operations on a stopped node's data directory.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Subcommand)]
pub enum DataCmd {
    /// Rewrite a stopped node's data directory for the previous release (v0 files), before the cluster version
    /// is raised; refused, with nothing changed, once the node has applied or logged the switch.
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
                None => println!("{} is already in the previous release's format (v0)", data_dir.display()),
                Some(d) => println!(
                    "{}: {} files ({} values) rewritten as v0; start the previous release on it",
                    data_dir.display(),
                    d.files,
                    d.values
                ),
            }
            Ok(())
        }
    }
}
