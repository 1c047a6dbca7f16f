//! Downgrade: a stopped node's data directory rewritten from v1 or v2 back to v0, so the release from before
//! cluster versions (which reads only v0, see `format.rs`) can run on it. Allowed only while the cluster version is 0 (`raft::version`): before
//! the switch the log holds only commands every release applies and snapshots hold v0 records, so the previous
//! release finds a state it knows. Once the node has applied the switch, or holds it in its log, the downgrade is
//! refused and nothing is written.
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
use super::format::{self, Stored, V0, V1, V2};
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
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Rewrites `dir` (a stopped node's data directory) as v0. `Ok(None)` when it already is v0.
pub fn downgrade_data_dir(dir: &Path) -> io::Result<Option<Downgraded>> {
    match format::data_dir_version(dir)? {
        None => return Err(refused(format!("{} holds no raftq data", dir.display()))),
        Some(V0) => return Ok(None),
        Some(_) => {}
    }
    files::recover_install(dir)?;
    let log = files::log_path(dir);
    let journal = super::files::journal_path(&log);
    let sm = files::sm_dir(dir);
    let shards: Vec<_> = (0..).map(|i| files::shard_path(&sm, i)).take_while(|p| p.exists()).collect();

    // ---- checks, reading only ----
    for path in &shards {
        let db = redb::ReadOnlyDatabase::open(path).map_err(|e| open_failed(path, e))?;
        if let Some(v) = applied_cluster_version(&db, path)?.filter(|v| *v > 0) {
            return Err(refused(format!(
                "this node has applied cluster version {v}: the previous release cannot apply what the cluster \
                 logged since the switch, so a downgrade is possible only before it (restore a backup taken \
                 before the upgrade instead); nothing was changed"
            )));
        }
    }
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
        if let Some((index, required)) = first_newer_entry(&db, &log)? {
            return Err(refused(format!(
                "the log holds, at index {index}, a command of cluster version {required} (the switch or newer): \
                 the previous release cannot apply it; nothing was changed"
            )));
        }
    }
    if let Some(layout) = snapshot::current_layout(dir)? {
        if layout.records != V0 {
            return Err(refused(
                "the current snapshot holds v1 or newer records (it was built after the switch, or by a build from before \
                 cluster versions): the previous release cannot install it; nothing was changed"
                    .into(),
            ));
        }
    }

    // ---- rewrites ----
    let mut out = Downgraded { files: 0, values: 0 };
    if log.exists() {
        out.values += rewrite(&log, &[], true, LOG_META)?;
        out.files += 1;
    }
    for path in &shards {
        let tables = [
            (TASKS, Stored::Task),
            (IDEMPOTENCY_KEYS, Stored::Key),
            (WEBHOOK_OUTBOX, Stored::Delivery),
            (SHARD_RECORDS, Stored::Record(&[])),
        ];
        out.values += rewrite(path, &tables, false, SHARD_META)?;
        out.files += 1;
    }
    snapshot::downgrade_current_meta(dir)?;
    if journal.exists() {
        fs::remove_file(&journal)?;
    }
    fs::remove_file(dir.join(format::DATA_DIR_MARKER))?;
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

/// The first log entry whose command needs a cluster version above 0: (its index, that version).
fn first_newer_entry(db: &redb::ReadOnlyDatabase, path: &Path) -> io::Result<Option<(u64, u32)>> {
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
            let required = req.command.required_version();
            if required > 0 {
                return Ok(Some((k.value(), required)));
            }
        }
    }
    Ok(None)
}

/// Rewrites one redb file as v0 in one transaction (a file already without a marker is left as it is).
fn rewrite(
    path: &Path,
    tables: &[format::TypedTable],
    log: bool,
    meta: redb::TableDefinition<&str, &[u8]>,
) -> io::Result<u64> {
    let db = open_db(path)?;
    if !matches!(format::file_version(&db, meta, path)?, Some(V1 | V2)) {
        return Ok(0);
    }
    let txn = db.begin_write().map_err(io::Error::other)?;
    let n = format::downgrade_file(&txn, tables, log, meta)?;
    txn.commit().map_err(io::Error::other)?;
    Ok(n)
}
