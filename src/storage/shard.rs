//! One shard store: a redb file holding the records of the tasks whose placement maps to it, its idempotency
//! keys and its `last_applied`, written in the same transaction as the changes.

use std::io;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, Table};

use super::codec::{decode, encode, io_err, key_bytes};
use super::tables::*;
use crate::queue::{DeliveryId, KeyRecord, RecordKey, ShardCore, Task, TaskId, TaskStore, TimeMs, WebhookDelivery};
use crate::raft::types::{LogId, StoredMembership};

/// The durable part of a shard's metadata.
#[derive(Debug, Clone, Default)]
pub struct ShardMeta {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub now: TimeMs,
}

pub fn open_db(path: &Path) -> io::Result<Database> {
    let db = super::codec::open_db(path)?;
    let txn = db.begin_write().map_err(io_err)?;
    txn.open_table(TASKS).map_err(io_err)?;
    txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
    txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
    txn.open_table(SHARD_META).map_err(io_err)?;
    txn.open_table(SHARD_RECORDS).map_err(io_err)?;
    txn.commit().map_err(io_err)?;
    Ok(db)
}

pub fn read_meta(db: &Database) -> io::Result<ShardMeta> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(SHARD_META).map_err(io_err)?;
    let mut m = ShardMeta::default();
    if let Some(v) = t.get(META_LAST_APPLIED).map_err(io_err)? {
        m.last_applied = decode(v.value())?;
    }
    if let Some(v) = t.get(META_MEMBERSHIP).map_err(io_err)? {
        m.membership = decode(v.value())?;
    }
    if let Some(v) = t.get(META_NOW).map_err(io_err)? {
        m.now = decode(v.value())?;
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
            core.index_paused(qk);
        }
        if k.value().first() == Some(&RecordKey::SCHEDULE) {
            core.index_schedule(decode(v.value())?);
        }
    }
    let tasks = txn.open_table(TASKS).map_err(io_err)?;
    for item in tasks.iter().map_err(io_err)? {
        let (_, v) = item.map_err(io_err)?;
        let t: Task = decode(v.value())?;
        core.index_task(&t);
    }
    let keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(io_err)?;
    for item in keys.iter().map_err(io_err)? {
        let (k, v) = item.map_err(io_err)?;
        let rec: KeyRecord = decode(v.value())?;
        let raw = k.value();
        let split = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
        let tenant = String::from_utf8_lossy(&raw[..split]);
        let key = String::from_utf8_lossy(raw.get(split + 1..).unwrap_or_default());
        core.index_key(&tenant, &key, &rec);
    }
    let outbox = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
    for item in outbox.iter().map_err(io_err)? {
        let (_, v) = item.map_err(io_err)?;
        core.index_delivery(&decode(v.value())?);
    }
    Ok(core)
}

pub fn get_delivery(db: &Database, id: &DeliveryId) -> io::Result<Option<WebhookDelivery>> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(WEBHOOK_OUTBOX).map_err(io_err)?;
    match t.get(id.to_bytes().as_slice()).map_err(io_err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}

pub fn get_task(db: &Database, id: &TaskId) -> io::Result<Option<Task>> {
    let txn = db.begin_read().map_err(io_err)?;
    let t = txn.open_table(TASKS).map_err(io_err)?;
    match t.get(id.0.as_slice()).map_err(io_err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}

/// `TaskStore` over the tables of one open write transaction.
pub struct RedbTaskStore<'t> {
    pub tasks: Table<'t, &'static [u8], &'static [u8]>,
    pub keys: Table<'t, &'static [u8], &'static [u8]>,
    pub outbox: Table<'t, &'static [u8], &'static [u8]>,
    pub records: Table<'t, &'static [u8], &'static [u8]>,
}

impl TaskStore for RedbTaskStore<'_> {
    type Error = io::Error;

    fn get(&mut self, id: &TaskId) -> io::Result<Option<Task>> {
        match self.tasks.get(id.0.as_slice()).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn put(&mut self, task: &Task) -> io::Result<()> {
        self.tasks.insert(task.id.0.as_slice(), encode(task)?.as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn remove(&mut self, id: &TaskId) -> io::Result<()> {
        self.tasks.remove(id.0.as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn get_key(&mut self, tenant: &str, key: &str) -> io::Result<Option<KeyRecord>> {
        match self.keys.get(key_bytes(tenant, key).as_slice()).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn put_key(&mut self, tenant: &str, key: &str, rec: &KeyRecord) -> io::Result<()> {
        self.keys.insert(key_bytes(tenant, key).as_slice(), encode(rec)?.as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn remove_key(&mut self, tenant: &str, key: &str) -> io::Result<()> {
        self.keys.remove(key_bytes(tenant, key).as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn get_delivery(&mut self, id: &DeliveryId) -> io::Result<Option<WebhookDelivery>> {
        match self.outbox.get(id.to_bytes().as_slice()).map_err(io_err)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn put_delivery(&mut self, d: &WebhookDelivery) -> io::Result<()> {
        self.outbox.insert(d.id.to_bytes().as_slice(), encode(d)?.as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn remove_delivery(&mut self, id: &DeliveryId) -> io::Result<()> {
        self.outbox.remove(id.to_bytes().as_slice()).map_err(io_err)?;
        Ok(())
    }

    fn put_record(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.records.insert(key, value).map_err(io_err)?;
        Ok(())
    }

    fn remove_record(&mut self, key: &[u8]) -> io::Result<()> {
        self.records.remove(key).map_err(io_err)?;
        Ok(())
    }
}
