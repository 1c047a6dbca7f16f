//! Every redb table raftq uses, and the layout of their keys. A table's name string and a key layout never
//! change: they are the on-disk format.

use redb::TableDefinition;

use crate::queue::{DeliveryId, QueueKey, TaskId};

/// Raft log entries by index, openraft entries encoded by `storage::format`.
pub const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft log metadata: `vote`, `committed`, `last_purged`, `journal_generation`.
pub const LOG_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_log_meta");
/// Task records of one shard by 16-byte task id.
pub const TASKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("tasks");
/// Idempotency keys of one shard: `tenant \0 key` -> key record.
pub const IDEMPOTENCY_KEYS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idempotency_keys");
/// Webhook deliveries waiting in one shard's outbox: 24-byte delivery id (task id, seq) -> delivery record.
pub const WEBHOOK_OUTBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("webhook_outbox");
/// Shard-level records other than tasks and keys, by a key whose first byte is its kind (`RecordKey`):
/// paused queues (held by every shard), ...
pub const SHARD_RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("shard_records");
/// Shard metadata: `last_applied`, `membership`, `now`.
pub const SHARD_META: TableDefinition<&str, &[u8]> = TableDefinition::new("shard_meta");

pub const META_VOTE: &str = "vote";
pub const META_COMMITTED: &str = "committed";
pub const META_LAST_PURGED: &str = "last_purged";
pub const META_LAST_APPLIED: &str = "last_applied";
pub const META_MEMBERSHIP: &str = "membership";
pub const META_NOW: &str = "now";
/// In `LOG_META`: the last generation of the log's journal whose records this file holds (`storage::journal`).
pub const META_JOURNAL: &str = "journal_generation";
/// In `LOG_META` and `SHARD_META`: the format version of the file's records (one byte, see `storage::format`).
pub const META_FORMAT: &str = "format_version";

// ---- key layouts ---------------------------------------------------------------------------------------------

/// `TASKS` key: the 16-byte task id.
pub fn task_key(id: &TaskId) -> &[u8] {
    id.0.as_slice()
}

/// `IDEMPOTENCY_KEYS` key: tenant, a NUL, the key (tenant names cannot hold NUL).
pub fn idempotency_key(tenant: &str, key: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(tenant.len() + 1 + key.len());
    v.extend_from_slice(tenant.as_bytes());
    v.push(0);
    v.extend_from_slice(key.as_bytes());
    v
}

/// (tenant, key) of an `IDEMPOTENCY_KEYS` key.
pub fn parse_idempotency_key(raw: &[u8]) -> (String, String) {
    let split = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    let tenant = String::from_utf8_lossy(&raw[..split]).into_owned();
    let key = String::from_utf8_lossy(raw.get(split + 1..).unwrap_or_default()).into_owned();
    (tenant, key)
}

/// `WEBHOOK_OUTBOX` key: the 16-byte task id, then the delivery's `seq` big-endian (a task's deliveries sort
/// together).
pub fn outbox_key(id: &DeliveryId) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..16].copy_from_slice(&id.task_id.0);
    b[16..].copy_from_slice(&id.seq.to_be_bytes());
    b
}

/// Keys of `SHARD_RECORDS`. The first byte is the kind; it also says where a snapshot puts the record: `PAUSED`
/// `WEIGHT`, `LIMITS`, `RATE` and `KEY_LIMIT` records are held by every shard, `SCHEDULE` records by the shard of their id.
pub struct RecordKey;

impl RecordKey {
    /// `p tenant \0 queue`: a paused queue (empty value).
    pub const PAUSED: u8 = b'p';
    /// `s` + 16-byte schedule id: a schedule (bincode `Schedule`), in the shard of its id.
    pub const SCHEDULE: u8 = b's';
    /// `l tenant \0 queue`: a queue's flow-control limits (bincode `Limits`; an empty queue: the tenant's), in
    /// every shard. Cluster version 2.
    pub const LIMITS: u8 = b'l';
    /// `w tenant \0 queue \0 key`: a fairness key's weight other than 1 (bincode `u32`), in every shard.
    pub const WEIGHT: u8 = b'w';
    /// `r tenant \0 queue`: the whole queue's token bucket; `r tenant \0 queue \0 key`: a fairness key's (bincode
    /// `RateBucket`, configuration and level), in every shard. Cluster version 2.
    pub const RATE: u8 = b'r';
    /// `o tenant \0 key`: an operator's override of a concurrency key's limit (bincode `KeyLimit`: the limit and
    /// its expiry, an absolute state-machine time or none), in every shard. Cluster version 3.
    pub const KEY_LIMIT: u8 = b'o';
    /// `v`: the cluster version in force (bincode `u32`), in every shard. Absent: version 0.
    pub const CLUSTER_VERSION: &'static [u8] = b"v";

    pub fn schedule(id: &TaskId) -> Vec<u8> {
        let mut v = vec![Self::SCHEDULE];
        v.extend_from_slice(&id.0);
        v
    }

    pub fn paused(qk: &QueueKey) -> Vec<u8> {
        Self::queue_record(Self::PAUSED, qk)
    }

    pub fn limits(qk: &QueueKey) -> Vec<u8> {
        Self::queue_record(Self::LIMITS, qk)
    }

    fn queue_record(kind: u8, qk: &QueueKey) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend_from_slice(qk.tenant.as_bytes());
        v.push(0);
        v.extend_from_slice(qk.queue.as_bytes());
        v
    }

    pub fn weight(qk: &QueueKey, key: &str) -> Vec<u8> {
        let mut v = vec![Self::WEIGHT];
        for part in [qk.tenant.as_bytes(), &[0], qk.queue.as_bytes(), &[0], key.as_bytes()] {
            v.extend_from_slice(part);
        }
        v
    }

    pub fn rate(qk: &QueueKey, key: Option<&str>) -> Vec<u8> {
        let mut v = Self::queue_record(Self::RATE, qk);
        if let Some(key) = key {
            v.push(0);
            v.extend_from_slice(key.as_bytes());
        }
        v
    }

    /// The queue and key (`None`: the whole queue's bucket) of a rate record. Tenant and queue names hold no NUL.
    pub fn parse_rate(key: &[u8]) -> Option<(QueueKey, Option<String>)> {
        let rest = key.strip_prefix(&[Self::RATE])?;
        let mut parts = rest.splitn(3, |b| *b == 0);
        let (tenant, queue, key) = (parts.next()?, parts.next()?, parts.next());
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Some((QueueKey { tenant: text(tenant), queue: text(queue) }, key.map(text)))
    }

    pub fn key_limit(tenant: &str, key: &str) -> Vec<u8> {
        let mut v = vec![Self::KEY_LIMIT];
        for part in [tenant.as_bytes(), &[0], key.as_bytes()] {
            v.extend_from_slice(part);
        }
        v
    }

    /// The tenant and concurrency key of a key limit record. Tenant names hold no NUL; the key is the rest.
    pub fn parse_key_limit(key: &[u8]) -> Option<(String, String)> {
        let rest = key.strip_prefix(&[Self::KEY_LIMIT])?;
        let split = rest.iter().position(|b| *b == 0)?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Some((text(&rest[..split]), text(&rest[split + 1..])))
    }

    /// The one shard that holds a record, or `None` for records every shard holds.
    pub fn shard_of(key: &[u8], shards: usize) -> Option<usize> {
        match key.first() {
            Some(&Self::SCHEDULE) if key.len() == 17 => {
                let id: [u8; 16] = key[1..17].try_into().expect("16 bytes");
                Some(TaskId(id).shard(shards))
            }
            _ => None,
        }
    }

    pub fn is_schedule(key: &[u8]) -> bool {
        key.first() == Some(&Self::SCHEDULE)
    }

    /// The queue and key of a weight record. Tenant and queue names hold no NUL; the key is the rest.
    pub fn parse_weight(key: &[u8]) -> Option<(QueueKey, String)> {
        let rest = key.strip_prefix(&[Self::WEIGHT])?;
        let mut parts = rest.splitn(3, |b| *b == 0);
        let (tenant, queue, key) = (parts.next()?, parts.next()?, parts.next()?);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Some((QueueKey { tenant: text(tenant), queue: text(queue) }, text(key)))
    }

    pub fn parse_paused(key: &[u8]) -> Option<QueueKey> {
        Self::parse_queue_record(Self::PAUSED, key)
    }

    pub fn parse_limits(key: &[u8]) -> Option<QueueKey> {
        Self::parse_queue_record(Self::LIMITS, key)
    }

    fn parse_queue_record(kind: u8, key: &[u8]) -> Option<QueueKey> {
        let rest = key.strip_prefix(&[kind])?;
        let split = rest.iter().position(|b| *b == 0)?;
        Some(QueueKey {
            tenant: String::from_utf8_lossy(&rest[..split]).into_owned(),
            queue: String::from_utf8_lossy(&rest[split + 1..]).into_owned(),
        })
    }
}
