//! A small 5-field cron parser (`minute hour day-of-month month day-of-week`) with IANA time zones (chrono-tz),
//! used by the leader to find schedule occurrences. Fields take `*`, numbers, ranges `a-b`, lists `a,b` and steps
//! `*/n` or `a-b/n`; day of week is 0-7 (0 and 7 are Sunday). As in cron, when both day fields are restricted a
//! day matching either one matches. Pure: the caller passes the time.

use chrono::{Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Timelike};
use chrono_tz::Tz;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    dom: u32,
    months: u16,
    dow: u8,
    dom_any: bool,
    dow_any: bool,
    tz: Tz,
}

fn field(s: &str, lo: u32, hi: u32, name: &str) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let any = s == "*";
    for part in s.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, st)) => (r, st.parse::<u32>().map_err(|_| format!("{name}: bad step in {part:?}"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("{name}: step 0 in {part:?}"));
        }
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let a = a.parse::<u32>().map_err(|_| format!("{name}: bad value in {part:?}"))?;
            let b = b.parse::<u32>().map_err(|_| format!("{name}: bad value in {part:?}"))?;
            (a, b)
        } else {
            let a = range.parse::<u32>().map_err(|_| format!("{name}: bad value in {part:?}"))?;
            (a, if part.contains('/') { hi } else { a })
        };
        if a < lo || b > hi || a > b {
            return Err(format!("{name}: {part:?} is outside {lo}-{hi}"));
        }
        let mut v = a;
        while v <= b {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, any))
}

impl Cron {
    /// Parses `expr` for the time zone `tz` (an IANA name such as `Europe/Paris`, or `UTC`).
    pub fn parse(expr: &str, tz: &str) -> Result<Cron, String> {
        let f: Vec<&str> = expr.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!("cron expression {expr:?} needs 5 fields: minute hour day-of-month month day-of-week"));
        }
        let tz: Tz = tz.parse().map_err(|_| format!("unknown time zone {tz:?}"))?;
        let (minutes, _) = field(f[0], 0, 59, "minute")?;
        let (hours, _) = field(f[1], 0, 23, "hour")?;
        let (dom, dom_any) = field(f[2], 1, 31, "day of month")?;
        let (months, _) = field(f[3], 1, 12, "month")?;
        let (mut dow, dow_any) = field(f[4], 0, 7, "day of week")?;
        if dow & (1 << 7) != 0 {
            dow |= 1;
        }
        Ok(Cron {
            minutes,
            hours: hours as u32,
            dom: dom as u32,
            months: months as u16,
            dow: dow as u8,
            dom_any,
            dow_any,
            tz,
        })
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        let dom = self.dom & (1 << d.day()) != 0;
        let dow = self.dow & (1 << d.weekday().num_days_from_sunday()) != 0;
        match (self.dom_any, self.dow_any) {
            (true, true) => true,
            (false, true) => dom,
            (true, false) => dow,
            (false, false) => dom || dow,
        }
    }

    /// The first occurrence strictly after `after_ms` (ms since the Unix epoch), within five years.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let start = chrono::DateTime::from_timestamp_millis(after_ms as i64)?.with_timezone(&self.tz);
        // Local wall-clock minutes from the one after `start`.
        let mut t: NaiveDateTime = start.naive_local().with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let limit = t + Duration::days(5 * 366);
        while t < limit {
            if self.months & (1 << t.month()) == 0 || !self.day_matches(t.date()) {
                t = t.date().succ_opt()?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t.with_minute(0)? + Duration::hours(1);
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t += Duration::minutes(1);
                continue;
            }
            // A local time skipped by a DST change does not occur; an ambiguous one occurs once (the first).
            if let Some(at) = self.tz.from_local_datetime(&t).earliest() {
                let ms = at.timestamp_millis();
                if ms > after_ms as i64 {
                    return Some(ms as u64);
                }
            }
            t += Duration::minutes(1);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> u64 {
        chrono::DateTime::parse_from_rfc3339(s).expect("time").timestamp_millis() as u64
    }

    #[test]
    fn next_occurrences_in_utc_and_a_time_zone() {
        let c = Cron::parse("*/15 * * * *", "UTC").expect("parse");
        assert_eq!(c.next_after(ms("2026-01-01T10:07:00Z")), Some(ms("2026-01-01T10:15:00Z")));
        assert_eq!(c.next_after(ms("2026-01-01T10:15:00Z")), Some(ms("2026-01-01T10:30:00Z")), "strictly after");
        let c = Cron::parse("30 9 * * 1-5", "Europe/Paris").expect("parse");
        // Saturday 2026-01-03: next is Monday 09:30 Paris = 08:30 UTC (winter).
        assert_eq!(c.next_after(ms("2026-01-03T12:00:00Z")), Some(ms("2026-01-05T08:30:00Z")));
        let c = Cron::parse("0 0 1 * *", "UTC").expect("parse");
        assert_eq!(c.next_after(ms("2026-01-31T00:00:00Z")), Some(ms("2026-02-01T00:00:00Z")));
        let c = Cron::parse("0 12 13 * 5", "UTC").expect("parse");
        // Either the 13th or a Friday.
        assert_eq!(c.next_after(ms("2026-01-01T13:00:00Z")), Some(ms("2026-01-02T12:00:00Z")));
        let c = Cron::parse("0 0 * * 7", "UTC").expect("parse");
        assert_eq!(c.next_after(ms("2026-01-01T00:00:00Z")), Some(ms("2026-01-04T00:00:00Z")), "7 is Sunday");
    }

    #[test]
    fn bad_expressions_are_refused() {
        for (e, tz) in [("* * * *", "UTC"), ("60 * * * *", "UTC"), ("*/0 * * * *", "UTC"), ("* * * * *", "Mars/Base")] {
            assert!(Cron::parse(e, tz).is_err(), "{e} {tz}");
        }
        assert!(Cron::parse("0 0 31 2 *", "UTC").expect("parses").next_after(0).is_none(), "never occurs");
    }
}

use super::types::{MissedPolicy, Schedule, ScheduleSpec, TimeMs};

/// An occurrence is missed when it could not be fired within this long after its time (the cluster was down or
/// had no leader); then the schedule's `MissedPolicy` applies.
pub const MISSED_AFTER_MS: u64 = 60_000;

/// The first occurrence of `spec` strictly after `after` (interval occurrences fall at `created_at + k*every`).
pub fn next_occurrence(spec: &ScheduleSpec, created_at: TimeMs, after: TimeMs) -> Option<TimeMs> {
    match spec {
        ScheduleSpec::Interval { every_ms } => {
            let every = (*every_ms).max(1);
            let k = after.saturating_sub(created_at) / every + 1;
            Some(created_at.saturating_add(k.saturating_mul(every)))
        }
        ScheduleSpec::Cron { expr, tz } => Cron::parse(expr, tz).ok()?.next_after(after),
    }
}

/// What the leader proposes for a schedule at time `now`: `Some((occurrence, create_task))`, or `None` when
/// nothing is due. Occurrences are fired one by one in order; once the first due one is missed (older than
/// `MISSED_AFTER_MS`), the schedule jumps to the latest missed one, which runs once (`RunOnce`) or is recorded
/// without a task (`Skip`).
pub fn due(s: &Schedule, now: TimeMs) -> Option<(TimeMs, bool)> {
    if s.paused {
        return None;
    }
    let next = next_occurrence(&s.spec, s.created_at, s.last_occurrence.unwrap_or(s.created_at))?;
    if next > now {
        return None;
    }
    if now - next <= MISSED_AFTER_MS {
        return Some((next, true));
    }
    let horizon = now - MISSED_AFTER_MS;
    let mut latest = next;
    // Bounded walk to the latest missed occurrence (interval arithmetic makes it one step).
    for _ in 0..100_000 {
        match next_occurrence(&s.spec, s.created_at, latest) {
            Some(n) if n <= horizon => latest = n,
            _ => break,
        }
    }
    Some((latest, s.missed == MissedPolicy::RunOnce))
}

/// When the schedule's next occurrence falls (for the ticker's sleep).
pub fn next_due(s: &Schedule) -> Option<TimeMs> {
    if s.paused {
        return None;
    }
    next_occurrence(&s.spec, s.created_at, s.last_occurrence.unwrap_or(s.created_at))
}

#[cfg(test)]
mod schedule_tests {
    use super::*;
    use crate::queue::{DependencyRule, NewTask, RetryPolicy, TaskId};

    fn schedule(spec: ScheduleSpec, missed: MissedPolicy) -> Schedule {
        let template = NewTask {
            id: TaskId::new(0, 0, 0),
            tenant: "t".into(),
            queue: "q".into(),
            payload: Default::default(),
            priority: 0,
            visible_at: 0,
            max_attempts: 1,
            idempotency_key: None,
            idempotency_window_ms: 0,
            webhook_url: None,
            traceparent: None,
            tracestate: None,
            retry: RetryPolicy { base_ms: 1, max_ms: 1, exponential: false },
            retention_ms: 1,
            deadline: None,
            concurrency: None,
            parent: None,
            depends_on: vec![],
            dependency_rule: DependencyRule::AllCompleted,
        };
        Schedule {
            id: TaskId::new(0, 1, 1),
            tenant: "t".into(),
            name: "n".into(),
            spec,
            missed,
            paused: false,
            created_at: 1_000_000,
            last_occurrence: None,
            fired: 0,
            template,
        }
    }

    #[test]
    fn occurrences_fire_in_order_and_missed_ones_follow_the_policy() {
        let mut s = schedule(ScheduleSpec::Interval { every_ms: 1_000 }, MissedPolicy::Skip);
        assert_eq!(due(&s, 1_000_999), None);
        assert_eq!(due(&s, 1_001_000), Some((1_001_000, true)));
        assert_eq!(due(&s, 1_003_500), Some((1_001_000, true)), "late by less than the grace: each one runs");
        s.last_occurrence = Some(1_001_000);
        assert_eq!(next_due(&s), Some(1_002_000));
        // Down for ten minutes: the occurrences older than a minute are missed; skip jumps to the latest of them.
        let now = 1_001_000 + 600_000;
        assert_eq!(due(&s, now), Some((now - MISSED_AFTER_MS, false)));
        s.missed = MissedPolicy::RunOnce;
        assert_eq!(due(&s, now), Some((now - MISSED_AFTER_MS, true)), "run once: the latest missed runs");
        s.last_occurrence = Some(now - MISSED_AFTER_MS);
        assert_eq!(due(&s, now), Some((now - MISSED_AFTER_MS + 1_000, true)), "then on time again");
        s.paused = true;
        assert_eq!((due(&s, now), next_due(&s)), (None, None));
    }

    #[test]
    fn cron_schedules_use_their_time_zone() {
        let s =
            schedule(ScheduleSpec::Cron { expr: "0 * * * *".into(), tz: "Asia/Kolkata".into() }, MissedPolicy::Skip);
        // Kolkata is UTC+5:30: local minute 0 is UTC minute 30.
        let n = next_due(&s).expect("next");
        assert_eq!((n / 60_000) % 60, 30);
    }
}
