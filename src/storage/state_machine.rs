//! The replicated state machine on N redb shard files: the shared state (`SmShared`: the shards and the
//! notifications the node watches) and openraft's `RaftStateMachine`, whose work is split by concern:
//!
//! - `apply.rs`: committed entries into each shard's in-memory layer of changes;
//! - `flush.rs`: those layers written into the shard files by a flusher thread;
//! - `read_view.rs`: what the API and the leader read between applies;
//! - `snapshot.rs`: building and installing snapshot files;
//! - `files.rs`: where everything lives in the data directory, and crash-safe file steps;
//! - `shard.rs`: one shard file (its tables, metadata, index rebuild, `TaskStore` over a write transaction).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::OptionalSend;
use redb::Database;
use tokio::sync::{broadcast, watch};

use super::files;
use super::shard::{self, Layer, ShardMeta};
use super::snapshot::SnapshotBuilder;
use crate::queue::{ShardCore, TaskId, TimeMs};
use crate::raft::types::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// The shard files, their derived indexes and durable metadata.
pub struct Shards {
    pub dbs: Vec<Arc<Database>>,
    /// Per shard, a read-only handle on its file: the flusher writes each flush's pages back through it.
    pub(super) files: Vec<Arc<fs::File>>,
    pub cores: Vec<ShardCore>,
    /// Each shard's meta as applied; the flusher writes it with the shard's changes.
    pub metas: Vec<ShardMeta>,
    /// Per shard, what apply changed since the flusher last took it.
    pub(super) dirty: Vec<Layer>,
    /// Per shard, changes taken out of `dirty` and not yet written into the file, oldest first: the flusher's
    /// (while it writes them), and a snapshot's, which it reads over the file (`snapshot.rs`). Apply and readers
    /// look in them, newest first, until a flush has written them.
    pub(super) frozen: Vec<Vec<Arc<Layer>>>,
    /// When every shard file was last synced (`flush.rs`).
    pub(super) last_sync: Instant,
    /// Per shard, no task id above this is stored, in the file or the layers (`shard::CachedStore`).
    pub(super) newest: Vec<Option<TaskId>>,
    /// Per shard, no task id above this is in the file: `newest` as it was when the flusher last took the shard's
    /// layer (a task stored since is in a layer, which a read looks in first).
    pub(super) file_newest: Vec<Option<TaskId>>,
}

impl Shards {
    /// Opens the shard files in `sm`, creating them if there are none. An existing directory keeps the shard
    /// count it was created with.
    pub(super) fn open(sm: &Path, shards: usize) -> io::Result<Shards> {
        fs::create_dir_all(sm)?;
        let count = files::shard_count(sm, shards)?;
        let mut out = Shards {
            dbs: vec![],
            files: vec![],
            cores: vec![],
            metas: vec![],
            dirty: (0..count).map(|_| Layer::default()).collect(),
            frozen: vec![Vec::new(); count],
            last_sync: Instant::now(),
            newest: vec![],
            file_newest: vec![],
        };
        for i in 0..count {
            let path = files::shard_path(sm, i);
            let db = shard::open_db_cached(&path, Some(shard::PAGE_CACHE_BYTES))?;
            out.files.push(Arc::new(fs::File::open(&path)?));
            let meta = shard::read_meta(&db)?;
            out.cores.push(shard::load_core(&db, i, count, meta.now)?);
            out.metas.push(meta);
            let newest = shard::newest_task_id(&db)?;
            out.newest.push(newest);
            out.file_newest.push(newest);
            out.dbs.push(Arc::new(db));
        }
        Ok(out)
    }

    pub fn count(&self) -> usize {
        self.dbs.len()
    }

    /// The applied point: the shard furthest behind (every shard holds at least that much), with its membership.
    pub(super) fn applied(&self) -> (Option<LogId>, StoredMembership) {
        let m = self.metas.iter().min_by_key(|m| m.last_applied.as_ref().map(|l| l.index)).expect("at least one shard");
        (m.last_applied, m.membership.clone())
    }

    /// Whether any limit is set (every shard holds them all; shard 0 answers).
    pub(super) fn any_limits(&self) -> bool {
        self.cores.first().is_some_and(|c| !c.limits().is_empty())
    }

    /// Whether any token bucket exists (every shard holds them all; shard 0 answers).
    pub(super) fn any_rates(&self) -> bool {
        self.cores.first().is_some_and(|c| !c.all_rates().is_empty())
    }

    /// Whether any shard holds a task waiting on a dependency.
    pub(super) fn any_dependents(&self) -> bool {
        self.cores.iter().any(|c| !c.waiters().is_empty())
    }

    /// The cluster version every shard has applied.
    pub fn cluster_version(&self) -> u32 {
        self.cores.iter().map(|c| c.cluster_version).min().unwrap_or(0)
    }

    pub fn now(&self) -> TimeMs {
        self.cores.iter().map(|c| c.now).max().unwrap_or(0)
    }
}

/// State shared between the state machine (owned by openraft) and the rest of the node: the shards (read through
/// `read_view.rs`), and the notifications apply sends.
pub struct SmShared {
    pub(super) shards: RwLock<Shards>,
    /// Ids of tasks that reached a terminal state, for result waiters.
    pub ended: broadcast::Sender<TaskId>,
    /// Deliveries ended without their worker (cancel, deadline, lease expiry), for the worker streams holding them.
    pub revoked: broadcast::Sender<crate::queue::RevokedLease>,
    /// Bumped whenever a queue gains claimable work (an enqueue, a retry, a lease expiry, a delayed task coming
    /// due, a redrive); the claim dispatcher watches it.
    pub work: watch::Sender<u64>,
    /// The last applied log index.
    pub applied: watch::Sender<u64>,
    /// Bumped when apply adds webhook deliveries to an outbox; the leader's webhook sender watches it.
    pub webhooks: watch::Sender<u64>,
    /// Whether any task waits on a dependency, kept after every apply batch, open and install: while none does,
    /// the dependency resolver is not woken by every batch that ends tasks (`leader::resolver`).
    pub dependents: watch::Sender<bool>,
    /// Task lifecycle counters and latencies, fed by apply.
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// One flush at a time: the flusher's, or one a snapshot or a digest makes inline (`flush.rs`).
    pub(super) flush_lock: Mutex<()>,
    /// Changed records in the shards' newest layers.
    pub(super) dirty_records: AtomicUsize,
    /// Whether any tenant has a limit set (`queue::Limits`), kept after every apply batch, open and install, so
    /// the hot paths (every enqueue, every claim pass) ask without taking the shards' lock.
    pub(super) limits_set: std::sync::atomic::AtomicBool,
    /// Whether any queue has a token bucket (`queue::rate`), kept like `limits_set`: without one the dispatcher
    /// looks at no bucket.
    pub(super) rates_set: std::sync::atomic::AtomicBool,
    /// Wakes the flusher early; dropping it stops the flusher.
    pub(super) flush_wake: Mutex<Option<mpsc::Sender<()>>>,
    /// The first flush error: apply fails from then on, which stops the node.
    pub(super) broken: Mutex<Option<String>>,
    /// Held by nothing else, and the last field, so it is dropped after the close's final flush (`Drop`) and
    /// after the shard files: a `Weak` of it (`closed_watch`) tells when the files are closed. The state
    /// machine's own count drops to zero *before* that, while the last holder's thread still writes the files.
    closed: Arc<()>,
}

impl SmShared {
    /// A handle that tells when the shard files have been closed (the state machine dropped and its close
    /// finished, on whichever thread dropped it last).
    pub fn closed_watch(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.closed)
    }

    /// Publishes whether any task waits on a dependency (watchers are woken only when that changes).
    pub(super) fn set_dependents(&self, any: bool) {
        self.dependents.send_if_modified(|d| std::mem::replace(d, any) != any);
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Shards> {
        self.shards.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster version this replica has applied (`raft::version`).
    pub fn cluster_version(&self) -> u32 {
        self.read().cluster_version()
    }

    /// The shards for a change: apply, a snapshot's sync, an install's swap.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Shards> {
        self.shards.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The openraft state machine: a handle on `SmShared` plus the data directory.
pub struct StateMachine {
    pub shared: Arc<SmShared>,
    pub(super) dir: PathBuf,
}

impl StateMachine {
    /// Opens the state machine in `dir` (the node's data directory), finishing an interrupted snapshot install.
    pub fn open(dir: &Path, shards: usize) -> io::Result<StateMachine> {
        fs::create_dir_all(dir)?;
        files::recover_install(dir)?;
        fs::create_dir_all(files::snap_dir(dir))?;
        let set = Shards::open(&files::sm_dir(dir), shards.max(1))?;
        let applied = set.applied().0.map(|l| l.index).unwrap_or(0);
        let limits_set = set.any_limits();
        let rates_set = set.any_rates();
        let dependents = set.any_dependents();
        let (wake, woken) = mpsc::channel();
        let shared = Arc::new(SmShared {
            shards: RwLock::new(set),
            ended: broadcast::channel(4096).0,
            revoked: broadcast::channel(4096).0,
            work: watch::channel(0).0,
            applied: watch::channel(applied).0,
            webhooks: watch::channel(0).0,
            dependents: watch::channel(dependents).0,
            metrics: Arc::default(),
            flush_lock: Mutex::new(()),
            dirty_records: AtomicUsize::new(0),
            limits_set: limits_set.into(),
            rates_set: rates_set.into(),
            flush_wake: Mutex::new(Some(wake)),
            broken: Mutex::new(None),
            closed: Arc::new(()),
        });
        super::flush::spawn_flusher(&shared, woken)?;
        Ok(StateMachine { shared, dir: dir.to_path_buf() })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = tokio::fs::File;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok(self.shared.read().applied())
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        self.apply_entries(entries).await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_builder().await
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: tokio::fs::File) -> Result<(), io::Error> {
        self.install(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.current_snapshot().await
    }
}
