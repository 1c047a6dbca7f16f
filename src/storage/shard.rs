//! One shard store: a redb file holding the records of the tasks whose placement maps to it, its idempotency
//! keys, webhook outbox and shard records, and its meta (`last_applied`). Apply changes the records in memory
//! (`Layer`, read through `CachedStore`); the flusher writes each layer with the meta it reached in one
//! transaction, so a file always holds a state some `last_applied` produced.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, Table};

use super::codec::io_err;
use super::format::{self, decode, encode, encode_into};
use super::tables::*;
use crate::queue::{
    DeliveryId, IdMap, KeyLimit, KeyRecord, Limits, QueueKey, RateBucket, Schedule, ShardCore, Task, TaskId, TaskStore,
    TimeMs, WebhookDelivery,
};
use crate::raft::types::{LogId, StoredMembership};

/// The durable part of a shard's metadata.
#[derive(Debug, Clone, Default)]
pub struct ShardMeta {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub now: TimeMs,
}

/// redb's page cache for each shard file of a running node (redb's default is 1 GiB per file). Apply reads the
/// records it changed lately from the layers, not the file, and the cache fills with the pages each flush writes,
/// which a full cycle never reads again; a deep backlog's claims read records written long before, which a cache
/// in LRU order has mostly dropped by then. At 64 MiB a node under `cycle-3` grew ~250 MB more, and each fresh page
/// costs the kernel's zeroing, so it was cut to 16 MiB; but redb holds a commit's dirty pages in a write buffer of
/// at most half the cache, and a deep backlog's flush (each completion rewrites an old record in the middle of the
/// tree) outgrew 8 MiB, so redb spilled pages and read some back at commit. At 32 MiB `backlog-1` was ahead in
/// five of six alternating pairs (median +6 %), `cycle-1` in three of three and `cycle-3` unchanged; 64 MiB bought
/// `backlog-1` no more (docs/performance.md, "A deep backlog's flush fits redb's write buffer").
pub const PAGE_CACHE_BYTES: usize = 32 << 20;

/// Opens (or creates) a shard file, upgrading one of an older format (`format`); one of a newer format is
/// refused before anything is written to it.
pub fn open_db(path: &Path) -> io::Result<Database> {
    open_db_cached(path, None)
}

/// [`open_db`] with a bounded page cache (`codec::open_db_cached`).
pub fn open_db_cached(path: &Path, cache_bytes: Option<usize>) -> io::Result<Database> {
    format::refuse_newer_file(path, SHARD_META)?;
    let db = super::codec::open_db_cached(path, cache_bytes)?;
    let found = format::file_version(&db, SHARD_META, path)?;
    // A current file has its tables (made with its marker) and is not written at open.
    if found != Some(format::CURRENT) {
        let txn = db.begin_write().map_err(io_err)?;
        txn.open_table(TASKS).map_err(io_err)?;
        txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
        txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
        txn.open_table(SHARD_META).map_err(io_err)?;
        txn.open_table(SHARD_RECORDS).map_err(io_err)?;
        format::upgrade_shard_file(&txn, found)?;
        txn.commit().map_err(io_err)?;
    }
    Ok(db)
}

/// The largest task id in a shard file's tasks table (keys are the ids' bytes, which order as the ids do).
pub fn newest_task_id(db: &Database) -> io::Result<Option<TaskId>> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(TASKS).map_err(io_err)?;
    let Some((k, _)) = t.last().map_err(io_err)? else { return Ok(None) };
    let bytes: [u8; 16] =
        k.value().try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a task key is not 16 bytes"))?;
    Ok(Some(TaskId(bytes)))
}

pub fn read_meta(db: &Database) -> io::Result<ShardMeta> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(SHARD_META).map_err(io_err)?;
    let mut m = ShardMeta::default();
    if let Some(v) = t.get(META_LAST_APPLIED).map_err(io_err)? {
        m.last_applied = decode(v.value(), "last applied log id")?;
    }
    if let Some(v) = t.get(META_MEMBERSHIP).map_err(io_err)? {
        m.membership = decode(v.value(), "membership")?;
    }
    if let Some(v) = t.get(META_NOW).map_err(io_err)? {
        m.now = decode(v.value(), "state machine time")?;
    }
    Ok(m)
}

pub fn write_meta(t: &mut Table<&str, &[u8]>, m: &ShardMeta) -> io::Result<()> {
    t.insert(META_LAST_APPLIED, encode(&m.last_applied)?.as_slice()).map_err(io_err)?;
    t.insert(META_MEMBERSHIP, encode(&m.membership)?.as_slice()).map_err(io_err)?;
    t.insert(META_NOW, encode(&m.now)?.as_slice()).map_err(io_err)?;
    Ok(())
}

/// Rebuilds a shard's in-memory indexes from its records.
pub fn load_core(db: &Database, shard_no: usize, shards: usize, now: TimeMs) -> io::Result<ShardCore> {
    let mut core = ShardCore::new(shard_no, shards);
    core.now = now;
    let txn = db.begin_read().map_err(io_err)?;
    // Records first: they shape the indexes of tasks (a paused queue).
    let records = txn.open_table(SHARD_RECORDS).map_err(io_err)?;
    for item in records.iter().map_err(io_err)? {
        let (k, v) = item.map_err(io_err)?;
        if let Some(qk) = RecordKey::parse_paused(k.value()) {
            decode::<()>(v.value(), "paused queue record")?;
            core.index_paused(qk);
        }
        if let Some(qk) = RecordKey::parse_limits(k.value()) {
            core.index_limits(qk, decode(v.value(), "limits record")?);
        }
        if let Some((qk, key)) = RecordKey::parse_weight(k.value()) {
            core.index_weight(qk, &key, decode(v.value(), "fairness weight record")?);
        }
        if let Some((qk, key)) = RecordKey::parse_rate(k.value()) {
            core.index_rate(qk, key.as_deref(), decode(v.value(), "rate bucket record")?);
        }
        if let Some((tenant, key)) = RecordKey::parse_key_limit(k.value()) {
            core.index_key_limit(&tenant, &key, decode(v.value(), "key limit record")?);
        }
        if RecordKey::is_schedule(k.value()) {
            core.index_schedule(decode(v.value(), "schedule record")?);
        }
        if k.value() == RecordKey::CLUSTER_VERSION {
            core.index_cluster_version(decode(v.value(), "cluster version record")?);
        }
    }
    let tasks = txn.open_table(TASKS).map_err(io_err)?;
    for item in tasks.iter().map_err(io_err)? {
        let (_, v) = item.map_err(io_err)?;
        let t: Task = decode(v.value(), "task record")?;
        core.index_task(&t);
    }
    let keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
    for item in keys.iter().map_err(io_err)? {
        let (k, v) = item.map_err(io_err)?;
        let rec: KeyRecord = decode(v.value(), "idempotency key record")?;
        let (tenant, key) = parse_idempotency_key(k.value());
        core.index_key(&tenant, &key, &rec);
    }
    let outbox = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
    for item in outbox.iter().map_err(io_err)? {
        let (_, v) = item.map_err(io_err)?;
        core.index_delivery(&decode(v.value(), "webhook delivery record")?);
    }
    Ok(core)
}

pub fn get_delivery(db: &Database, id: &DeliveryId) -> io::Result<Option<WebhookDelivery>> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
    match t.get(outbox_key(id).as_slice()).map_err(io_err)? {
        Some(v) => Ok(Some(decode(v.value(), "webhook delivery record")?)),
        None => Ok(None),
    }
}

pub fn get_task(db: &Database, id: &TaskId) -> io::Result<Option<Task>> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(TASKS).map_err(io_err)?;
    match t.get(task_key(id)).map_err(io_err)? {
        Some(v) => Ok(Some(decode(v.value(), "task record")?)),
        None => Ok(None),
    }
}

/// Changes applied in memory and not yet written to the shard's file (`None`: removed). Apply writes into the
/// shard's newest layer; the flusher (`flush.rs`) writes a layer into the file in one transaction.
#[derive(Default)]
pub struct Layer {
    /// Hashed, not ordered: apply looks a task up here at every claim and ack; the flush sorts it once.
    pub tasks: IdMap<Option<std::sync::Arc<Task>>>,
    pub keys: HashMap<Vec<u8>, Option<KeyRecord>>,
    pub outbox: HashMap<DeliveryId, Option<WebhookDelivery>>,
    /// `shard_records` rows by key (schedules, paused queues, weights), encoded.
    pub records: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Layer {
    /// Changed records in the layer.
    pub fn len(&self) -> usize {
        self.tasks.len() + self.keys.len() + self.outbox.len() + self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the layer into the tables of a write transaction.
    pub fn write_to(&self, txn: &redb::WriteTransaction) -> io::Result<()> {
        let mut tasks = txn.open_table(TASKS).map_err(io_err)?;
        let mut buf = Vec::new();
        // In id order: redb's inserts then go along its tree instead of jumping about it.
        let mut sorted: Vec<_> = self.tasks.iter().collect();
        sorted.sort_unstable_by_key(|(id, _)| **id);
        for (id, t) in sorted {
            match t {
                Some(t) => {
                    buf.clear();
                    encode_into(&mut buf, t.as_ref())?;
                    tasks.insert(task_key(id), buf.as_slice()).map_err(io_err)?;
                }
                None => {
                    tasks.remove(task_key(id)).map_err(io_err)?;
                }
            }
        }
        let mut keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
        for (k, rec) in &self.keys {
            match rec {
                Some(rec) => keys.insert(k.as_slice(), encode(rec)?.as_slice()).map_err(io_err)?,
                None => keys.remove(k.as_slice()).map_err(io_err)?,
            };
        }
        let mut outbox = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
        for (id, d) in &self.outbox {
            match d {
                Some(d) => outbox.insert(outbox_key(id).as_slice(), encode(d)?.as_slice()).map_err(io_err)?,
                None => outbox.remove(outbox_key(id).as_slice()).map_err(io_err)?,
            };
        }
        let mut records = txn.open_table(SHARD_RECORDS).map_err(io_err)?;
        for (k, v) in &self.records {
            match v {
                Some(v) => records.insert(k.as_slice(), v.as_slice()).map_err(io_err)?,
                None => records.remove(k.as_slice()).map_err(io_err)?,
            };
        }
        Ok(())
    }
}

/// Looks a record up in the newest layer, then in the frozen layers from the newest to the oldest: the first hit
/// is its latest unflushed state (a removal included); none means the file holds its state.
pub fn in_layers<'a, V>(
    dirty: &'a Layer,
    frozen: &'a [Arc<Layer>],
    f: impl Fn(&'a Layer) -> Option<&'a V>,
) -> Option<&'a V> {
    f(dirty).or_else(|| frozen.iter().rev().find_map(|l| f(l)))
}

/// A shard's unflushed changes as they would be stored: per table, each changed key's latest value (`None`: removed),
/// in key order. A snapshot overlays it on read transactions of the files taken at the same applied point.
#[derive(Default)]
pub struct Overlay {
    pub tasks: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pub keys: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pub outbox: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pub records: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Overlay {
    /// The changes of `layers`, oldest first (a later layer's value of a key replaces an earlier one's).
    pub fn of(layers: &[Arc<Layer>]) -> io::Result<Overlay> {
        let mut o = Overlay::default();
        for l in layers {
            for (id, t) in &l.tasks {
                let v = t.as_deref().map(encode).transpose()?;
                o.tasks.insert(task_key(id).to_vec(), v);
            }
            for (k, rec) in &l.keys {
                o.keys.insert(k.clone(), rec.as_ref().map(encode).transpose()?);
            }
            for (id, d) in &l.outbox {
                o.outbox.insert(outbox_key(id).to_vec(), d.as_ref().map(encode).transpose()?);
            }
            for (k, v) in &l.records {
                o.records.insert(k.clone(), v.clone());
            }
        }
        Ok(o)
    }
}

/// Read tables of one shard file, opened on a `CachedStore`'s first miss.
struct ReadTables {
    tasks: ReadOnlyTable<&'static [u8], &'static [u8]>,
    keys: ReadOnlyTable<&'static [u8], &'static [u8]>,
    outbox: ReadOnlyTable<&'static [u8], &'static [u8]>,
}

/// `TaskStore` for apply: writes go into the shard's newest layer; reads look there, then in the layer being
/// flushed, then in the file (whose state is older than both layers).
///
/// `newest` bounds the ids the shard can hold (the file's largest when it was opened, raised by every task stored
/// since): a read of a larger id, which is what most enqueues' check for a taken id is (ids begin with the
/// leader's clock), is answered without looking in the layers or the file. `file_newest` bounds the ids in the
/// file (`newest` when the flusher last took the layer): a miss in the layers above it is answered without the
/// file. Ids stamped in the same millisecond are ordered by their placement and random bytes, so about half of
/// a busy shard's fresh ids fall below `newest`; they are all above `file_newest`, up to a flush interval old.
pub struct CachedStore<'a> {
    dirty: &'a mut Layer,
    frozen: &'a [Arc<Layer>],
    db: &'a Database,
    newest: &'a mut Option<TaskId>,
    file_newest: Option<TaskId>,
    read: Option<ReadTables>,
}

impl<'a> CachedStore<'a> {
    pub fn new(
        dirty: &'a mut Layer,
        frozen: &'a [Arc<Layer>],
        db: &'a Database,
        newest: &'a mut Option<TaskId>,
        file_newest: Option<TaskId>,
    ) -> Self {
        CachedStore { dirty, frozen, db, newest, file_newest, read: None }
    }

    fn file(&mut self) -> io::Result<&ReadTables> {
        if self.read.is_none() {
            let txn = self.db.begin_read().map_err(io_err)?;
            self.read = Some(ReadTables {
                tasks: txn.open_table(TASKS).map_err(io_err)?,
                keys: txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?,
                outbox: txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?,
            });
        }
        Ok(self.read.as_ref().expect("opened above"))
    }
}

impl TaskStore for CachedStore<'_> {
    type Error = io::Error;

    fn get(&mut self, id: &TaskId) -> io::Result<Option<std::sync::Arc<Task>>> {
        if Some(*id) > *self.newest {
            return Ok(None);
        }
        // A hit in a layer is the answer, a removal included.
        if let Some(v) = in_layers(self.dirty, self.frozen, |l| l.tasks.get(id)) {
            return Ok(v.clone());
        }
        if Some(*id) > self.file_newest {
            return Ok(None);
        }
        match self.file()?.tasks.get(task_key(id)).map_err(io_err)? {
            Some(v) => Ok(Some(std::sync::Arc::new(decode(v.value(), "task record")?))),
            None => Ok(None),
        }
    }

    fn put(&mut self, task: std::sync::Arc<Task>) -> io::Result<()> {
        *self.newest = (*self.newest).max(Some(task.id));
        self.dirty.tasks.insert(task.id, Some(task));
        Ok(())
    }

    fn remove(&mut self, id: &TaskId) -> io::Result<()> {
        self.dirty.tasks.insert(*id, None);
        Ok(())
    }

    fn release(&mut self, id: &TaskId) -> io::Result<()> {
        // Read as removed until the put: a frozen layer, or the file, may hold an older state.
        if let Some(slot) = self.dirty.tasks.get_mut(id) {
            *slot = None;
        }
        Ok(())
    }

    fn get_key(&mut self, tenant: &str, key: &str) -> io::Result<Option<KeyRecord>> {
        let k = idempotency_key(tenant, key);
        if let Some(v) = in_layers(self.dirty, self.frozen, |l| l.keys.get(&k)) {
            return Ok(*v);
        }
        match self.file()?.keys.get(k.as_slice()).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value(), "idempotency key record")?)),
            None => Ok(None),
        }
    }

    fn put_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) -> io::Result<()> {
        self.dirty.keys.insert(idempotency_key(tenant, key), Some(*rec));
        Ok(())
    }

    fn remove_key(&mut self, tenant: &str, key: &str) -> io::Result<()> {
        self.dirty.keys.insert(idempotency_key(tenant, key), None);
        Ok(())
    }

    fn get_delivery(&mut self, id: &DeliveryId) -> io::Result<Option<WebhookDelivery>> {
        if let Some(v) = in_layers(self.dirty, self.frozen, |l| l.outbox.get(id)) {
            return Ok(v.clone());
        }
        match self.file()?.outbox.get(outbox_key(id).as_slice()).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value(), "webhook delivery record")?)),
            None => Ok(None),
        }
    }

    fn put_delivery(&mut self, d: &WebhookDelivery) -> io::Result<()> {
        self.dirty.outbox.insert(d.id, Some(d.clone()));
        Ok(())
    }

    fn remove_delivery(&mut self, id: &DeliveryId) -> io::Result<()> {
        self.dirty.outbox.insert(*id, None);
        Ok(())
    }

    fn put_schedule(&mut self, s: &Schedule) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::schedule(&s.id), Some(encode(s)?));
        Ok(())
    }

    fn remove_schedule(&mut self, id: &TaskId) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::schedule(id), None);
        Ok(())
    }

    fn put_paused(&mut self, qk: &QueueKey) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::paused(qk), Some(encode(&())?));
        Ok(())
    }

    fn remove_paused(&mut self, qk: &QueueKey) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::paused(qk), None);
        Ok(())
    }

    fn put_limits(&mut self, qk: &QueueKey, limits: &Limits) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::limits(qk), Some(encode(limits)?));
        Ok(())
    }

    fn remove_limits(&mut self, qk: &QueueKey) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::limits(qk), None);
        Ok(())
    }

    fn put_weight(&mut self, qk: &QueueKey, key: &str, weight: u32) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::weight(qk, key), Some(encode(&weight)?));
        Ok(())
    }

    fn remove_weight(&mut self, qk: &QueueKey, key: &str) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::weight(qk, key), None);
        Ok(())
    }

    fn put_rate(&mut self, qk: &QueueKey, key: Option<&str>, bucket: &RateBucket) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::rate(qk, key), Some(encode(bucket)?));
        Ok(())
    }

    fn remove_rate(&mut self, qk: &QueueKey, key: Option<&str>) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::rate(qk, key), None);
        Ok(())
    }

    fn put_key_limit(&mut self, tenant: &str, key: &str, limit: &KeyLimit) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::key_limit(tenant, key), Some(encode(limit)?));
        Ok(())
    }

    fn remove_key_limit(&mut self, tenant: &str, key: &str) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::key_limit(tenant, key), None);
        Ok(())
    }

    fn put_cluster_version(&mut self, version: u32) -> io::Result<()> {
        self.dirty.records.insert(RecordKey::CLUSTER_VERSION.to_vec(), Some(encode(&version)?));
        Ok(())
    }
}
