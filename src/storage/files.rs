//! The data directory's layout, and the file steps that must survive a crash (directory syncs, finishing or
//! discarding a snapshot install). Every path inside the data directory is built here.
//!
//! ```text
//! <data_dir>/
//!   raft-log.redb          the Raft log (`LogStore`)
//!   raft-log.journal       the log's journal: writes since its last checkpoint (`storage::journal`)
//!   sm/SHARDS              the shard count, fixed when the directory is created
//!   sm/shard-<N>.redb      shard N of the state machine (`storage::shard`)
//!   sm.new/                a snapshot install being written; it replaces sm/ once sm.new/COMPLETE exists
//!   sm.old/                the state an install replaced, removed at open
//!   snapshots/<id>.snap    snapshot files (`storage::snapshot`); current.meta names the current one;
//!                          incoming-*.snap are spooled there by the internal Raft service before install
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::codec::io_err;

/// The Raft log's file.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("raft-log.redb")
}

/// The journal of the log file at `log_path` (`raft-log.redb`): `raft-log.journal`, beside it.
pub fn journal_path(log_path: &Path) -> PathBuf {
    log_path.with_extension("journal")
}

/// The directory of the state machine's shard files.
pub fn sm_dir(dir: &Path) -> PathBuf {
    dir.join("sm")
}

/// Where a snapshot install writes its shard files before they replace `sm/`.
pub fn sm_new_dir(dir: &Path) -> PathBuf {
    dir.join("sm.new")
}

fn sm_old_dir(dir: &Path) -> PathBuf {
    dir.join("sm.old")
}

/// Marks a complete `sm.new/`: from then on a restart finishes the swap instead of discarding it.
pub fn complete_marker(sm_new: &Path) -> PathBuf {
    sm_new.join("COMPLETE")
}

/// The snapshot directory: snapshot files, the current snapshot's meta, incoming snapshots.
pub fn snap_dir(dir: &Path) -> PathBuf {
    dir.join("snapshots")
}

/// The meta of the current snapshot (which file, which log id).
pub fn current_meta_path(dir: &Path) -> PathBuf {
    snap_dir(dir).join("current.meta")
}

/// A snapshot file of the snapshot directory.
pub fn snapshot_path(dir: &Path, id: &str) -> PathBuf {
    snap_dir(dir).join(format!("{id}.snap"))
}

pub fn shard_path(sm: &Path, i: usize) -> PathBuf {
    sm.join(format!("shard-{i}.redb"))
}

fn shard_count_path(sm: &Path) -> PathBuf {
    sm.join("SHARDS")
}

/// Syncs a directory, so the renames and creations in it survive a crash.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    fs::File::open(path)?.sync_all()
}

/// The shard count of the shard directory `sm`: the stored one, or `configured` (stored now) for a new
/// directory. An existing directory keeps the count it was created with.
pub fn shard_count(sm: &Path, configured: usize) -> io::Result<usize> {
    let count_file = shard_count_path(sm);
    let count = match fs::read_to_string(&count_file) {
        Ok(s) => s.trim().parse::<usize>().map_err(io_err)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::write(&count_file, configured.to_string())?;
            fs::File::open(&count_file)?.sync_all()?;
            sync_dir(sm)?;
            configured
        }
        Err(e) => return Err(e),
    };
    if count != configured {
        tracing::warn!(configured, stored = count, "data directory keeps its shard count");
    }
    Ok(count)
}

/// Starts the shard directory of a snapshot install: an empty `sm.new/` holding the shard count.
pub fn start_install(dir: &Path, shards: usize) -> io::Result<PathBuf> {
    let new = sm_new_dir(dir);
    if new.exists() {
        fs::remove_dir_all(&new)?;
    }
    fs::create_dir_all(&new)?;
    fs::write(shard_count_path(&new), shards.to_string())?;
    Ok(new)
}

/// Finishes or discards a snapshot install interrupted by a crash (and completes a finished one).
pub fn recover_install(dir: &Path) -> io::Result<()> {
    let new = sm_new_dir(dir);
    let old = sm_old_dir(dir);
    if new.exists() {
        if complete_marker(&new).exists() {
            if sm_dir(dir).exists() {
                if old.exists() {
                    fs::remove_dir_all(&old)?;
                }
                fs::rename(sm_dir(dir), &old)?;
            }
            fs::rename(&new, sm_dir(dir))?;
            sync_dir(dir)?;
        } else {
            fs::remove_dir_all(&new)?;
        }
    }
    if old.exists() {
        fs::remove_dir_all(&old)?;
    }
    Ok(())
}
