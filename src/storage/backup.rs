//! Backup files: written from one applied point taken without a flush (`snapshot::Point`, read transactions with
//! the unflushed changes laid over them; one pass of the snapshot writer), and restored offline into a new data directory through the snapshot install
//! path (`snapshot::write_shards`), so every record is decoded and upgraded by `format.rs`. It must not talk to
//! the network or to Raft: the linearizable point and the stream are the API's (`api/admin.rs`).
//!
//! Layout (`docs/design.md`, "Backup files"):
//!
//! ```text
//! "RAFTQBACKUP1\n"
//! u32 BE length, header: a record (version byte + bincode) { applied, membership, created_ms, node_id, shards }
//! a snapshot file of the current layout ("RAFTQSNAP3\n" ... its own SHA-256)
//! trailer: "RAFTQEND", u64 BE records, u64 BE state digest, u64 BE tasks, u64 BE bytes before the trailer
//! SHA-256 of every byte before it (32 bytes)
//! ```
//!
//! A restore reads the file twice: first the magic, the header (a newer version is refused by name), the trailer
//! (a file cut short has none) and the SHA-256 over everything, then the records into fresh shard files in a
//! temporary directory beside the target, whose state digest must equal the trailer's; only then is it renamed
//! into place. A refused restore leaves the target as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::codec::io_err;
use super::files::{self, sync_dir};
use super::format::{self, Version};
use super::read_view::StateDigest;
use super::shard::{self, ShardMeta};
use super::snapshot::{self, Hashing, Point};
use super::state_machine::SmShared;
use super::tables::{LOG, LOG_META, META_LAST_PURGED, META_VOTE};
use crate::queue::TimeMs;
use crate::raft::types::{LogId, NodeId, NodeInfo, StoredMembership};

const TRAILER_MAGIC: &[u8; 8] = b"RAFTQEND";
/// The trailer (magic and four u64) and the SHA-256 after it.
const TAIL_LEN: u64 = 8 + 4 * 8 + 32;
/// Records a restore writes per (unsynced) commit: redb holds a transaction's pages in memory until it commits,
/// so this bounds a restore's memory whatever the state's size; large enough that commits cost little.
const RESTORE_COMMIT_RECORDS: u64 = 50_000;
/// Read and hash buffer: large enough that a pass over a backup is bound by the disk, not by calls.
const IO_BUF: usize = 1 << 20;

/// What a backup says about where it comes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The source's applied log id: the backup holds the state after exactly this entry.
    pub applied: Option<LogId>,
    /// The source's membership then (informational: a restore writes a fresh one).
    pub membership: StoredMembership,
    /// Wall-clock time the backup was started, ms since the Unix epoch.
    pub created_ms: u64,
    /// The node that wrote it.
    pub node_id: NodeId,
    /// The source's shard count (a restore may use another).
    pub shards: u32,
}

/// What a backup's trailer says, checked by its SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupTrailer {
    pub records: u64,
    /// The source's state digest at `applied` (the admin digest call's, `read_view.rs`).
    pub state_digest: u64,
    pub tasks: u64,
    /// The file's length before the trailer.
    pub body_len: u64,
}

/// A checked backup file: its header, trailer and the version of its header record.
#[derive(Debug, Clone)]
pub struct BackupInfo {
    pub header: BackupHeader,
    pub trailer: BackupTrailer,
    pub version: Version,
    pub bytes: u64,
}

/// One applied point of every shard, for one backup.
pub struct BackupSource {
    point: Point,
}

impl SmShared {
    /// Takes the applied point between two applies, without writing anything (`SmShared::point`): apply waits
    /// tens of µs, not for a flush.
    pub fn backup_source(&self) -> io::Result<BackupSource> {
        let t = std::time::Instant::now();
        let point = self.point()?;
        tracing::debug!(us = t.elapsed().as_micros() as u64, "backup point taken");
        Ok(BackupSource { point })
    }
}

/// Counts what passes through it (progress, and the trailer's length).
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl BackupSource {
    pub fn applied(&self) -> Option<LogId> {
        self.point.header.last_applied
    }

    /// Writes the whole backup file to `w` in one pass over the records; `records` is told each record written
    /// (progress). Returns the trailer.
    pub fn write(
        self,
        node_id: NodeId,
        created_ms: u64,
        w: impl Write,
        records: &mut dyn FnMut(u64),
    ) -> io::Result<BackupTrailer> {
        let header = BackupHeader {
            applied: self.point.header.last_applied,
            membership: self.point.header.membership.clone(),
            created_ms,
            node_id,
            shards: self.point.txns.len() as u32,
        };
        let mut w = Hashing::new(Counting { inner: w, bytes: 0 });
        w.write_all(format::BACKUP_MAGIC)?;
        let head = format::encode(&header)?;
        w.write_all(&(head.len() as u32).to_be_bytes())?;
        w.write_all(&head)?;
        let mut digest = StateDigest::new(self.point.txns.len());
        let mut n = 0u64;
        let written = self.point.write(format::CURRENT, &mut w, &mut |table, shard, k, v| {
            digest.add(table, shard, k, v);
            n += 1;
            records(n);
        })?;
        let (state_digest, tasks) = digest.finish(self.point.header.now);
        let trailer = BackupTrailer { records: written, state_digest, tasks, body_len: w.inner.bytes };
        w.write_all(TRAILER_MAGIC)?;
        for x in [trailer.records, trailer.state_digest, trailer.tasks, trailer.body_len] {
            w.write_all(&x.to_be_bytes())?;
        }
        let sha = w.digest();
        w.inner.write_all(&sha)?;
        w.flush()?;
        Ok(trailer)
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

/// Reads the magic and the header; the reader is left at the snapshot.
fn read_head(r: &mut impl Read) -> io::Result<(BackupHeader, Version)> {
    let short = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => bad("backup file is truncated: it ends inside its header"),
        _ => e,
    };
    let mut magic = [0u8; format::BACKUP_MAGIC_LEN];
    r.read_exact(&mut magic).map_err(short)?;
    format::backup_layout(&magic)?;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(short)?;
    let len = u32::from_be_bytes(len) as usize;
    // A header is a few hundred bytes; a huge length is damage, not a header to allocate for.
    if len > 1 << 20 {
        return Err(bad(format!("backup header of {len} bytes: the file is damaged")));
    }
    let mut head = vec![0u8; len];
    r.read_exact(&mut head).map_err(short)?;
    let version = head.first().copied().unwrap_or(0);
    let header: BackupHeader = format::decode(&head, "backup header")?;
    Ok((header, version))
}

/// Checks a backup file without writing anything: its magic and header version, that it is whole (its
/// trailer), and its SHA-256.
pub fn verify(path: &Path) -> io::Result<BackupInfo> {
    let mut f = fs::File::open(path)?;
    let bytes = f.metadata()?.len();
    let (header, version) = read_head(&mut BufReader::new(&mut f))?;
    let truncated = || bad(format!("backup file is truncated: {bytes} bytes and no complete trailer (cut short?)"));
    if bytes < TAIL_LEN {
        return Err(truncated());
    }
    f.seek(SeekFrom::Start(bytes - TAIL_LEN))?;
    let mut tail = [0u8; TAIL_LEN as usize];
    f.read_exact(&mut tail)?;
    let trailer = BackupTrailer {
        records: be64(&tail[8..16]),
        state_digest: be64(&tail[16..24]),
        tasks: be64(&tail[24..32]),
        body_len: be64(&tail[32..40]),
    };
    if &tail[..8] != TRAILER_MAGIC || trailer.body_len != bytes - TAIL_LEN {
        return Err(truncated());
    }
    f.seek(SeekFrom::Start(0))?;
    let mut h = Hashing::new(io::sink());
    let copied = io::copy(&mut BufReader::with_capacity(IO_BUF, (&mut f).take(bytes - 32)), &mut h)?;
    if copied != bytes - 32 || h.digest()[..] != tail[40..] {
        return Err(bad("backup checksum mismatch: the file is damaged (its SHA-256 does not match its contents)"));
    }
    Ok(BackupInfo { header, trailer, version, bytes })
}

/// Where and as what a backup is restored.
#[derive(Debug, Clone)]
pub struct RestoreTarget {
    pub data_dir: PathBuf,
    /// The restored node: the only member of the new cluster.
    pub node_id: NodeId,
    pub node: NodeInfo,
    pub shards: usize,
    /// Replace a data directory that already holds data.
    pub force: bool,
}

/// What a restore wrote.
#[derive(Debug, Clone)]
pub struct Restored {
    pub info: BackupInfo,
    /// The state digest of the restored shard files (equal to the backup's, or the restore is refused).
    pub state_digest: u64,
    pub now: TimeMs,
}

/// Whether `dir` holds anything (a data directory in use, or anything else we must not delete).
fn holds_data(dir: &Path) -> io::Result<bool> {
    match fs::read_dir(dir) {
        Ok(mut it) => Ok(it.next().is_some()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Initialises a data directory from a backup, offline: a single node `target.node_id` whose membership is
/// itself alone (the backup's names old machines), holding the backup's state at its applied log id. Other
/// nodes join it with add-node and receive a snapshot. Everything is written and synced in a temporary
/// directory beside the target and renamed into place last; any refusal leaves the target untouched.
pub fn restore(path: &Path, target: &RestoreTarget) -> io::Result<Restored> {
    let dir = &target.data_dir;
    if holds_data(dir)? && !target.force {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "data directory {} already holds data; nothing was changed (restore replaces it only with --force)",
                dir.display()
            ),
        ));
    }
    let info = verify(path)?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("data");
    let tmp = parent.join(format!(".{name}.restore-{}", rand::random::<u32>()));
    let result = write_dir(path, &info, target, &tmp);
    match result {
        Ok((state_digest, now)) => {
            swap_in(&tmp, dir, &parent, target.force)?;
            Ok(Restored { info, state_digest, now })
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Writes the whole restored data directory into `tmp` and syncs it; returns the restored state's digest.
fn write_dir(path: &Path, info: &BackupInfo, target: &RestoreTarget, tmp: &Path) -> io::Result<(u64, TimeMs)> {
    let id = target.node_id;
    let sm = files::sm_dir(tmp);
    fs::create_dir_all(&sm)?;
    fs::create_dir_all(files::snap_dir(tmp))?;
    let shards = files::shard_count(&sm, target.shards.max(1))?;
    let membership = openraft::Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, target.node.clone())]))
        .map_err(|e| bad(format!("membership of node {id}: {e}")))?;
    let fresh = StoredMembership::new(info.header.applied, membership);
    let mut r = BufReader::with_capacity(IO_BUF, fs::File::open(path)?);
    read_head(&mut r)?;
    let installed = snapshot::write_shards(&mut r, &sm, shards, Some(RESTORE_COMMIT_RECORDS), |h| ShardMeta {
        last_applied: info.header.applied,
        membership: fresh.clone(),
        now: h.now,
    })?;
    if installed.last_applied != info.header.applied || installed.records != info.trailer.records {
        return Err(bad("backup header and snapshot disagree: the file is damaged"));
    }
    // The restored files, read back, must hold the state the source had: its digest at the backup's point.
    let lean = Some(snapshot::LEAN_CACHE_BYTES);
    let dbs =
        (0..shards).map(|i| shard::open_db_cached(&files::shard_path(&sm, i), lean)).collect::<io::Result<Vec<_>>>()?;
    let (state_digest, tasks) = StateDigest::of_dbs(dbs.iter(), installed.now)?;
    drop(dbs);
    if (state_digest, tasks) != (info.trailer.state_digest, info.trailer.tasks) {
        return Err(bad(format!(
            "restored state digest {state_digest:#x} ({tasks} tasks) differs from the backup's {:#x} ({} tasks)",
            info.trailer.state_digest, info.trailer.tasks
        )));
    }
    write_log(tmp, id, info.header.applied)?;
    format::mark_data_dir(tmp)?;
    for d in [sm.as_path(), files::snap_dir(tmp).as_path(), tmp] {
        sync_dir(d)?;
    }
    Ok((state_digest, installed.now))
}

/// A Raft log for the restored node: empty, purged up to the applied point (the state machine holds it), and a
/// vote for itself in the backup's term, so its first election is in a later term than any entry it holds.
fn write_log(dir: &Path, id: NodeId, applied: Option<LogId>) -> io::Result<()> {
    let db = super::codec::open_db(&files::log_path(dir))?;
    let txn = db.begin_write().map_err(io_err)?;
    txn.open_table(LOG).map_err(io_err)?;
    format::upgrade_log_file(&txn, None)?;
    {
        let mut meta = txn.open_table(LOG_META).map_err(io_err)?;
        let term = applied.map(|l| l.leader_id.term).unwrap_or(0);
        let vote: crate::raft::types::Vote = openraft::impls::Vote::new(term, id);
        meta.insert(META_VOTE, format::encode(&vote)?.as_slice()).map_err(io_err)?;
        if let Some(l) = applied {
            meta.insert(META_LAST_PURGED, format::encode(&l)?.as_slice()).map_err(io_err)?;
        }
    }
    txn.commit().map_err(io_err)
}

/// Puts the finished `tmp` where `dir` is: renames an existing `dir` aside first (only with `force`; it is
/// deleted once the new one is in place), then syncs the parent so the rename survives a crash.
fn swap_in(tmp: &Path, dir: &Path, parent: &Path, force: bool) -> io::Result<()> {
    let old = if dir.exists() {
        if !force && holds_data(dir)? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} was filled meanwhile", dir.display()),
            ));
        }
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("data");
        let old = parent.join(format!(".{name}.replaced-{}", rand::random::<u32>()));
        fs::rename(dir, &old)?;
        Some(old)
    } else {
        None
    };
    fs::rename(tmp, dir)?;
    sync_dir(parent)?;
    if let Some(old) = old {
        fs::remove_dir_all(old)?;
    }
    Ok(())
}

/// The state digest of the shard files of a stopped node's data directory (tests compare it with a backup's).
pub fn data_dir_digest(dir: &Path) -> io::Result<(Option<LogId>, u64, u64)> {
    let sm = files::sm_dir(dir);
    let shards = files::shard_count(&sm, 1)?;
    let dbs = (0..shards).map(|i| shard::open_db(&files::shard_path(&sm, i))).collect::<io::Result<Vec<_>>>()?;
    let metas = dbs.iter().map(shard::read_meta).collect::<io::Result<Vec<_>>>()?;
    let now = metas.iter().map(|m| m.now).max().unwrap_or(0);
    let applied = metas.iter().map(|m| m.last_applied).min().flatten();
    let (digest, tasks) = StateDigest::of_dbs(dbs.iter(), now)?;
    Ok((applied, digest, tasks))
}

/// A backup written to a file: into `<path>.tmp`, synced, renamed (the CLI's stream uses the same steps).
pub fn write_file(source: BackupSource, node_id: NodeId, created_ms: u64, path: &Path) -> io::Result<BackupTrailer> {
    let tmp = path.with_extension("tmp");
    let mut w = BufWriter::with_capacity(IO_BUF, fs::File::create(&tmp)?);
    let trailer = source.write(node_id, created_ms, &mut w, &mut |_| {})?;
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(trailer)
}
