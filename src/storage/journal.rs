//! The Raft log's journal: the file that makes a log writer turn durable with one `pwrite` and one `fdatasync`.
//!
//! A durable redb commit writes and syncs several pages (the log table's path, the table tree, the allocator
//! state, the header): about four times the CPU of one appended write and its sync (docs/performance.md). So the
//! log writer commits most turns to redb without syncing (`Durability::None`: visible to readers at once, on disk
//! only after a later durable commit) and appends the turn's operations to this file as one record, synced when
//! the turn holds an append. Every so often a turn is a *checkpoint* instead: one durable redb commit, which also
//! records in the log's meta table ([`META_JOURNAL`]) the generation whose records it covers; the next records
//! belong to the next generation and are written from the start of the file again, over the old ones.
//!
//! At open, the records of the generation after the recorded one are read from the start of the file, in order,
//! until the first one that is not whole, not of that generation or not the next in sequence (a torn write, a
//! record of an older generation, zeros). They are what was written since the last checkpoint; the log store
//! applies them to redb in one durable commit before anything else happens. A record that was not read back was
//! never acknowledged: every record before a synced one is on disk once the sync returns.
//!
//! A record: `len: u32`, `hash: u64` (of the rest), `generation: u64`, `seq: u64`, then `len` bytes of payload,
//! all little-endian. The payload is the log store's business (`log_store.rs`).
//!
//! [`META_JOURNAL`]: super::tables::META_JOURNAL

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes before a record's payload: length, hash, generation, sequence number.
const HEADER: usize = 4 + 8 + 8 + 8;
/// A record longer than this is not one (a garbage length read from old bytes).
const MAX_RECORD: usize = 1 << 30;
/// The file grows by zeros in steps of this size, ahead of the records. A write inside the file's size needs no
/// metadata in its sync (an `fdatasync` of a write that grows the file also commits the file system's journal,
/// which costs about as much CPU again), and the records of each generation overwrite the same blocks.
const GROW: u64 = 1 << 20;

pub struct Journal {
    file: File,
    /// The generation of the records written now.
    generation: u64,
    /// The next record's sequence number in its generation.
    seq: u64,
    /// Where the next record goes.
    offset: u64,
    /// The file's size.
    size: u64,
    buf: Vec<u8>,
}

impl Journal {
    /// Opens (or creates) the journal and reads back the records of `generation`, oldest first. The journal
    /// then writes `generation + 1`: the caller checkpoints what was read (and records `generation`) before the
    /// first write.
    pub fn open(path: &Path, generation: u64) -> io::Result<(Journal, Vec<Vec<u8>>)> {
        let existed = path.exists();
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        if !existed {
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        let records = read_generation(&file, generation)?;
        let size = file.metadata()?.len();
        let journal = Journal { file, generation: generation + 1, seq: 0, offset: 0, size, buf: Vec::new() };
        Ok((journal, records))
    }

    /// The generation of the records written now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes written in this generation.
    pub fn written(&self) -> u64 {
        self.offset
    }

    /// Writes one record whose payload `fill` appends to the buffer it is given; not synced.
    pub fn write(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.resize(HEADER, 0);
        fill(&mut buf);
        let len = buf.len() - HEADER;
        if len > MAX_RECORD {
            self.buf = buf;
            return Err(io::Error::other(format!("raft log journal record of {len} bytes is too long")));
        }
        buf[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        buf[12..20].copy_from_slice(&self.generation.to_le_bytes());
        buf[20..28].copy_from_slice(&self.seq.to_le_bytes());
        let h = hash(&buf[12..]);
        buf[4..12].copy_from_slice(&h.to_le_bytes());
        let end = self.offset + buf.len() as u64;
        if end > self.size {
            if let Err(e) = self.grow(end) {
                self.buf = buf;
                return Err(e);
            }
        }
        let result = self.file.write_all_at(&buf, self.offset);
        if result.is_ok() {
            self.offset += buf.len() as u64;
            self.seq += 1;
        }
        self.buf = buf;
        result
    }

    /// Extends the file with zeros past `end`, to the next multiple of [`GROW`] (synced with the next record).
    fn grow(&mut self, end: u64) -> io::Result<()> {
        let to = end.div_ceil(GROW) * GROW;
        let zeros = vec![0u8; (to - self.size).min(GROW) as usize];
        while self.size < to {
            let n = (to - self.size).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], self.size)?;
            self.size += n as u64;
        }
        Ok(())
    }

    /// Makes every record written so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// After a checkpoint that covers every record written: the next generation starts at the file's start.
    pub fn next_generation(&mut self) {
        self.generation += 1;
        self.seq = 0;
        self.offset = 0;
    }
}

/// How many records of `generation` the journal at `path` holds (none without a file), reading only.
pub fn count(path: &Path, generation: u64) -> io::Result<usize> {
    match File::open(path) {
        Ok(file) => Ok(read_generation(&file, generation)?.len()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// The records of `generation` from the start of the file, in sequence, up to the first one that is not.
fn read_generation(file: &File, generation: u64) -> io::Result<Vec<Vec<u8>>> {
    let size = file.metadata()?.len();
    let mut out = Vec::new();
    let mut offset = 0u64;
    let mut header = [0u8; HEADER];
    while offset + HEADER as u64 <= size {
        file.read_exact_at(&mut header, offset)?;
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let h = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let g = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
        let seq = u64::from_le_bytes(header[20..28].try_into().expect("8 bytes"));
        if g != generation || seq != out.len() as u64 || len > MAX_RECORD || offset + (HEADER + len) as u64 > size {
            break;
        }
        let mut rec = vec![0u8; HEADER - 12 + len];
        file.read_exact_at(&mut rec, offset + 12)?;
        if hash(&rec) != h {
            break;
        }
        out.push(rec.split_off(HEADER - 12));
        offset += (HEADER + len) as u64;
    }
    Ok(out)
}

/// A 64-bit hash of a record, to tell a whole record from a torn or stale one (not against tampering: redb's
/// checksums and the snapshot's digest cover the data at rest).
fn hash(b: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = 0x243f_6a88_85a3_08d3u64 ^ (b.len() as u64).wrapping_mul(K);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(K);
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u8, len: usize) -> Vec<u8> {
        vec![n; len]
    }

    #[test]
    fn records_of_the_open_generation_read_back_in_order_and_stop_at_a_torn_or_stale_one() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("raft-log.journal");
        // Generation 1: three records.
        let (mut j, got) = Journal::open(&path, 0).expect("open");
        assert!(got.is_empty());
        assert_eq!(j.generation(), 1);
        for n in 1..=3 {
            j.write(|b| b.extend(rec(n, 100 * n as usize))).expect("write");
        }
        j.sync().expect("sync");
        drop(j);
        let (mut j, got) = Journal::open(&path, 1).expect("reopen");
        assert_eq!(got, vec![rec(1, 100), rec(2, 200), rec(3, 300)]);
        // Another generation read back finds nothing of generation 1.
        assert!(Journal::open(&path, 2).expect("other").1.is_empty());
        // Generation 2 overwrites the start: one short record, then generation 1's bytes follow and are not read.
        assert_eq!(j.generation(), 2);
        j.write(|b| b.extend(rec(9, 10))).expect("write");
        drop(j);
        let (_, got) = Journal::open(&path, 2).expect("reopen");
        assert_eq!(got, vec![rec(9, 10)]);

        // A torn record (its last byte changed) ends the read there, whatever follows.
        let (mut j, _) = Journal::open(&path, 5).expect("gen 6");
        for n in 1..=3 {
            j.write(|b| b.extend(rec(n, 50))).expect("write");
        }
        drop(j);
        let mut bytes = std::fs::read(&path).expect("read");
        let second_end = 2 * (HEADER + 50);
        bytes[second_end - 1] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(Journal::open(&path, 6).expect("reopen").1, vec![rec(1, 50)]);
        // A file cut short in a record's header or payload: the whole records before it.
        std::fs::write(&path, &bytes[..HEADER + 50 + 10]).expect("cut");
        assert_eq!(Journal::open(&path, 6).expect("reopen").1, vec![rec(1, 50)]);
        // Zeros are not a record.
        std::fs::write(&path, vec![0u8; 4096]).expect("zeros");
        assert!(Journal::open(&path, 0).expect("reopen").1.is_empty());
    }

    #[test]
    fn next_generation_writes_from_the_start_and_counts_again() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("raft-log.journal");
        let (mut j, _) = Journal::open(&path, 3).expect("open");
        j.write(|b| b.extend(rec(1, 1000))).expect("write");
        assert_eq!(j.written(), (HEADER + 1000) as u64);
        j.next_generation();
        assert_eq!((j.generation(), j.written()), (5, 0));
        j.write(|b| b.extend(rec(2, 10))).expect("write");
        j.write(|b| b.extend(rec(3, 10))).expect("write");
        drop(j);
        assert_eq!(Journal::open(&path, 5).expect("reopen").1, vec![rec(2, 10), rec(3, 10)]);
        assert!(Journal::open(&path, 4).expect("reopen").1.is_empty(), "generation 4's record was overwritten");
        assert_eq!(std::fs::metadata(&path).expect("size").len(), GROW, "the file grows by whole steps of zeros");
    }
}
