//! The Raft log on redb, with group commit.
//!
//! One writer thread owns every log write. It takes all operations queued since its last turn, writes them in
//! one transaction committed with `Durability::None` (visible to readers at once, not yet on disk), tells the
//! callers they are visible, and then commits an empty `Durability::Immediate` transaction, which fsyncs
//! everything before it. Only then are append callbacks fired and `save_vote` answered: nothing is acknowledged
//! before it is on disk, and one fsync covers every append queued meanwhile. Because all writes go through the
//! one thread in submission order, vote, append, truncate and purge are ordered writes.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::codec::{decode, encode, io_err};
use super::tables::*;
use crate::raft::types::{Entry, LogId, TypeConfig, Vote};

/// How many queued operations one writer turn takes at most, so a turn's transaction stays bounded.
const MAX_OPS_PER_TURN: usize = 4096;

enum Op {
    Append { entries: Vec<(u64, Vec<u8>)>, visible: oneshot::Sender<io::Result<()>>, flushed: IOFlushed<TypeConfig> },
    Meta { key: &'static str, value: Vec<u8>, durable: bool, done: oneshot::Sender<io::Result<()>> },
    TruncateAfter { index: Option<u64>, done: oneshot::Sender<io::Result<()>> },
    Purge { log_id: Vec<u8>, upto: u64, done: oneshot::Sender<io::Result<()>> },
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
    pub stats: Arc<LogStats>,
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
}

impl LogStore {
    /// Opens (or creates) the log file and starts its writer thread. The thread ends when the last `LogStore`
    /// clone is dropped.
    pub fn open(path: &Path) -> io::Result<LogStore> {
        let db = Arc::new(super::codec::open_db(path)?);
        {
            let txn = db.begin_write().map_err(io_err)?;
            txn.open_table(LOG).map_err(io_err)?;
            txn.open_table(LOG_META).map_err(io_err)?;
            txn.commit().map_err(io_err)?;
        }
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(LogStats::default());
        let (wdb, wstats) = (db.clone(), stats.clone());
        let thread =
            std::thread::Builder::new().name("raftq-log-writer".into()).spawn(move || writer_loop(wdb, rx, wstats))?;
        Ok(LogStore { db, writer: Arc::new(Writer { tx: Some(tx), thread: Some(thread) }), stats })
    }

    /// A handle that tells when the log file has been closed (every clone and reader dropped).
    pub fn closed_watch(&self) -> std::sync::Weak<Database> {
        Arc::downgrade(&self.db)
    }

    fn send(&self, op: Op) -> io::Result<()> {
        let tx = self.writer.tx.as_ref().expect("sender lives until drop");
        tx.send(op).map_err(|_| io::Error::other("log writer stopped"))
    }

    async fn meta(&self, key: &'static str, value: Vec<u8>, durable: bool) -> io::Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Meta { key, value, durable, done })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        LogReader { db: self.db.clone() }.read_meta(key)
    }
}

fn writer_loop(db: Arc<Database>, rx: mpsc::Receiver<Op>, stats: Arc<LogStats>) {
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
        let result = match &broken {
            Some(e) => Err(io::Error::other(e.clone())),
            None => write_ops(&db, &ops),
        };
        let mut n_entries = 0u64;
        let mut after_sync = Vec::new();
        for op in ops {
            match op {
                Op::Append { entries, visible, flushed } => {
                    n_entries += entries.len() as u64;
                    let _ = visible.send(clone_result(&result));
                    after_sync.push(Sync::Flushed(flushed));
                }
                Op::Meta { durable: true, done, .. } => after_sync.push(Sync::Done(done)),
                Op::Meta { done, .. } | Op::TruncateAfter { done, .. } | Op::Purge { done, .. } => {
                    let _ = done.send(clone_result(&result));
                }
            }
        }
        let started = std::time::Instant::now();
        let synced = result.and_then(|_| {
            if after_sync.is_empty() {
                return Ok(());
            }
            let txn = db.begin_write().map_err(io_err)?;
            txn.commit().map_err(io_err)
        });
        if let Err(e) = &synced {
            tracing::error!(error = %e, "raft log write failed");
            broken.get_or_insert_with(|| e.to_string());
        } else if !after_sync.is_empty() {
            stats.fsyncs.fetch_add(1, Relaxed);
            stats.entries.fetch_add(n_entries, Relaxed);
            stats.fsync_latency.observe_us(started.elapsed().as_micros() as u64);
        }
        for s in after_sync {
            match s {
                Sync::Flushed(cb) => cb.io_completed(clone_result(&synced)),
                Sync::Done(done) => {
                    let _ = done.send(clone_result(&synced));
                }
            }
        }
    }
}

enum Sync {
    Flushed(IOFlushed<TypeConfig>),
    Done(oneshot::Sender<io::Result<()>>),
}

fn clone_result(r: &io::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// Writes one turn's operations in one non-durable transaction, in submission order.
fn write_ops(db: &Database, ops: &[Op]) -> io::Result<()> {
    let mut txn = db.begin_write().map_err(io_err)?;
    txn.set_durability(Durability::None).map_err(io_err)?;
    {
        let mut log = txn.open_table(LOG).map_err(io_err)?;
        let mut meta = txn.open_table(LOG_META).map_err(io_err)?;
        for op in ops {
            match op {
                Op::Append { entries, .. } => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice()).map_err(io_err)?;
                    }
                }
                Op::Meta { key, value, .. } => {
                    meta.insert(*key, value.as_slice()).map_err(io_err)?;
                }
                Op::TruncateAfter { index, .. } => {
                    let from = index.map(|i| i + 1).unwrap_or(0);
                    log.retain_in(from.., |_, _| false).map_err(io_err)?;
                }
                Op::Purge { log_id, upto, .. } => {
                    meta.insert(META_LAST_PURGED, log_id.as_slice()).map_err(io_err)?;
                    log.retain_in(..=*upto, |_, _| false).map_err(io_err)?;
                }
            }
        }
    }
    txn.commit().map_err(io_err)
}

impl LogReader {
    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let meta = txn.open_table(LOG_META).map_err(io_err)?;
        match meta.get(key).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }
}

// Log reads run inline: they hit pages redb has just written and cached, and moving each read to a blocking
// thread would cost more than the read.
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
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(*i),
            Bound::Excluded(i) => Bound::Excluded(*i),
            Bound::Unbounded => Bound::Unbounded,
        };
        let txn = self.db.begin_read().map_err(io_err)?;
        let log = txn.open_table(LOG).map_err(io_err)?;
        let mut out = Vec::new();
        for item in log.range::<u64>((Bound::Included(start), end)).map_err(io_err)? {
            let (_, v) = item.map_err(io_err)?;
            out.push(decode(v.value())?);
        }
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
        LogReader { db: self.db.clone() }.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.read_meta(META_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogId> = self.read_meta(META_LAST_PURGED)?;
        let txn = self.db.begin_read().map_err(io_err)?;
        let log = txn.open_table(LOG).map_err(io_err)?;
        let last = match log.last().map_err(io_err)? {
            Some((_, v)) => Some(decode::<Entry>(v.value())?.log_id()),
            None => last_purged,
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader { db: self.db.clone() }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.meta(META_VOTE, encode(vote)?, true).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced on its own: it only lets a restart re-apply sooner, and a later fsync hardens it.
        self.meta(META_COMMITTED, encode(&committed)?, false).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.read_meta::<Option<LogId>>(META_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for e in entries {
            encoded.push((e.log_id().index, encode(&e)?));
        }
        let (visible, rx) = oneshot::channel();
        self.send(Op::Append { entries: encoded, visible, flushed: callback })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let (done, rx) = oneshot::channel();
        self.send(Op::TruncateAfter { index: last_log_id.map(|l| l.index), done })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Purge { upto: log_id.index, log_id: encode(&log_id)?, done })?;
        rx.await.map_err(|_| io::Error::other("log writer stopped"))?
    }
}
