//! Encoding of stored values: bincode over serde, errors mapped to `io::Error` as openraft's storage wants.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io;

pub fn encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    bincode::serialize(v).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> io::Result<T> {
    bincode::deserialize(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Any redb error as an I/O error: storage errors stop the node, their kind matters less than their message.
pub fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The idempotency-key table key: tenant, a NUL, the key (tenant names cannot hold NUL).
pub fn key_bytes(tenant: &str, key: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(tenant.len() + 1 + key.len());
    v.extend_from_slice(tenant.as_bytes());
    v.push(0);
    v.extend_from_slice(key.as_bytes());
    v
}

/// Opens (or creates) a redb file. A file still held by a store of this process that is closing (its last
/// handle is being dropped on another thread) is waited for briefly; a file held by another process is not.
pub fn open_db(path: &std::path::Path) -> io::Result<redb::Database> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match redb::Database::create(path) {
            Ok(db) => return Ok(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(io::Error::other(format!("{}: {e}", path.display()))),
        }
    }
}
