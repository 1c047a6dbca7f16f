//! The version of every persisted format, and the only code that turns stored bytes into values and back: Raft
//! log entries and the log's metadata (vote, committed, purged), state-machine records (tasks, idempotency keys,
//! webhook deliveries, schedules, paused queues) and shard metadata, snapshot files and their frames, the
//! current-snapshot meta file and the data directory's marker. It must not know what the values mean (that is
//! `queue`'s) nor where files live (`files.rs`).
//!
//! # Versions
//! - **v0**: everything written before formats carried versions (up to commit 27ebc28): bare bincode values.
//! - **v1**: the same bincode values behind a version byte, as below.
//! - **v2** ([`CURRENT`]): bincode with variable-length integers behind the version byte: lengths, enum tags and
//!   small numbers take one byte instead of four or eight, so a task record is about a quarter smaller (a pending
//!   task of 100 payload bytes 274 → 194 bytes, a completed one 388 → 289). A v2 file may still hold v1 records
//!   (each says its version): opening a v1 file writes its v2 marker and nothing else, and a record is written in
//!   v2 the next time it changes.
//!
//! # Telling v0 from v1
//! A stored value cannot say by itself that it is v0: a v0 log entry starts with the low byte of its term and a
//! v0 task with its id, so any first byte is possible and no prefix byte could be told apart from them. The
//! version of records is therefore recorded **per file**, where the whole file is known:
//! - every redb file (the log, each shard) holds a marker, [`META_FORMAT`] in its meta table (one byte, the
//!   version of the records it holds). A file without it is v0 (or new) and is upgraded at open, in the one
//!   transaction that also writes the marker: a crash leaves it all v0 or all current. In a v1 or v2 file every
//!   value is `[version byte] ++ bincode` (the byte lets a later version mix records in an older file, as v2 does
//!   with v1 records, and lets a newer record be refused by name);
//! - a snapshot file says its layout in its magic (`RAFTQSNAP1`, `RAFTQSNAP2`: v0 records; `RAFTQSNAP3`: v1
//!   records, and a header with a version byte; `RAFTQSNAP4`: v1 and v2 records); v0 snapshots are upgraded
//!   record by record as they install. A snapshot holds the records a member of the cluster's oldest binary
//!   reads (the cluster version, `raft::version`): a record newer than that is re-encoded as it is written;
//! - the current-snapshot meta file starts with [`META_FILE_MAGIC`] and a version byte: its v0 encoding starts
//!   with an `Option` tag (0 or 1), never with `R`, so the two are told apart by the first byte;
//! - the data directory holds [`DATA_DIR_MARKER`] (`FORMAT`), the directory's version, written when the
//!   directory is created or once every file in it has been upgraded. A directory with raftq files and no
//!   marker is v0. Version 2 holds v1 files and the Raft log's journal: nothing is converted from version 1, but
//!   a build of version 1 must not open it, since it would not replay the journal. Version 3 ([`DIR_CURRENT`])
//!   holds v2 files: a build of version 2 must not open it, since it cannot read v2 records.
//!
//! # State, not encoding
//! The state digest (`read_view::StateDigest`, carried by backups) hashes every record in its v0 form (the
//! fixed-width bincode body), whatever version it is stored in, so replicas and backups of any version agree.
//!
//! # Refusal
//! Data of a version newer than [`CURRENT`] (a directory marker, a file marker, a record, a log entry, a
//! snapshot) is refused with an error naming the version found and the newest this binary supports. The
//! directory and file markers are read before anything is written, so a refused start leaves every file as it
//! was.
//!
//! # Cost
//! Encoding pushes the version byte into the caller's buffer before bincode writes the value (no allocation of
//! its own); decoding checks one byte and decodes the rest in place. Variable-length integers cost a branch per
//! integer and save the bytes: `backlog-1`, `cycle-1` and `cycle-3` 4–6 % faster than with v1, in three
//! alternating pairs each (docs/performance.md, "Smaller records").

use std::borrow::Cow;
use std::fs;
use std::io;
use std::ops::Bound;
use std::path::Path;

use bincode::Options;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableError, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::tables::*;
use crate::queue::{KeyRecord, Schedule, Task, TimeMs, WebhookDelivery};
use crate::raft::types::{Entry, LogId, StoredMembership, Vote};

/// A format version: 0 is the unversioned data of old builds.
pub type Version = u8;
/// Unversioned data (bare bincode values), written by every build before formats carried versions.
pub const V0: Version = 0;
/// Values behind a version byte, then bincode with fixed-width integers; redb files, snapshots and the data
/// directory say their version.
pub const V1: Version = 1;
/// Values behind a version byte, then bincode with variable-length integers (`varint`).
pub const V2: Version = 2;
/// The version this binary writes, and the newest it reads.
pub const CURRENT: Version = V2;
/// The data directory's version 2: v1 files, and the Raft log's journal (`storage::journal`) beside the log
/// file, which holds writes the log file may not yet hold. A build that knows only version 1 would not read it,
/// so it must refuse the directory.
pub const DIR_V2: Version = 2;
/// The data directory's version 3: v2 files (which may still hold v1 records), and the journal.
pub const DIR_V3: Version = 3;
/// The data directory's version this binary writes, and the newest it reads.
pub const DIR_CURRENT: Version = DIR_V3;

/// The data directory's marker file: the directory's format version in ASCII decimal.
pub const DATA_DIR_MARKER: &str = "FORMAT";
/// Opens the current-snapshot meta file (then a version byte, then bincode).
pub const META_FILE_MAGIC: &[u8] = b"RAFTQMETA";

/// Snapshot magics by layout. Every magic is `RAFTQSNAP`, one digit, a newline.
const SNAPSHOT_MAGIC_PREFIX: &[u8] = b"RAFTQSNAP";
/// The magic of snapshot files written now: v1 and v2 records, a SHA-256 digest at the end.
pub const SNAPSHOT_MAGIC: &[u8] = b"RAFTQSNAP4\n";
/// The length of every snapshot magic.
pub const SNAPSHOT_MAGIC_LEN: usize = SNAPSHOT_MAGIC.len();
/// The newest snapshot layout this binary reads.
const SNAPSHOT_LAYOUT: u8 = 4;

/// Stored data this binary cannot read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "{what} has format version {found}, newer than this binary supports (version {supported}): it was written \
         by a newer raftq; nothing was changed, run that version or newer"
    )]
    Newer { what: String, found: u64, supported: u64 },
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
}

impl From<FormatError> for io::Error {
    fn from(e: FormatError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

fn newer(what: impl Into<String>, found: u64, supported: u64) -> io::Error {
    FormatError::Newer { what: what.into(), found, supported }.into()
}

fn invalid(what: impl Into<String>, reason: impl std::fmt::Display) -> io::Error {
    FormatError::Invalid { what: what.into(), reason: reason.to_string() }.into()
}

// ---- records and log entries -----------------------------------------------------------------------------------

/// v2's bincode: variable-length integers (one byte below 251), little-endian, no size limit; like v1's
/// `bincode::deserialize`, a value followed by more bytes decodes. Raft messages use it too (`raft::network::Wire`).
pub(crate) fn varint() -> impl Options {
    bincode::DefaultOptions::new().with_varint_encoding().allow_trailing_bytes()
}

/// Appends `v` in the current format to `buf`: the version byte, then bincode (reuses `buf`'s allocation).
pub fn encode_into<T: Serialize>(buf: &mut Vec<u8>, v: &T) -> io::Result<()> {
    buf.push(CURRENT);
    varint().serialize_into(buf, v).map_err(|e| invalid("encoding a record", e))
}

/// `v` in the current format.
pub fn encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(1 + varint().serialized_size(v).unwrap_or(0) as usize);
    encode_into(&mut buf, v)?;
    Ok(buf)
}

/// Decodes a value stored behind a version byte (every value of a file whose marker is v1 or v2: each says its
/// own version). `what` names the value in errors ("task record", "log entry").
pub fn decode<T: DeserializeOwned>(b: &[u8], what: &str) -> io::Result<T> {
    match b.split_first() {
        Some((&V1, rest)) => bincode::deserialize(rest).map_err(|e| invalid(what, e)),
        Some((&V2, rest)) => varint().deserialize(rest).map_err(|e| invalid(what, e)),
        Some((&v, _)) if v > CURRENT => Err(newer(what, v.into(), CURRENT.into())),
        Some((&v, _)) => Err(invalid(what, format!("unknown format version {v}"))),
        None => Err(invalid(what, "empty value")),
    }
}

/// Decodes a value stored in `version` (the version of the file or snapshot it comes from).
pub fn decode_as<T: DeserializeOwned>(version: Version, b: &[u8], what: &str) -> io::Result<T> {
    match version {
        V0 => bincode::deserialize(b).map_err(|e| invalid(format!("{what} (v0)"), e)),
        _ => decode(b, what),
    }
}

/// `v` in `version`: the current format, or an older one a peer of an older binary reads (a snapshot sent
/// before the cluster version allows newer records, see [`snapshot_records_for`]).
pub fn encode_as<T: Serialize>(version: Version, v: &T) -> io::Result<Vec<u8>> {
    match version {
        V0 => bincode::serialize(v).map_err(|e| invalid("encoding a record (v0)", e)),
        V1 => {
            let mut buf = vec![V1];
            bincode::serialize_into(&mut buf, v).map_err(|e| invalid("encoding a record (v1)", e))?;
            Ok(buf)
        }
        _ => encode(v),
    }
}

/// A stored value (behind its version byte) as a reader of `to` reads it: the same bytes when it can (a record
/// of `to` or older, v0 excepted; a v1 record's body for v0, which is v1 without the byte), else decoded and
/// encoded again.
pub fn stored_as<'a, T: Serialize + DeserializeOwned>(
    to: Version,
    b: &'a [u8],
    what: &str,
) -> io::Result<Cow<'a, [u8]>> {
    match (to, b.split_first()) {
        (V0, Some((&V1, rest))) => Ok(Cow::Borrowed(rest)),
        (to, Some((&from, _))) if to >= V1 && (V1..=to).contains(&from) => Ok(Cow::Borrowed(b)),
        _ => Ok(Cow::Owned(encode_as(to, &decode::<T>(b, what)?)?)),
    }
}

/// What a stored value is, from where it is stored: the type it decodes to.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'k> {
    /// A `TASKS` value.
    Task,
    /// An `IDEMPOTENCY_KEYS` value.
    Key,
    /// A `WEBHOOK_OUTBOX` value.
    Delivery,
    /// A `SHARD_RECORDS` value under this key.
    Record(&'k [u8]),
    /// A `LOG` value.
    Entry,
    /// A `LOG_META` or `SHARD_META` value under this key.
    Meta(&'k str),
}

/// Calls the generic function `$f` with the type a value of `$of` (a [`Stored`]) decodes to, then `$args`, then
/// the value's name for errors.
macro_rules! by_type {
    ($of:expr, $f:ident ( $($arg:expr),* )) => {
        match $of {
            Stored::Task => $f::<Task>($($arg,)* "task record"),
            Stored::Key => $f::<KeyRecord>($($arg,)* "idempotency key record"),
            Stored::Delivery => $f::<WebhookDelivery>($($arg,)* "webhook delivery record"),
            Stored::Entry => $f::<Entry>($($arg,)* "log entry"),
            Stored::Record(k) if RecordKey::is_schedule(k) => $f::<Schedule>($($arg,)* "schedule record"),
            Stored::Record(k) if k == RecordKey::CLUSTER_VERSION => $f::<u32>($($arg,)* "cluster version record"),
            Stored::Record(k) if RecordKey::parse_limits(k).is_some() => {
                $f::<crate::queue::Limits>($($arg,)* "limits record")
            }
            Stored::Record(k) if RecordKey::parse_rate(k).is_some() => {
                $f::<crate::queue::RateBucket>($($arg,)* "rate bucket record")
            }
            Stored::Record(k) if RecordKey::parse_key_limit(k).is_some() => {
                $f::<crate::queue::KeyLimit>($($arg,)* "key limit record")
            }
            Stored::Record(k) if RecordKey::parse_weight(k).is_some() => $f::<u32>($($arg,)* "fairness weight record"),
            Stored::Record(_) => $f::<()>($($arg,)* "shard record"),
            Stored::Meta(META_VOTE) => $f::<Vote>($($arg,)* "vote"),
            Stored::Meta(META_COMMITTED) => $f::<Option<LogId>>($($arg,)* "committed log id"),
            Stored::Meta(META_LAST_PURGED) => $f::<LogId>($($arg,)* "last purged log id"),
            Stored::Meta(META_LAST_APPLIED) => $f::<Option<LogId>>($($arg,)* "last applied log id"),
            Stored::Meta(META_MEMBERSHIP) => $f::<StoredMembership>($($arg,)* "membership"),
            Stored::Meta(META_NOW) => $f::<TimeMs>($($arg,)* "state machine time"),
            Stored::Meta(META_JOURNAL) => $f::<u64>($($arg,)* "journal generation"),
            Stored::Meta(k) => Err(invalid(format!("meta value {k:?}"), "not a value this binary knows")),
        }
    };
}

/// A record table of a redb file and what its values are (a downgrade rewrites each by its type).
pub type TypedTable = (TableDefinition<'static, &'static [u8], &'static [u8]>, Stored<'static>);

/// [`stored_as`] for a value of `of`.
pub fn stored_value_as<'a>(to: Version, of: Stored<'_>, b: &'a [u8]) -> io::Result<Cow<'a, [u8]>> {
    by_type!(of, stored_as(to, b))
}

/// The state a stored value holds, in one encoding whatever the version it is stored in: its v0 form (the
/// fixed-width bincode body). Replicas whose files are of different versions (a rolling upgrade, records not
/// rewritten since an upgrade) and backups of older builds hash the same state alike (`digest`).
pub fn canonical<'a>(of: Stored<'_>, b: &'a [u8]) -> io::Result<Cow<'a, [u8]>> {
    stored_value_as(V0, of, b)
}

/// The upgrade path: a value stored in `version`, decoded, and its bytes as the current format stores them:
/// borrowed when they carry a version byte (a v1 or v2 value is valid in a current file), encoded again from v0.
pub fn upgrade<'a, T: Serialize + DeserializeOwned>(
    version: Version,
    b: &'a [u8],
    what: &str,
) -> io::Result<(T, Cow<'a, [u8]>)> {
    let v: T = decode_as(version, b, what)?;
    if version == V0 {
        let bytes = encode(&v)?;
        Ok((v, Cow::Owned(bytes)))
    } else {
        Ok((v, Cow::Borrowed(b)))
    }
}

fn upgraded_bytes<'a, T: Serialize + DeserializeOwned>(
    version: Version,
    b: &'a [u8],
    what: &str,
) -> io::Result<Cow<'a, [u8]>> {
    upgrade::<T>(version, b, what).map(|(_, bytes)| bytes)
}

/// A pair of byte strings inside a snapshot frame (a key and its stored value). The pair is part of the
/// snapshot's layout (versioned by its magic), not a record.
pub fn encode_pair(k: &[u8], v: &[u8]) -> io::Result<Vec<u8>> {
    bincode::serialize(&(k, v)).map_err(|e| invalid("encoding a snapshot frame", e))
}

pub fn decode_pair(b: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
    bincode::deserialize(b).map_err(|e| invalid("snapshot frame", e))
}

// ---- redb files ------------------------------------------------------------------------------------------------

/// Refuses a redb file of a newer format before it is opened for writing: opening a redb file for writing
/// rewrites its header even when nothing else is written, so the marker is read through a read-only handle.
/// A file that does not open read-only (absent, or left by a crash and needing redb's repair) is checked by
/// [`file_version`] once opened.
pub fn refuse_newer_file(path: &Path, meta: TableDefinition<&str, &[u8]>) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    match redb::ReadOnlyDatabase::open(path) {
        Ok(db) => file_version(&db, meta, path).map(|_| ()),
        Err(_) => Ok(()),
    }
}

/// The version of records a redb file holds, from its marker: `None` for a file without one (v0, or new).
/// Reads only. `meta` is the file's meta table.
pub fn file_version(
    db: &impl ReadableDatabase,
    meta: TableDefinition<&str, &[u8]>,
    path: &Path,
) -> io::Result<Option<Version>> {
    let what = || format!("{}", path.display());
    let txn = db.begin_read().map_err(|e| invalid(what(), e))?;
    let table = match txn.open_table(meta) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(invalid(what(), e)),
    };
    let Some(v) = table.get(META_FORMAT).map_err(|e| invalid(what(), e))? else { return Ok(None) };
    match v.value() {
        [v] if *v > CURRENT => Err(newer(format!("{} (file marker)", what()), (*v).into(), CURRENT.into())),
        [v] => Ok(Some(*v)),
        other => Err(invalid(what(), format!("format marker of {} bytes, expected 1", other.len()))),
    }
}

/// Brings a redb file to the current version inside `txn` (the transaction that opens its tables): a file
/// without a marker (v0, or new and empty) has every value rewritten in the current format, then gets the
/// marker. `found` is what [`file_version`] read.
pub fn upgrade_log_file(txn: &WriteTransaction, found: Option<Version>) -> io::Result<()> {
    if found == Some(CURRENT) {
        return Ok(());
    }
    let from = found.unwrap_or(V0);
    let mut meta = txn.open_table(LOG_META).map_err(|e| invalid("raft log meta", e))?;
    if from != V0 {
        // Every value says its version, and this binary reads them all: only the marker changes.
        meta.insert(META_FORMAT, [CURRENT].as_slice()).map_err(|e| invalid("raft log meta", e))?;
        return Ok(());
    }
    drop(meta);
    rewrite_log(txn, |v| Ok(upgrade::<Entry>(from, v, "log entry")?.1.into_owned()))?;
    let mut meta = txn.open_table(LOG_META).map_err(|e| invalid("raft log meta", e))?;
    upgrade_meta::<Vote>(&mut meta, from, META_VOTE, "vote")?;
    upgrade_meta::<Option<LogId>>(&mut meta, from, META_COMMITTED, "committed log id")?;
    upgrade_meta::<LogId>(&mut meta, from, META_LAST_PURGED, "last purged log id")?;
    meta.insert(META_FORMAT, [CURRENT].as_slice()).map_err(|e| invalid("raft log meta", e))?;
    Ok(())
}

/// As [`upgrade_log_file`], for a shard file.
pub fn upgrade_shard_file(txn: &WriteTransaction, found: Option<Version>) -> io::Result<()> {
    if found == Some(CURRENT) {
        return Ok(());
    }
    let from = found.unwrap_or(V0);
    if from != V0 {
        // Every value says its version, and this binary reads them all: only the marker changes.
        let mut meta = txn.open_table(SHARD_META).map_err(|e| invalid("shard meta", e))?;
        meta.insert(META_FORMAT, [CURRENT].as_slice()).map_err(|e| invalid("shard meta", e))?;
        return Ok(());
    }
    upgrade_table(txn, TASKS, |_, v| Ok(upgrade::<Task>(from, v, "task record")?.1.into_owned()))?;
    upgrade_table(txn, IDEMPOTENCY_KEYS, |_, v| {
        Ok(upgrade::<KeyRecord>(from, v, "idempotency key record")?.1.into_owned())
    })?;
    upgrade_table(txn, WEBHOOK_OUTBOX, |_, v| {
        Ok(upgrade::<WebhookDelivery>(from, v, "webhook delivery record")?.1.into_owned())
    })?;
    upgrade_table(txn, SHARD_RECORDS, |k, v| upgrade_shard_record(from, k, v).map(Cow::into_owned))?;
    let mut meta = txn.open_table(SHARD_META).map_err(|e| invalid("shard meta", e))?;
    upgrade_meta::<Option<LogId>>(&mut meta, from, META_LAST_APPLIED, "last applied log id")?;
    upgrade_meta::<StoredMembership>(&mut meta, from, META_MEMBERSHIP, "membership")?;
    upgrade_meta::<TimeMs>(&mut meta, from, META_NOW, "state machine time")?;
    meta.insert(META_FORMAT, [CURRENT].as_slice()).map_err(|e| invalid("shard meta", e))?;
    Ok(())
}

/// A `SHARD_RECORDS` value stored in `version`, as the current format stores it: a schedule, or a paused
/// queue's value (empty in v0, the encoded unit value since v1), ...
pub fn upgrade_shard_record<'a>(version: Version, key: &[u8], v: &'a [u8]) -> io::Result<Cow<'a, [u8]>> {
    by_type!(Stored::Record(key), upgraded_bytes(version, v))
}

/// The way back, for a downgrade before the cluster version is raised: every value of a newer file in `tables`
/// and `meta` rewritten as `to` (v0: a v1 value without its version byte; v0 or v1: a v2 value decoded and
/// encoded again), and the file's marker set to `to` (removed for v0), inside `txn` (so a crash leaves the file
/// as it was or all `to`). Returns the values rewritten.
pub fn downgrade_file(
    txn: &WriteTransaction,
    tables: &[TypedTable],
    log: bool,
    meta: TableDefinition<&str, &[u8]>,
    to: Version,
) -> io::Result<u64> {
    let convert = |of: Stored<'_>, v: &[u8]| stored_value_as(to, of, v).map(Cow::into_owned);
    let mut n = 0u64;
    for (def, of) in tables {
        upgrade_table(txn, *def, |k, v| {
            n += 1;
            match of {
                Stored::Record(_) => convert(Stored::Record(k), v),
                of => convert(*of, v),
            }
        })?;
    }
    if log {
        rewrite_log(txn, |v| {
            n += 1;
            convert(Stored::Entry, v)
        })?;
    }
    let mut m = txn.open_table(meta).map_err(|e| invalid("meta", e))?;
    m.remove(META_FORMAT).map_err(|e| invalid("meta", e))?;
    if to != V0 {
        m.insert(META_FORMAT, [to].as_slice()).map_err(|e| invalid("meta", e))?;
    }
    // The journal's generation: the downgrade runs only on a journal with nothing to replay, and removes it.
    m.remove(META_JOURNAL).map_err(|e| invalid("meta", e))?;
    let keys: Vec<String> = m
        .iter()
        .map_err(|e| invalid("meta", e))?
        .map(|item| item.map(|(k, _)| k.value().to_string()))
        .collect::<Result<_, _>>()
        .map_err(|e| invalid("meta", e))?;
    for k in keys.into_iter().filter(|k| k != META_FORMAT) {
        let v = match m.get(k.as_str()).map_err(|e| invalid("meta", e))? {
            Some(v) => convert(Stored::Meta(&k), v.value())?,
            None => continue,
        };
        m.insert(k.as_str(), v.as_slice()).map_err(|e| invalid("meta", e))?;
    }
    Ok(n)
}

/// Rewrites every entry of the Raft log with `f`, in chunks.
fn rewrite_log(txn: &WriteTransaction, mut f: impl FnMut(&[u8]) -> io::Result<Vec<u8>>) -> io::Result<()> {
    let mut log = txn.open_table(LOG).map_err(|e| invalid("raft log", e))?;
    let mut after: Option<u64> = None;
    loop {
        let chunk: Vec<(u64, Vec<u8>)> = {
            let lo = after.map_or(Bound::Unbounded, Bound::Excluded);
            let range = log.range::<u64>((lo, Bound::Unbounded)).map_err(|e| invalid("raft log", e))?;
            let mut chunk = Vec::new();
            for item in range.take(UPGRADE_CHUNK) {
                let (k, v) = item.map_err(|e| invalid("raft log", e))?;
                chunk.push((k.value(), f(v.value())?));
            }
            chunk
        };
        let Some(last) = chunk.last().map(|(k, _)| *k) else { break };
        for (k, v) in &chunk {
            log.insert(*k, v.as_slice()).map_err(|e| invalid("raft log", e))?;
        }
        after = Some(last);
    }
    Ok(())
}

/// Records rewritten per read pass of an upgrade: redb allows no writes to a table while it is being iterated.
const UPGRADE_CHUNK: usize = 10_000;

fn upgrade_table(
    txn: &WriteTransaction,
    def: TableDefinition<&[u8], &[u8]>,
    mut f: impl FnMut(&[u8], &[u8]) -> io::Result<Vec<u8>>,
) -> io::Result<()> {
    let name = def.to_string();
    let mut table = txn.open_table(def).map_err(|e| invalid(&name, e))?;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let chunk: Vec<(Vec<u8>, Vec<u8>)> = {
            let lo = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let range = table.range::<&[u8]>((lo, Bound::Unbounded)).map_err(|e| invalid(&name, e))?;
            let mut chunk = Vec::new();
            for item in range.take(UPGRADE_CHUNK) {
                let (k, v) = item.map_err(|e| invalid(&name, e))?;
                chunk.push((k.value().to_vec(), f(k.value(), v.value())?));
            }
            chunk
        };
        let Some(last) = chunk.last().map(|(k, _)| k.clone()) else { break };
        for (k, v) in &chunk {
            table.insert(k.as_slice(), v.as_slice()).map_err(|e| invalid(&name, e))?;
        }
        after = Some(last);
    }
    Ok(())
}

fn upgrade_meta<T: Serialize + DeserializeOwned>(
    table: &mut redb::Table<&str, &[u8]>,
    from: Version,
    key: &str,
    what: &str,
) -> io::Result<()> {
    let new = match table.get(key).map_err(|e| invalid(what, e))? {
        Some(v) => upgrade::<T>(from, v.value(), what)?.1.into_owned(),
        None => return Ok(()),
    };
    table.insert(key, new.as_slice()).map_err(|e| invalid(what, e))?;
    Ok(())
}

// ---- snapshot files --------------------------------------------------------------------------------------------

/// What a snapshot file's magic says about the rest of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLayout {
    /// The version of the records (and of the header) in its frames.
    pub records: Version,
    /// Whether the file ends with the SHA-256 of every byte before it.
    pub digest: bool,
}

/// The version of the records in the snapshots a cluster at `cluster_version` builds: they are sent to every
/// member, and a member of a binary from before cluster versions (cluster version 0) reads only v0 records, one
/// of a binary from before v2 (cluster versions 1 to 3) only v0 and v1. The cluster version rises only once every
/// member's binary reads what it allows.
pub fn snapshot_records_for(cluster_version: u32) -> Version {
    match cluster_version {
        0 => V0,
        1..=3 => V1,
        _ => V2,
    }
}

/// The magic of a snapshot file whose records are of `records` or older: layout 2 for v0 records (what a build
/// from before versions reads), 3 for v1, [`SNAPSHOT_MAGIC`] for v2. Each ends with a digest.
pub fn snapshot_magic(records: Version) -> &'static [u8] {
    match records {
        V0 => b"RAFTQSNAP2\n",
        V1 => b"RAFTQSNAP3\n",
        _ => SNAPSHOT_MAGIC,
    }
}

/// The layout of a snapshot file from its first [`SNAPSHOT_MAGIC_LEN`] bytes.
pub fn snapshot_layout(magic: &[u8]) -> io::Result<SnapshotLayout> {
    let what = "snapshot file";
    let digit = match magic.strip_prefix(SNAPSHOT_MAGIC_PREFIX) {
        Some([d, b'\n']) if d.is_ascii_digit() => d - b'0',
        // A layout of two or more digits: newer than any this binary knows.
        Some([d, e, ..]) if d.is_ascii_digit() && e.is_ascii_digit() => {
            let n = [*d, *e].iter().fold(0u64, |n, c| n * 10 + u64::from(c - b'0'));
            return Err(newer(format!("{what} (layout)"), n, SNAPSHOT_LAYOUT.into()));
        }
        _ => return Err(invalid(what, "not a raftq snapshot")),
    };
    match digit {
        1 => Ok(SnapshotLayout { records: V0, digest: false }),
        2 => Ok(SnapshotLayout { records: V0, digest: true }),
        3 => Ok(SnapshotLayout { records: V1, digest: true }),
        4 => Ok(SnapshotLayout { records: V2, digest: true }),
        n if n > SNAPSHOT_LAYOUT => Err(newer(format!("{what} (layout)"), n.into(), SNAPSHOT_LAYOUT.into())),
        _ => Err(invalid(what, "not a raftq snapshot")),
    }
}

// ---- backup files ----------------------------------------------------------------------------------------------

/// The magic of backup files written now (`backup.rs`): a layout digit, a newline. The header after it is a
/// record (version byte + bincode), and the snapshot inside says its own layout.
pub const BACKUP_MAGIC: &[u8] = b"RAFTQBACKUP1\n";
/// The length of every backup magic.
pub const BACKUP_MAGIC_LEN: usize = BACKUP_MAGIC.len();
const BACKUP_MAGIC_PREFIX: &[u8] = b"RAFTQBACKUP";
/// The newest backup layout this binary reads.
const BACKUP_LAYOUT: u8 = 1;

/// Checks a backup file's first [`BACKUP_MAGIC_LEN`] bytes: the one layout there is, or a newer one refused by
/// name.
pub fn backup_layout(magic: &[u8]) -> io::Result<()> {
    let what = "backup file";
    match magic.strip_prefix(BACKUP_MAGIC_PREFIX) {
        Some([d, b'\n']) if *d == b'0' + BACKUP_LAYOUT => Ok(()),
        Some([d, b'\n']) if d.is_ascii_digit() && d - b'0' > BACKUP_LAYOUT => {
            Err(newer(format!("{what} (layout)"), (d - b'0').into(), BACKUP_LAYOUT.into()))
        }
        Some([d, e]) if d.is_ascii_digit() && e.is_ascii_digit() => {
            let n = [*d, *e].iter().fold(0u64, |n, c| n * 10 + u64::from(c - b'0'));
            Err(newer(format!("{what} (layout)"), n, BACKUP_LAYOUT.into()))
        }
        _ => Err(invalid(what, "not a raftq backup (no RAFTQBACKUP magic)")),
    }
}

// ---- small metadata files --------------------------------------------------------------------------------------

/// A small metadata file (the current snapshot's meta): [`META_FILE_MAGIC`], the version byte, bincode.
pub fn encode_meta_file<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    let mut buf = META_FILE_MAGIC.to_vec();
    encode_into(&mut buf, v)?;
    Ok(buf)
}

/// A small metadata file as a reader of `version` reads it: bare bincode for v0, else the magic, the version byte
/// and its bincode.
pub fn encode_meta_file_as<T: Serialize>(version: Version, v: &T) -> io::Result<Vec<u8>> {
    match version {
        V0 => encode_as(V0, v),
        _ => Ok([META_FILE_MAGIC, &encode_as(version, v)?].concat()),
    }
}

/// Reads a metadata file of any version: v0 ones are bare bincode, whose first byte (an `Option` tag of the
/// snapshot meta, 0 or 1) is never the magic's first.
pub fn decode_meta_file<T: DeserializeOwned>(b: &[u8], what: &str) -> io::Result<T> {
    match b.strip_prefix(META_FILE_MAGIC) {
        Some(rest) => decode(rest, what),
        None => decode_as(V0, b, what),
    }
}

// ---- the data directory ----------------------------------------------------------------------------------------

/// The data directory's version: its marker's, `Some(V0)` for a directory holding raftq files and no marker,
/// `None` for a new one. Reads only; a marker newer than this binary is refused.
pub fn data_dir_version(dir: &Path) -> io::Result<Option<Version>> {
    let path = dir.join(DATA_DIR_MARKER);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let holds_data = ["raft-log.redb", "sm", "sm.new", "snapshots"].iter().any(|f| dir.join(f).exists());
            return Ok(holds_data.then_some(V0));
        }
        Err(e) => return Err(invalid(format!("{}", path.display()), e)),
    };
    let what = format!("data directory {}", dir.display());
    let found: u64 = text
        .trim()
        .parse()
        .map_err(|_| invalid(&what, format!("unreadable format marker {DATA_DIR_MARKER}: {:?}", text.trim())))?;
    match Version::try_from(found) {
        Ok(v) if v <= DIR_CURRENT => Ok(Some(v)),
        _ => Err(newer(what, found, DIR_CURRENT.into())),
    }
}

/// Writes the directory's marker with the current version (atomically: a temp file renamed over it).
pub fn mark_data_dir(dir: &Path) -> io::Result<()> {
    mark_data_dir_as(dir, DIR_CURRENT)
}

/// Writes the directory's marker with `version` (a downgrade's).
pub fn mark_data_dir_as(dir: &Path, version: Version) -> io::Result<()> {
    let path = dir.join(DATA_DIR_MARKER);
    let tmp = dir.join(format!("{DATA_DIR_MARKER}.tmp"));
    fs::write(&tmp, format!("{version}\n"))?;
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, &path)?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_payload_is_encoded_as_the_bytes_of_a_vec_were() {
        // Task and NewTask payloads were `Vec<u8>`: records, log entries and snapshots of either build must read
        // in the other (older nodes in a rolling upgrade, older files, a downgrade).
        let v: Vec<u8> = (0..=255).collect();
        let shared = bytes::Bytes::from(v.clone());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_into(&mut a, &("q", &v, 3u8)).expect("encode vec");
        encode_into(&mut b, &("q", &shared, 3u8)).expect("encode bytes");
        assert_eq!(a, b);
        let back: (String, bytes::Bytes, u8) = decode(&a, "record").expect("decode");
        assert_eq!((back.0.as_str(), &back.1[..], back.2), ("q", &v[..], 3));
        let empty: (Vec<u8>, u8) = decode(&encode(&(bytes::Bytes::new(), 1u8)).expect("encode"), "r").expect("decode");
        assert_eq!(empty, (vec![], 1));
    }

    #[test]
    fn a_record_is_its_version_byte_then_bincode_and_round_trips() {
        let v = (7u64, "seven".to_string());
        let mut buf = Vec::with_capacity(64);
        let cap = buf.capacity();
        encode_into(&mut buf, &v).expect("encode");
        // v2: the version byte, then varint bincode (one byte for 7, one for the string's length).
        assert_eq!(buf, [&[V2, 7, 5][..], b"seven"].concat());
        assert_eq!(buf.capacity(), cap, "the version byte goes into the caller's buffer");
        assert_eq!(decode::<(u64, String)>(&buf, "pair").expect("decode"), v);
        let v0 = bincode::serialize(&v).expect("bincode");
        assert_eq!(v0.len(), 8 + 8 + 5, "v0 and v1 integers are fixed-width");
        let (back, bytes) = upgrade::<(u64, String)>(V0, &v0, "pair").expect("upgrade");
        assert_eq!((back, bytes.as_ref()), (v.clone(), buf.as_slice()), "a v0 value upgrades to the v2 bytes");
        // A v1 value reads as it is, and stays as it is in a current file (each value says its version).
        let v1 = [&[V1][..], &v0].concat();
        assert_eq!(decode::<(u64, String)>(&v1, "pair").expect("v1"), v);
        let (back, bytes) = upgrade::<(u64, String)>(V1, &v1, "pair").expect("upgrade");
        assert_eq!((back, bytes.as_ref()), (v.clone(), v1.as_slice()), "a v1 value is kept");
        assert_eq!(encode_as(V1, &v).expect("v1"), v1);
        assert_eq!(encode_as(V0, &v).expect("v0"), v0);
    }

    #[test]
    fn stored_values_convert_to_what_an_older_reader_reads_and_hash_alike() {
        let v = (300u64, "three hundred".to_string(), vec![1u32, 2, 3]);
        type V = (u64, String, Vec<u32>);
        let v0 = encode_as(V0, &v).expect("v0");
        let v1 = encode_as(V1, &v).expect("v1");
        let v2 = encode(&v).expect("v2");
        assert!(v2.len() < v1.len(), "v2 is shorter: {} against {}", v2.len(), v1.len());
        for (to, want) in [(V0, &v0), (V1, &v1), (V2, &v2)] {
            let got = stored_as::<V>(to, &v2, "x").expect("from v2");
            assert_eq!(got.as_ref(), want.as_slice(), "v2 as v{to}");
            assert_eq!(decode_as::<V>(to, &got, "x").expect("reads back"), v);
        }
        // A v1 value needs no conversion for a reader of v1 or v2, and only loses its byte for v0.
        assert!(matches!(stored_as::<V>(V2, &v1, "x").expect("v1"), Cow::Borrowed(b) if b == v1.as_slice()));
        assert!(matches!(stored_as::<V>(V1, &v1, "x").expect("v1"), Cow::Borrowed(b) if b == v1.as_slice()));
        assert!(matches!(stored_as::<V>(V0, &v1, "x").expect("v0"), Cow::Borrowed(b) if b == v0.as_slice()));
        // The digest's form is the same whatever the version stored.
        let of = Stored::Record(RecordKey::CLUSTER_VERSION);
        let (r1, r2) = (encode_as(V1, &300u32).expect("v1"), encode(&300u32).expect("v2"));
        assert_ne!(r1, r2);
        assert_eq!(canonical(of, &r1).expect("v1"), canonical(of, &r2).expect("v2"));
        assert_eq!(canonical(of, &r2).expect("v2").as_ref(), 300u32.to_le_bytes().as_slice());
        assert!(canonical(Stored::Meta("nonsense"), &r2).is_err(), "an unknown meta value is named, not guessed");
    }

    #[test]
    fn a_record_of_a_newer_or_unknown_version_is_refused_by_name() {
        let err = decode::<u64>(&[99, 1, 0, 0, 0, 0, 0, 0, 0], "task record").expect_err("v99");
        let msg = err.to_string();
        assert!(msg.starts_with("task record has format version 99"), "{msg}");
        assert!(msg.contains("supports (version 2)"), "{msg}");
        assert!(decode::<u64>(&[0, 1, 0, 0, 0, 0, 0, 0, 0], "x").expect_err("v0 byte").to_string().contains("unknown"));
        assert!(decode::<u64>(&[], "x").expect_err("empty").to_string().contains("empty"));
        assert!(decode::<u64>(&[V2, 253, 1], "x").is_err(), "cut short (a u64 follows 253)");
        assert!(decode::<u64>(&[V1, 1], "x").is_err(), "cut short (v1 integers are 8 bytes)");
    }

    #[test]
    fn meta_files_of_both_versions_decode_and_a_newer_one_is_refused() {
        // A v0 meta file starts with an Option tag, 0 or 1: never the magic.
        for v in [None, Some(5u64)] {
            let v0 = bincode::serialize(&v).expect("bincode");
            assert_eq!(decode_meta_file::<Option<u64>>(&v0, "meta").expect("v0"), v);
            let v1 = encode_meta_file(&v).expect("encode");
            assert!(v1.starts_with(META_FILE_MAGIC));
            assert_eq!(decode_meta_file::<Option<u64>>(&v1, "meta").expect("v1"), v);
        }
        let mut newer = META_FILE_MAGIC.to_vec();
        newer.extend([42, 0]);
        let msg = decode_meta_file::<Option<u64>>(&newer, "meta").expect_err("v42").to_string();
        assert!(msg.contains("format version 42") && msg.contains("(version 2)"), "{msg}");
    }

    #[test]
    fn snapshot_layouts_map_to_record_versions_and_newer_ones_are_refused() {
        assert_eq!(snapshot_layout(b"RAFTQSNAP1\n").expect("1"), SnapshotLayout { records: V0, digest: false });
        assert_eq!(snapshot_layout(b"RAFTQSNAP2\n").expect("2"), SnapshotLayout { records: V0, digest: true });
        assert_eq!(snapshot_layout(b"RAFTQSNAP3\n").expect("3"), SnapshotLayout { records: V1, digest: true });
        assert_eq!(snapshot_layout(SNAPSHOT_MAGIC).expect("4"), SnapshotLayout { records: V2, digest: true });
        for (records, magic) in [(V0, &b"RAFTQSNAP2\n"[..]), (V1, b"RAFTQSNAP3\n"), (V2, SNAPSHOT_MAGIC)] {
            assert_eq!(snapshot_magic(records), magic);
            assert_eq!(snapshot_layout(magic).expect("known").records, records);
        }
        for (magic, found) in [(&b"RAFTQSNAP5\n"[..], "5"), (b"RAFTQSNAP12", "12")] {
            let msg = snapshot_layout(magic).expect_err("newer").to_string();
            assert!(msg.contains(&format!("format version {found}")) && msg.contains("(version 4)"), "{msg}");
        }
        assert_eq!(
            [0, 1, 3, 4, 9].map(snapshot_records_for),
            [V0, V1, V1, V2, V2],
            "v2 records only once every member reads them"
        );
        for bad in [&b"RAFTQSNAP0\n"[..], b"RAFTQSNAPX\n", b"hello world"] {
            assert!(snapshot_layout(bad).expect_err("bad").to_string().contains("not a raftq snapshot"));
        }
    }

    #[test]
    fn backup_layouts_newer_than_this_binary_are_refused_by_name() {
        backup_layout(BACKUP_MAGIC).expect("1");
        for (magic, found) in [(&b"RAFTQBACKUP2\n"[..], "2"), (b"RAFTQBACKUP17", "17")] {
            let msg = backup_layout(magic).expect_err("newer").to_string();
            assert!(msg.contains(&format!("format version {found}")) && msg.contains("(version 1)"), "{msg}");
        }
        for bad in [&b"RAFTQBACKUP0\n"[..], b"RAFTQSNAP3\n\0\0", b"hello world!\n"] {
            assert!(backup_layout(bad).expect_err("bad").to_string().contains("not a raftq backup"));
        }
    }

    #[test]
    fn the_data_dir_marker_says_new_v0_v1_v2_v3_or_refuses() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(data_dir_version(dir.path()).expect("new"), None);
        fs::create_dir(dir.path().join("sm")).expect("mkdir");
        assert_eq!(data_dir_version(dir.path()).expect("v0"), Some(V0));
        fs::write(dir.path().join(DATA_DIR_MARKER), "1\n").expect("write");
        assert_eq!(data_dir_version(dir.path()).expect("v1"), Some(V1));
        fs::write(dir.path().join(DATA_DIR_MARKER), "2\n").expect("write");
        assert_eq!(data_dir_version(dir.path()).expect("v2"), Some(DIR_V2));
        mark_data_dir(dir.path()).expect("mark");
        assert_eq!(data_dir_version(dir.path()).expect("v3"), Some(DIR_V3));
        fs::write(dir.path().join(DATA_DIR_MARKER), "300\n").expect("write");
        let msg = data_dir_version(dir.path()).expect_err("newer").to_string();
        assert!(msg.contains("format version 300") && msg.contains("(version 3)"), "{msg}");
        fs::write(dir.path().join(DATA_DIR_MARKER), "one\n").expect("write");
        assert!(data_dir_version(dir.path()).expect_err("garbage").to_string().contains("unreadable"));
    }
}
