//! The cluster version: which commands (and which snapshot records) the replicas may be sent.
//!
//! A binary can apply commands up to [`SUPPORTED`]. The cluster runs at the version the log says (the last
//! `SetClusterVersion` applied; 0 before any), and the leader raises it only once every member, voter or learner,
//! has said it can apply the next one (the gate, `leader::versions`). So during a rolling upgrade a replica never
//! receives a command or a snapshot it cannot read, and every replica applies the same entries the same way; the
//! switch itself is an entry of the log, at one index on every replica.
//!
//! | version | what it allows                                                                   |
//! |---------|----------------------------------------------------------------------------------|
//! | 0       | every command up to `FireSchedule`; snapshots of v0 records (`RAFTQSNAP2`)       |
//! | 1       | `SetClusterVersion` itself; snapshots of v1 records (`RAFTQSNAP3`)                |
//! | 2       | `SetLimits`, `SetFairnessWeight`, `SetRateLimit`, `RatedClaim` (and their `l`, `w`, `r` shard records) |
//! | 3       | `EnqueueKeyed` (debounce and singleton keys; their records are idempotency-key records, `KeyRecord`); `SetKeyLimit` (concurrency key overrides, and their `o` shard records) |
//! | 4       | snapshots of v2 records (`RAFTQSNAP4`: variable-length integers, `storage::format`)                |
//! | 5       | Raft messages in bincode with variable-length integers (`raft::network::Wire::Varint`)             |
//!
//! A node's own files are its own business (`storage::format`): a newer binary upgrades them at start whatever
//! the cluster version. A binary from before cluster versions applies version 0 and does not answer the version
//! call; it is counted as 0.
//!
//! Adding a version: give `SUPPORTED` the next number, add the row above, make each new command's
//! `Command::required_version` return it (the proposer refuses it before the switch), and keep every older
//! command's meaning.

use std::io;

/// The newest cluster version this binary can apply.
pub const SUPPORTED: u32 = 5;

/// Refuses an entry raising the cluster version past what this binary can apply: the node stops (apply fails)
/// rather than apply entries of a version it does not know. The gate never proposes one while this node is a
/// member; a node that gets there was downgraded after the switch.
pub fn check_can_apply(version: u32) -> io::Result<()> {
    if version > SUPPORTED {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the cluster runs at version {version}, newer than this binary supports (version {SUPPORTED}): \
                 it was raised by newer raftq nodes; run that version or newer on this node"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_past_this_binary_is_refused_naming_both() {
        assert!(check_can_apply(SUPPORTED).is_ok());
        assert!(check_can_apply(0).is_ok());
        let msg = check_can_apply(SUPPORTED + 1).expect_err("newer").to_string();
        assert!(
            msg.contains(&format!("version {}", SUPPORTED + 1)) && msg.contains(&format!("(version {SUPPORTED})")),
            "{msg}"
        );
    }
}
