//! Downgrade: a stopped node's data directory rewritten for the release before this one, which runs at the
//! cluster version this node has applied (`raft::version`):
//! - at cluster version 0 (every member was of a release from before cluster versions, which reads only v0, see
//!   `format.rs`): every file back to v0;
//! - at cluster versions 1 to 3 (every member read v1 records): every file back to v1, the directory to version 2.
//!
//! Before the next switch the log holds only commands that release applies and snapshots hold records it reads,
//! so it finds a state it knows. Once the node has applied a cluster version of this release (4 or more), or
//! holds such a switch or command in its log, the downgrade is refused and nothing is written.
//!
//! Every check reads only (the files are opened read-only, the log scanned) before the first write; a node that
//! was killed rather than stopped (its log's journal holds writes, see `journal.rs`) is refused. Each redb
//! file is rewritten in one transaction that also removes its marker; the directory's marker goes last. A crash
//! part way leaves some files v0 and some newer under a newer directory marker: the new binary upgrades the v0 ones
//! again at its next start, and the downgrade can be run again.

use std::fs;
use std::io;
use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, TableError};

use super::codec::open_db;
use super::files::{self, sync_dir};
use super::format::{self, Stored, V0, V1};
use super::snapshot;
use super::tables::*;
use crate::raft::types::Entry;

/// What a downgrade rewrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Downgraded {
    /// Redb files rewritten (the log and every shard).
    pub files: usize,
    /// Values rewritten in them.
    pub values: u64,
    /// The format the files are in now: v0, or v1 (in a directory of version 2).
    pub to: format::Version,
}

/// The newest cluster version a release of v1 records applies (86e2f28 and the releases before it back to
/// cluster version 1).
const V1_CLUSTER_VERSION: u32 = 3;

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Rewrites `dir` (a stopped node's data directory) for the release before this one: v0 at cluster version 0,
/// v1 at 1 to 3. `Ok(None)` when it already is in that release's format.
pub fn downgrade_data_dir(dir: &Path) -> io::Result<Option<Downgraded>> {
    let found = match format::data_dir_version(dir)? {
        None => return Err(refused(format!("{} holds no raftq data", dir.display()))),
        Some(V0) => return Ok(None),
        Some(v) => v,
    };
    let log = files::log_path(dir);
    let journal = super::files::journal_path(&log);
    let sm = files::sm_dir(dir);
    let shards: Vec<_> = (0..).map(|i| files::shard_path(&sm, i)).take_while(|p| p.exists()).collect();

    // ---- checks, reading only ----
    let mut applied = 0;
    for path in &shards {
        let db = redb::ReadOnlyDatabase::open(path).map_err(|e| open_failed(path, e))?;
        applied = applied.max(applied_cluster_version(&db, path)?.unwrap_or(0));
    }
    if applied > V1_CLUSTER_VERSION {
        return Err(refused(format!(
            "this node has applied cluster version {applied}: the previous release cannot apply what the cluster \
             logged since the switch, so a downgrade is possible only before it (restore a backup taken before \
             the upgrade instead); nothing was changed"
        )));
    }
    // The release the node goes back to: one from before cluster versions (v0), or one of v1 records.
    let (to, newest) = if applied == 0 { (V0, 0) } else { (V1, V1_CLUSTER_VERSION) };
    if to == V1 && found <= format::DIR_V2 {
        return Ok(None);
    }
    files::recover_install(dir)?;
    if log.exists() {
        let db = redb::ReadOnlyDatabase::open(&log).map_err(|e| open_failed(&log, e))?;
        // A directory of version 2 has the log's journal. A stopped node checkpointed it into the log file; one
        // that was killed left writes there that only its next start puts into the log file.
        let pending = super::journal::count(&journal, super::log_store::journal_generation(&db)? + 1)?;
        if pending > 0 {
            return Err(refused(format!(
                "{}: the node did not stop cleanly, and its log's journal holds {pending} records not yet in the \
                 log file: start the node once with this binary and stop it (SIGTERM), then downgrade; nothing \
                 was changed",
                journal.display()
            )));
        }
        if let Some((index, required)) = first_newer_entry(&db, &log, newest)? {
            return Err(refused(format!(
                "the log holds, at index {index}, a command of cluster version {required} (the switch or newer): \
                 the previous release cannot apply it; nothing was changed"
            )));
        }
    }
    if let Some(layout) = snapshot::current_layout(dir)? {
        if layout.records > to {
            return Err(refused(format!(
                "the current snapshot holds v{} records (it was built after the switch): the previous release \
                 cannot install it; nothing was changed",
                layout.records
            )));
        }
    }

    // ---- rewrites ----
    let mut out = Downgraded { files: 0, values: 0, to };
    if log.exists() {
        out.values += rewrite(&log, &[], true, LOG_META, to)?;
        out.files += 1;
    }
    for path in &shards {
        let tables = [
            (TASKS, Stored::Task),
            (IDEMPOTENCY_KEYS, Stored::Key),
            (WEBHOOK_OUTBOX, Stored::Delivery),
            (SHARD_RECORDS, Stored::Record(&[])),
        ];
        out.values += rewrite(path, &tables, false, SHARD_META, to)?;
        out.files += 1;
    }
    snapshot::downgrade_current_meta(dir, to)?;
    if journal.exists() {
        fs::remove_file(&journal)?;
    }
    if to == V0 {
        fs::remove_file(dir.join(format::DATA_DIR_MARKER))?;
    } else {
        format::mark_data_dir_as(dir, format::DIR_V2)?;
    }
    sync_dir(dir)?;
    Ok(Some(out))
}

fn open_failed(path: &Path, e: impl std::fmt::Display) -> io::Error {
    refused(format!(
        "{}: {e} (is the node still running? stop it first; a file left by a crash needs one start of this \
         binary to be repaired)",
        path.display()
    ))
}

/// The cluster version a shard file holds (`None`: none recorded, version 0).
fn applied_cluster_version(db: &redb::ReadOnlyDatabase, path: &Path) -> io::Result<Option<u32>> {
    let version = format::file_version(db, SHARD_META, path)?;
    let txn = db.begin_read().map_err(io::Error::other)?;
    let table = match txn.open_table(SHARD_RECORDS) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    let Some(v) = table.get(RecordKey::CLUSTER_VERSION).map_err(io::Error::other)? else { return Ok(None) };
    format::decode_as(version.unwrap_or(V0), v.value(), "cluster version record").map(Some)
}

/// The first log entry whose command needs a cluster version above `newest`, or switches to one: (its index, that
/// version).
fn first_newer_entry(db: &redb::ReadOnlyDatabase, path: &Path, newest: u32) -> io::Result<Option<(u64, u32)>> {
    let version = format::file_version(db, LOG_META, path)?.unwrap_or(V0);
    let txn = db.begin_read().map_err(io::Error::other)?;
    let table = match txn.open_table(LOG) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    for item in table.iter().map_err(io::Error::other)? {
        let (k, v) = item.map_err(io::Error::other)?;
        let entry: Entry = format::decode_as(version, v.value(), "log entry")?;
        if let openraft::EntryPayload::Normal(req) = &entry.payload {
            let required = match &*req.command {
                crate::queue::Command::SetClusterVersion { version } => *version,
                c => c.required_version(),
            };
            if required > newest {
                return Ok(Some((k.value(), required)));
            }
        }
    }
    Ok(None)
}

/// Rewrites one redb file as `to` (v0 or v1) in one transaction (a file already of `to` or older is left as it
/// is).
fn rewrite(
    path: &Path,
    tables: &[format::TypedTable],
    log: bool,
    meta: redb::TableDefinition<&str, &[u8]>,
    to: format::Version,
) -> io::Result<u64> {
    let db = open_db(path)?;
    if format::file_version(&db, meta, path)?.unwrap_or(V0) <= to {
        return Ok(0);
    }
    let txn = db.begin_write().map_err(io::Error::other)?;
    let n = format::downgrade_file(&txn, tables, log, meta, to)?;
    txn.commit().map_err(io::Error::other)?;
    Ok(n)
}
