//! The worker's counters: atomics written by the slots, readable at any time as a [`WorkerSummary`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters of a [`Worker`](crate::Worker), shared with the running slots. Read them with
/// [`WorkerStats::snapshot`].
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub(crate) claimed: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) nacked: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) unconfirmed: AtomicU64,
    pub(crate) lease_extensions: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) exceptions: AtomicU64,
    pub(crate) revoked: AtomicU64,
}

/// The worker's counters at one moment; also what [`Worker::run`](crate::Worker::run) returns.
///
/// Every claimed task ends up in exactly one of completed, failed, nacked, abandoned, exceptions (an applied outcome),
/// rejected (the server refused the outcome) or unconfirmed (no answer came before shutdown), once the
/// worker has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WorkerSummary {
    /// Tasks delivered to this worker.
    pub claimed: u64,
    /// Completed outcomes the server applied.
    pub completed: u64,
    /// Failed outcomes the server applied.
    pub failed: u64,
    /// Nacks the server applied.
    pub nacked: u64,
    /// Abandons the server applied (by the handler, or by the worker at shutdown).
    pub abandoned: u64,
    /// Outcomes the server refused (`LEASE_LOST`, `NOT_IN_PROGRESS`, ...); each is also sent to
    /// [`Worker::rejections`](crate::Worker::rejections).
    pub rejected: u64,
    /// Outcomes whose answer never came before the worker stopped: they may or may not have been applied.
    pub unconfirmed: u64,
    /// Lease extensions (heartbeats) the server applied.
    pub lease_extensions: u64,
    /// Worker streams opened again after one was lost.
    pub reconnects: u64,
    /// Exceptions (`Outcome::Exception`) the server applied.
    pub exceptions: u64,
    /// Deliveries the server ended while their handlers ran (cancel, deadline, lease expiry), each signalled to
    /// its handler through [`Task::cancellation`](crate::Task::cancellation).
    pub revoked: u64,
}

impl WorkerStats {
    /// The counters now.
    pub fn snapshot(&self) -> WorkerSummary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerSummary {
            claimed: get(&self.claimed),
            completed: get(&self.completed),
            failed: get(&self.failed),
            nacked: get(&self.nacked),
            abandoned: get(&self.abandoned),
            rejected: get(&self.rejected),
            unconfirmed: get(&self.unconfirmed),
            lease_extensions: get(&self.lease_extensions),
            reconnects: get(&self.reconnects),
            exceptions: get(&self.exceptions),
            revoked: get(&self.revoked),
        }
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_every_counter() {
        let s = WorkerStats::default();
        WorkerStats::add(&s.claimed, 3);
        WorkerStats::add(&s.completed, 1);
        WorkerStats::add(&s.rejected, 2);
        WorkerStats::add(&s.reconnects, 1);
        let snap = s.snapshot();
        assert_eq!(snap, WorkerSummary { claimed: 3, completed: 1, rejected: 2, reconnects: 1, ..Default::default() });
    }
}
