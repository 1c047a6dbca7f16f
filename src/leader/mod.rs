//! The leader's services: what the node that leads does besides replicating.
//!
//! - `proposer`: proposes commands (coalescing enqueues and acks into few entries) and reads at a linearizable
//!   point; every node has one (a follower's proposals fail with `NotLeader` and the API forwards them).
//! - `dispatcher`: parks claim requests and proposes `Claim` entries as work becomes claimable.
//! - `ticker`: proposes `Tick` when a lease, delayed task, deadline or retention falls due.
//! - `resolver`: proposes `ResolveDependencies` for tasks whose dependencies ended.
//! - `scheduler`: proposes `FireSchedule` for due schedule occurrences.
//! - `webhooks`: sends the outbox's due deliveries and proposes their outcomes.
//! - `limits`: flow control: the depth limit on enqueues and the running cap on claims.
//! - `flow`: producer flow control: enqueues paced at the rate tasks are claimed while workers wait on the server.
//! - `versions`: the cluster version gate: raises the cluster version once every member can apply it.
//!
//! Everything they act on is replicated state, so a new leader carries on at once where the last one stopped.
//! Leadership comes from openraft's leader-change callback (`Leadership::follow`). The ticker, resolver, scheduler
//! and webhook sender work only while this node leads: each is one `Leadership::while_leading` loop around its
//! work for one term. The dispatcher runs for the node's life, because it also answers followers' claims
//! (`NOT_LEADER`). Nothing here may run inside apply or block it.

pub mod dispatcher;
pub mod flow;
pub mod limits;
pub mod proposer;
pub mod resolver;
pub mod scheduler;
pub mod ticker;
pub mod versions;
pub mod webhooks;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::raft::types::TypeConfig;
use crate::storage::Raft;
use proposer::Proposer;

/// Whether this node leads (from openraft's leader-change callback), and the node's shutdown.
#[derive(Clone)]
pub struct Leadership {
    leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
}

impl Leadership {
    /// Follows openraft's leader-change callback. The callback stays registered until the returned handle is
    /// closed (the node's stop does that).
    pub fn follow(raft: &Raft, shutdown: CancellationToken) -> (Leadership, openraft::WatchChangeHandle<TypeConfig>) {
        let (tx, leading) = watch::channel(false);
        let tx = Arc::new(tx);
        let (up, down) = (tx.clone(), tx);
        let handle = raft.on_leader_change(
            move |_| {
                up.send_replace(true);
                async {}
            },
            move |_| {
                down.send_replace(false);
                async {}
            },
        );
        (Leadership { leading, shutdown }, handle)
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits for the next leadership change; `false` once no more can come (the callback is gone).
    pub async fn changed(&mut self) -> bool {
        self.leading.changed().await.is_ok()
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The one loop of the leader-only services: runs `term()` for each stretch of time this node leads, until
    /// the node shuts down. A term's future is dropped (so its work and in-flight requests are cancelled) as soon
    /// as leadership is lost; whatever it left undone is in replicated state for the next leader. A term that
    /// returns early waits for the next one.
    pub async fn while_leading<F, Fut>(mut self, mut term: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                r = self.leading.wait_for(|l| *l) => if r.is_err() { return },
            }
            let mut lost = self.leading.clone();
            let returned = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = lost.wait_for(|l| !*l) => false,
                _ = term() => true,
            };
            if returned {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    _ = lost.wait_for(|l| !*l) => {}
                }
            }
        }
    }
}

/// Starts the leader-only services that act on their own (the dispatcher and proposer serve requests and are
/// started with the API): the ticker, the dependency resolver, the schedule ticker and the webhook sender.
pub fn spawn(
    proposer: &Arc<Proposer>,
    cfg: &Config,
    webhook_key: Option<Vec<u8>>,
    leadership: &Leadership,
    tasks: &TaskTracker,
) {
    let p = proposer.clone();
    tasks.spawn(leadership.clone().while_leading(move || ticker::lead(p.clone())));
    let p = proposer.clone();
    tasks.spawn(leadership.clone().while_leading(move || resolver::lead(p.clone())));
    let p = proposer.clone();
    tasks.spawn(leadership.clone().while_leading(move || scheduler::lead(p.clone())));
    let p = proposer.clone();
    let sender = webhooks::Sender::new(cfg, webhook_key);
    tasks.spawn(leadership.clone().while_leading(move || sender.clone().lead(p.clone())));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    use super::*;

    /// Counts running terms: +1 when a term starts, -1 when its future is dropped.
    struct Running(Arc<AtomicUsize>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.fetch_sub(1, SeqCst);
        }
    }

    /// Lets the loop under test run until it waits again (a current-thread runtime: nothing else runs).
    async fn settle() {
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_term_runs_only_while_leading_and_stops_at_shutdown() {
        let (tx, leading) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let leadership = Leadership { leading, shutdown: shutdown.clone() };
        let (running, started) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (r, s) = (running.clone(), started.clone());
        let task = tokio::spawn(leadership.while_leading(move || {
            let (r, s) = (r.clone(), s.clone());
            async move {
                r.fetch_add(1, SeqCst);
                s.fetch_add(1, SeqCst);
                let _guard = Running(r);
                std::future::pending::<()>().await;
            }
        }));
        settle().await;
        assert_eq!((running.load(SeqCst), started.load(SeqCst)), (0, 0), "no term while following");
        tx.send_replace(true);
        settle().await;
        assert_eq!((running.load(SeqCst), started.load(SeqCst)), (1, 1), "a term starts on leadership");
        tx.send_replace(true);
        settle().await;
        assert_eq!(started.load(SeqCst), 1, "still leading: the same term goes on");
        tx.send_replace(false);
        settle().await;
        assert_eq!(running.load(SeqCst), 0, "the term is dropped when leadership is lost");
        tx.send_replace(true);
        settle().await;
        assert_eq!((running.load(SeqCst), started.load(SeqCst)), (1, 2), "a new term on leading again");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("ends at shutdown").expect("no panic");
        assert_eq!(running.load(SeqCst), 0, "the term is dropped at shutdown");
    }
}
