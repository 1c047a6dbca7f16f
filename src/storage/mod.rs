//! redb storage: table definitions, the Raft log store, the shard stores of the state machine, snapshots.
//!
//! Implements openraft's storage traits for `raft::types::TypeConfig` (this layer imports `raft::types`; `raft`
//! never imports `storage`); the rules of the queue itself live in `crate::queue`.

mod apply;
pub mod backup;
pub mod codec;
pub mod downgrade;
pub mod files;
mod flush;
pub mod format;
pub mod journal;
pub mod log_store;
mod read_view;
pub mod shard;
mod snapshot;
pub mod state_machine;
pub mod tables;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use log_store::{LogReader, LogStore};
pub use read_view::{FairnessRow, KeyLimitRow, RateRow};
pub use snapshot::SnapshotBuilder;
pub use state_machine::{Shards, SmShared, StateMachine};

/// The Raft handle of a node: openraft over this storage's state machine.
pub type Raft = openraft::Raft<crate::raft::types::TypeConfig, StateMachine>;

/// Opens a node's data directory: refuses one of a newer format before anything in it is written, opens (and
/// upgrades, see `format`) the log and the state machine, then marks the directory with the current format.
pub fn open_data_dir(dir: &std::path::Path, shards: usize) -> std::io::Result<(LogStore, StateMachine)> {
    std::fs::create_dir_all(dir)?;
    let found = format::data_dir_version(dir)?;
    // Every file is checked before any is opened for writing (which rewrites a redb header), so a refused start
    // leaves the whole directory as it was.
    format::refuse_newer_file(&files::log_path(dir), tables::LOG_META)?;
    let sm_dir = files::sm_dir(dir);
    for shard in (0..).map(|i| files::shard_path(&sm_dir, i)).take_while(|p| p.exists()) {
        format::refuse_newer_file(&shard, tables::SHARD_META)?;
    }
    snapshot::check_current(dir)?;
    let log = LogStore::open(&files::log_path(dir))?;
    let sm = StateMachine::open(dir, shards)?;
    if found != Some(format::DIR_CURRENT) {
        format::mark_data_dir(dir)?;
    }
    Ok((log, sm))
}
