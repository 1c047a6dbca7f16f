//! Tells a worker at once that a delivery it holds is over: which worker stream of this node holds which
//! delivery, and a `LeaseRevoked` frame pushed on it when the state machine ends that delivery without its worker
//! (a cancel, the task's deadline, the lease's expiry).
//!
//! Every node applies the log, so each node tells the streams it serves from its own apply: a follower proxying a
//! worker stream learns of the cancel by replicating it, with no relay from the leader. A stream holds a delivery
//! from the TaskBatch that carried it (or from a lease extension applied on it, so a worker that reconnected to
//! another node is covered again within one heartbeat) until the worker's outcome for it is answered or the
//! stream ends. This module decides nothing: the state machine already ended the delivery; it only tells.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftq_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::queue::{IdHasher, IdMap, RevokedLease, RunOutcome, TaskId, TaskState};
use crate::storage::SmShared;

type Out = mpsc::Sender<Result<pb::ServerEvent, Status>>;

/// Revocations remembered for deliveries no stream held yet: the stream that carried the delivery may register
/// it just after the revocation was applied (a follower applies a cancel before the leader's claim answer
/// arrives). Bounded: older ones are forgotten.
const RECENT_REVOKED: usize = 4096;
/// Longest wait for room in a stream's send buffer before a revocation is dropped (the worker's next lease
/// extension is refused anyway, which tells it too).
const SEND_WAIT: Duration = Duration::from_secs(1);

struct Hold {
    token: u64,
    /// Shared by the deliveries of one batch: one clone of the stream's sender per batch, not per task.
    out: Arc<Out>,
}

/// Keyed by task id (parsed: no key is allocated per delivery, and ids hash cheaply). Only ids of tasks this
/// node delivered or saw revoked are inserted, so an id a worker makes up is only ever looked up.
#[derive(Default)]
struct Holds {
    by_task: IdMap<Hold>,
    /// Revocations no stream held, with their reason; `recent_order` says which to forget first.
    recent: HashMap<(TaskId, u64), &'static str, BuildHasherDefault<IdHasher>>,
    recent_order: VecDeque<(TaskId, u64)>,
}

impl Holds {
    /// Takes the hold of this delivery; a hold of another delivery of the task stays.
    fn remove(&mut self, task_id: TaskId, token: u64) -> Option<Hold> {
        match self.by_task.entry(task_id) {
            std::collections::hash_map::Entry::Occupied(e) if e.get().token == token => Some(e.remove()),
            _ => None,
        }
    }
}

/// The deliveries held by this node's worker streams.
#[derive(Default)]
pub struct LeaseWatch {
    holds: Mutex<Holds>,
}

fn revoked_event(task_id: &str, token: u64, reason: &str) -> pb::ServerEvent {
    pb::ServerEvent {
        event: Some(pb::server_event::Event::Revoked(pb::LeaseRevoked {
            task_id: task_id.to_string(),
            token,
            reason: reason.to_string(),
        })),
    }
}

impl LeaseWatch {
    pub fn new() -> Arc<LeaseWatch> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stream `out` holds these deliveries (their TaskBatch was sent, or extensions of them applied). A
    /// delivery revoked just before is pushed at once.
    pub fn hold(&self, deliveries: &[(TaskId, u64)], out: &Out) {
        if deliveries.is_empty() {
            return;
        }
        let shared = Arc::new(out.clone());
        let mut revoked = Vec::new();
        {
            let mut h = self.lock();
            for &(id, token) in deliveries {
                match h.recent.get(&(id, token)).copied() {
                    Some(why) => revoked.push((id, token, why)),
                    None => {
                        h.by_task.insert(id, Hold { token, out: shared.clone() });
                    }
                }
            }
        }
        for (id, token, why) in revoked {
            let _ = out.try_send(Ok(revoked_event(&id.to_string(), token, why)));
        }
    }

    /// The worker's outcomes for these deliveries were answered: the stream no longer holds them.
    pub fn release(&self, deliveries: &[(TaskId, u64)]) {
        if deliveries.is_empty() {
            return;
        }
        let mut h = self.lock();
        for &(id, token) in deliveries {
            h.remove(id, token);
        }
    }

    /// The stream ended: it holds nothing any more.
    pub fn forget_stream(&self, out: &Out) {
        self.lock().by_task.retain(|_, x| !x.out.same_channel(out));
    }

    /// Deliveries held now (for tests and the lag scan).
    pub fn held(&self) -> usize {
        self.lock().by_task.len()
    }

    /// Takes the stream holding this delivery, or remembers the revocation for a hold that comes late.
    fn take(&self, task_id: TaskId, token: u64, why: &'static str) -> Option<Arc<Out>> {
        let mut h = self.lock();
        if let Some(held) = h.remove(task_id, token) {
            return Some(held.out);
        }
        if h.recent.insert((task_id, token), why).is_none() {
            h.recent_order.push_back((task_id, token));
            while h.recent_order.len() > RECENT_REVOKED {
                if let Some(old) = h.recent_order.pop_front() {
                    h.recent.remove(&old);
                }
            }
        }
        None
    }

    async fn push(&self, r: &RevokedLease) {
        let why = r.outcome.as_str();
        let Some(out) = self.take(r.task_id, r.token, why) else { return };
        let task_id = r.task_id.to_string();
        tracing::debug!(task_id, token = r.token, reason = why, "telling the worker its delivery is over");
        match out.try_send(Ok(revoked_event(&task_id, r.token, why))) {
            Err(mpsc::error::TrySendError::Full(ev)) => {
                let _ = tokio::time::timeout(SEND_WAIT, out.send(ev)).await;
            }
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Pushes each revocation the state machine reports to the stream holding it, until shutdown. After a lag
    /// (revocations missed), every held delivery is checked against the state instead.
    pub async fn run(self: Arc<Self>, shared: Arc<SmShared>, shutdown: CancellationToken) {
        let mut rx = shared.revoked.subscribe();
        loop {
            let r = tokio::select! {
                r = rx.recv() => r,
                _ = shutdown.cancelled() => return,
            };
            match r {
                Ok(r) => self.push(&r).await,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "revocations lagged; checking every held delivery");
                    self.rescan(&shared).await;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn rescan(&self, shared: &Arc<SmShared>) {
        let held: Vec<(TaskId, u64)> = self.lock().by_task.iter().map(|(t, h)| (*t, h.token)).collect();
        let shared = shared.clone();
        let ended = tokio::task::spawn_blocking(move || {
            held.into_iter()
                .filter_map(|(task_id, token)| {
                    let t = shared.get_task(&task_id).ok()??;
                    let run = t.runs.iter().rev().find(|r| r.token == token)?;
                    let outcome = run.outcome?;
                    let by_worker = t.state == TaskState::InProgress
                        || !matches!(
                            outcome,
                            RunOutcome::Cancelled | RunOutcome::DeadlineExceeded | RunOutcome::LeaseExpired
                        );
                    (!by_worker).then_some(RevokedLease { task_id, token, outcome })
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for r in ended {
            self.push(&r).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> TaskId {
        TaskId([n; 16])
    }

    fn revoked(n: u8, token: u64) -> RevokedLease {
        RevokedLease { task_id: id(n), token, outcome: RunOutcome::Cancelled }
    }

    fn next(rx: &mut mpsc::Receiver<Result<pb::ServerEvent, Status>>) -> Option<pb::LeaseRevoked> {
        match rx.try_recv().ok()?.ok()?.event? {
            pb::server_event::Event::Revoked(r) => Some(r),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_revocation_reaches_the_stream_holding_that_delivery_only() {
        let w = LeaseWatch::new();
        let (a, mut ra) = mpsc::channel(4);
        let (b, mut rb) = mpsc::channel(4);
        w.hold(&[(id(1), 7)], &a);
        w.hold(&[(id(2), 8)], &b);
        w.push(&revoked(1, 6)).await; // an older delivery of the task: not this stream's
        assert!(next(&mut ra).is_none());
        w.push(&revoked(1, 7)).await;
        let r = next(&mut ra).expect("pushed");
        assert_eq!((r.task_id, r.token, r.reason.as_str()), (id(1).to_string(), 7, "CANCELLED"));
        assert!(next(&mut rb).is_none());
        w.push(&revoked(1, 7)).await;
        assert!(next(&mut ra).is_none(), "pushed once");
    }

    #[tokio::test]
    async fn released_and_forgotten_deliveries_are_not_pushed() {
        let w = LeaseWatch::new();
        let (a, mut ra) = mpsc::channel(4);
        w.hold(&[(id(1), 7), (id(2), 8)], &a);
        w.release(&[(id(1), 7)]);
        assert_eq!(w.held(), 1);
        w.forget_stream(&a);
        assert_eq!(w.held(), 0);
        w.push(&revoked(1, 7)).await;
        w.push(&revoked(2, 8)).await;
        assert!(next(&mut ra).is_none());
    }

    #[tokio::test]
    async fn a_hold_registered_after_its_revocation_is_pushed_at_once() {
        let w = LeaseWatch::new();
        let (a, mut ra) = mpsc::channel(4);
        w.push(&RevokedLease { task_id: id(3), token: 9, outcome: RunOutcome::LeaseExpired }).await;
        // In a batch with a delivery not revoked, which is held.
        w.hold(&[(id(4), 1), (id(3), 9)], &a);
        let r = next(&mut ra).expect("pushed on hold");
        assert_eq!((r.task_id, r.token, r.reason.as_str()), (id(3).to_string(), 9, "LEASE_EXPIRED"));
        assert!(next(&mut ra).is_none());
        assert_eq!(w.held(), 1);
    }
}
