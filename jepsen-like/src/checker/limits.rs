//! The limits checker (`--workload limits`): never more tasks running than the queue's cap (`max_running`), nor
//! than a key's concurrency limit, at any point of the replicated state, across failovers. Informational: each
//! key's share of the claims against its share of the weights.
//!
//! # What "running" is, and what a history can prove about it
//!
//! A delivery runs on the server from the entry that claimed it (its task `InProgress` under its token) to the
//! entry that ends it: the accepted ack (complete, fail) or the tick that expires its lease. The cap and the key
//! limits bound how many deliveries run in each state the log reaches. The history does not see those entries,
//! only client events, and it is in real-time order (each event takes its time under the recorder's lock). Each
//! delivery gets a closed interval `[s, e]` of event positions that lies inside its server interval:
//!
//! - `s` is its `deliver` event: the task reached the worker, so its claim entry had been applied (by the node
//!   that answered), hence committed, before.
//! - `e` is, for a result the server accepted, the result's `invoke` event, recorded before the handler returned
//!   the outcome to the SDK, so before the ack was first sent. An accepted ack needs the task `InProgress` under
//!   this very token when it applies (`apply/ack.rs`; leaving `InProgress` and coming back takes a new claim and
//!   a new token), so the delivery ran without a break until that ack's entry, appended after `e`.
//! - For a refused result, one without an answer, or none at all (the worker stopped), the end entry is the ack
//!   (appended after its first send, so after the `invoke` event) or the tick that expired the lease: a leader
//!   stamps a tick with its clock, and a lease expires in the first tick stamped at or past its deadline
//!   (`deadline_ms`, stamped by the claiming leader), so that tick was proposed at or after the deadline by the
//!   leaders' clock. The nodes run on this machine with its clock, so the deadline maps to the history's clock
//!   through `clock` events (wall time at a history time): `e` is the last event before that time, less
//!   `CLOCK_MARGIN_MS` and the drift between the clock samples, or the `invoke` event if earlier. When a
//!   `clock-skew` fault ran (a node's clock was off), or the history has no clock sample, deadlines are not
//!   used and such a delivery counts only up to its `invoke` event (none: it is left out).
//!
//! If deliveries `1..k` have `s_i <= p <= e_i` for some position `p`, then at the time of event `p` every claim
//! entry `c_i` was committed and no end entry `x_i` had been appended yet. A leader appends after every entry
//! committed before it appends (it holds all of them), so each `x_i` comes after every `c_j` in the log, and in the
//! state after the last `c_j` all `k` deliveries run. `k` above the cap (or above a key's limit, for deliveries of
//! that key) is a true violation: the intervals only shrink the server's, so there are no false positives. The
//! converse does not hold: the counts are lower bounds, and `most_running` says how close the run came to each
//! limit (at the limit: the limit bound, and was held).
//!
//! Every delivery of the history is of the limits queue: the workload enqueues to that queue only.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Finding;
use crate::history::{Event, FaultPhase, KeyLimits, Op, Phase};

/// Slack between the nodes' wall clock and the history's clock samples, ms (both read this machine's clock; the
/// samples themselves are taken a few microseconds apart from their event's time).
pub const CLOCK_MARGIN_MS: i64 = 100;

/// One key's share of the claims.
#[derive(Debug, Default, Clone, Serialize)]
pub struct KeyShare {
    pub key: String,
    pub weight: u32,
    /// Its concurrency limit (0: none, the tasks without a key).
    pub limit: u32,
    /// Its rate limit, claims per second (0: none).
    pub per_second: f64,
    /// Deliveries of the key between the start and the end of the fault phase.
    pub claims: usize,
    pub share: f64,
    /// Its weight over the sum of the weights.
    pub weight_share: f64,
    /// The most of its deliveries running at once (a lower bound of the server's count).
    pub most_running: usize,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct LimitsAnalysis {
    pub queue: String,
    pub max_running: u32,
    pub deliveries: usize,
    /// Intervals ended by an accepted result.
    pub ended_by_ack: usize,
    /// Intervals ended by the lease deadline (or an earlier result that was not accepted).
    pub ended_by_deadline: usize,
    /// Deliveries left out: nothing bounds their end from below (no accepted result, no usable deadline), or the
    /// bound came before their delivery.
    pub left_out: usize,
    /// Whether lease deadlines were used (a clock sample, no `clock-skew` fault).
    pub deadlines_used: bool,
    /// The most deliveries of the queue running at once (a lower bound of the server's count).
    pub most_running: usize,
    pub keys: Vec<KeyShare>,
    /// Times more deliveries than the cap ran at once (each rise above it counts once).
    pub over_cap: Finding,
    /// Times more deliveries of a key than its limit ran at once.
    pub over_key_limit: Finding,
}

/// One delivery's interval of event positions, `[s, e]`.
#[derive(Debug, Clone)]
struct Interval {
    s: usize,
    e: usize,
    key: String,
    task: String,
    token: u64,
}

/// The limits recorded by the workload's setup, if the history has them.
fn setup(events: &[Event]) -> Option<(String, u32, Vec<KeyLimits>)> {
    events.iter().find_map(|e| match &e.op {
        Op::Limits { queue, max_running, keys } => Some((queue.clone(), *max_running, keys.clone())),
        _ => None,
    })
}

/// The wall-clock offset (wall ms minus history ms) to map deadlines with, and the margin: the largest offset
/// seen (it maps a deadline to the earliest history time), the margin widened by the samples' spread.
fn clock(events: &[Event]) -> Option<(i64, i64)> {
    let offsets: Vec<i64> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::Clock { wall_ms } => Some(wall_ms - e.t as i64),
            _ => None,
        })
        .collect();
    let (lo, hi) = (offsets.iter().min()?, offsets.iter().max()?);
    Some((*hi, CLOCK_MARGIN_MS + (hi - lo)))
}

/// The most intervals sharing a position, and each rise above `limit` (the position and the intervals then).
fn sweep(events: &[Event], intervals: &[&Interval], limit: Option<u32>, what: &str, found: &mut Finding) -> usize {
    // Starts before ends at one position: both intervals hold there.
    let mut marks: Vec<(usize, u8, usize)> = Vec::new();
    for (i, iv) in intervals.iter().enumerate() {
        marks.push((iv.s, 0, i));
        marks.push((iv.e, 1, i));
    }
    marks.sort_unstable();
    let mut running: BTreeSet<usize> = BTreeSet::new();
    let mut most = 0;
    let mut over = false;
    for (pos, kind, i) in marks {
        if kind == 1 {
            running.remove(&i);
            over = limit.is_some_and(|l| running.len() > l as usize);
            continue;
        }
        running.insert(i);
        most = most.max(running.len());
        let now_over = limit.is_some_and(|l| running.len() > l as usize);
        if now_over && !over {
            let who: Vec<String> = running
                .iter()
                .map(|j| format!("{}/{}@{}", intervals[*j].task, intervals[*j].token, intervals[*j].key))
                .collect();
            found.add(format!(
                "at {} ms {} deliveries of {what} running at once (limit {}): {}",
                events[pos].t,
                running.len(),
                limit.unwrap_or(0),
                who.join(", ")
            ));
        }
        over = now_over;
    }
    most
}

pub fn check(events: &[Event]) -> Option<LimitsAnalysis> {
    let (queue, max_running, keys) = setup(events)?;
    let mut a = LimitsAnalysis { queue: queue.clone(), max_running, ..Default::default() };
    let skewed = events
        .iter()
        .any(|e| matches!(&e.op, Op::Nemesis { fault, phase: FaultPhase::Start, .. } if fault == "clock-skew"));
    let clock = clock(events).filter(|_| !skewed);
    a.deadlines_used = clock.is_some();

    // Each result's invoke position and how it settled.
    let mut results: BTreeMap<(&str, u64), (usize, Phase)> = BTreeMap::new();
    for (i, ev) in events.iter().enumerate() {
        if let Op::Result { task_id, token, phase, .. } = &ev.op {
            match phase {
                Phase::Invoke => {
                    results.insert((task_id.as_str(), *token), (i, Phase::Invoke));
                }
                p => {
                    if let Some(r) = results.get_mut(&(task_id.as_str(), *token)) {
                        r.1 = *p;
                    }
                }
            }
        }
    }

    let phase =
        |what: &str| events.iter().find_map(|e| matches!(&e.op, Op::Mark { what: w } if w == what).then_some(e.t));
    let (from, to) = (phase("faults_start").unwrap_or(0), phase("faults_end").unwrap_or(u64::MAX));
    let mut claims: BTreeMap<&str, usize> = BTreeMap::new();
    let mut intervals: Vec<Interval> = Vec::new();
    for (s, ev) in events.iter().enumerate() {
        let Op::Deliver { task_id, token, deadline_ms, key, .. } = &ev.op else { continue };
        a.deliveries += 1;
        if ev.t >= from && ev.t <= to {
            *claims.entry(key.as_str()).or_default() += 1;
        }
        let result = results.get(&(task_id.as_str(), *token));
        let end = match result {
            Some((e, Phase::Ok)) => {
                a.ended_by_ack += 1;
                Some(*e)
            }
            _ => {
                // The last event before the deadline, in history time, less the margin.
                let by_deadline = clock.and_then(|(offset, margin)| {
                    let at = deadline_ms - offset - margin;
                    let n = events.partition_point(|e| (e.t as i64) < at);
                    n.checked_sub(1)
                });
                let end = match (result.map(|r| r.0), by_deadline) {
                    (Some(x), Some(y)) => Some(x.min(y)),
                    (x, y) => x.or(y),
                };
                if end.is_some_and(|e| e >= s) {
                    a.ended_by_deadline += 1;
                }
                end
            }
        };
        match end {
            Some(e) if e >= s => {
                intervals.push(Interval { s, e, key: key.clone(), task: task_id.clone(), token: *token })
            }
            _ => a.left_out += 1,
        }
    }

    let all: Vec<&Interval> = intervals.iter().collect();
    a.most_running = sweep(events, &all, Some(max_running), &format!("queue {queue}"), &mut a.over_cap);
    let total_weight: u32 = keys.iter().map(|k| k.weight).sum::<u32>().max(1);
    let total_claims: usize = claims.values().sum();
    let mut shares: Vec<KeyShare> = keys
        .iter()
        .map(|k| KeyShare {
            key: k.key.clone(),
            weight: k.weight,
            limit: k.limit,
            per_second: k.per_second,
            weight_share: k.weight as f64 / total_weight as f64,
            ..Default::default()
        })
        .collect();
    // Keys the setup did not name (the tasks without one): counted under the cap, no limit of their own.
    for key in claims.keys().copied().chain(intervals.iter().map(|iv| iv.key.as_str())) {
        if !shares.iter().any(|k| k.key == *key) {
            shares.push(KeyShare { key: key.to_string(), weight: 1, ..Default::default() });
        }
    }
    for k in &mut shares {
        let mine: Vec<&Interval> = intervals.iter().filter(|iv| iv.key == k.key).collect();
        let limit = (k.limit > 0).then_some(k.limit);
        k.most_running = sweep(events, &mine, limit, &format!("key {:?}", k.key), &mut a.over_key_limit);
        k.claims = claims.get(k.key.as_str()).copied().unwrap_or(0);
        k.share = if total_claims == 0 { 0.0 } else { k.claims as f64 / total_claims as f64 };
    }
    a.keys = shares;
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ResultKind;

    /// A crafted history: a cap of 2, keys "a" and "b" with a limit of 1 each, the wall clock at 1,000,000 ms at
    /// history time 0, then the steps of `script`, separated by spaces: `d<ms>:<task>:<key>:<deadline ms>` a
    /// delivery (key `-`: none; the lease deadline in history time), `r<ms>:<task>:<ok|fail|info>` its result
    /// (the invoke at the time, the answer 1 ms later). A task's token is the number in its name.
    fn history(script: &str) -> Vec<Event> {
        let key = |k: &str| KeyLimits { key: k.into(), limit: 1, weight: 1, per_second: 0.0, burst: 0 };
        let mut out = vec![
            Event { t: 0, op: Op::Limits { queue: "q".into(), max_running: 2, keys: vec![key("a"), key("b")] } },
            Event { t: 0, op: Op::Clock { wall_ms: 1_000_000 } },
        ];
        for step in script.split_whitespace() {
            let f: Vec<&str> = step[1..].split(':').collect();
            let t: u64 = f[0].parse().expect("a time");
            let task_id = f[1].to_string();
            let token: u64 = f[1][1..].parse().expect("a task named t<n>");
            if step.starts_with('d') {
                let deadline: i64 = f[3].parse().expect("a deadline");
                let key = if f[2] == "-" { String::new() } else { f[2].to_string() };
                let (claimed_at_ms, deadline_ms) = (1_000_000 + t as i64, 1_000_000 + deadline);
                let (worker, value, attempts, max_attempts) = (0, task_id.clone(), 1, 3);
                let op = Op::Deliver {
                    worker,
                    task_id,
                    value,
                    token,
                    attempts,
                    max_attempts,
                    claimed_at_ms,
                    deadline_ms,
                    key,
                };
                out.push(Event { t, op });
                continue;
            }
            let settled = match f[2] {
                "ok" => Phase::Ok,
                "fail" => Phase::Fail,
                _ => Phase::Info,
            };
            for (t, phase) in [(t, Phase::Invoke), (t + 1, settled)] {
                let (task_id, outcome, reason) = (task_id.clone(), ResultKind::Complete, None);
                out.push(Event { t, op: Op::Result { worker: 0, task_id, token, outcome, phase, reason } });
            }
        }
        out
    }

    fn analyse(script: &str) -> LimitsAnalysis {
        check(&history(script)).expect("a limits history")
    }

    /// Two running (t1 of key a, t2 of key b) from 10 and 20 ms, leases to 5 s.
    const TWO: &str = "d10:t1:a:5000 d20:t2:b:5000";

    #[test]
    fn acked_deliveries_over_the_cap_or_a_key_limit_are_flagged_and_none_within_them() {
        // (what, the steps after TWO, expected (over the cap, over a key's limit, most running at once)).
        let cases = [
            ("t1 acked before t3 (key a) starts", "r30:t1:ok d40:t3:a:5000 r50:t2:ok r60:t3:ok", (0, 0, 2)),
            (
                "a broken cap: t3 (no key) claimed while t1 and t2 run",
                "d30:t3:-:5000 r40:t1:ok r50:t2:ok r60:t3:ok",
                (1, 0, 3),
            ),
            ("a broken key limit: t3 of key a while t1 runs", "r25:t2:ok d30:t3:a:5000 r40:t3:ok r50:t1:ok", (0, 1, 2)),
        ];
        for (what, steps, expected) in cases {
            let a = analyse(&format!("{TWO} {steps}"));
            assert_eq!((a.over_cap.count, a.over_key_limit.count, a.most_running), expected, "{what}: {a:#?}");
            assert_eq!(a.ended_by_ack, 3, "{what}");
        }
        let a = analyse(&format!("{TWO} {}", cases[1].1));
        assert!(a.over_cap.examples[0].contains("3 deliveries of queue q"), "{:?}", a.over_cap.examples);
        let a = analyse(&format!("{TWO} {}", cases[2].1));
        assert!(a.over_key_limit.examples[0].contains("key \"a\""), "{:?}", a.over_key_limit.examples);
        assert_eq!(a.keys.iter().map(|k| (k.claims, k.most_running)).collect::<Vec<_>>(), vec![(2, 2), (1, 1)]);
    }

    /// t1 (key a) delivered at 10 ms with its lease ending at `deadline`, its result at 900 ms settled as
    /// `result`; t2 and t3 (keys b and none) run from 500 ms, acked.
    fn late(deadline: u64, result: &str) -> String {
        format!("d10:t1:a:{deadline} d500:t2:b:5000 d510:t3:-:5000 r900:t1:{result} r910:t2:ok r920:t3:ok")
    }

    #[test]
    fn an_unaccepted_result_counts_only_until_the_lease_deadline() {
        // Within the cap: t1 stopped running at its deadline (300 ms), before t2 and t3 came.
        let a = analyse(&late(300, "fail"));
        assert_eq!(a.over_cap.count, 0, "{a:#?}");
        assert_eq!((a.ended_by_ack, a.ended_by_deadline), (2, 1));
        // Were t1's deadline after t3's delivery, the three overlapped (its result refused or unanswered).
        assert_eq!(analyse(&late(3000, "fail")).over_cap.count, 1);
        assert_eq!(analyse(&late(3000, "info")).over_cap.count, 1);
        // Within the margin of the clocks: not counted.
        assert_eq!(analyse(&late(510 + CLOCK_MARGIN_MS as u64 - 1, "info")).over_cap.count, 0);
    }

    #[test]
    fn without_a_usable_clock_an_unconfirmed_result_ends_at_its_send() {
        // A clock-skew fault: node clocks are not the history's, so deadlines say nothing, even t1's at 300 ms;
        // the result's send still bounds the interval from below.
        let mut h = history(&late(300, "info"));
        let skew =
            Op::Nemesis { fault: "clock-skew".into(), phase: FaultPhase::Start, detail: String::new(), node: None };
        h.push(Event { t: 1000, op: skew });
        let a = check(&h).expect("limits");
        assert!(!a.deadlines_used);
        assert_eq!(a.over_cap.count, 1, "{a:#?}");
        // A delivery without any result and no deadline to go by is left out.
        h.extend(history("d1100:t4:b:1200").into_iter().skip(2));
        assert_eq!(check(&h).expect("limits").left_out, 1);
    }

    #[test]
    fn no_limits_setup_no_analysis() {
        assert!(check(&history(TWO)[1..]).is_none());
    }
}
