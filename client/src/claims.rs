//! Claiming and reporting tasks one request at a time, on the [`Producer`]'s connection: for scripts, tools
//! and the CLI. A long-running worker uses [`Worker`](crate::Worker) instead (one stream, lease extension,
//! every answer checked).

use std::time::Duration;

use raftq_proto::v1 as pb;

use crate::error::Result;
use crate::producer::{Kind, Producer};
use crate::task::{duration_ms, Task, TaskState};
use crate::worker::{ack_action, Outcome};

/// What [`Producer::claim`] asks for, built step by step:
///
/// ```
/// use std::time::Duration;
/// use raftq_client::Claim;
/// let c = Claim::new("script-1", ["emails"]).count(10).lease(Duration::from_secs(60)).wait(Duration::from_secs(5));
/// # let _ = c;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    worker_id: String,
    queues: Vec<String>,
    count: u32,
    lease: Duration,
    wait: Duration,
}

impl Claim {
    /// One task of `queues` for `worker_id`, under the server's default lease, answered at once.
    pub fn new(worker_id: impl Into<String>, queues: impl IntoIterator<Item = impl Into<String>>) -> Claim {
        Claim {
            worker_id: worker_id.into(),
            queues: queues.into_iter().map(Into::into).collect(),
            count: 1,
            lease: Duration::ZERO,
            wait: Duration::ZERO,
        }
    }

    /// Up to this many tasks (default 1).
    pub fn count(mut self, count: u32) -> Claim {
        self.count = count;
        self
    }

    /// The lease of each task (default: the server's).
    pub fn lease(mut self, lease: Duration) -> Claim {
        self.lease = lease;
        self
    }

    /// Wait up to this long for work when none is ready (default: answer at once, bounded by the server).
    pub fn wait(mut self, wait: Duration) -> Claim {
        self.wait = wait;
        self
    }
}

/// The server's answer to a [`Producer::report`] or [`Producer::extend_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acked {
    /// The task's state after the report.
    pub state: TaskState,
    /// A lease extension: the new deadline; a retry: when the task is claimable again (ms since the Unix
    /// epoch); else 0.
    pub at_ms: i64,
    /// A completion with follow-ups: the ids of the tasks it created, in order.
    pub follow_up_ids: Vec<String>,
}

impl Acked {
    fn from_proto(a: pb::AckResponse) -> Acked {
        let pb::AckResponse { state, at_ms, follow_up_ids } = a;
        Acked { state: TaskState::from_proto(state), at_ms, follow_up_ids }
    }
}

impl Producer {
    /// Claims tasks under a lease. Each comes with its fencing token ([`Task::token`]): report it with
    /// [`Producer::report`] before the lease runs out, or it is delivered again. A claim whose outcome is
    /// unknown is not retried (the tasks come back when their leases run out).
    pub async fn claim(&self, claim: &Claim) -> Result<Vec<Task>> {
        let Claim { worker_id, queues, count, lease, wait } = claim;
        let req = pb::ClaimRequest {
            worker_id: worker_id.clone(),
            queues: queues.clone(),
            count: *count,
            lease_ms: duration_ms(*lease),
            wait_ms: duration_ms(*wait),
        };
        let r = self
            .call(Kind::Write, *wait, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.claim(req).await }
            })
            .await?;
        Ok(r.tasks.into_iter().map(Task::from_proto).collect())
    }

    /// Reports the outcome of a claimed task's delivery (`token` is its fencing token). A stale token is
    /// refused with `LEASE_LOST`; the token makes a repeated report apply at most once.
    pub async fn report(&self, task_id: &str, token: u64, outcome: Outcome) -> Result<Acked> {
        self.ack(task_id, token, ack_action(&outcome)).await
    }

    /// Extends a claimed task's lease by `by` from now (zero: the server's default lease), recording
    /// `progress` (0-100 and a message) with it when given.
    pub async fn extend_lease(
        &self,
        task_id: &str,
        token: u64,
        by: Duration,
        progress: Option<(u32, &str)>,
    ) -> Result<Acked> {
        let heartbeat = pb::Heartbeat {
            extend_ms: duration_ms(by),
            progress: progress.map(|(percent, message)| pb::Progress {
                percent,
                message: message.to_string(),
                at_ms: 0,
            }),
        };
        self.ack(task_id, token, pb::ack_request::Action::Heartbeat(heartbeat)).await
    }

    async fn ack(&self, task_id: &str, token: u64, action: pb::ack_request::Action) -> Result<Acked> {
        let req = pb::AckRequest { task_id: task_id.to_string(), token, action: Some(action) };
        let r = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.ack(req).await }
            })
            .await?;
        Ok(Acked::from_proto(r))
    }
}
