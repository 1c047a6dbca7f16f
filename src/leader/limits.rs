//! Flow control on the leader: the depth limit on enqueues (backpressure) and the running cap on claims.
//!
//! Limits (`queue::Limits`) are replicated records; enforcing them needs counts over every shard, which no single
//! shard's apply may read. So the leader, which alone proposes enqueues and claims, decides: it admits an enqueue
//! or a claim only if the applied counts, plus what it has itself proposed and not yet seen applied, stay within
//! the limits. Its decisions are entries of the log, so every replica applies the same. An enqueue that does not
//! fit waits for room for a while (`Admission::admit_or_hold`, `depth_hold_ms`) before it is refused, so a full
//! queue that workers drain is topped up as they drain it.
//!
//! A leader decides only once it has applied an entry of its own term (`caught_up`): every entry of earlier terms
//! is applied by then, so the counts include whatever an earlier leader admitted. Until then an enqueue to a
//! limited queue waits for a linearizable read point, and a capped queue gets no claims.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use openraft::type_config::async_runtime::watch::WatchReceiver;

use super::proposer::ProposeError;
use crate::queue::{Limits, NewTask, QueueKey};
use crate::storage::{Raft, SmShared};

/// Whether this node leads and has applied an entry of its own term (so all earlier terms are applied).
pub fn caught_up(raft: &Raft) -> bool {
    let rx = raft.metrics();
    let m = rx.borrow_watched();
    m.state.is_leader() && m.last_applied.as_ref().is_some_and(|l| l.leader_id.term == m.current_term)
}

/// Whether this node leads now.
pub fn is_leader(raft: &Raft) -> bool {
    raft.metrics().borrow_watched().state.is_leader()
}

/// Enqueues admitted by this leader and not yet answered, per queue and per tenant (under an empty queue name).
#[derive(Default)]
pub struct Admission {
    in_flight: Mutex<HashMap<QueueKey, u64>>,
    /// Enqueues waiting for room in a full queue (`admit_or_hold`) line up per limit that refused them: the
    /// first of each line re-checks at every apply (and every `RECHECK`), the rest wait their turn, so a hundred
    /// held creates cost one check per apply, not a hundred.
    lines: Mutex<HashMap<QueueKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds an admitted enqueue's place until its write is answered (by then apply counts it).
pub struct Admitted {
    admission: Arc<Admission>,
    taken: Vec<(QueueKey, u64)>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut g = self.admission.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        for (qk, n) in self.taken.drain(..) {
            if let Some(v) = g.get_mut(&qk) {
                *v = v.saturating_sub(n);
                if *v == 0 {
                    g.remove(&qk);
                }
            }
        }
    }
}

/// The limit an enqueue ran into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    pub tenant: String,
    /// Empty: the tenant's limit over all its queues.
    pub queue: String,
    pub max_depth: u64,
    pub waiting: u64,
    pub adding: u64,
    pub retry_after_ms: u64,
}

impl Admission {
    /// Checks `items` whole: for each queue and tenant they touch that has a depth limit, the waiting tasks
    /// (applied pending and delayed, plus admitted enqueues in flight) plus these must fit. Admitted, they hold
    /// their place until the `Admitted` is dropped. The caller must be caught up (`caught_up`). `None` when no
    /// limit applies (nothing is held). A refusal names the limit and carries no retry hint yet (`refusal` adds
    /// it: the completion rates it needs are summed over minutes of every shard, and a held enqueue re-checks
    /// often). The limits are looked at in one order (the queue's before the tenant's, then by name), and one
    /// that the items alone exceed is named first, so the same items are always refused for the same limit.
    fn check<T: std::borrow::Borrow<NewTask>>(
        self: &Arc<Self>,
        shared: &SmShared,
        items: &[T],
    ) -> Result<Option<Admitted>, Box<Full>> {
        let mut adding: HashMap<QueueKey, u64> = HashMap::new();
        for t in items.iter().map(|t| t.borrow()) {
            *adding.entry(QueueKey::new(&t.tenant, &t.queue)).or_default() += 1;
            *adding.entry(QueueKey::new(&t.tenant, "")).or_default() += 1;
        }
        let mut limited: Vec<(QueueKey, u64, u64)> = adding
            .into_iter()
            .filter_map(|(qk, n)| {
                let max = shared.limits(&qk.tenant, &qk.queue).and_then(|l: Limits| l.max_depth)?;
                Some((qk, n, max))
            })
            .collect();
        if limited.is_empty() {
            return Ok(None);
        }
        limited.sort_by(|a, b| (a.0.queue.is_empty(), &a.0).cmp(&(b.0.queue.is_empty(), &b.0)));
        let full = |qk: &QueueKey, n: u64, max: u64, waiting: u64| {
            Box::new(Full {
                tenant: qk.tenant.clone(),
                queue: qk.queue.clone(),
                max_depth: max,
                waiting,
                adding: n,
                retry_after_ms: 0,
            })
        };
        let mut g = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let counted = |qk: &QueueKey, g: &HashMap<QueueKey, u64>| {
            let c = shared.queue_counts(&qk.tenant, &qk.queue);
            c.pending + c.delayed + g.get(qk).copied().unwrap_or(0)
        };
        if let Some((qk, n, max)) = limited.iter().find(|(_, n, max)| n > max) {
            return Err(full(qk, *n, *max, counted(qk, &g)));
        }
        for (qk, n, max) in &limited {
            let waiting = counted(qk, &g);
            if waiting + n > *max {
                return Err(full(qk, *n, *max, waiting));
            }
        }
        let taken: Vec<(QueueKey, u64)> = limited.into_iter().map(|(qk, n, _)| (qk, n)).collect();
        for (qk, n) in &taken {
            *g.entry(qk.clone()).or_default() += n;
        }
        Ok(Some(Admitted { admission: self.clone(), taken }))
    }
}

/// How often a held enqueue re-checks for room when no apply wakes it.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

impl Admission {
    /// Admits `items` whole (`check`), but items that find a limit full wait up to `hold` for room instead of
    /// being refused at once: apply makes room as it applies claims (and cancels, and deletions), and the waiting
    /// enqueues of a limit are let in as soon as they fit, in the order they came to wait (an enqueue that
    /// arrives meanwhile and fits goes in at once). Refused with `QUEUE_FULL` and a retry hint when `hold` runs
    /// out (after a last look), or at once when the items alone exceed a limit or `hold` is zero. If this node
    /// stops leading (or leads again in a later term, whose counts it has not caught up on) while they wait, they
    /// are answered `NOT_LEADER`, so the client goes to the new leader. Nothing is proposed while an enqueue
    /// waits, so either answer applied nothing.
    pub async fn admit_or_hold<T: std::borrow::Borrow<NewTask>>(
        self: &Arc<Self>,
        raft: &Raft,
        shared: &SmShared,
        items: &[T],
        hold: std::time::Duration,
    ) -> Result<Option<Admitted>, ProposeError> {
        let full = match self.check(shared, items) {
            Err(f) => f,
            Ok(admitted) => return Ok(admitted),
        };
        if hold.is_zero() || full.adding > full.max_depth {
            return Err(refusal(shared, full));
        }
        let term = raft.metrics().borrow_watched().current_term;
        let key = QueueKey::new(&full.tenant, &full.queue);
        let line = self.lines.lock().unwrap_or_else(|p| p.into_inner()).entry(key.clone()).or_default().clone();
        shared.metrics.enqueue_held_full.fetch_add(items.len() as u64, Relaxed);
        let deadline = tokio::time::Instant::now() + hold;
        let out = self.wait_in_line(&line, raft, term, shared, items, deadline).await;
        // A line nobody else holds or waits in is dropped (a queue that was full once keeps no entry).
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&line) == 2 {
            lines.remove(&key);
        }
        out
    }

    async fn wait_in_line<T: std::borrow::Borrow<NewTask>>(
        self: &Arc<Self>,
        line: &tokio::sync::Mutex<()>,
        raft: &Raft,
        term: u64,
        shared: &SmShared,
        items: &[T],
        deadline: tokio::time::Instant,
    ) -> Result<Option<Admitted>, ProposeError> {
        let turn = tokio::time::timeout_at(deadline, line.lock()).await;
        let mut applied = shared.applied.subscribe();
        let full = loop {
            let deposed = {
                let rx = raft.metrics();
                let m = rx.borrow_watched();
                (!m.state.is_leader() || m.current_term != term).then(|| m.current_leader.filter(|l| *l != m.id))
            };
            if let Some(leader_id) = deposed {
                return Err(ProposeError::NotLeader { leader_id, leader_addr: None });
            }
            let full = match self.check(shared, items) {
                Err(f) => f,
                Ok(admitted) => return Ok(admitted),
            };
            if turn.is_err() || tokio::time::Instant::now() >= deadline {
                break full;
            }
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() {
                        break full;
                    }
                }
                // Room an apply did not signal: an admitted enqueue's place given back after its apply (it
                // turned out a duplicate, or was refused there).
                _ = tokio::time::sleep_until((tokio::time::Instant::now() + RECHECK).min(deadline)) => {}
            }
        };
        Err(refusal(shared, full))
    }
}

/// A refusal with its retry hint: the time the limited queue's (or tenant's) last-minute completion rate takes
/// to make room for the excess.
fn refusal(shared: &SmShared, mut full: Box<Full>) -> ProposeError {
    let tp = shared.throughput(&full.tenant, &full.queue).completed_1m;
    full.retry_after_ms = retry_after_ms((full.waiting + full.adding).saturating_sub(full.max_depth), tp);
    ProposeError::QueueFull(full)
}

/// When an enqueue refused for `excess` tasks too many may fit: the time the queue's recent completion rate takes
/// to drain them, between 100 ms and 30 s (1 s when nothing completed in the last minute).
pub fn retry_after_ms(excess: u64, completed_last_minute: u64) -> u64 {
    if completed_last_minute == 0 {
        return 1_000;
    }
    let per_ms = completed_last_minute as f64 / 60_000.0;
    ((excess as f64 / per_ms).ceil() as u64).clamp(100, 30_000)
}

/// Claims a capped queue may still take now: its cap less its running tasks and less `promised` (tasks of it in
/// claims proposed and not yet answered). `None`: the queue has no cap. `Some(0)` also while this leader is not
/// caught up.
pub fn claim_room(shared: &SmShared, caught_up: bool, tenant: &str, queue: &str, promised: u64) -> Option<u64> {
    let cap = shared.limits(tenant, queue).and_then(|l| l.max_running)?;
    if !caught_up {
        shared.metrics.capped_claims.fetch_add(1, Relaxed);
        return Some(0);
    }
    let running = shared.queue_counts(tenant, queue).in_progress;
    let room = u64::from(cap).saturating_sub(running + promised);
    if room == 0 {
        shared.metrics.capped_claims.fetch_add(1, Relaxed);
    }
    Some(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_hint_is_the_time_to_drain_the_excess_within_bounds() {
        assert_eq!(retry_after_ms(10, 0), 1_000, "no recent completions: a second");
        assert_eq!(retry_after_ms(100, 6_000), 1_000, "100 per second drains 100 in a second");
        assert_eq!(retry_after_ms(1, 60_000), 100, "never below 100 ms");
        assert_eq!(retry_after_ms(1_000_000, 60), 30_000, "never above 30 s");
    }
}
