//! The tick loop: proposes a `Tick` when a lease, delayed task, deadline, retention or idempotency key falls due,
//! so time moves in the state machine (and expiries happen) even when no client writes.

use std::sync::Arc;
use std::time::Duration;

use super::proposer::{wall_clock_ms, Proposer};
use crate::queue::Command;

/// Longest pause of the tick loop: a due lease is expired at most this late.
const TICK_MAX_SLEEP: Duration = Duration::from_millis(200);

/// The tick loop for one term.
pub async fn lead(proposer: Arc<Proposer>) {
    loop {
        let now = wall_clock_ms();
        let sleep = match proposer.shared.next_due() {
            Some(d) if d > now => Duration::from_millis(d - now).min(TICK_MAX_SLEEP),
            Some(_) => Duration::ZERO,
            None => TICK_MAX_SLEEP,
        };
        tokio::time::sleep(sleep.max(Duration::from_millis(5))).await;
        if proposer.shared.next_due().is_some_and(|d| d <= wall_clock_ms()) {
            if let Err(e) = proposer.write(Command::Tick).await {
                tracing::debug!(error = %e, "tick not applied");
            }
        }
    }
}
