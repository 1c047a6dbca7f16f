//! Every redb table raftq uses. A table's name string never changes: it is the on-disk format.

use redb::TableDefinition;

/// Raft log entries by index, bincode-encoded openraft entries.
pub const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft log metadata: `vote`, `committed`, `last_purged`.
pub const LOG_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_log_meta");
/// Task records of one shard by 16-byte task id.
pub const TASKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("tasks");
/// Idempotency keys of one shard: `tenant \0 key` -> key record.
pub const IDEMPOTENCY_KEYS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idempotency_keys");
/// Webhook deliveries waiting in one shard's outbox: 24-byte delivery id (task id, seq) -> delivery record.
pub const WEBHOOK_OUTBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("webhook_outbox");
/// Shard-level records other than tasks and keys, by a key whose first byte is its kind (`queue::RecordKey`):
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
