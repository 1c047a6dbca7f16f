//! The Raft log on redb, with group commit and an in-memory tail.
//!
//! Appends, truncations and purges take effect at once in `LogCache`, the newest entries as appended, which is
//! where apply and replication read them (no redb read, no decoding). One writer thread owns every write to the
//! file: it takes all operations queued since its last turn, encodes the entries and writes everything in one
//! transaction, committed with `Durability::Immediate` (one fsync) when it holds an append or a vote. Only then
//! are the append callbacks fired and `save_vote` answered: nothing is acknowledged before it is on disk, and one
//! fsync covers every append queued meanwhile. All writes go through the one thread in submission order, so vote,
//! append, truncate and purge are ordered writes; `save_committed`, truncations and purges return once queued (a
//! later fsync hardens them, and openraft needs no more). The cache keeps `CACHE_ENTRIES` entries and never
//! drops one the writer has not yet written.

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
use super::tables::*;
use crate::raft::types::{Entry, LogId, TypeConfig, Vote};

/// How many queued operations one writer turn takes at most, so a turn's transaction stays bounded.
const MAX_OPS_PER_TURN: usize = 4096;

/// A write for the writer thread. Appends, truncations and purges take effect in the cache before they are
/// sent (so readers see them at once); the writer makes them durable in submission order.
enum Op {
    /// Entries encoded by `append` (which moves the entries themselves into the cache): `bytes` holds them one
    /// after the other, `spans` each one's index and end offset.
    Append {
        bytes: Vec<u8>,
        spans: Vec<(u64, usize)>,
        flushed: IOFlushed<TypeConfig>,
    },
    /// `done` is answered after the fsync (a vote); without it the write is only ordered (committed).
    Meta {
        key: &'static str,
        value: Vec<u8>,
        done: Option<oneshot::Sender<io::Result<()>>>,
    },
    TruncateAfter {
        index: Option<u64>,
    },
    Purge {
        log_id: Vec<u8>,
        upto: u64,
    },
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

/// The newest entries of the log, contiguous by index, as appended. It holds every entry not yet written to
/// redb, so a reader finds an appended entry at once (before the writer thread's commit).
#[derive(Default)]
struct LogCache {
    entries: std::collections::BTreeMap<u64, Entry>,
    /// Entries at or below this index are in redb (written by the writer thread), so they may be evicted.
    written: u64,
    /// The index of the log's last entry (`None`: empty, nothing ever appended or purged).
    last: Option<u64>,
    /// The last purged log id, as purged (the writer stores it in order).
    purged: Option<LogId>,
}

impl LogCache {
    fn first(&self) -> Option<u64> {
        self.entries.first_key_value().map(|(i, _)| *i)
    }
    fn evict(&mut self) {
        while self.entries.len() > CACHE_ENTRIES && self.first().is_some_and(|i| i <= self.written) {
            self.entries.pop_first();
        }
    }
    fn append(&mut self, entries: Vec<Entry>) {
        for e in entries {
            let index = e.log_id().index;
            self.entries.insert(index, e);
            self.last = Some(index);
        }
    }
    fn truncate_after(&mut self, index: Option<u64>) {
        let from = index.map_or(0, |i| i + 1);
        self.entries.split_off(&from);
        self.written = self.written.min(index.unwrap_or(0));
        self.last = match (self.last, index) {
            (Some(l), Some(i)) => Some(l.min(i)),
            _ => None,
        };
    }
    fn purge(&mut self, log_id: LogId) {
        let upto = log_id.index;
        self.entries = self.entries.split_off(&(upto + 1));
        self.last = Some(self.last.map_or(upto, |l| l.max(upto)));
        self.purged = Some(log_id);
    }
}

/// The writer thread's handle: dropping the last one stops the thread and waits for it, so the file is closed
/// when the store is (a restart in the same process can reopen it).
struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<std::thread::JoinHandle<()>>,
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
/// cache would only hold copies of appended pages, and its default (1 GiB) fills with them, page by page.
const LOG_PAGE_CACHE_BYTES: usize = 32 << 20;

impl LogStore {
    /// Opens (or creates) the log file and starts its writer thread. The thread ends when the last `LogStore`
    /// clone is dropped.
    pub fn open(path: &Path) -> io::Result<LogStore> {
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
        let cache =
            Arc::new(Mutex::new(LogCache { last, purged, written: last.unwrap_or(0), entries: Default::default() }));
        let (wdb, wstats, wcache) = (db.clone(), stats.clone(), cache.clone());
        let thread = std::thread::Builder::new()
            .name("raftq-log-writer".into())
            .spawn(move || writer_loop(wdb, rx, wstats, wcache))?;
        Ok(LogStore { db, writer: Arc::new(Writer { tx: Some(tx), thread: Some(thread) }), cache, stats })
    }

    /// A handle that tells when the log file has been closed (every clone and reader dropped).
    pub fn closed_watch(&self) -> std::sync::Weak<Database> {
        Arc::downgrade(&self.db)
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

fn writer_loop(db: Arc<Database>, rx: mpsc::Receiver<Op>, stats: Arc<LogStats>, cache: Arc<Mutex<LogCache>>) {
    use std::sync::atomic::Ordering::Relaxed;
    // After an I/O error every later operation fails too: openraft stops the node on the first one.
    let mut broken: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        while ops.len() < MAX_OPS_PER_TURN {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let durable = ops.iter().any(|op| matches!(op, Op::Append { .. } | Op::Meta { done: Some(_), .. }));
        let started = std::time::Instant::now();
        let result = match &broken {
            Some(e) => Err(io::Error::other(e.clone())),
            None => write_ops(&db, &ops, durable),
        };
        let mut n_entries = 0u64;
        let mut last_written = None;
        if let Err(e) = &result {
            tracing::error!(error = %e, "raft log write failed");
            broken.get_or_insert_with(|| e.to_string());
        }
        for op in ops {
            match op {
                Op::Append { spans, flushed, .. } => {
                    n_entries += spans.len() as u64;
                    last_written = spans.last().map(|(index, _)| *index).or(last_written);
                    flushed.io_completed(clone_result(&result));
                }
                Op::Meta { done: Some(done), .. } => {
                    let _ = done.send(clone_result(&result));
                }
                Op::Meta { done: None, .. } | Op::TruncateAfter { .. } | Op::Purge { .. } => {}
            }
        }
        if result.is_ok() && durable {
            stats.fsyncs.fetch_add(1, Relaxed);
            stats.entries.fetch_add(n_entries, Relaxed);
            stats.fsync_latency.observe_us(started.elapsed().as_micros() as u64);
        }
        if let (Ok(()), Some(i)) = (&result, last_written) {
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            c.written = c.written.max(i);
            c.evict();
        }
    }
}

fn clone_result(r: &io::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// Writes one turn's operations in one transaction, in submission order; `durable` commits it with an fsync.
fn write_ops(db: &Database, ops: &[Op], durable: bool) -> io::Result<()> {
    let mut txn = db.begin_write().map_err(io_err)?;
    if !durable {
        txn.set_durability(Durability::None).map_err(io_err)?;
    }
    {
        let mut log = txn.open_table(LOG).map_err(io_err)?;
        let mut meta = txn.open_table(LOG_META).map_err(io_err)?;
        for op in ops {
            match op {
                Op::Append { bytes, spans, .. } => {
                    let mut start = 0;
                    for (index, end) in spans {
                        log.insert(*index, &bytes[start..*end]).map_err(io_err)?;
                        start = *end;
                    }
                }
                Op::Meta { key, value, .. } => {
                    meta.insert(*key, value.as_slice()).map_err(io_err)?;
                }
                Op::TruncateAfter { index } => {
                    let from = index.map(|i| i + 1).unwrap_or(0);
                    log.retain_in(from.., |_, _| false).map_err(io_err)?;
                }
                Op::Purge { log_id, upto } => {
                    meta.insert(META_LAST_PURGED, log_id.as_slice()).map_err(io_err)?;
                    log.retain_in(..=*upto, |_, _| false).map_err(io_err)?;
                }
            }
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
        // Exclusive end, never past the log's last entry (redb may still hold entries truncated from the cache).
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let (from_cache, cache_first) = {
            let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            let end = end.min(c.last.map_or(0, |l| l + 1));
            let first = c.first().unwrap_or(end);
            let lo = start.max(first);
            let cached: Vec<Entry> =
                if lo < end { c.entries.range(lo..end).map(|(_, e)| e.clone()).collect() } else { vec![] };
            (cached, first.min(end))
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
            (c.purged, c.last, c.entries.last_key_value().map(|(_, e)| e.log_id()))
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
        self.send(Op::Meta { key: META_VOTE, value: encode(vote)?, done: Some(done) })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced on its own: it only lets a restart re-apply sooner, and a later fsync hardens it.
        self.send(Op::Meta { key: META_COMMITTED, value: encode(&committed)?, done: None })
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
        for e in &entries {
            encode_into(&mut bytes, e)?;
            spans.push((e.log_id().index, bytes.len()));
        }
        self.cache().append(entries);
        self.send(Op::Append { bytes, spans, flushed: callback })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let index = last_log_id.map(|l| l.index);
        self.cache().truncate_after(index);
        self.send(Op::TruncateAfter { index })
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.cache().purge(log_id);
        self.send(Op::Purge { upto: log_id.index, log_id: encode(&log_id)? })
    }
}
