//! The dependency resolver: leader-only work that tells tasks waiting on dependencies that those ended.
//!
//! A dependency usually lives in another shard than the task waiting on it, and apply may only read its own
//! shard (the sharding rule). So the leader, reading replicated state, proposes `ResolveDependencies` with each
//! ended dependency's outcome; apply on the waiting task's shard crosses it off (idempotent: a dependency already
//! crossed off is ignored). It runs when a task ends (the state machine's `ended` notifications) while
//! some task waits on a dependency, and when such a task appears; it scans everything every `SCAN_INTERVAL` and
//! when it becomes leader, which covers a dependency that ended before its dependent existed, lost notifications
//! and a leader change.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use super::proposer::Proposer;
use crate::queue::Command;

/// The safety-net scan period: bounds how late a dependency that ended unnoticed is resolved.
const SCAN_INTERVAL: Duration = Duration::from_millis(250);
/// Resolutions per proposed entry.
const MAX_PER_ENTRY: usize = 1_000;

/// The resolver's work for one term: a scan at once (it may just have become leader), then one after each batch
/// of ended tasks while a task waits on a dependency, when such a task appears, and every `SCAN_INTERVAL`.
pub async fn lead(proposer: Arc<Proposer>) {
    let mut ended = proposer.shared.ended.subscribe();
    let mut dependents = proposer.shared.dependents.subscribe();
    loop {
        match proposer.shared.dependency_resolutions(MAX_PER_ENTRY) {
            Ok(items) if items.is_empty() => {}
            Ok(items) => {
                if let Err(e) = proposer.write(Command::ResolveDependencies(items)).await {
                    tracing::debug!(error = %e, "dependency resolutions not applied");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read dependencies"),
        }
        if !*dependents.borrow_and_update() {
            // No task waits on a dependency: an ended task concerns none, so the batches that end tasks (nearly
            // every one under load) do not wake this. A dependent's arrival does; the scan then covers what ended
            // meanwhile, and the notifications of that time are skipped.
            tokio::select! {
                r = dependents.changed() => {
                    if r.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep(SCAN_INTERVAL) => {}
            }
            ended = ended.resubscribe();
            continue;
        }
        tokio::select! {
            r = ended.recv() => {
                if matches!(r, Err(RecvError::Closed)) {
                    return;
                }
                // Take whatever else ended meanwhile: one scan covers it all.
                while ended.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(SCAN_INTERVAL) => {}
        }
    }
}
