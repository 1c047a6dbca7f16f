//! Opening redb files, and redb errors as the `io::Error`s openraft's storage wants. Stored values are encoded
//! and decoded by `format.rs` alone (versions included); `queue/` defines the types and never chooses an encoding.

use std::io;

/// Any redb error as an I/O error: storage errors stop the node, their kind matters less than their message.
pub fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Opens (or creates) a redb file. A file still held by a store of this process that is closing (its last
/// handle is being dropped on another thread) is waited for briefly; a file held by another process is not.
///
/// Every open verifies the checksum of every page (redb's integrity check), not only after a crash: a file
/// altered behind redb's back (a bit flip on disk, a bad copy) after a clean shutdown would otherwise be
/// trusted, and the node would serve and replicate whatever the altered bytes decode to. Such a node now
/// refuses to start; replace it (remove it, add a new node). The check reads the whole file once per start.
pub fn open_db(path: &std::path::Path) -> io::Result<redb::Database> {
    open_db_cached(path, None)
}

/// [`open_db`] with a page cache of at most `cache_bytes` (`None`: redb's default, 1 GiB). A pass over a whole
/// file that must not grow with it (a restore) sets a small one.
pub fn open_db_cached(path: &std::path::Path, cache_bytes: Option<usize>) -> io::Result<redb::Database> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let mut b = redb::Builder::new();
        b.set_check_integrity_on_open(true);
        if let Some(c) = cache_bytes {
            b.set_cache_size(c);
        }
        match b.create(path) {
            Ok(db) => return Ok(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(io::Error::other(format!("{}: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("t");

    #[test]
    fn a_file_altered_after_a_clean_close_refuses_to_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.redb");
        let value = vec![0xa5u8; 2000];
        {
            let db = open_db(&path).expect("create");
            let txn = db.begin_write().expect("write");
            txn.open_table(TABLE).expect("table").insert(b"k".as_slice(), value.as_slice()).expect("insert");
            txn.commit().expect("commit");
        }
        // A clean close, then one bit of the stored value flips on disk.
        let mut bytes = std::fs::read(&path).expect("read");
        let at = bytes.windows(value.len()).position(|w| w == value.as_slice()).expect("the value is in the file");
        bytes[at + 100] ^= 0x01;
        std::fs::write(&path, &bytes).expect("write");
        let err = open_db(&path).expect_err("an altered file must not open");
        assert!(err.to_string().contains("orrupt"), "{err}");
    }
}
