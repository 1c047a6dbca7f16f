//! The Raft log on redb and its journal, with group commit and an in-memory tail.
//!
//! Appends, truncations and purges take effect at once in `LogCache`, the newest entries as appended, which is
//! where apply and replication read them (no redb read, no decoding). One writer thread owns every write to the
//! files: it takes all operations queued since its last turn and writes them as one record to the journal
//! (`journal.rs`: one `pwrite`, and one `fdatasync` when the turn holds an append), keeping them in memory; every
//! `CHECKPOINT_EVERY` (and for a vote) a turn is a checkpoint instead: every write kept since the last one and the
//! turn's own go to redb in one commit with `Durability::Immediate`, and the journal starts over. Only once a turn
//! is durable are the append callbacks fired and `save_vote` answered: nothing is acknowledged before it is on
//! disk, and one fsync covers every append queued meanwhile. All writes go through
//! the one thread in submission order, so vote, append, truncate and purge are ordered writes (each turn's
//! operations are journaled, synced or not, so the journal replays them in order); `save_committed`,
//! truncations and purges return once queued (a later fsync hardens them, and openraft needs no more). At open,
//! the journal's records since the last checkpoint are applied to redb and made durable before anything else.
//! The cache keeps `CACHE_ENTRIES` entries and `CACHE_BYTES` of them (encoded), whichever is less, and never drops
//! one the writer has not yet written.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::codec::io_err;
use super::format::{self, decode, encode, encode_into};
use super::journal::Journal;
use super::tables::*;
use crate::raft::types::{Entry, LogId, TypeConfig, Vote};

/// How many queued operations one writer turn takes at most, so a turn's transaction stays bounded.
const MAX_OPS_PER_TURN: usize = 4096;
/// A durable turn this long after the last checkpoint is a checkpoint (a synced redb commit of every write since
/// the last one), so the journal and the writes kept in memory stay short.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// A turn that finds the journal this long is a checkpoint, however recent the last one (the file stays about
/// this size: each generation overwrites the last one's blocks).
const CHECKPOINT_BYTES: u64 = 8 << 20;

/// A write for the writer thread. Appends, truncations and purges take effect in the cache before they are
/// sent (so readers see them at once); the writer makes them durable in submission order.
struct Op {
    data: OpData,
    reply: Reply,
}

/// What an operation writes, owned: the writer keeps it from its journal record until the checkpoint that puts it
/// in redb.
enum OpData {
    /// Entries encoded by `append` (which moves the entries themselves into the cache): `bytes` holds them one
    /// after the other, `spans` each one's index and end offset.
    Append {
        bytes: Vec<u8>,
        spans: Vec<(u64, usize)>,
    },
    Meta {
        key: &'static str,
        value: Vec<u8>,
    },
    /// `epoch`: the cache's count of truncations, this one included.
    TruncateAfter {
        index: Option<u64>,
        epoch: u64,
    },
    Purge {
        log_id: Vec<u8>,
        upto: u64,
    },
}

/// Who waits for an operation to be durable.
enum Reply {
    /// An append's callback, fired after the fsync.
    Flushed(IOFlushed<TypeConfig>),
    /// A vote, answered after the fsync.
    Done(oneshot::Sender<io::Result<()>>),
    /// Nobody: the write is only ordered (committed, truncate, purge).
    None,
}

/// Group-commit statistics, for metrics and the benchmark.
#[derive(Debug, Default)]
pub struct LogStats {
    pub fsyncs: std::sync::atomic::AtomicU64,
    pub entries: std::sync::atomic::AtomicU64,
    pub fsync_latency: crate::telemetry::Histogram,
}

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    writer: Arc<Writer>,
    cache: Arc<Mutex<LogCache>>,
    pub stats: Arc<LogStats>,
}

/// Entries kept in memory once the log holds this many more (newest kept): apply and replication read the
/// recent tail, so they are served without touching redb or decoding.
pub(crate) const CACHE_ENTRIES: usize = 20_000;
/// And at most this many bytes of entries (their encoded size, which their decoded size follows): an entry carries
/// a batch of commands (a create of a hundred tasks, a claim of as many), so a count alone would let the tail
/// hold gigabytes of large payloads, and under a full cycle it held hundreds of megabytes of entries already
/// in the file. At three nodes' full-cycle peak this is one to two seconds of the log, far more than apply and
/// the replication of a follower in step lag behind; older entries are read from the file. It was 64 MiB: halving
/// it (and the file's page cache) lowered a node's resident memory under a full cycle by ~110 MB with no change in
/// throughput (docs/performance.md, "Smaller caches").
pub(crate) const CACHE_BYTES: usize = 32 << 20;

/// The newest entries of the log, contiguous by index, as appended. It holds every entry not yet written to
/// redb, so a reader finds an appended entry at once (before the writer thread's commit).
#[derive(Default)]
struct LogCache {
    /// Each entry with its encoded size.
    entries: std::collections::BTreeMap<u64, (Entry, usize)>,
    /// The encoded sizes of `entries`, summed.
    bytes: usize,
    /// Entries at or below this index are in redb (written by the writer thread), so they may be evicted.
    written: u64,
    /// The index of the log's last entry (`None`: empty, nothing ever appended or purged).
    last: Option<u64>,
    /// The last purged log id, as purged (the writer stores it in order).
    purged: Option<LogId>,
    /// How many truncations the cache has taken: the writer raises `written` only when none is queued after
    /// what it wrote (an entry truncated and appended again at the same index is not the one written).
    truncations: u64,
}

impl LogCache {
    fn first(&self) -> Option<u64> {
        self.entries.first_key_value().map(|(i, _)| *i)
    }
    fn evict(&mut self) {
        while (self.entries.len() > CACHE_ENTRIES || self.bytes > CACHE_BYTES)
            && self.first().is_some_and(|i| i <= self.written)
        {
            if let Some((_, (_, size))) = self.entries.pop_first() {
                self.bytes -= size;
            }
        }
    }
    /// Takes the bytes of entries removed from the tail off its count.
    fn forget(&mut self, gone: &std::collections::BTreeMap<u64, (Entry, usize)>) {
        self.bytes -= gone.values().map(|(_, size)| size).sum::<usize>();
    }
    /// `sizes`: each entry's encoded size, in the same order.
    fn append(&mut self, entries: Vec<Entry>, sizes: Vec<usize>) {
        for (e, size) in entries.into_iter().zip(sizes) {
            let index = e.log_id().index;
            self.bytes += size;
            if let Some((_, old)) = self.entries.insert(index, (e, size)) {
                self.bytes -= old;
            }
            self.last = Some(index);
        }
    }
    fn truncate_after(&mut self, index: Option<u64>) {
        let from = index.map_or(0, |i| i + 1);
        let gone = self.entries.split_off(&from);
        self.forget(&gone);
        self.truncations += 1;
        self.written = self.written.min(index.unwrap_or(0));
        self.last = match (self.last, index) {
            (Some(l), Some(i)) => Some(l.min(i)),
            _ => None,
        };
    }
    fn purge(&mut self, log_id: LogId) {
        let upto = log_id.index;
        let kept = self.entries.split_off(&(upto + 1));
        let gone = std::mem::replace(&mut self.entries, kept);
        self.forget(&gone);
        self.last = Some(self.last.map_or(upto, |l| l.max(upto)));
        self.purged = Some(log_id);
    }
}

/// The writer thread's handle: dropping the last one stops the thread and waits for it, so the file is closed
/// when the store is (a restart in the same process can reopen it).
struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Cleared to close without the last checkpoint, as a crash would (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    checkpoint_at_close: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A cheap clone reading the log through redb's MVCC read transactions.
#[derive(Clone)]
pub struct LogReader {
    db: Arc<Database>,
    cache: Arc<Mutex<LogCache>>,
}

/// redb's page cache for the log file. Small: replication and apply read the log's in-memory tail, so redb's
/// cache would only hold copies of appended pages, and its default (1 GiB) fills with them, page by page. It
/// also holds a checkpoint's writes until they go to the file (100 ms of the log, a few MiB at the peak).
const LOG_PAGE_CACHE_BYTES: usize = 8 << 20;

impl LogStore {
    /// Opens (or creates) the log file and starts its writer thread. The thread ends when the last `LogStore`
    /// clone is dropped.
    pub fn open(path: &Path) -> io::Result<LogStore> {
        Self::open_checkpointing(path, CHECKPOINT_EVERY)
    }

    /// [`LogStore::open`] with checkpoints `every` (tests: none but at open, for a vote or at close).
    pub(crate) fn open_checkpointing(path: &Path, every: std::time::Duration) -> io::Result<LogStore> {
        // The version is read before anything is written: a file of a newer format is left as it was.
        format::refuse_newer_file(path, LOG_META)?;
        let db = Arc::new(super::codec::open_db_cached(path, Some(LOG_PAGE_CACHE_BYTES))?);
        let found = format::file_version(db.as_ref(), LOG_META, path)?;
        // A current file has its tables (made with its marker) and is not written at open.
        if found != Some(format::CURRENT) {
            let txn = db.begin_write().map_err(io_err)?;
            txn.open_table(LOG).map_err(io_err)?;
            txn.open_table(LOG_META).map_err(io_err)?;
            format::upgrade_log_file(&txn, found)?;
            txn.commit().map_err(io_err)?;
        }
        let journal = open_journal(&db, path)?;
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(LogStats::default());
        let (last, purged) = {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            let purged: Option<LogId> = match txn.open_table(LOG_META).map_err(io_err)?.get(META_LAST_PURGED) {
                Ok(Some(v)) => Some(decode(v.value(), "last purged log id")?),
                Ok(None) => None,
                Err(e) => return Err(io_err(e)),
            };
            let last = log.last().map_err(io_err)?.map(|(k, _)| k.value());
            (last.or(purged.map(|p| p.index)), purged)
        };
        let cache = Arc::new(Mutex::new(LogCache {
            last,
            purged,
            written: last.unwrap_or(0),
            entries: Default::default(),
            bytes: 0,
            truncations: 0,
        }));
        let (wdb, wstats, wcache) = (db.clone(), stats.clone(), cache.clone());
        let checkpoint_at_close = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let at_close = checkpoint_at_close.clone();
        let thread = std::thread::Builder::new()
            .name("raftq-log-writer".into())
            .spawn(move || writer_loop(wdb, journal, rx, wstats, wcache, at_close, every))?;
        let writer = Writer { tx: Some(tx), thread: Some(thread), checkpoint_at_close };
        Ok(LogStore { db, writer: Arc::new(writer), cache, stats })
    }

    /// How many entries the in-memory tail holds, and their encoded bytes (tests).
    #[cfg(test)]
    pub(crate) fn cached(&self) -> (usize, usize) {
        let c = self.cache();
        (c.entries.len(), c.bytes)
    }

    /// A handle that tells when the log file has been closed (every clone and reader dropped).
    pub fn closed_watch(&self) -> std::sync::Weak<Database> {
        Arc::downgrade(&self.db)
    }

    /// Closes without the checkpoint a clean close makes, leaving what the journal holds for the next open to
    /// replay, as after a crash (the process killed; redb's unsynced commits are not on disk either).
    #[cfg(test)]
    pub(crate) fn close_as_crashed(self) {
        self.writer.checkpoint_at_close.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn send(&self, op: Op) -> io::Result<()> {
        let tx = self.writer.tx.as_ref().expect("sender lives until drop");
        tx.send(op).map_err(|_| io::Error::other("log writer stopped"))
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &'static str) -> io::Result<Option<T>> {
        self.reader().read_meta(key)
    }

    fn reader(&self) -> LogReader {
        LogReader { db: self.db.clone(), cache: self.cache.clone() }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, LogCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Applies the journal's records since the last checkpoint to redb and records their generation, in one synced
/// commit (always, so the journal then writes a generation never written before), and returns the journal.
fn open_journal(db: &Database, path: &Path) -> io::Result<Journal> {
    let done = journal_generation(db)?;
    let (journal, records) = Journal::open(&super::files::journal_path(path), done + 1)?;
    let mut ops = Vec::new();
    for (i, r) in records.iter().enumerate() {
        decode_record(r, &mut ops).map_err(|e| io::Error::other(format!("raft log journal record {i}: {e}")))?;
    }
    if !records.is_empty() {
        tracing::info!(records = records.len(), writes = ops.len(), "raft log: replayed the journal");
    }
    write_ops(db, ops.iter().map(Replayed::as_write), Durability::Immediate, Some(done + 1))?;
    Ok(journal)
}

/// The last generation of the log's journal that the log file holds (0: none, a directory older than the
/// journal).
pub(super) fn journal_generation(db: &impl ReadableDatabase) -> io::Result<u64> {
    let txn = db.begin_read().map_err(io_err)?;
    let meta = match txn.open_table(LOG_META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(io_err(e)),
    };
    match meta.get(META_JOURNAL).map_err(io_err)? {
        Some(v) => decode(v.value(), "journal generation"),
        None => Ok(0),
    }
}

fn writer_loop(
    db: Arc<Database>,
    mut journal: Journal,
    rx: mpsc::Receiver<Op>,
    stats: Arc<LogStats>,
    cache: Arc<Mutex<LogCache>>,
    checkpoint_at_close: Arc<std::sync::atomic::AtomicBool>,
    checkpoint_every: std::time::Duration,
) {
    use std::sync::atomic::Ordering::Relaxed;
    // After an I/O error every later operation fails too: openraft stops the node on the first one.
    let mut broken: Option<String> = None;
    let mut checkpointed = std::time::Instant::now();
    // The writes journaled since the last checkpoint, in order: redb gets them at the next checkpoint, in one
    // synced commit (a commit per turn, even unsynced, rewrote the same pages turn after turn).
    let mut pending: Vec<OpData> = Vec::new();
    // The cache's truncation count as of the last truncation written to redb.
    let mut truncations_written = 0u64;
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        while ops.len() < MAX_OPS_PER_TURN {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let (data, replies): (Vec<OpData>, Vec<Reply>) = ops.into_iter().map(|op| (op.data, op.reply)).unzip();
        let vote = replies.iter().any(|r| matches!(r, Reply::Done(_)));
        let durable = vote || data.iter().any(|d| matches!(d, OpData::Append { .. }));
        let checkpoint =
            vote || journal.written() >= CHECKPOINT_BYTES || (durable && checkpointed.elapsed() >= checkpoint_every);
        let n_entries: u64 =
            data.iter().map(|d| if let OpData::Append { spans, .. } = d { spans.len() as u64 } else { 0 }).sum();
        let started = std::time::Instant::now();
        let result = match &broken {
            Some(e) => Err(io::Error::other(e.clone())),
            None if checkpoint => {
                let writes = writes(pending.iter().chain(&data));
                let r = write_ops(&db, writes.iter().copied(), Durability::Immediate, Some(journal.generation()));
                if r.is_ok() {
                    journal.next_generation();
                    checkpointed = started;
                    let (top, truncated) = written_by(pending.iter().chain(&data));
                    truncations_written = truncated.unwrap_or(truncations_written);
                    if let Some(i) = top {
                        let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                        if c.truncations == truncations_written {
                            c.written = c.written.max(i);
                            c.evict();
                        }
                    }
                }
                drop(writes);
                pending.clear();
                r
            }
            None => {
                let writes = writes(data.iter());
                journal
                    .write(|b| encode_record(&writes, b))
                    .and_then(|()| if durable { journal.sync() } else { Ok(()) })
            }
        };
        if !checkpoint && result.is_ok() {
            pending.extend(data);
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "raft log write failed");
            broken.get_or_insert_with(|| e.to_string());
            pending.clear();
        }
        for r in replies {
            match r {
                Reply::Flushed(flushed) => flushed.io_completed(clone_result(&result)),
                Reply::Done(done) => {
                    let _ = done.send(clone_result(&result));
                }
                Reply::None => {}
            }
        }
        if checkpoint {
            tracing::trace!(us = started.elapsed().as_micros() as u64, "raft log checkpoint");
        }
        if result.is_ok() && durable {
            stats.fsyncs.fetch_add(1, Relaxed);
            stats.entries.fetch_add(n_entries, Relaxed);
            stats.fsync_latency.observe_us(started.elapsed().as_micros() as u64);
        }
    }
    // Closed: a last checkpoint, so the next open has nothing to replay.
    if broken.is_none() && journal.written() > 0 && checkpoint_at_close.load(Relaxed) {
        let writes = writes(pending.iter());
        if let Err(e) = write_ops(&db, writes.into_iter(), Durability::Immediate, Some(journal.generation())) {
            tracing::warn!(error = %e, "raft log: the checkpoint at close failed (the journal is replayed at open)");
        }
    }
}

/// What a checkpoint's writes leave in redb: the index of the log's last entry they wrote (`None`: no entry),
/// and the cache's truncation count as of the last truncation among them.
fn written_by<'a>(data: impl Iterator<Item = &'a OpData>) -> (Option<u64>, Option<u64>) {
    let (mut top, mut truncated) = (None, None);
    for d in data {
        match d {
            OpData::Append { spans, .. } => top = spans.last().map(|(i, _)| *i).or(top),
            OpData::TruncateAfter { index, epoch } => {
                top = match (top, index) {
                    (Some(t), Some(i)) => Some(t.min(*i)),
                    _ => None,
                };
                truncated = Some(*epoch);
            }
            OpData::Meta { .. } | OpData::Purge { .. } => {}
        }
    }
    (top, truncated)
}

/// One write of a turn, in order: the unit that redb gets and the journal replays.
#[derive(Clone, Copy)]
enum Write<'a> {
    Entry(u64, &'a [u8]),
    Meta(&'a str, &'a [u8]),
    TruncateAfter(Option<u64>),
    Purge(u64, &'a [u8]),
}

/// Operations as their writes, in order (an append gives one write per entry).
fn writes<'a>(ops: impl Iterator<Item = &'a OpData>) -> Vec<Write<'a>> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            OpData::Append { bytes, spans } => {
                let mut start = 0;
                for (index, end) in spans {
                    out.push(Write::Entry(*index, &bytes[start..*end]));
                    start = *end;
                }
            }
            OpData::Meta { key, value } => out.push(Write::Meta(key, value)),
            OpData::TruncateAfter { index, .. } => out.push(Write::TruncateAfter(*index)),
            OpData::Purge { log_id, upto } => out.push(Write::Purge(*upto, log_id)),
        }
    }
    out
}

// ---- journal records: a turn's writes ---------------------------------------------------------------------------
// Each write: a tag byte, then its fields (integers little-endian, byte strings behind a u32 length):
// 1 entry (index, bytes), 2 meta (key, value), 3 truncate after (0, or 1 and an index), 4 purge (upto, log id).

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}

fn encode_record(writes: &[Write<'_>], b: &mut Vec<u8>) {
    for w in writes {
        match *w {
            Write::Entry(index, v) => {
                b.push(1);
                b.extend_from_slice(&index.to_le_bytes());
                put_bytes(b, v);
            }
            Write::Meta(key, v) => {
                b.push(2);
                put_bytes(b, key.as_bytes());
                put_bytes(b, v);
            }
            Write::TruncateAfter(index) => {
                b.push(3);
                b.push(index.is_some() as u8);
                b.extend_from_slice(&index.unwrap_or(0).to_le_bytes());
            }
            Write::Purge(upto, log_id) => {
                b.push(4);
                b.extend_from_slice(&upto.to_le_bytes());
                put_bytes(b, log_id);
            }
        }
    }
}

/// A journaled write read back (owning its bytes).
enum Replayed {
    Entry(u64, Vec<u8>),
    Meta(String, Vec<u8>),
    TruncateAfter(Option<u64>),
    Purge(u64, Vec<u8>),
}

impl Replayed {
    fn as_write(&self) -> Write<'_> {
        match self {
            Replayed::Entry(i, v) => Write::Entry(*i, v),
            Replayed::Meta(k, v) => Write::Meta(k, v),
            Replayed::TruncateAfter(i) => Write::TruncateAfter(*i),
            Replayed::Purge(u, v) => Write::Purge(*u, v),
        }
    }
}

fn decode_record(mut b: &[u8], out: &mut Vec<Replayed>) -> Result<(), &'static str> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], &'static str> {
        if b.len() < n {
            return Err("cut short");
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn u64_(b: &mut &[u8]) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(take(b, 8)?.try_into().expect("8 bytes")))
    }
    fn bytes(b: &mut &[u8]) -> Result<Vec<u8>, &'static str> {
        let n = u32::from_le_bytes(take(b, 4)?.try_into().expect("4 bytes")) as usize;
        Ok(take(b, n)?.to_vec())
    }
    while !b.is_empty() {
        let tag = take(&mut b, 1)?[0];
        out.push(match tag {
            1 => Replayed::Entry(u64_(&mut b)?, bytes(&mut b)?),
            2 => {
                let key = String::from_utf8(bytes(&mut b)?).map_err(|_| "a meta key is not UTF-8")?;
                Replayed::Meta(key, bytes(&mut b)?)
            }
            3 => {
                let some = take(&mut b, 1)?[0] == 1;
                let index = u64_(&mut b)?;
                Replayed::TruncateAfter(some.then_some(index))
            }
            4 => Replayed::Purge(u64_(&mut b)?, bytes(&mut b)?),
            _ => return Err("unknown write"),
        });
    }
    Ok(())
}

fn clone_result(r: &io::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// Writes one turn's writes in one transaction, in order. `journal`: this commit covers the journal's records
/// up to that generation (a checkpoint, with `Durability::Immediate`).
fn write_ops<'a>(
    db: &Database,
    writes: impl Iterator<Item = Write<'a>>,
    durability: Durability,
    journal: Option<u64>,
) -> io::Result<()> {
    let mut txn = db.begin_write().map_err(io_err)?;
    txn.set_durability(durability).map_err(io_err)?;
    {
        let mut log = txn.open_table(LOG).map_err(io_err)?;
        let mut meta = txn.open_table(LOG_META).map_err(io_err)?;
        for w in writes {
            match w {
                Write::Entry(index, v) => {
                    log.insert(index, v).map_err(io_err)?;
                }
                Write::Meta(key, value) => {
                    meta.insert(key, value).map_err(io_err)?;
                }
                Write::TruncateAfter(index) => {
                    let from = index.map(|i| i + 1).unwrap_or(0);
                    log.retain_in(from.., |_, _| false).map_err(io_err)?;
                }
                Write::Purge(upto, log_id) => {
                    meta.insert(META_LAST_PURGED, log_id).map_err(io_err)?;
                    log.retain_in(..=upto, |_, _| false).map_err(io_err)?;
                }
            }
        }
        if let Some(g) = journal {
            meta.insert(META_JOURNAL, encode(&g)?.as_slice()).map_err(io_err)?;
        }
    }
    txn.commit().map_err(io_err)
}

impl LogReader {
    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &'static str) -> io::Result<Option<T>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let meta = txn.open_table(LOG_META).map_err(io_err)?;
        match meta.get(key).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value(), key)?)),
            None => Ok(None),
        }
    }
}

// Log reads of the recent tail come from the cache; older entries (a follower far behind, a restart) from
// redb, inline: they hit pages redb has cached, and moving each read to a blocking thread would cost more.
impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        // Exclusive end.
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let (from_cache, cache_first, start) = {
            let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            // Nothing at or below the last purge, nor past the log's last entry: redb may still hold entries
            // purged or truncated since the last checkpoint.
            let start = start.max(c.purged.map_or(0, |p| p.index + 1));
            let end = end.min(c.last.map_or(0, |l| l + 1));
            let first = c.first().unwrap_or(end);
            let lo = start.max(first);
            let cached: Vec<Entry> =
                if lo < end { c.entries.range(lo..end).map(|(_, (e, _))| e.clone()).collect() } else { vec![] };
            (cached, first.min(end), start)
        };
        let mut out = Vec::new();
        if start < cache_first {
            let txn = self.db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            for item in log.range::<u64>(start..cache_first).map_err(io_err)? {
                let (_, v) = item.map_err(io_err)?;
                out.push(decode(v.value(), "log entry")?);
            }
        }
        out.extend(from_cache);
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.read_meta(META_VOTE)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        self.reader().try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.read_meta(META_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let (purged, last, cached) = {
            let c = self.cache();
            (c.purged, c.last, c.entries.last_key_value().map(|(_, (e, _))| e.log_id()))
        };
        let last_log_id = match (cached, last) {
            (Some(l), _) => Some(l),
            (None, None) => purged,
            (None, Some(i)) if purged.is_some_and(|p| p.index >= i) => purged,
            // Written and evicted from the cache: redb has it.
            (None, Some(i)) => {
                let txn = self.db.begin_read().map_err(io_err)?;
                let log = txn.open_table(LOG).map_err(io_err)?;
                match log.get(i).map_err(io_err)? {
                    Some(v) => Some(decode::<Entry>(v.value(), "log entry")?.log_id()),
                    None => purged,
                }
            }
        };
        Ok(LogState { last_purged_log_id: purged, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let (done, rx) = oneshot::channel();
        self.send(Op { data: OpData::Meta { key: META_VOTE, value: encode(vote)? }, reply: Reply::Done(done) })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced on its own: it only lets a restart re-apply sooner, and a later fsync hardens it.
        self.send(Op { data: OpData::Meta { key: META_COMMITTED, value: encode(&committed)? }, reply: Reply::None })
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.read_meta::<Option<LogId>>(META_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Encoded here, so the entries themselves move into the cache (readable at once) rather than being
        // copied for the writer thread, which makes the bytes durable.
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        let mut bytes = Vec::new();
        let mut spans = Vec::with_capacity(entries.len());
        let mut sizes = Vec::with_capacity(entries.len());
        for e in &entries {
            let start = bytes.len();
            encode_into(&mut bytes, e)?;
            spans.push((e.log_id().index, bytes.len()));
            sizes.push(bytes.len() - start);
        }
        self.cache().append(entries, sizes);
        self.send(Op { data: OpData::Append { bytes, spans }, reply: Reply::Flushed(callback) })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let index = last_log_id.map(|l| l.index);
        // Truncated in the cache and queued under one lock, so the writer's epochs follow the cache's.
        let mut c = self.cache();
        c.truncate_after(index);
        self.send(Op { data: OpData::TruncateAfter { index, epoch: c.truncations }, reply: Reply::None })
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.cache().purge(log_id);
        self.send(Op { data: OpData::Purge { upto: log_id.index, log_id: encode(&log_id)? }, reply: Reply::None })
    }
}
