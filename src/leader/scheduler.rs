//! The schedule ticker: leader-only work that fires due schedule occurrences through the log.
//!
//! It reads the replicated schedules (their last fired occurrence included), so a new leader carries on exactly
//! where the last one stopped; each occurrence is proposed as `FireSchedule`, whose apply ignores an occurrence
//! at or before the last one recorded, so an occurrence proposed twice (by two leaders, or a retry) creates one
//! task. Occurrences are computed here (`queue::cron`), never in apply.

use std::sync::Arc;
use std::time::Duration;

use super::proposer::{wall_clock_ms, Proposer};
use crate::queue::{cron, Command, TaskId};

/// Longest sleep between looks: bounds how late a schedule created or resumed meanwhile is first seen.
const MAX_SLEEP: Duration = Duration::from_millis(200);

/// The schedule ticker's work for one term: fire what is due (at once: it may just have become leader), then sleep until
/// the next occurrence, at most `MAX_SLEEP`.
pub async fn lead(proposer: Arc<Proposer>) {
    loop {
        fire_due(&proposer).await;
        let now = wall_clock_ms();
        let next = proposer.shared.schedules(None).iter().filter_map(cron::next_due).min();
        let sleep = next.map(|n| Duration::from_millis(n.saturating_sub(now))).unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
        tokio::time::sleep(sleep.max(Duration::from_millis(5))).await;
    }
}

/// Proposes every due occurrence, in order, one entry each.
async fn fire_due(proposer: &Proposer) {
    for s in proposer.shared.schedules(None) {
        let mut sch = s;
        // A bounded burst per schedule and look; the next look continues.
        for _ in 0..64 {
            let now = wall_clock_ms();
            let Some((occurrence, run)) = cron::due(&sch, now) else { break };
            let task = run.then(|| {
                let mut t = sch.template.clone();
                t.id = TaskId::new(now, sch.id.placement(), rand::random());
                t.visible_at = now;
                Box::new(t)
            });
            match proposer.write(Command::FireSchedule { id: sch.id, occurrence, task }).await {
                Ok(_) => sch.last_occurrence = Some(occurrence),
                Err(e) => {
                    tracing::debug!(error = %e, "schedule occurrence not applied");
                    return;
                }
            }
        }
    }
}
