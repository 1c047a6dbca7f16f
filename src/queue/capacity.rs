//! The capacity view of one queue: backlog, throughput over recent windows, time to drain and the workers
//! needed to drain it within a horizon. Pure arithmetic over figures read from the state machine (counts and
//! completions, in state-machine time) and the leader's count of active workers.

use super::{StateCounts, Throughput};

/// The horizons for "workers needed to drain within": 1, 4 and 8 hours.
pub const DRAIN_HORIZONS_H: [u64; 3] = [1, 4, 8];

#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Tasks not yet claimed: ready plus delayed.
    pub pending: u64,
    /// Claimable now.
    pub ready: u64,
    pub delayed: u64,
    pub running: u64,
    pub active_workers: u64,
    pub throughput: Throughput,
    /// Completions per second over the last 1, 5 and 15 minutes (the count over the whole window length).
    pub rate_1m: f64,
    pub rate_5m: f64,
    pub rate_15m: f64,
    /// Seconds to finish the backlog (pending + running) at the 5-minute rate; `None` when nothing completes.
    pub drain_s: Option<f64>,
    /// What one worker completes per second: the 5-minute rate over the active workers, or, with no active
    /// worker, one task at a time at the mean run time of the last 15 minutes. `None` when unknown.
    pub per_worker_rate: Option<f64>,
    /// Workers needed to drain the backlog within each of `DRAIN_HORIZONS_H`; `None` when unknown.
    pub workers_needed: [Option<u64>; 3],
}

pub fn capacity(counts: &StateCounts, tp: Throughput, active_workers: u64) -> Capacity {
    let rate_1m = tp.completed_1m as f64 / 60.0;
    let rate_5m = tp.completed_5m as f64 / 300.0;
    let rate_15m = tp.completed_15m as f64 / 900.0;
    let backlog = counts.pending + counts.delayed + counts.in_progress;
    let drain_s = match (backlog, rate_5m > 0.0) {
        (0, _) => Some(0.0),
        (_, true) => Some(backlog as f64 / rate_5m),
        (_, false) => None,
    };
    let per_worker_rate = if active_workers > 0 && rate_5m > 0.0 {
        Some(rate_5m / active_workers as f64)
    } else if tp.completed_15m > 0 && tp.run_ms_15m > 0 {
        Some(1000.0 * tp.completed_15m as f64 / tp.run_ms_15m as f64)
    } else {
        None
    };
    let workers_needed = DRAIN_HORIZONS_H.map(|h| match (backlog, per_worker_rate) {
        (0, _) => Some(0),
        (_, Some(r)) => Some((backlog as f64 / (r * h as f64 * 3600.0)).ceil().max(1.0) as u64),
        (_, None) => None,
    });
    Capacity {
        pending: counts.pending + counts.delayed,
        ready: counts.pending,
        delayed: counts.delayed,
        running: counts.in_progress,
        active_workers,
        throughput: tp,
        rate_1m,
        rate_5m,
        rate_15m,
        drain_s,
        per_worker_rate,
        workers_needed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pending: u64, in_progress: u64) -> StateCounts {
        StateCounts { pending, in_progress, ..Default::default() }
    }

    #[test]
    fn known_workload_gives_exact_figures() {
        // 3,000 completed in the last 5 minutes (10/s) by 2 workers; 36,000 pending + 0 running.
        let tp = Throughput { completed_1m: 600, completed_5m: 3_000, completed_15m: 9_000, run_ms_15m: 1_800_000 };
        let c = capacity(&counts(36_000, 0), tp, 2);
        assert_eq!((c.rate_1m, c.rate_5m, c.rate_15m), (10.0, 10.0, 10.0));
        assert_eq!(c.drain_s, Some(3_600.0), "36,000 at 10/s");
        assert_eq!(c.per_worker_rate, Some(5.0));
        // 1 h: 36,000 / (5 * 3600) = 2; 4 h: 0.5 -> 1; 8 h: 1.
        assert_eq!(c.workers_needed, [Some(2), Some(1), Some(1)]);

        let c = capacity(&counts(180_000, 0), tp, 2);
        assert_eq!(c.workers_needed, [Some(10), Some(3), Some(2)], "ceil(180000 / (5 * 3600 * h))");
    }

    #[test]
    fn without_workers_the_mean_run_time_gives_the_per_worker_rate() {
        // 100 tasks of 200 ms each: one worker does 5 per second.
        let tp = Throughput { completed_1m: 0, completed_5m: 0, completed_15m: 100, run_ms_15m: 20_000 };
        let c = capacity(&counts(36_000, 0), tp, 0);
        assert_eq!(c.drain_s, None, "nothing completes now");
        assert_eq!(c.per_worker_rate, Some(5.0));
        assert_eq!(c.workers_needed, [Some(2), Some(1), Some(1)]);
    }

    #[test]
    fn an_empty_queue_needs_nothing_and_an_unknown_rate_is_unknown() {
        let c = capacity(&counts(0, 0), Throughput::default(), 0);
        assert_eq!((c.drain_s, c.workers_needed), (Some(0.0), [Some(0); 3]));
        let c = capacity(&counts(5, 1), Throughput::default(), 3);
        assert_eq!((c.drain_s, c.per_worker_rate, c.workers_needed), (None, None, [None; 3]));
    }
}
