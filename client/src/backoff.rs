//! Exponential backoff with jitter, for reconnects and retries. Pure arithmetic plus a random draw; it never
//! sleeps itself.

use std::time::Duration;

use rand::Rng;

/// Delays that double from `min` up to `max`; each delay is drawn from the upper half of the current step
/// ("equal jitter"), so many clients that lost the same server do not come back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A backoff starting at `min` and never exceeding `max` (`max` below `min` is raised to `min`).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        let min = min.max(Duration::from_millis(1));
        Backoff { min, max: max.max(min), step: min }
    }

    /// The next delay: within `[step/2, step]`, after which the step doubles up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let jitter_ns = step.saturating_sub(half).as_nanos().min(u64::MAX as u128) as u64;
        half + Duration::from_nanos(rand::rng().random_range(0..=jitter_ns))
    }

    /// Starts again from `min`, after something worked.
    pub fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_jitter_and_stop_at_max() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let mut step = 100u64;
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(step / 2) && d <= Duration::from_millis(step),
                "{d:?} outside [{}, {step}] ms",
                step / 2
            );
            step = (step * 2).min(1000);
        }
        assert!(b.next_delay() <= Duration::from_millis(1000));
    }

    #[test]
    fn reset_starts_from_min_again() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(10));
        for _ in 0..8 {
            b.next_delay();
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(10));
    }

    #[test]
    fn max_below_min_is_raised_to_min() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(1));
        for _ in 0..4 {
            assert!(b.next_delay() <= Duration::from_millis(50));
        }
    }
}
