//! Queue-level calls on the [`Producer`]: the per-state counts of each queue ([`QueueStats`]) and the
//! dead-letter queue (list, redrive, purge). They use `TaskService` on the producer's connection, with the
//! producer's retry rules.

use std::time::Duration;

use raftq_proto::v1 as pb;

use crate::error::Result;
use crate::producer::{Kind, Producer};
use crate::task::Task;

/// How many tasks of one queue are in each state (see [`Producer::queue_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Claimable now.
    pub pending: u64,
    /// Pending, but not before their visible time (delayed, backing off, waiting on dependencies).
    pub delayed: u64,
    /// Claimed under a lease.
    pub in_progress: u64,
    /// Ended with a result (kept for the retention period).
    pub completed: u64,
    /// Ended with a failure.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Out of attempts, waiting to be redriven or purged.
    pub dead_lettered: u64,
    /// Paused: accepts enqueues, serves no claims.
    pub paused: bool,
}

impl QueueStats {
    fn from_proto(q: pb::QueueStats) -> QueueStats {
        let pb::QueueStats {
            queue,
            pending,
            delayed,
            in_progress,
            completed,
            failed,
            cancelled,
            dead_lettered,
            paused,
        } = q;
        QueueStats { queue, pending, delayed, in_progress, completed, failed, cancelled, dead_lettered, paused }
    }
}

/// Which dead-lettered tasks of a queue a redrive or purge acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetters {
    /// Every dead-lettered task of the queue.
    All,
    /// These tasks (ids that are not dead-lettered in the queue are skipped).
    Ids(Vec<String>),
}

impl DeadLetters {
    fn selection(&self, queue: &str) -> pb::DeadLetterSelection {
        match self {
            DeadLetters::All => pb::DeadLetterSelection { queue: queue.to_string(), ids: vec![], all: true },
            DeadLetters::Ids(ids) => pb::DeadLetterSelection { queue: queue.to_string(), ids: ids.clone(), all: false },
        }
    }
}

impl Producer {
    /// The per-state counts of `queues` (empty: every queue of the tenant).
    pub async fn queue_stats(&self, queues: &[&str]) -> Result<Vec<QueueStats>> {
        let req = pb::QueueStatsRequest { queues: queues.iter().map(|q| q.to_string()).collect() };
        let stale = self.stale;
        let r = self
            .call(Kind::Read, Duration::ZERO, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.queue_stats(req).await }
            })
            .await?;
        Ok(r.queues.into_iter().map(QueueStats::from_proto).collect())
    }

    /// Up to `limit` dead-lettered tasks of `queue` (0: the server's default of 100), oldest first.
    pub async fn dead_letters(&self, queue: &str, limit: u32) -> Result<Vec<Task>> {
        let req = pb::ListDeadLettersRequest { queue: queue.to_string(), limit };
        let stale = self.stale;
        let r = self
            .call(Kind::Read, Duration::ZERO, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.list_dead_letters(req).await }
            })
            .await?;
        Ok(r.tasks.into_iter().map(Task::from_proto).collect())
    }

    /// Moves dead-lettered tasks of `queue` back to pending with their attempts reset; returns the ids moved.
    pub async fn redrive(&self, queue: &str, which: &DeadLetters) -> Result<Vec<String>> {
        let req = which.selection(queue);
        let r = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.redrive(req).await }
            })
            .await?;
        Ok(r.ids)
    }

    /// Deletes dead-lettered tasks of `queue` (needs the `admin` scope); returns the ids deleted.
    pub async fn purge_dead_letters(&self, queue: &str, which: &DeadLetters) -> Result<Vec<String>> {
        let req = which.selection(queue);
        let r = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.purge_dead_letters(req).await }
            })
            .await?;
        Ok(r.ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_is_all_or_the_ids() {
        assert_eq!(
            DeadLetters::All.selection("q"),
            pb::DeadLetterSelection { queue: "q".into(), ids: vec![], all: true }
        );
        assert_eq!(
            DeadLetters::Ids(vec!["a".into()]).selection("q"),
            pb::DeadLetterSelection { queue: "q".into(), ids: vec!["a".into()], all: false }
        );
    }
}
