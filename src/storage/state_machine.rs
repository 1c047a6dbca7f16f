//! The replicated state machine on N redb shard files, and its snapshots.
//!
//! Apply writes each shard's changes and its `last_applied` in one transaction per shard and batch. A shard
//! skips entries at or below its own `last_applied`, and `applied_state` reports the minimum, so after a crash
//! between two shard commits each shard replays exactly what it lacks (every effect on a shard depends only on
//! that shard, see `queue::shard`). Shard commits are not synced on every batch: the log is, and a restart
//! re-applies from the last synced point. Before a snapshot is built every shard is synced, so the log is never
//! purged past what the shards hold durably.
//!
//! Snapshots are a single file: a header (last log id, membership, time) and every task record and idempotency
//! key. Installing one writes fresh shard files in `sm.new/`, marks them complete, then swaps directories, so a
//! crash at any point leaves either the old or the new state.

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use redb::{Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use super::codec::{decode, encode, io_err};
use super::shard::{self, RedbTaskStore, ShardMeta};
use super::tables::*;
use crate::queue::{
    self, DeliveryId, Effects, PartialResponse, Response, ShardCore, StateCounts, Task, TaskId, TimeMs, WebhookDelivery,
};
use crate::raft::types::{Entry, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// How often apply syncs the shard files. Bounds the log a restart re-applies; the log itself is always synced.
const SHARD_SYNC_INTERVAL: Duration = Duration::from_secs(5);
/// How far before `created_from` a listing starts scanning ids (see `SmShared::list_tasks`).
const LIST_FLOOR_MARGIN_MS: u64 = 60_000;
/// Version 2 ends with the SHA-256 of every byte before it; version 1 files (no digest) are still read.
const SNAPSHOT_MAGIC: &[u8] = b"RAFTQSNAP2\n";
const SNAPSHOT_MAGIC_V1: &[u8] = b"RAFTQSNAP1\n";

/// Hashes what passes through it: a snapshot file's digest, written and checked without a second pass.
struct Hashing<T> {
    inner: T,
    hash: sha2::Sha256,
}

impl<T> Hashing<T> {
    fn new(inner: T) -> Self {
        Hashing { inner, hash: <sha2::Sha256 as sha2::Digest>::new() }
    }

    fn digest(&self) -> [u8; 32] {
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

/// The shard files, their derived indexes and durable metadata.
pub struct Shards {
    pub dbs: Vec<Arc<Database>>,
    pub cores: Vec<ShardCore>,
    pub metas: Vec<ShardMeta>,
    last_sync: Instant,
}

impl Shards {
    pub fn count(&self) -> usize {
        self.dbs.len()
    }
    fn applied(&self) -> (Option<LogId>, StoredMembership) {
        let m = self.metas.iter().min_by_key(|m| m.last_applied.as_ref().map(|l| l.index)).expect("at least one shard");
        (m.last_applied, m.membership.clone())
    }
    pub fn now(&self) -> TimeMs {
        self.cores.iter().map(|c| c.now).max().unwrap_or(0)
    }
}

/// State shared between the state machine (owned by openraft) and the API: reads, claim choice, notifications.
pub struct SmShared {
    shards: RwLock<Shards>,
    /// Ids of tasks that reached a terminal state, for result waiters.
    pub ended: broadcast::Sender<TaskId>,
    /// Bumped whenever a queue gains claimable work (an enqueue, a retry, a lease expiry, a delayed task coming
    /// due, a redrive); the claim dispatcher watches it.
    pub work: watch::Sender<u64>,
    /// The last applied log index.
    pub applied: watch::Sender<u64>,
    /// Bumped when apply adds webhook deliveries to an outbox; the leader's webhook sender watches it.
    pub webhooks: watch::Sender<u64>,
    /// Task lifecycle counters and latencies, fed by apply.
    pub metrics: Arc<crate::telemetry::Metrics>,
}

impl SmShared {
    pub fn read(&self) -> RwLockReadGuard<'_, Shards> {
        self.shards.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get_task(&self, id: &TaskId) -> io::Result<Option<Task>> {
        let db = {
            let g = self.read();
            g.dbs[id.shard(g.count())].clone()
        };
        shard::get_task(&db, id)
    }

    /// Claim choice for the leader: see `queue::pick_ready`.
    pub fn pick_ready(&self, tenant: &str, queues: &[String], count: usize, skip: &HashSet<TaskId>) -> Vec<TaskId> {
        queue::pick_ready(&self.read().cores, tenant, queues, count, skip)
    }

    /// Dead-lettered tasks of a queue, oldest first, at most `limit`.
    pub fn dead_letters(&self, tenant: &str, queue: &str, limit: usize) -> io::Result<Vec<Task>> {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        let (mut ids, dbs) = {
            let g = self.read();
            let ids: Vec<(TimeMs, TaskId)> = g.cores.iter().flat_map(|c| c.dead_letters(&qk)).collect();
            (ids, g.dbs.clone())
        };
        ids.sort();
        let mut out = Vec::new();
        for (_, id) in ids.into_iter().take(limit) {
            if let Some(t) = shard::get_task(&dbs[id.shard(dbs.len())], &id)? {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Task counts per state for every queue of a tenant (all tenants when `None`).
    pub fn counts(&self, tenant: Option<&str>) -> Vec<(queue::QueueKey, StateCounts)> {
        let g = self.read();
        let mut all: std::collections::BTreeMap<queue::QueueKey, StateCounts> = Default::default();
        for c in &g.cores {
            for (qk, n) in c.counts() {
                if tenant.is_none_or(|t| t == qk.tenant) {
                    all.entry(qk.clone()).or_default().add(n);
                }
            }
        }
        all.into_iter().collect()
    }

    /// Webhook deliveries due at `now` (earliest first, at most `limit`), skipping those in flight.
    pub fn due_deliveries(
        &self,
        now: TimeMs,
        limit: usize,
        skip: &HashSet<DeliveryId>,
    ) -> io::Result<Vec<WebhookDelivery>> {
        let (mut ids, dbs) = {
            let g = self.read();
            let ids: Vec<(TimeMs, DeliveryId)> =
                g.cores.iter().flat_map(|c| c.due_deliveries(now, limit, skip)).collect();
            (ids, g.dbs.clone())
        };
        ids.sort();
        let mut out = Vec::new();
        for (_, id) in ids.into_iter().take(limit) {
            if let Some(d) = shard::get_delivery(&dbs[id.task_id.shard(dbs.len())], &id)? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Whether a queue is paused (every shard holds the flag; shard 0 answers).
    pub fn is_paused(&self, tenant: &str, queue: &str) -> bool {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        self.read().cores.first().is_some_and(|c| c.is_paused(&qk))
    }

    /// Every schedule (all tenants when `None`).
    pub fn schedules(&self, tenant: Option<&str>) -> Vec<queue::Schedule> {
        let g = self.read();
        g.cores
            .iter()
            .flat_map(|c| c.schedules().values())
            .filter(|s| tenant.is_none_or(|t| t == s.tenant))
            .cloned()
            .collect()
    }

    /// Paused queues of a tenant.
    pub fn paused_queues(&self, tenant: &str) -> Vec<String> {
        let g = self.read();
        let mut v: Vec<String> = g
            .cores
            .first()
            .map(|c| c.paused().filter(|qk| qk.tenant == tenant).map(|qk| qk.queue.clone()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Completions of a queue over the recent windows, summed over shards.
    pub fn throughput(&self, tenant: &str, queue: &str) -> queue::Throughput {
        let qk = queue::QueueKey { tenant: tenant.to_string(), queue: queue.to_string() };
        let mut out = queue::Throughput::default();
        for c in &self.read().cores {
            let t = c.throughput(&qk);
            out.completed_1m += t.completed_1m;
            out.completed_5m += t.completed_5m;
            out.completed_15m += t.completed_15m;
            out.run_ms_15m += t.run_ms_15m;
        }
        out
    }

    /// Tasks of a tenant matching `filter`, in id order (ids start with their creation time), after `after`.
    /// Returns up to `limit` tasks and whether more may follow.
    pub fn list_tasks(
        &self,
        tenant: &str,
        filter: &queue::TaskFilter,
        after: Option<TaskId>,
        limit: usize,
    ) -> io::Result<(Vec<Task>, bool)> {
        let dbs = self.read().dbs.clone();
        // Ids begin with the leader's clock at enqueue: a lower time bound starts the scan there.
        // The margin covers a task whose shard clock ran ahead of the clock that stamped its id.
        let floor = filter.created_from.map(|t| TaskId::new(t.saturating_sub(LIST_FLOOR_MARGIN_MS), 0, 0));
        let start = match (after, floor) {
            (Some(a), Some(f)) => Some(a.max(f)),
            (a, f) => a.or(f),
        };
        let mut out: Vec<Task> = Vec::new();
        for db in &dbs {
            let txn = db.begin_read().map_err(io_err)?;
            let table = txn.open_table(TASKS).map_err(io_err)?;
            let iter = match &start {
                Some(s) => table.range::<&[u8]>(s.0.as_slice()..).map_err(io_err)?,
                None => table.iter().map_err(io_err)?,
            };
            let mut taken = 0;
            for item in iter {
                let (k, v) = item.map_err(io_err)?;
                if after.is_some_and(|a| k.value() == a.0.as_slice()) {
                    continue;
                }
                let t: Task = decode(v.value())?;
                if t.tenant == tenant && filter.matches(&t) {
                    out.push(t);
                    taken += 1;
                    if taken > limit {
                        break;
                    }
                }
            }
        }
        out.sort_by_key(|t| t.id);
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// For the leader's dependency resolver: every (waiting task, dependency) whose dependency has ended (or is
    /// gone), with the dependency's outcome, at most `limit`.
    pub fn dependency_resolutions(&self, limit: usize) -> io::Result<Vec<queue::DependencyResolved>> {
        let waiting: Vec<(TaskId, Vec<TaskId>)> = {
            let g = self.read();
            g.cores.iter().flat_map(|c| c.waiters().iter().map(|(d, w)| (*d, w.iter().copied().collect()))).collect()
        };
        let mut out = Vec::new();
        for (dep, tasks) in waiting {
            let outcome = match self.get_task(&dep)? {
                Some(t) if t.state.is_terminal() => Some(t.state),
                Some(_) => continue,
                None => None,
            };
            for task_id in tasks {
                out.push(queue::DependencyResolved { task_id, dependency: dep, outcome });
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// When the earliest pending webhook delivery is due, and how many are pending.
    pub fn webhook_backlog(&self) -> (Option<TimeMs>, usize) {
        let g = self.read();
        let next = g.cores.iter().filter_map(|c| c.next_delivery_at()).min();
        (next, g.cores.iter().map(|c| c.pending_deliveries()).sum())
    }

    pub fn next_due(&self) -> Option<TimeMs> {
        self.read().cores.iter().filter_map(|c| c.next_due()).min()
    }

    pub fn now(&self) -> TimeMs {
        self.read().now()
    }

    /// A digest of the applied state: (applied index, order-independent hash of every record, task count).
    /// Taken between two applies, so all shards are at the same point.
    pub fn digest(&self) -> io::Result<(u64, u64, u64)> {
        let g = self.read();
        let applied = g.applied().0.map(|l| l.index).unwrap_or(0);
        let mut digest: u64 = 0;
        let mut tasks = 0u64;
        let mut add = |kind: u8, k: &[u8], v: &[u8]| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ kind as u64;
            for b in k.iter().chain([0xffu8].iter()).chain(v.iter()) {
                h ^= *b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            digest = digest.wrapping_add(h);
        };
        for (i, db) in g.dbs.iter().enumerate() {
            let txn = db.begin_read().map_err(io_err)?;
            for item in txn.open_table(TASKS).map_err(io_err)?.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                add(1, k.value(), v.value());
                tasks += 1;
            }
            for item in txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                add(2, k.value(), v.value());
            }
            for item in txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                add(3, k.value(), v.value());
            }
            for item in txn.open_table(SHARD_RECORDS).map_err(io_err)?.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                // A record every shard holds counts once, so replicas with other shard counts agree.
                if i == 0 || queue::RecordKey::shard_of(k.value(), g.count()).is_some() {
                    add(4, k.value(), v.value());
                }
            }
        }
        Ok((applied, digest ^ g.now(), tasks))
    }

    /// Checks every shard's indexes against its records: a task is in exactly one index for its state.
    pub fn check_indexes(&self) -> io::Result<()> {
        let g = self.read();
        for (i, (db, core)) in g.dbs.iter().zip(&g.cores).enumerate() {
            let fresh = shard::load_core(db, i, g.count(), core.now)?;
            if fresh.index_sizes() != core.index_sizes() {
                return Err(io::Error::other(format!(
                    "shard {i}: live indexes {:?} differ from records {:?}",
                    core.index_sizes(),
                    fresh.index_sizes()
                )));
            }
            let txn = db.begin_read().map_err(io_err)?;
            let n = txn.open_table(TASKS).map_err(io_err)?.len().map_err(io_err)? as usize;
            let s = core.index_sizes();
            if s.ready + s.delayed + s.leases + s.retention + s.dead + s.held != n {
                return Err(io::Error::other(format!("shard {i}: {n} records but indexes {s:?}")));
            }
            let w = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?.len().map_err(io_err)? as usize;
            if s.webhooks != w {
                return Err(io::Error::other(format!("shard {i}: {w} webhook deliveries but index {s:?}")));
            }
        }
        Ok(())
    }
}

/// The openraft state machine: a handle on `SmShared` plus where snapshots live.
pub struct StateMachine {
    pub shared: Arc<SmShared>,
    dir: PathBuf,
}

fn sm_dir(dir: &Path) -> PathBuf {
    dir.join("sm")
}
fn snap_dir(dir: &Path) -> PathBuf {
    dir.join("snapshots")
}

fn sync_dir(path: &Path) -> io::Result<()> {
    fs::File::open(path)?.sync_all()
}

/// Finishes or discards a snapshot install interrupted by a crash.
fn recover_install(dir: &Path) -> io::Result<()> {
    let new = dir.join("sm.new");
    let old = dir.join("sm.old");
    if new.exists() {
        if new.join("COMPLETE").exists() {
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

fn shard_path(sm: &Path, i: usize) -> PathBuf {
    sm.join(format!("shard-{i}.redb"))
}

/// Opens the shard files in `sm`, creating `shards` of them if there are none. An existing directory keeps the
/// shard count it was created with.
fn open_shards(sm: &Path, shards: usize) -> io::Result<Shards> {
    fs::create_dir_all(sm)?;
    let count_file = sm.join("SHARDS");
    let count = match fs::read_to_string(&count_file) {
        Ok(s) => s.trim().parse::<usize>().map_err(io_err)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::write(&count_file, shards.to_string())?;
            fs::File::open(&count_file)?.sync_all()?;
            sync_dir(sm)?;
            shards
        }
        Err(e) => return Err(e),
    };
    if count != shards {
        tracing::warn!(configured = shards, stored = count, "data directory keeps its shard count");
    }
    let mut out = Shards { dbs: vec![], cores: vec![], metas: vec![], last_sync: Instant::now() };
    for i in 0..count {
        let db = shard::open_db(&shard_path(sm, i))?;
        let meta = shard::read_meta(&db)?;
        out.cores.push(shard::load_core(&db, i, count, meta.now)?);
        out.metas.push(meta);
        out.dbs.push(Arc::new(db));
    }
    Ok(out)
}

impl StateMachine {
    /// Opens the state machine in `dir` (the node's data directory), finishing an interrupted snapshot install.
    pub fn open(dir: &Path, shards: usize) -> io::Result<StateMachine> {
        fs::create_dir_all(dir)?;
        recover_install(dir)?;
        fs::create_dir_all(snap_dir(dir))?;
        let set = open_shards(&sm_dir(dir), shards.max(1))?;
        let applied = set.applied().0.map(|l| l.index).unwrap_or(0);
        let shared = Arc::new(SmShared {
            shards: RwLock::new(set),
            ended: broadcast::channel(4096).0,
            work: watch::channel(0).0,
            applied: watch::channel(applied).0,
            webhooks: watch::channel(0).0,
            metrics: Arc::default(),
        });
        Ok(StateMachine { shared, dir: dir.to_path_buf() })
    }

    fn apply_batch(shared: &SmShared, entries: &[Entry]) -> io::Result<(Vec<Response>, Effects)> {
        let mut g = shared.shards.write().unwrap_or_else(|p| p.into_inner());
        let g = &mut *g;
        let durable = g.last_sync.elapsed() >= SHARD_SYNC_INTERVAL;
        let mut txns = Vec::with_capacity(g.dbs.len());
        for db in &g.dbs {
            let mut txn = db.begin_write().map_err(io_err)?;
            if !durable {
                txn.set_durability(Durability::None).map_err(io_err)?;
            }
            txns.push(txn);
        }
        let mut fx = Effects::default();
        let mut responses = Vec::with_capacity(entries.len());
        {
            let mut stores = Vec::with_capacity(txns.len());
            for txn in &txns {
                stores.push(RedbTaskStore {
                    tasks: txn.open_table(TASKS).map_err(io_err)?,
                    keys: txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?,
                    outbox: txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?,
                    records: txn.open_table(SHARD_RECORDS).map_err(io_err)?,
                });
            }
            for entry in entries {
                let log_id = entry.log_id;
                let idx = log_id.index;
                let behind: Vec<bool> =
                    g.metas.iter().map(|m| m.last_applied.as_ref().is_none_or(|l| l.index < idx)).collect();
                let resp = match &entry.payload {
                    EntryPayload::Blank => Response::None,
                    EntryPayload::Membership(mem) => {
                        for (m, _) in g.metas.iter_mut().zip(&behind).filter(|(_, b)| **b) {
                            m.membership = StoredMembership::new(Some(log_id), mem.clone());
                        }
                        Response::None
                    }
                    EntryPayload::Normal(req) => {
                        let mut out = PartialResponse::for_command(&req.command);
                        for i in 0..g.cores.len() {
                            if behind[i] {
                                g.cores[i].apply(&mut stores[i], idx, req, &mut out, &mut fx)?;
                                g.metas[i].now = g.cores[i].now;
                            }
                        }
                        out.finish()
                    }
                };
                for (m, _) in g.metas.iter_mut().zip(&behind).filter(|(_, b)| **b) {
                    m.last_applied = Some(log_id);
                }
                responses.push(resp);
            }
        }
        for (txn, meta) in txns.into_iter().zip(&g.metas) {
            {
                let mut t = txn.open_table(SHARD_META).map_err(io_err)?;
                shard::write_meta(&mut t, meta)?;
            }
            txn.commit().map_err(io_err)?;
        }
        if durable {
            g.last_sync = Instant::now();
        }
        Ok((responses, fx))
    }

    fn record(&self, fx: &Effects) {
        use crate::telemetry::TaskEvent::*;
        let m = &self.shared.metrics;
        let c = &fx.counts;
        for (e, n) in [
            (Enqueued, c.enqueued),
            (Claimed, c.claimed),
            (Completed, c.completed),
            (Failed, c.failed),
            (Cancelled, c.cancelled),
            (Retried, c.retried),
            (DeadLettered, c.dead_lettered),
            (LeaseExpired, c.lease_expired),
        ] {
            if n > 0 {
                m.count(e, n);
            }
        }
        for (h, v) in [
            (&m.enqueue_to_claim, &fx.enqueue_to_claim_ms),
            (&m.claim_to_end, &fx.claim_to_end_ms),
            (&m.enqueue_to_end, &fx.enqueue_to_end_ms),
        ] {
            for ms in v {
                h.observe_us(ms.saturating_mul(1000));
            }
        }
    }

    /// Syncs every shard file: after this, the shards' `last_applied` survives a crash.
    fn sync_all(g: &mut Shards) -> io::Result<()> {
        for db in &g.dbs {
            db.begin_write().map_err(io_err)?.commit().map_err(io_err)?;
        }
        g.last_sync = Instant::now();
        Ok(())
    }

    fn current_meta_path(&self) -> PathBuf {
        snap_dir(&self.dir).join("current.meta")
    }
}

#[derive(Serialize, Deserialize)]
struct SnapHeader {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    now: TimeMs,
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

/// Builds a snapshot file from read transactions taken at one applied point.
pub struct SnapshotBuilder {
    txns: Vec<ReadTransaction>,
    header: SnapHeader,
    dir: PathBuf,
}

impl SnapshotBuilder {
    fn write(self) -> io::Result<(SnapshotMeta, PathBuf)> {
        let last = self.header.last_applied;
        let id = match &last {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, rand::random::<u32>()),
            None => format!("empty-{}", rand::random::<u32>()),
        };
        let id = id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
        let path = snap_dir(&self.dir).join(format!("{id}.snap"));
        let tmp = path.with_extension("tmp");
        let mut w = Hashing::new(BufWriter::new(fs::File::create(&tmp)?));
        w.write_all(SNAPSHOT_MAGIC)?;
        write_frame(&mut w, FRAME_HEADER, &encode(&self.header)?)?;
        let mut records: u64 = 0;
        for txn in &self.txns {
            let tasks = txn.open_table(TASKS).map_err(io_err)?;
            for item in tasks.iter().map_err(io_err)? {
                let (_, v) = item.map_err(io_err)?;
                write_frame(&mut w, FRAME_TASK, v.value())?;
                records += 1;
            }
            let keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
            for item in keys.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                write_frame(&mut w, FRAME_KEY, &encode(&(k.value(), v.value()))?)?;
                records += 1;
            }
            let outbox = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
            for item in outbox.iter().map_err(io_err)? {
                let (_, v) = item.map_err(io_err)?;
                write_frame(&mut w, FRAME_WEBHOOK, v.value())?;
                records += 1;
            }
            let recs = txn.open_table(SHARD_RECORDS).map_err(io_err)?;
            for item in recs.iter().map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                write_frame(&mut w, FRAME_RECORD, &encode(&(k.value(), v.value()))?)?;
                records += 1;
            }
        }
        write_frame(&mut w, FRAME_END, &records.to_be_bytes())?;
        let digest = w.digest();
        let mut w = w.inner;
        w.write_all(&digest)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        let meta = SnapshotMeta { last_log_id: last, last_membership: self.header.membership.clone() };
        publish_current(&self.dir, &meta, &path)?;
        Ok((meta, path))
    }
}

/// Makes `path` the current snapshot and removes older snapshot files.
fn publish_current(dir: &Path, meta: &SnapshotMeta, path: &Path) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let cur = CurrentSnapshot { meta: meta.clone(), file: name.clone() };
    let meta_path = snap_dir(dir).join("current.meta");
    let tmp = meta_path.with_extension("tmp");
    fs::write(&tmp, encode(&cur)?)?;
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
            txns: std::mem::take(&mut self.txns),
            header: SnapHeader {
                last_applied: self.header.last_applied,
                membership: self.header.membership.clone(),
                now: self.header.now,
            },
            dir: self.dir.clone(),
        };
        let (meta, path) = tokio::task::spawn_blocking(move || me.write()).await.map_err(io_err)??;
        let file = tokio::fs::File::open(&path).await?;
        Ok(Snapshot { meta, snapshot: file })
    }
}

fn install_blocking(shared: &SmShared, dir: &Path, meta: &SnapshotMeta, mut file: fs::File) -> io::Result<()> {
    use std::io::Seek;
    file.seek(io::SeekFrom::Start(0))?;
    let shards = shared.read().count();
    let new = dir.join("sm.new");
    if new.exists() {
        fs::remove_dir_all(&new)?;
    }
    fs::create_dir_all(&new)?;
    fs::write(new.join("SHARDS"), shards.to_string())?;
    // Keep a copy as our current snapshot, so followers of this node can be sent it later.
    let keep = snap_dir(dir).join(format!("installed-{}.snap", rand::random::<u64>()));
    {
        let mut out = fs::File::create(&keep)?;
        io::copy(&mut file, &mut out)?;
        out.sync_all()?;
    }
    let mut r = Hashing::new(BufReader::new(fs::File::open(&keep)?));
    let mut magic = vec![0u8; SNAPSHOT_MAGIC.len()];
    r.read_exact(&mut magic)?;
    if magic != SNAPSHOT_MAGIC && magic != SNAPSHOT_MAGIC_V1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a raftq snapshot"));
    }
    let checked = magic == SNAPSHOT_MAGIC;
    let (kind, head) = read_frame(&mut r)?;
    if kind != FRAME_HEADER {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot without header"));
    }
    let header: SnapHeader = decode(&head)?;
    let dbs: Vec<Database> = (0..shards).map(|i| shard::open_db(&shard_path(&new, i))).collect::<io::Result<_>>()?;
    let txns: Vec<redb::WriteTransaction> =
        dbs.iter().map(|d| d.begin_write().map_err(io_err)).collect::<io::Result<_>>()?;
    {
        let mut tasks: Vec<_> = txns.iter().map(|t| t.open_table(TASKS).map_err(io_err)).collect::<io::Result<_>>()?;
        let mut keys: Vec<_> =
            txns.iter().map(|t| t.open_table(IDEMPOTENCY_KEYS).map_err(io_err)).collect::<io::Result<_>>()?;
        let mut outboxes: Vec<_> =
            txns.iter().map(|t| t.open_table(WEBHOOK_OUTBOX).map_err(io_err)).collect::<io::Result<_>>()?;
        let mut recs: Vec<_> =
            txns.iter().map(|t| t.open_table(SHARD_RECORDS).map_err(io_err)).collect::<io::Result<_>>()?;
        let mut records = 0u64;
        loop {
            let (kind, body) = read_frame(&mut r)?;
            match kind {
                FRAME_TASK => {
                    let t: Task = decode(&body)?;
                    tasks[t.id.shard(shards)].insert(t.id.0.as_slice(), body.as_slice()).map_err(io_err)?;
                }
                FRAME_KEY => {
                    let (k, v): (Vec<u8>, Vec<u8>) = decode(&body)?;
                    let rec: queue::KeyRecord = decode(&v)?;
                    keys[rec.task_id.shard(shards)].insert(k.as_slice(), v.as_slice()).map_err(io_err)?;
                }
                FRAME_WEBHOOK => {
                    let d: WebhookDelivery = decode(&body)?;
                    let shard = d.id.task_id.shard(shards);
                    outboxes[shard].insert(d.id.to_bytes().as_slice(), body.as_slice()).map_err(io_err)?;
                }
                FRAME_RECORD => {
                    let (k, v): (Vec<u8>, Vec<u8>) = decode(&body)?;
                    match queue::RecordKey::shard_of(&k, shards) {
                        Some(i) => {
                            recs[i].insert(k.as_slice(), v.as_slice()).map_err(io_err)?;
                        }
                        None => {
                            for r in recs.iter_mut() {
                                r.insert(k.as_slice(), v.as_slice()).map_err(io_err)?;
                            }
                        }
                    }
                }
                FRAME_END => {
                    let want = u64::from_be_bytes(body.as_slice().try_into().map_err(io_err)?);
                    if want != records {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot record count mismatch"));
                    }
                    if checked {
                        // Nothing is committed before the whole file checks out: a damaged snapshot is refused
                        // and the installed state stays as it was.
                        let got = r.digest();
                        let mut digest = [0u8; 32];
                        r.inner.read_exact(&mut digest)?;
                        if digest != got {
                            return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot checksum mismatch"));
                        }
                    }
                    break;
                }
                _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown snapshot frame")),
            }
            records += 1;
        }
    }
    let sm_meta =
        ShardMeta { last_applied: meta.last_log_id, membership: meta.last_membership.clone(), now: header.now };
    for txn in txns {
        {
            let mut t = txn.open_table(SHARD_META).map_err(io_err)?;
            shard::write_meta(&mut t, &sm_meta)?;
        }
        txn.commit().map_err(io_err)?;
    }
    drop(dbs);
    fs::File::create(new.join("COMPLETE"))?.sync_all()?;
    sync_dir(&new)?;
    sync_dir(dir)?;

    let mut g = shared.shards.write().unwrap_or_else(|p| p.into_inner());
    g.dbs.clear();
    recover_install(dir)?;
    *g = open_shards(&sm_dir(dir), shards)?;
    drop(g);
    publish_current(dir, meta, &keep)?;
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = tokio::fs::File;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok(self.shared.read().applied())
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            batch.push(entry);
            responders.push(responder);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let last = batch.last().map(|e| e.log_id.index).unwrap_or(0);
        let shared = self.shared.clone();
        let (responses, fx) =
            tokio::task::spawn_blocking(move || Self::apply_batch(&shared, &batch)).await.map_err(io_err)??;
        for (responder, resp) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(resp);
            }
        }
        self.record(&fx);
        for id in fx.ended {
            let _ = self.shared.ended.send(id);
        }
        if !fx.ready.is_empty() {
            self.shared.work.send_modify(|v| *v += 1);
        }
        if fx.webhooks_added > 0 {
            self.shared.webhooks.send_modify(|v| *v += 1);
        }
        self.shared.applied.send_replace(last);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let shared = self.shared.clone();
        let dir = self.dir.clone();
        self.shared.metrics.snapshots_built.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let built = tokio::task::spawn_blocking(move || -> io::Result<SnapshotBuilder> {
            let mut g = shared.shards.write().unwrap_or_else(|p| p.into_inner());
            Self::sync_all(&mut g)?;
            let txns = g.dbs.iter().map(|d| d.begin_read().map_err(io_err)).collect::<io::Result<Vec<_>>>()?;
            let (last_applied, membership) = g.applied();
            Ok(SnapshotBuilder { txns, header: SnapHeader { last_applied, membership, now: g.now() }, dir })
        })
        .await;
        match built {
            Ok(Ok(b)) => b,
            // The trait gives no way to fail here: hand out a builder whose build fails, which openraft reports.
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot start a snapshot");
                SnapshotBuilder {
                    txns: vec![],
                    header: SnapHeader { last_applied: None, membership: Default::default(), now: 0 },
                    dir: PathBuf::from("/nonexistent/raftq-snapshot-failed"),
                }
            }
            Err(e) => panic!("snapshot preparation panicked: {e}"),
        }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: tokio::fs::File) -> Result<(), io::Error> {
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

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let bytes = match fs::read(self.current_meta_path()) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let cur: CurrentSnapshot = decode(&bytes)?;
        let file = tokio::fs::File::open(snap_dir(&self.dir).join(&cur.file)).await?;
        Ok(Some(Snapshot { meta: cur.meta, snapshot: file }))
    }
}
