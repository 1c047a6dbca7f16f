//! Write-back of applied changes into the shard files.
//!
//! Apply changes each shard in memory only (its newest `Layer`). The flusher thread takes every shard's layer
//! every `FLUSH_INTERVAL` (sooner once `FLUSH_AT_RECORDS` records changed) and freezes it (apply and readers still
//! see it), writes the shard's frozen layers with its meta (`last_applied`, membership, time) in one transaction
//! per shard, and then drops them. A task enqueued, claimed and completed within one interval is written once, and
//! the files' work leaves the apply path. A snapshot freezes the layers too, without writing them (`snapshot.rs`):
//! the next flush does.
//!
//! Durability is unchanged: nothing is acknowledged before its log entry is fsynced on a quorum, and a restart
//! re-applies the log from each shard's `last_applied` as written. Layer commits are not synced; every
//! `SHARD_SYNC_INTERVAL` one is, and a snapshot is handed to openraft only after a synced flush of everything
//! applied up to then, so the log is never purged past what the shard files hold durably.
//!
//! The flusher is background work, kept out of the way of the threads that answer requests: it runs at nice
//! `FLUSHER_NICE`, its interval is jittered so that replicas started together do not flush in step, and what an
//! unsynced flush spilled into the file is written back as it ends (redb keeps the rest in its write buffer until
//! the next synced flush).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use redb::{Database, Durability};

use super::codec::io_err;
use super::shard::{self, Layer, ShardMeta};
use super::state_machine::{Shards, SmShared};
use super::tables::SHARD_META;

/// How often the flusher writes what apply changed into the shard files. Each flush writes every task changed
/// since the last one, once, in its latest state: a task that lives about a second under load (enqueued,
/// claimed, completed) was written four to five times at 200 ms and is written about twice at 1 s. The price is a
/// larger write each time (tail latency at moderate load rose; README, "Flush interval and the allocator's purge
/// delay"). Bounded in memory by `FLUSH_AT_RECORDS` and `MAX_DIRTY_RECORDS`; a restart re-applies the log since
/// the last flush.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(1000);
/// Changed records that wake the flusher before its interval ends.
pub(super) const FLUSH_AT_RECORDS: usize = 100_000;
/// Changed records at which apply first waits for a flush: bounds the memory unflushed changes hold.
pub(super) const MAX_DIRTY_RECORDS: usize = 200_000;
/// How often a flush is synced. Bounds the log a restart re-applies; the log itself is synced before every
/// acknowledgement.
const SHARD_SYNC_INTERVAL: Duration = Duration::from_secs(5);
/// The flusher thread's nice value (CPU weight about a tenth of a default thread's).
pub(super) const FLUSHER_NICE: i32 = 10;

/// `d` scaled by a random factor in 0.75..1.25: replicas started together (a cluster, a rolling restart) would
/// otherwise flush in step, every node's burst of CPU and disk work landing in the same few hundred ms.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.75 + rand::random::<f64>() / 2.0)
}

impl Shards {
    /// Moves shard `i`'s newest layer to the end of its frozen layers (apply goes on into an empty one).
    pub(super) fn freeze(&mut self, i: usize) {
        let l = Arc::new(std::mem::take(&mut self.dirty[i]));
        self.frozen[i].push(l);
        // Every task of the file after the frozen layers are written is in a layer taken up to now.
        self.file_newest[i] = self.newest[i];
    }

    /// Writes every unflushed change and each shard's meta into the shard files, with the flush lock and the write
    /// lock held (nothing else writes meanwhile).
    pub(super) fn flush_locked(&mut self, durable: bool) -> io::Result<()> {
        for i in 0..self.dbs.len() {
            let layers = self.frozen[i].iter().map(|l| &**l).chain([&self.dirty[i]]);
            write_shard(&self.dbs[i], layers, &self.metas[i], durable)?;
            self.frozen[i].clear();
            self.dirty[i] = Layer::default();
            self.file_newest[i] = self.newest[i];
        }
        if durable {
            self.last_sync = Instant::now();
        }
        Ok(())
    }
}

impl SmShared {
    /// Freezes each shard's layer (apply goes on into a new one), writes the shard's frozen layers with its meta in
    /// one transaction, then drops them. The flusher thread also writes back what an unsynced flush spilled
    /// (`write_back`); apply, when it has to flush, does not wait for the disk.
    pub(super) fn flush(&self, durable: bool) -> io::Result<()> {
        self.flush_with(durable, false).map(drop)
    }

    /// Returns how long the shards' commits, the write-back and the freeing of the layers took, in that order
    /// (the flusher's trace line: `bench/episodes.py` lines up slow claims with each).
    fn flush_with(&self, durable: bool, pages_back: bool) -> io::Result<[Duration; 3]> {
        let _one = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (layers, metas, dbs, files) = {
            let mut g = self.write();
            let g = &mut *g;
            for i in 0..g.dbs.len() {
                g.freeze(i);
            }
            self.dirty_records.store(0, Ordering::Relaxed);
            (g.frozen.clone(), g.metas.clone(), g.dbs.clone(), g.files.clone())
        };
        let t = Instant::now();
        for ((db, frozen), meta) in dbs.iter().zip(&layers).zip(&metas) {
            write_shard(db, frozen.iter().map(|l| &**l), meta, durable)?;
        }
        let committed = t.elapsed();
        if pages_back && !durable {
            for file in &files {
                write_back(file);
            }
        }
        let written_back = t.elapsed();
        let mut g = self.write();
        for (frozen, written) in g.frozen.iter_mut().zip(&layers) {
            // Layers frozen meanwhile (by a snapshot) stay for the next flush. A snapshot installed meanwhile
            // replaced the shards: their layers are not this flush's.
            let n = frozen.iter().zip(written).take_while(|(a, b)| Arc::ptr_eq(a, b)).count();
            frozen.drain(..n);
        }
        if durable {
            g.last_sync = Instant::now();
        }
        drop(g);
        // The layers are freed here, off the apply path.
        let freeing = t.elapsed();
        drop(layers);
        Ok([committed, written_back - committed, t.elapsed() - freeing])
    }

    /// Runs `f` on the shards with every change written (unsynced) into the files, holding the write lock: no apply
    /// runs meanwhile, so the files hold exactly the applied state.
    pub(super) fn with_flushed<T>(&self, f: impl FnOnce(&mut Shards) -> io::Result<T>) -> io::Result<T> {
        let _one = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut g = self.write();
        g.flush_locked(false)?;
        self.dirty_records.store(0, Ordering::Relaxed);
        f(&mut g)
    }

    /// After apply changed `changed` records in all: wakes the flusher early when there are many.
    pub(super) fn note_changed(&self, changed: usize) {
        self.dirty_records.store(changed, Ordering::Relaxed);
        if changed >= FLUSH_AT_RECORDS {
            if let Some(w) = self.flush_wake.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                let _ = w.send(());
            }
        }
    }

    /// Whether apply would wait for a flush now (see [`SmShared::before_apply`]).
    pub(super) fn flush_behind(&self) -> bool {
        self.dirty_records.load(Ordering::Relaxed) >= MAX_DIRTY_RECORDS
    }

    /// Before apply takes more changes into memory: waits for a flush when the flusher fell far behind, and fails
    /// once a flush has failed (which stops the node, as a failed write always did).
    pub(super) fn before_apply(&self) -> io::Result<()> {
        if self.flush_behind() {
            let t = Instant::now();
            self.flush(false)?;
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "apply waited for a flush");
        }
        match self.broken.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(e) => Err(io::Error::other(format!("writing the shard files failed earlier: {e}"))),
            None => Ok(()),
        }
    }
}

/// Writes the pages an unsynced flush left in the OS page cache to disk now, on the flusher's thread, rather than
/// at the kernel's 30 s expiry or the next synced flush. redb 4 keeps most of an unsynced commit's pages in its
/// own write buffer until the next synced commit; what reaches the page cache is what that buffer spilled, so this
/// takes 0-2 ms per flush at `latency-3` (`back_ms` in the flusher's trace line). The commit itself stays unsynced
/// for redb: this is about when the disk does the work, not about what a restart finds.
fn write_back(file: &std::fs::File) {
    if let Err(e) = file.sync_data() {
        tracing::debug!(error = %e, "writing a shard file's pages back");
    }
}

/// Writes `layers` (oldest first) and `meta` into one shard file in one transaction, synced when `durable`.
fn write_shard<'a>(
    db: &Database,
    layers: impl IntoIterator<Item = &'a Layer>,
    meta: &ShardMeta,
    durable: bool,
) -> io::Result<()> {
    let mut txn = db.begin_write().map_err(io_err)?;
    if !durable {
        txn.set_durability(Durability::None).map_err(io_err)?;
    }
    for layer in layers {
        layer.write_to(&txn)?;
    }
    {
        let mut t = txn.open_table(SHARD_META).map_err(io_err)?;
        shard::write_meta(&mut t, meta)?;
    }
    txn.commit().map_err(io_err)
}

/// The flusher thread: ends when the state machine is dropped.
pub(super) fn spawn_flusher(shared: &Arc<SmShared>, woken: mpsc::Receiver<()>) -> io::Result<()> {
    let weak = Arc::downgrade(shared);
    std::thread::Builder::new().name("raftq-sm-flush".into()).spawn(move || flusher(weak, woken))?;
    Ok(())
}

fn flusher(shared: Weak<SmShared>, woken: mpsc::Receiver<()>) {
    // Background work yields to the threads that answer requests (Linux: this thread only). Starved, it falls
    // behind until apply waits for a flush at `MAX_DIRTY_RECORDS`, which runs on apply's thread at its priority.
    if let Err(e) = rustix::process::nice(FLUSHER_NICE) {
        tracing::debug!(error = %e, "lowering the flusher's priority");
    }
    loop {
        match woken.recv_timeout(jittered(FLUSH_INTERVAL)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(s) = shared.upgrade() else { return };
        let durable = s.read().last_sync.elapsed() >= SHARD_SYNC_INTERVAL;
        let (t, records) = (Instant::now(), s.dirty_records.load(Ordering::Relaxed));
        let r = s.flush_with(durable, true);
        let [commit, back, free] = r.as_ref().map_or([Duration::ZERO; 3], |d| *d);
        tracing::trace!(
            ms = t.elapsed().as_millis() as u64,
            records,
            durable,
            commit_ms = commit.as_millis() as u64,
            back_ms = back.as_millis() as u64,
            free_ms = free.as_millis() as u64,
            "flushed"
        );
        if let Err(e) = r {
            tracing::error!(error = %e, "writing the shard files failed");
            s.broken.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.to_string());
            return;
        }
    }
}

impl Drop for SmShared {
    /// Writes and syncs what is still in memory, so a restart re-applies little.
    fn drop(&mut self) {
        self.flush_wake.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        let g = self.shards.get_mut().unwrap_or_else(|p| p.into_inner());
        if !g.dbs.is_empty() {
            if let Err(e) = g.flush_locked(true) {
                tracing::warn!(error = %e, "writing the shard files at close failed");
            }
        }
    }
}
