//! Producer flow control on the leader: when the server, not the workers, is what holds completions back, new
//! enqueues are admitted at the rate tasks are claimed, so producers slow down instead of workers.
//!
//! The signal comes from the claim dispatcher: a worker's Ready that waits while every claim entry the leader
//! allows in flight (`dispatcher::MAX_IN_FLIGHT`) is still being committed is a worker the server cannot keep
//! fed. When that is so for more than a tenth of the last half second ([`BLOCKED_PERMILLE`]) and more than
//! `flow_backlog` tasks are ready (pacing then goes on while the share stays above a tenth and half of the
//! backlog is left), accepting enqueues faster than tasks leave the ready set only takes capacity from the
//! completions: each claimed task then earns one enqueue ([`Flow::claimed`]), or three quarters of one while
//! more than `flow_backlog` are ready ([`DRAIN_SHARE`]), so a backlog that grew before pacing started shrinks
//! back (a larger ready set makes every task dearer: more of them are written to the shard files before they
//! are claimed); the enqueue coalescer waits for earned room before it proposes ([`Flow::take`]). A producer
//! stream's creates are answered later, so its window fills and the producer waits; an enqueue held longer than
//! `flow_max_wait_ms` is refused with `RATE_LIMITED` and a retry-after (the SDKs wait and send it again).
//! Nothing of this is replicated: it decides only when this leader proposes, never what apply does.
//!
//! Workers that are busy with their tasks (slow handlers) have no Ready waiting, so a bulk load for slow workers
//! is never paced: only workers kept waiting by the server pace producers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::storage::SmShared;

/// How long one measurement of the dispatcher's blocked time lasts.
pub const WINDOW: Duration = Duration::from_millis(500);
/// Blocked for more than this share (per mille) of a window: the server cannot keep its workers fed; pacing
/// starts (with a backlog) and goes on while it stays so. Under an unpaced flood on one node the share sits at
/// 15–50 % depending on the machine, while the ready set grows by tens of thousands a second, so the bar is
/// low: at a quarter, pacing started only with 185,000 tasks ready (README, "Pacing that starts early").
/// Workers busy with their own tasks keep it at 0.
pub const BLOCKED_PERMILLE: u32 = 100;
/// While pacing with more than `flow_backlog` tasks ready, a claimed task earns this much of an enqueue, so the
/// ready set shrinks back towards the backlog at a quarter of the claim rate.
pub const DRAIN_SHARE: f64 = 0.75;
/// Earned room kept at most (tasks): a short pause in enqueues does not bank a burst.
const MAX_CREDIT: f64 = 4096.0;
/// How often the ready count is read again (it sums every shard's counts).
const READY_REFRESH: Duration = Duration::from_millis(100);

/// The leader's producer flow control; one per node, shared by the dispatcher and the enqueue coalescer.
pub struct Flow {
    /// Ready tasks above which pacing may start; 0: never.
    backlog: u64,
    /// Longest an enqueue waits for room before it is refused.
    max_wait: Duration,
    epoch: Instant,
    /// The dispatcher's last measurement: per mille of the window it was blocked, and when the window ended
    /// (ms since `epoch`).
    blocked_permille: AtomicU32,
    measured_at_ms: AtomicU64,
    state: Mutex<State>,
    earned: Notify,
}

struct State {
    credit: f64,
    pacing: bool,
    ready: u64,
    ready_at: Option<Instant>,
}

impl Flow {
    pub fn new(backlog: u64, max_wait: Duration) -> Arc<Flow> {
        Arc::new(Flow {
            backlog,
            max_wait,
            epoch: Instant::now(),
            blocked_permille: AtomicU32::new(0),
            measured_at_ms: AtomicU64::new(0),
            state: Mutex::new(State { credit: 0.0, pacing: false, ready: 0, ready_at: None }),
            earned: Notify::new(),
        })
    }

    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    fn ms(&self, at: Instant) -> u64 {
        at.duration_since(self.epoch).as_millis() as u64
    }

    /// The dispatcher's measurement of one window: `blocked` of `window` with Readys waiting behind a full
    /// claim pipeline.
    pub fn measured(&self, blocked: Duration, window: Duration, now: Instant) {
        let permille = (blocked.as_secs_f64() / window.as_secs_f64().max(1e-9) * 1000.0).min(1000.0) as u32;
        self.blocked_permille.store(permille, Relaxed);
        self.measured_at_ms.store(self.ms(now).max(1), Relaxed);
        tracing::trace!(permille, "claim pipeline blocked");
    }

    /// The share (per mille) of the last window the claim pipeline was blocked; 0 when that measurement is
    /// older than two windows (the dispatcher measures only while it is busy).
    fn blocked(&self, now: Instant) -> u32 {
        let at = self.measured_at_ms.load(Relaxed);
        if at == 0 || self.ms(now).saturating_sub(at) > 2 * WINDOW.as_millis() as u64 {
            return 0;
        }
        self.blocked_permille.load(Relaxed)
    }

    /// Whether the last measurement says workers wait on the server enough to start pacing.
    #[cfg(test)]
    fn starved(&self, now: Instant) -> bool {
        self.blocked(now) > BLOCKED_PERMILLE
    }

    /// `n` tasks were claimed: while pacing, each lets one more task in, or [`DRAIN_SHARE`] of one while the
    /// ready set (as last read) is above the backlog.
    pub fn claimed(&self, n: usize) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.pacing {
            let share = if st.ready > self.backlog { DRAIN_SHARE } else { 1.0 };
            st.credit = (st.credit + n as f64 * share).min(MAX_CREDIT);
            drop(st);
            self.earned.notify_one();
        }
    }

    /// Whether enqueues are paced now, given the ready count `ready` reads (called only when the blocked share
    /// passes, at most every `READY_REFRESH`). Pacing starts when workers are starved with more than `backlog`
    /// tasks ready, and stops when they no longer are or the ready tasks fall to half of it.
    fn pacing(&self, now: Instant, ready: impl FnOnce() -> u64) -> bool {
        if self.backlog == 0 {
            return false;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let blocked = self.blocked(now);
        let least = if st.pacing { self.backlog / 2 } else { self.backlog };
        // The ready count (a walk over every shard's counts) is read only when the workers' side says so.
        if blocked > BLOCKED_PERMILLE && st.ready_at.is_none_or(|at| now.duration_since(at) >= READY_REFRESH) {
            st.ready = ready();
            st.ready_at = Some(now);
        }
        let pacing = blocked > BLOCKED_PERMILLE && st.ready > least;
        if pacing != st.pacing {
            st.pacing = pacing;
            st.credit = 0.0;
            tracing::debug!(pacing, ready = st.ready, blocked, "producer flow control");
        }
        pacing
    }

    /// Room for an entry of enqueues: `Ok(n)`, the most tasks the entry may carry now (`usize::MAX` when not
    /// pacing; at least `first`, the size of the request at the head, which may overdraw the room), after waiting
    /// for claims to earn it; `Err(())` once the head request has waited `max_wait` since `since`.
    pub async fn take(&self, shared: &SmShared, first: usize, since: Instant) -> Result<usize, ()> {
        loop {
            let now = Instant::now();
            if !self.pacing(now, || shared.ready_total()) {
                return Ok(usize::MAX);
            }
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.credit >= 1.0 {
                    let n = (st.credit as usize).max(first);
                    st.credit -= n as f64;
                    shared.metrics.enqueue_paced.fetch_add(n as u64, Relaxed);
                    return Ok(n);
                }
            }
            if now.duration_since(since) >= self.max_wait {
                shared.metrics.enqueue_refused_overload.fetch_add(first as u64, Relaxed);
                return Err(());
            }
            // Woken by a claim, or after a short while to look at the signal and the wait again.
            let _ = tokio::time::timeout(Duration::from_millis(20), self.earned.notified()).await;
        }
    }

    /// Gives back room taken for tasks that an entry did not carry after all.
    pub fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.pacing {
            st.credit = (st.credit + n as f64).min(MAX_CREDIT);
        }
    }
}

/// The dispatcher's side: measures the share of each window in which Readys waited behind a full claim
/// pipeline, and reports it to [`Flow::measured`] at the end of the window.
pub struct BlockedClock {
    window_start: Instant,
    last: Instant,
    blocked: Duration,
    was_blocked: bool,
}

impl BlockedClock {
    pub fn new(now: Instant) -> BlockedClock {
        BlockedClock { window_start: now, last: now, blocked: Duration::ZERO, was_blocked: false }
    }

    /// Called on every turn of the dispatcher's loop, with whether Readys wait behind a full pipeline now.
    pub fn observe(&mut self, flow: &Flow, now: Instant, blocked: bool) {
        if self.was_blocked {
            self.blocked += now.duration_since(self.last);
        }
        self.last = now;
        self.was_blocked = blocked;
        let window = now.duration_since(self.window_start);
        if window >= WINDOW {
            flow.measured(self.blocked, window, now);
            self.window_start = now;
            self.blocked = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two windows in one state from `at` (the first also closes whatever window was open); the last measurement
    /// is then all `blocked` or all not.
    fn starve(flow: &Flow, clock: &mut BlockedClock, at: Instant, blocked: bool) -> Instant {
        clock.observe(flow, at, blocked);
        clock.observe(flow, at + WINDOW, blocked);
        clock.observe(flow, at + WINDOW + WINDOW / 2, blocked);
        let end = at + 2 * WINDOW;
        clock.observe(flow, end, blocked);
        end
    }

    #[test]
    fn pacing_needs_both_starved_workers_and_a_backlog() {
        let flow = Flow::new(1_000, Duration::from_secs(1));
        let now = Instant::now();
        let mut clock = BlockedClock::new(now);
        let t = starve(&flow, &mut clock, now, true);
        assert!(flow.starved(t), "blocked the whole window");
        assert!(!flow.pacing(t, || 999), "starved but no backlog: not paced");
        let t = t + READY_REFRESH;
        assert!(flow.pacing(t, || 1_001), "starved with a backlog: paced");
        // Stays on down to half the backlog, off below it.
        let t = t + READY_REFRESH;
        assert!(flow.pacing(t, || 600));
        let t = t + READY_REFRESH;
        assert!(!flow.pacing(t, || 499));
        // Workers kept busy by their own work (not blocked): never paced, whatever the backlog.
        let t = starve(&flow, &mut clock, t, false);
        assert!(!flow.pacing(t + READY_REFRESH, || 1_000_000));
        assert!(!flow.starved(t));
        assert!(!flow.pacing(t + READY_REFRESH, || 1_000_000));
        // A measurement too old to mean anything counts as not starved.
        let t = starve(&flow, &mut clock, t, true);
        assert!(flow.pacing(t + READY_REFRESH, || 5_000));
        assert!(!flow.pacing(t + 3 * WINDOW, || 5_000));
        // Off entirely with backlog 0.
        let off = Flow::new(0, Duration::from_secs(1));
        let mut clock = BlockedClock::new(t);
        let t = starve(&off, &mut clock, t, true);
        assert!(!off.pacing(t, || u64::MAX));
    }

    #[test]
    fn a_blocked_share_over_a_tenth_starts_pacing_and_keeps_it_on() {
        let flow = Flow::new(1_000, Duration::from_secs(1));
        let mut t = Instant::now();
        let mut clock = BlockedClock::new(t);
        // A window blocked for `ms` of its 500 ms.
        let mut window = |t: Instant, ms: u64| {
            clock.observe(&flow, t, true);
            clock.observe(&flow, t + Duration::from_millis(ms), false);
            clock.observe(&flow, t + WINDOW, false);
            t + WINDOW
        };
        t = window(t, 40);
        assert_eq!(flow.blocked_permille.load(Relaxed), 80);
        assert!(!flow.starved(t));
        assert!(!flow.pacing(t, || 5_000), "8 %: not enough to start");
        t = window(t, 75);
        assert!(flow.starved(t));
        assert!(flow.pacing(t, || 5_000), "15 %: starts");
        t = window(t, 60);
        assert!(flow.pacing(t, || 5_000), "12 % while pacing: stays on");
        t = window(t, 25);
        assert!(!flow.pacing(t, || 5_000), "5 %: off");
        t = window(t, 100);
        assert!(flow.pacing(t, || 5_000), "20 %: on again");
        t = window(t, 100);
        assert!(flow.pacing(t + READY_REFRESH, || 600), "above half the backlog while pacing: stays on");
        assert!(!flow.pacing(t + 2 * READY_REFRESH, || 499), "under half the backlog: off");
        assert!(!flow.pacing(t + 3 * READY_REFRESH, || 999), "off, and not above the backlog: stays off");
    }

    #[test]
    fn claims_earn_room_only_while_pacing_and_never_more_than_the_cap() {
        let flow = Flow::new(10, Duration::from_secs(1));
        flow.claimed(100);
        assert_eq!(flow.state.lock().unwrap().credit, 0.0, "not pacing: nothing banked");
        flow.state.lock().unwrap().pacing = true;
        flow.claimed(100);
        assert_eq!(flow.state.lock().unwrap().credit, 100.0, "ready set at most the backlog: one per claim");
        flow.state.lock().unwrap().ready = 11;
        flow.claimed(100);
        assert_eq!(flow.state.lock().unwrap().credit, 175.0, "above the backlog: the ready set drains");
        flow.claimed(1_000_000);
        assert_eq!(flow.state.lock().unwrap().credit, MAX_CREDIT);
        flow.give_back(5);
        assert_eq!(flow.state.lock().unwrap().credit, MAX_CREDIT);
    }
}
