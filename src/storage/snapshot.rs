//! Snapshots: one file per snapshot, built from read transactions taken at one applied point with the changes not
//! yet in the files laid over them, and installed by writing fresh shard files and swapping directories
//! (`files::recover_install`), so a crash at any point leaves either the old or the new state.
//!
//! Taking the point stops apply (openraft asks for the builder on its state-machine task) only while each shard's
//! newest layer is frozen and read transactions begin: no file is written then. The builder writes the snapshot
//! file on its own task, then a synced flush makes the files hold everything applied up to then, and only then
//! is the snapshot published and handed to openraft, which may purge the log up to it.
//!
//! Format (`docs/design.md`, "Snapshots"; its versions are `format.rs`'s): the magic, then frames (kind u8,
//! length u32 BE, bytes): a header (last log id, membership, time), every task record, idempotency key, webhook
//! delivery and shard record, an end frame with their count; layouts 2 to 4 end with the SHA-256 of every byte
//! before it. A snapshot whose count or digest does not match is refused before anything of it is committed.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::RaftSnapshotBuilder;
use redb::{Database, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use super::codec::io_err;
use super::files::{self, snap_dir, sync_dir};
use super::format;
use super::shard::{self, Layer, Overlay, ShardMeta};
use super::state_machine::{Shards, SmShared, StateMachine};
use super::tables::*;
use crate::queue::{self, Task, TimeMs, WebhookDelivery};
use crate::raft::types::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// Hashes what passes through it: a snapshot file's digest, written and checked without a second pass.
pub(super) struct Hashing<T> {
    pub inner: T,
    hash: sha2::Sha256,
}

impl<T> Hashing<T> {
    pub fn new(inner: T) -> Self {
        Hashing { inner, hash: <sha2::Sha256 as sha2::Digest>::new() }
    }

    pub fn digest(&self) -> [u8; 32] {
        sha2::Digest::finalize(self.hash.clone()).into()
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        sha2::Digest::update(&mut self.hash, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        sha2::Digest::update(&mut self.hash, &buf[..n]);
        Ok(n)
    }
}

const FRAME_HEADER: u8 = 1;
const FRAME_TASK: u8 = 2;
const FRAME_KEY: u8 = 3;
const FRAME_WEBHOOK: u8 = 4;
/// A shard-level record (`SHARD_RECORDS`): bincode (key bytes, value bytes). Written from every shard; records
/// held by every shard (paused queues) are written to every shard on install, others by their placement.
const FRAME_RECORD: u8 = 5;
const FRAME_END: u8 = 0xff;

#[derive(Serialize, Deserialize)]
pub(super) struct SnapHeader {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub now: TimeMs,
}

#[derive(Serialize, Deserialize)]
struct CurrentSnapshot {
    meta: SnapshotMeta,
    file: String,
}

fn write_frame(w: &mut impl Write, kind: u8, bytes: &[u8]) -> io::Result<()> {
    w.write_all(&[kind])?;
    w.write_all(&(bytes.len() as u32).to_be_bytes())?;
    w.write_all(bytes)
}

fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok((head[0], buf))
}

/// One applied point, taken between two applies without writing anything (`SmShared::point`): a read transaction
/// on each shard file and the changes the files may not hold yet. What snapshots and backups are written from.
pub(super) struct Point {
    pub txns: Vec<ReadTransaction>,
    /// Per shard, the frozen layers at the point (oldest first); a flush may have written some of them into the
    /// files before the read transactions began, and laying a change over itself changes nothing.
    pub layers: Vec<Vec<Arc<Layer>>>,
    pub header: SnapHeader,
    /// The cluster version every shard had applied.
    pub cluster_version: u32,
}

impl SmShared {
    /// Takes the applied point under the write lock (apply waits only for this): freezes each shard's newest
    /// layer and begins a read transaction on each file. Tens of µs; nothing is written.
    pub(super) fn point(&self) -> io::Result<Point> {
        let mut g = self.write();
        for i in 0..g.count() {
            if !g.dirty[i].is_empty() {
                g.freeze(i);
            }
        }
        let txns = g.dbs.iter().map(|d| d.begin_read().map_err(io_err)).collect::<io::Result<Vec<_>>>()?;
        let (last_applied, membership) = g.applied();
        Ok(Point {
            txns,
            layers: g.frozen.clone(),
            header: SnapHeader { last_applied, membership, now: g.now() },
            cluster_version: g.cluster_version(),
        })
    }
}

impl Point {
    /// Writes a whole snapshot of the point (`write_snapshot`) with records of `version`.
    pub fn write(&self, version: format::Version, w: impl Write, seen: &mut RecordSeen<'_>) -> io::Result<u64> {
        let over = self.layers.iter().map(|l| Overlay::of(l)).collect::<io::Result<Vec<_>>>()?;
        write_snapshot(&self.txns, &over, &self.header, version, w, seen)
    }
}

/// Builds a snapshot file from a point.
pub struct SnapshotBuilder {
    /// `None` for a builder that only fails.
    point: Option<Point>,
    /// Flushes (synced) before the snapshot is published.
    shared: Option<Arc<SmShared>>,
    dir: PathBuf,
    /// The version of the records written: what every member can read (`format::snapshot_records_for`).
    records: format::Version,
}

/// Which table a record comes from, for [`write_snapshot`]'s observer (the state digest, `read_view.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Table {
    Tasks,
    Keys,
    Outbox,
    Records,
}

/// Shown each record a snapshot writes: its table, its shard, its key and stored value.
pub(super) type RecordSeen<'a> = dyn FnMut(Table, usize, &[u8], &[u8]) + 'a;

/// Writes a whole snapshot (magic to digest) to `w` from read transactions taken at one applied point, one per
/// shard in order, each with `over`'s changes for it laid over it (none: the files hold every change), with
/// records of `version` (`format::snapshot_records_for`). `seen` is shown every record as it is stored (table,
/// shard, key, value). The one pass over the records that snapshots and backups (`backup.rs`) make. Returns the
/// count of records written.
fn write_snapshot(
    txns: &[ReadTransaction],
    over: &[Overlay],
    header: &SnapHeader,
    version: format::Version,
    w: impl Write,
    seen: &mut RecordSeen<'_>,
) -> io::Result<u64> {
    let mut w = Hashing::new(w);
    w.write_all(format::snapshot_magic(version))?;
    write_frame(&mut w, FRAME_HEADER, &format::encode_as(version, header)?)?;
    let as_written = format::stored_value_as;
    use format::Stored;
    let none = Overlay::default();
    let mut records: u64 = 0;
    for (i, txn) in txns.iter().enumerate() {
        let o = over.get(i).unwrap_or(&none);
        each_record(&txn.open_table(TASKS).map_err(io_err)?, &o.tasks, |k, v| {
            write_frame(&mut w, FRAME_TASK, &as_written(version, Stored::Task, v)?)?;
            seen(Table::Tasks, i, k, v);
            records += 1;
            Ok(())
        })?;
        each_record(&txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?, &o.keys, |k, v| {
            write_frame(&mut w, FRAME_KEY, &format::encode_pair(k, &as_written(version, Stored::Key, v)?)?)?;
            seen(Table::Keys, i, k, v);
            records += 1;
            Ok(())
        })?;
        each_record(&txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?, &o.outbox, |k, v| {
            write_frame(&mut w, FRAME_WEBHOOK, &as_written(version, Stored::Delivery, v)?)?;
            seen(Table::Outbox, i, k, v);
            records += 1;
            Ok(())
        })?;
        each_record(&txn.open_table(SHARD_RECORDS).map_err(io_err)?, &o.records, |k, v| {
            write_frame(&mut w, FRAME_RECORD, &format::encode_pair(k, &as_written(version, Stored::Record(k), v)?)?)?;
            seen(Table::Records, i, k, v);
            records += 1;
            Ok(())
        })?;
    }
    write_frame(&mut w, FRAME_END, &records.to_be_bytes())?;
    let digest = w.digest();
    w.inner.write_all(&digest)?;
    Ok(records)
}

/// Calls `f` on each record of `table` with `over` laid over it, in key order: a key in `over` has its value
/// there (`None`: removed), the others the table's.
fn each_record(
    table: &ReadOnlyTable<&'static [u8], &'static [u8]>,
    over: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    mut f: impl FnMut(&[u8], &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut over = over.iter().peekable();
    for item in table.iter().map_err(io_err)? {
        let (k, v) = item.map_err(io_err)?;
        let k = k.value();
        while let Some((ok, ov)) = over.next_if(|(ok, _)| ok.as_slice() < k) {
            if let Some(ov) = ov {
                f(ok, ov)?;
            }
        }
        if let Some((_, ov)) = over.next_if(|(ok, _)| ok.as_slice() == k) {
            if let Some(ov) = ov {
                f(k, ov)?;
            }
            continue;
        }
        f(k, v.value())?;
    }
    for (ok, ov) in over {
        if let Some(ov) = ov {
            f(ok, ov)?;
        }
    }
    Ok(())
}

impl SnapshotBuilder {
    fn write(self) -> io::Result<(SnapshotMeta, PathBuf)> {
        let (Some(point), Some(shared)) = (self.point, &self.shared) else {
            return Err(io::Error::other("the snapshot's point could not be taken"));
        };
        let last = point.header.last_applied;
        let id = match &last {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, rand::random::<u32>()),
            None => format!("empty-{}", rand::random::<u32>()),
        };
        let id = id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
        let path = files::snapshot_path(&self.dir, &id);
        let tmp = path.with_extension("tmp");
        let mut w = BufWriter::new(fs::File::create(&tmp)?);
        point.write(self.records, &mut w, &mut |_, _, _, _| {})?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        let membership = point.header.membership.clone();
        drop(point);
        // The files must hold the snapshot's point durably before anything may purge the log up to it.
        shared.flush(true)?;
        let meta = SnapshotMeta { last_log_id: last, last_membership: membership };
        // An install may have published a newer snapshot while this one was written (it publishes holding the
        // flush lock): an older one never replaces it as the snapshot this node sends.
        let _one = shared.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        if read_current(&self.dir)?.is_none_or(|cur| cur.meta.last_log_id <= meta.last_log_id) {
            publish_current(&self.dir, &meta, &path)?;
        } else {
            tracing::info!(index = ?meta.last_log_id, "a newer snapshot was installed meanwhile: this one is not published");
        }
        Ok((meta, path))
    }
}

/// The current snapshot's meta and file name, if there is one.
fn read_current(dir: &Path) -> io::Result<Option<CurrentSnapshot>> {
    match fs::read(files::current_meta_path(dir)) {
        Ok(b) => Ok(Some(format::decode_meta_file(&b, "current snapshot meta")?)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes `path` the current snapshot and removes older snapshot files.
fn publish_current(dir: &Path, meta: &SnapshotMeta, path: &Path) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let cur = CurrentSnapshot { meta: meta.clone(), file: name.clone() };
    let meta_path = files::current_meta_path(dir);
    let tmp = meta_path.with_extension("tmp");
    fs::write(&tmp, format::encode_meta_file(&cur)?)?;
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, &meta_path)?;
    sync_dir(&snap_dir(dir))?;
    for e in fs::read_dir(snap_dir(dir))? {
        let e = e?;
        let n = e.file_name().to_string_lossy().to_string();
        if n.ends_with(".snap") && n != name {
            // An open handle (a transfer in progress) keeps reading the unlinked file.
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = tokio::fs::File;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let me = SnapshotBuilder {
            point: self.point.take(),
            shared: self.shared.take(),
            dir: self.dir.clone(),
            records: self.records,
        };
        let t = std::time::Instant::now();
        let (meta, path) = tokio::task::spawn_blocking(move || me.write()).await.map_err(io_err)??;
        tracing::debug!(ms = t.elapsed().as_millis() as u64, "snapshot written");
        let file = tokio::fs::File::open(&path).await?;
        Ok(Snapshot { meta, snapshot: file })
    }
}

fn install_blocking(shared: &SmShared, dir: &Path, meta: &SnapshotMeta, mut file: fs::File) -> io::Result<()> {
    use std::io::Seek;
    file.seek(io::SeekFrom::Start(0))?;
    let shards = shared.read().count();
    let new = files::start_install(dir, shards)?;
    // Keep a copy as our current snapshot, so followers of this node can be sent it later.
    let keep = files::snapshot_path(dir, &format!("installed-{}", rand::random::<u64>()));
    {
        let mut out = fs::File::create(&keep)?;
        io::copy(&mut file, &mut out)?;
        out.sync_all()?;
    }
    write_shards(BufReader::new(fs::File::open(&keep)?), &new, shards, None, |h| ShardMeta {
        last_applied: meta.last_log_id,
        membership: meta.last_membership.clone(),
        now: h.now,
    })?;
    fs::File::create(files::complete_marker(&new))?.sync_all()?;
    sync_dir(&new)?;
    sync_dir(dir)?;

    // No flush runs meanwhile, and the installed state replaces everything, unflushed changes included.
    let _one = shared.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut g = shared.write();
    g.dbs.clear();
    files::recover_install(dir)?;
    *g = Shards::open(&files::sm_dir(dir), shards)?;
    shared.dirty_records.store(0, std::sync::atomic::Ordering::Relaxed);
    shared.limits_set.store(g.any_limits(), std::sync::atomic::Ordering::Relaxed);
    shared.rates_set.store(g.any_rates(), std::sync::atomic::Ordering::Relaxed);
    shared.set_dependents(g.any_dependents());
    drop(g);
    publish_current(dir, meta, &keep)?;
    Ok(())
}

/// The page cache of each shard file a bounded install writes (and a restore reads back): a few MiB keep the
/// B-tree's upper levels; the rest streams through the OS page cache.
pub(super) const LEAN_CACHE_BYTES: usize = 16 << 20;

/// What a snapshot's header says: the applied point it was taken at, and the state machine's time then.
pub(super) struct Installed {
    pub last_applied: Option<LogId>,
    pub now: TimeMs,
    pub records: u64,
}

/// The install path: reads a whole snapshot from `r` (magic to digest; nothing after it is read) and writes its
/// records into `shards` new shard files in `new`, each record decoded and upgraded by `format.rs`. The shard
/// meta is `meta(header)`. With `commit_every: None` nothing is committed unless the whole snapshot checks out
/// (count and digest), so a damaged or cut-short one leaves `new` without committed records (a follower's
/// install). With `Some(n)`, the records are committed every `n` records without a sync (the last commit syncs),
/// which keeps memory flat for a state of any size: for a caller that discards `new` on failure (a restore, which
/// has checked the whole file first).
pub(super) fn write_shards(
    r: impl Read,
    new: &Path,
    shards: usize,
    commit_every: Option<u64>,
    meta: impl FnOnce(&Installed) -> ShardMeta,
) -> io::Result<Installed> {
    let mut r = Hashing::new(r);
    let mut magic = [0u8; format::SNAPSHOT_MAGIC_LEN];
    r.read_exact(&mut magic)?;
    // Records of an older format are upgraded as they are written into the new shard files.
    let layout = format::snapshot_layout(&magic)?;
    let version = layout.records;
    let (kind, head) = read_frame(&mut r)?;
    if kind != FRAME_HEADER {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot without header"));
    }
    let header: SnapHeader = format::decode_as(version, &head, "snapshot header")?;
    // Bounded batches come with a bounded page cache: redb keeps the pages it wrote in its cache.
    let cache = commit_every.map(|_| LEAN_CACHE_BYTES);
    let dbs: Vec<Database> =
        (0..shards).map(|i| shard::open_db_cached(&files::shard_path(new, i), cache)).collect::<io::Result<_>>()?;
    let begin = || dbs.iter().map(|d| d.begin_write().map_err(io_err)).collect::<io::Result<Vec<_>>>();
    let mut txns = begin()?;
    let mut records = 0u64;
    loop {
        let mut ended = false;
        {
            let mut tasks: Vec<_> =
                txns.iter().map(|t| t.open_table(TASKS).map_err(io_err)).collect::<io::Result<_>>()?;
            let mut keys: Vec<_> =
                txns.iter().map(|t| t.open_table(IDEMPOTENCY_KEYS).map_err(io_err)).collect::<io::Result<_>>()?;
            let mut outboxes: Vec<_> =
                txns.iter().map(|t| t.open_table(WEBHOOK_OUTBOX).map_err(io_err)).collect::<io::Result<_>>()?;
            let mut recs: Vec<_> =
                txns.iter().map(|t| t.open_table(SHARD_RECORDS).map_err(io_err)).collect::<io::Result<_>>()?;
            let batch_end = commit_every.map(|n| records + n);
            while batch_end.is_none_or(|end| records < end) {
                let (kind, body) = read_frame(&mut r)?;
                match kind {
                    FRAME_TASK => {
                        let (t, v) = format::upgrade::<Task>(version, &body, "task record")?;
                        tasks[t.id.shard(shards)].insert(t.id.0.as_slice(), v.as_ref()).map_err(io_err)?;
                    }
                    FRAME_KEY => {
                        let (k, v) = format::decode_pair(&body)?;
                        let (rec, v) = format::upgrade::<queue::KeyRecord>(version, &v, "idempotency key record")?;
                        keys[rec.task_id.shard(shards)].insert(k.as_slice(), v.as_ref()).map_err(io_err)?;
                    }
                    FRAME_WEBHOOK => {
                        let (d, v) = format::upgrade::<WebhookDelivery>(version, &body, "webhook delivery record")?;
                        let shard = d.id.task_id.shard(shards);
                        outboxes[shard].insert(outbox_key(&d.id).as_slice(), v.as_ref()).map_err(io_err)?;
                    }
                    FRAME_RECORD => {
                        let (k, v) = format::decode_pair(&body)?;
                        let v = format::upgrade_shard_record(version, &k, &v)?;
                        let v = v.as_ref();
                        match RecordKey::shard_of(&k, shards) {
                            Some(i) => {
                                recs[i].insert(k.as_slice(), v).map_err(io_err)?;
                            }
                            None => {
                                for r in recs.iter_mut() {
                                    r.insert(k.as_slice(), v).map_err(io_err)?;
                                }
                            }
                        }
                    }
                    FRAME_END => {
                        let want = u64::from_be_bytes(body.as_slice().try_into().map_err(io_err)?);
                        if want != records {
                            return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot record count mismatch"));
                        }
                        if layout.digest {
                            // Nothing is committed before the whole file checks out: a damaged snapshot is refused
                            // and the installed state stays as it was.
                            let got = r.digest();
                            let mut digest = [0u8; 32];
                            r.inner.read_exact(&mut digest)?;
                            if digest != got {
                                return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot checksum mismatch"));
                            }
                        }
                        ended = true;
                        break;
                    }
                    _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown snapshot frame")),
                }
                records += 1;
            }
        }
        if ended {
            break;
        }
        // Synced: redb keeps the pages of unsynced commits in memory until a synced one.
        for txn in std::mem::take(&mut txns) {
            txn.commit().map_err(io_err)?;
        }
        txns = begin()?;
    }
    let installed = Installed { last_applied: header.last_applied, now: header.now, records };
    let sm_meta = meta(&installed);
    for txn in txns {
        {
            let mut t = txn.open_table(SHARD_META).map_err(io_err)?;
            shard::write_meta(&mut t, &sm_meta)?;
        }
        txn.commit().map_err(io_err)?;
    }
    Ok(installed)
}

/// The snapshot side of `RaftStateMachine` (the trait impl in `state_machine.rs` calls these).
impl StateMachine {
    /// Takes the applied point without writing anything (`SmShared::point`); the builder lays the frozen layers
    /// over the files' state as it writes the snapshot, on its own task.
    pub(super) async fn snapshot_builder(&mut self) -> SnapshotBuilder {
        self.shared.metrics.snapshots_built.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::Instant::now();
        let point = self.shared.point();
        tracing::debug!(us = t.elapsed().as_micros() as u64, "snapshot point taken");
        let point = point
            .inspect_err(|e| {
                // The trait gives no way to fail here: hand out a builder whose build fails, which openraft reports.
                tracing::error!(error = %e, "cannot start a snapshot");
            })
            .ok();
        SnapshotBuilder {
            records: point.as_ref().map(|p| format::snapshot_records_for(p.cluster_version)).unwrap_or(format::CURRENT),
            point,
            shared: Some(self.shared.clone()),
            dir: self.dir.clone(),
        }
    }

    pub(super) async fn install(&mut self, meta: &SnapshotMeta, snapshot: tokio::fs::File) -> io::Result<()> {
        let shared = self.shared.clone();
        let dir = self.dir.clone();
        let meta2 = meta.clone();
        let file = snapshot.into_std().await;
        tokio::task::spawn_blocking(move || install_blocking(&shared, &dir, &meta2, file)).await.map_err(io_err)??;
        let idx = meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0);
        self.shared.metrics.snapshots_installed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.shared.applied.send_replace(idx);
        self.shared.work.send_modify(|v| *v += 1);
        self.shared.webhooks.send_modify(|v| *v += 1);
        Ok(())
    }

    pub(super) async fn current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        // A snapshot built meanwhile may publish itself and remove the file the meta we read named: read again.
        let mut tries = 0;
        loop {
            let Some(cur) = read_current(&self.dir)? else { return Ok(None) };
            match tokio::fs::File::open(snap_dir(&self.dir).join(&cur.file)).await {
                Ok(file) => return Ok(Some(Snapshot { meta: cur.meta, snapshot: file })),
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 10 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Refuses, at start, a current snapshot of a format newer than this binary (its meta file or its file's magic):
/// it would be sent to followers and installed later. Reads only.
pub(super) fn check_current(dir: &Path) -> io::Result<()> {
    current_layout(dir).map(|_| ())
}

/// The layout of the current snapshot's file (`None`: no current snapshot). Reads only.
pub(super) fn current_layout(dir: &Path) -> io::Result<Option<format::SnapshotLayout>> {
    let bytes = match fs::read(files::current_meta_path(dir)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let cur: CurrentSnapshot = format::decode_meta_file(&bytes, "current snapshot meta")?;
    let mut file = match fs::File::open(snap_dir(dir).join(&cur.file)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut magic = [0u8; format::SNAPSHOT_MAGIC_LEN];
    file.read_exact(&mut magic)?;
    format::snapshot_layout(&magic).map(Some)
}

/// Writes the current snapshot's meta file in `to`'s encoding (a downgrade, `downgrade.rs`).
pub(super) fn downgrade_current_meta(dir: &Path, to: format::Version) -> io::Result<()> {
    let path = files::current_meta_path(dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let cur: CurrentSnapshot = format::decode_meta_file(&bytes, "current snapshot meta")?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format::encode_meta_file_as(to, &cur)?)?;
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, &path)?;
    sync_dir(&snap_dir(dir))
}
