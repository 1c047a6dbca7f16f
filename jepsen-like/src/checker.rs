//! Checkers over a recorded history. Pure: they read events and return an `Analysis`; nothing here talks to
//! the cluster, so they run offline on a history file and on crafted histories in the tests below.
//!
//! - total queue (Jepsen's): every acknowledged enqueue delivered (lost = 0), nothing delivered that was
//!   never enqueued (unexpected = 0), nothing delivered whose enqueue certainly failed, no value turned into
//!   two tasks. Redeliveries after an accepted retryable failure are retries; every other redelivery is a
//!   duplicate and must be explained by the previous delivery's lease having expired (its deadline passed in
//!   server time before the new claim) or, failing that, a leader change between the two.
//! - fencing: no result accepted whose token was already superseded when it was sent (a later delivery of
//!   the task had reached a worker before the result was sent).
//! - one outcome: at most one accepted terminal result per task, no delivery after one, and the final state
//!   agrees with the accepted results (a completed task's result names the delivery whose completion won;
//!   it must not be one the server refused).
//! - attempts: never above the task's maximum; every task terminal (completed, failed, cancelled,
//!   dead-lettered) after the drain, and the server holds no task the history never saw.
//! - convergence: every node's digest equal (same applied index and state digest) after heal and drain.
//! - nodes: a node refuses to start only after its files were corrupted.
//! - limits (`--workload limits`, `limits.rs`): never more deliveries running at once than the queue's cap or a
//!   key's concurrency limit, from intervals that lie inside the server's; each key's share of the claims.
//! - availability (measured, not judged): the share of enqueues that succeeded during faults and overall,
//!   the longest time without a delivery during the fault phase and within each fault's windows, and for
//!   leaders stopped by SIGTERM how long the cluster went without a leader.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use crate::history::{Event, FaultPhase, Op, Phase, ResultKind, RunRead};
use crate::nemesis::{EXITED, REFUSED_TO_START};
use crate::upgrade::{STEP as UPGRADE_STEP, UPGRADED};

pub mod limits;

/// Examples kept per finding in the summary.
const EXAMPLES: usize = 20;

#[derive(Debug, Default, Clone, Serialize)]
pub struct Finding {
    pub count: usize,
    pub examples: Vec<String>,
}

impl Finding {
    fn add(&mut self, example: String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example);
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Enqueues {
    pub attempted: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Unknown enqueues that were delivered (they happened).
    pub unknown_delivered: usize,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Redeliveries {
    /// Deliveries after the first of a task.
    pub total: usize,
    /// After an accepted retryable failure: retries, not duplicates.
    pub retries: usize,
    /// Of those, retries after a failure whose answer was lost, which the server's runs show it applied (the
    /// previous run ended RETRIED no later than the next claim).
    pub retries_shown_by_runs: usize,
    /// The others.
    pub duplicates: usize,
    pub explained_by_lease_expiry: usize,
    pub explained_by_leader_change: usize,
    pub unexplained: Finding,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Results {
    pub sent: usize,
    pub accepted: usize,
    pub refused: BTreeMap<String, usize>,
    pub unknown: usize,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct FaultAvailability {
    pub windows: usize,
    pub seconds: f64,
    pub enqueues: usize,
    pub ok_share: f64,
    pub longest_claim_gap_ms: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Availability {
    pub enqueues: usize,
    pub ok_share: f64,
    pub enqueues_during_faults: usize,
    pub ok_share_during_faults: f64,
    /// Longest time without any delivery between the start and the end of the fault phase.
    pub longest_claim_gap_ms: u64,
    /// When that gap began (ms since the run started).
    pub longest_claim_gap_at_ms: u64,
    pub per_fault: BTreeMap<String, FaultAvailability>,
    /// Leaders stopped by SIGTERM (rolling restarts).
    pub leader_stops: usize,
    /// Those after which no other node led within the watch (an election that never came, or came late).
    pub leader_stops_without_successor: usize,
    /// The longest time between the last answer naming a stopped leader and the first naming the next one.
    pub longest_leaderless_after_leader_stop_ms: u64,
    /// The longest time from a leader's SIGTERM until another node led.
    pub longest_leader_stop_to_next_leader_ms: u64,
}

/// One step of the upgrade scenario (a window of its `upgrade` fault on one node).
#[derive(Debug, Default, Clone, Serialize)]
pub struct UpgradeStep {
    pub node: u64,
    /// What the step did, as its start event says.
    pub what: String,
    pub from_ms: u64,
    pub seconds: f64,
    /// The longest time without any delivery within the step.
    pub longest_claim_gap_ms: u64,
    pub enqueues: usize,
    pub ok_share: f64,
}

/// What the upgrade scenario recorded (empty in other runs).
#[derive(Debug, Default, Clone, Serialize)]
pub struct UpgradeAnalysis {
    pub steps: Vec<UpgradeStep>,
    /// (ms, node, binary version, cluster version) each time a node's status changed them.
    pub versions: Vec<(u64, u64, u32, u32)>,
    /// (ms, node, "old" or "new") each time a node's binary was swapped.
    pub binaries: Vec<(u64, u64, String)>,
    /// When no node ran the previous binary any more.
    pub upgraded_at_ms: Option<u64>,
    /// (what, passed, detail) of each expectation the scenario checked as it ran.
    pub expectations: Vec<(String, bool, String)>,
    /// A node reported a cluster version above the previous release's own while another still ran that release.
    pub switched_early: Finding,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Convergence {
    pub agree: bool,
    /// node -> (applied index, digest, tasks)
    pub nodes: BTreeMap<u64, (u64, u64, u64)>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Analysis {
    pub valid: bool,
    /// One line per violated property.
    pub violations: Vec<String>,
    pub enqueues: Enqueues,
    pub deliveries: usize,
    pub values_delivered: usize,
    pub lost: Finding,
    pub unexpected: Finding,
    pub failed_but_delivered: Finding,
    pub one_value_two_tasks: Finding,
    pub redeliveries: Redeliveries,
    pub token_reused: Finding,
    pub results: Results,
    pub stale_token_accepted: Finding,
    pub two_accepted_outcomes: Finding,
    pub delivered_after_end: Finding,
    pub final_state_mismatch: Finding,
    pub attempts_above_max: Finding,
    pub not_terminal: Finding,
    /// Ok-enqueued tasks that were dead-lettered without any delivery the workers saw (claims whose answer
    /// was lost): not lost, they wait in the dead-letter queue.
    pub dead_lettered_unseen: usize,
    pub final_states: BTreeMap<String, usize>,
    /// Tasks the server holds that the history never saw (digest task count minus known tasks).
    pub unseen_on_server: i64,
    pub convergence: Convergence,
    pub refused_to_start: Finding,
    /// Node processes that ended without the harness stopping them.
    pub exited_by_itself: Finding,
    pub corrupted_nodes: Vec<u64>,
    pub availability: Availability,
    pub faults: BTreeMap<String, usize>,
    pub upgrade: UpgradeAnalysis,
    /// The limits workload's checks (None in other runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<limits::LimitsAnalysis>,
}

#[derive(Debug, Clone)]
struct Enq {
    phase: Phase,
    task_id: Option<String>,
    max_attempts: u32,
    invoke_t: u64,
}

#[derive(Debug, Clone)]
struct Delivery {
    t: u64,
    worker: u32,
    task_id: String,
    value: String,
    token: u64,
    attempts: u32,
    max_attempts: u32,
    claimed_at_ms: i64,
    deadline_ms: i64,
}

#[derive(Debug, Clone)]
struct Res {
    invoke_t: u64,
    kind: ResultKind,
    phase: Phase,
    reason: Option<String>,
}

#[derive(Debug, Clone)]
struct Final {
    state: String,
    attempts: u32,
    result: String,
}

fn share(ok: usize, all: usize) -> f64 {
    if all == 0 {
        1.0
    } else {
        ok as f64 / all as f64
    }
}

/// The longest gap between consecutive times in `ts` (sorted) within [from, to], counting the edges.
fn longest_gap(ts: &[u64], from: u64, to: u64) -> (u64, u64) {
    let mut prev = from;
    let mut best = (0, from);
    for &t in ts.iter().filter(|t| **t >= from && **t <= to) {
        if t - prev > best.0 {
            best = (t - prev, prev);
        }
        prev = t;
    }
    if to > prev && to - prev > best.0 {
        best = (to - prev, prev);
    }
    best
}

pub fn check(events: &[Event]) -> Analysis {
    let mut a = Analysis::default();

    let mut enq: HashMap<String, Enq> = HashMap::new();
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut results: HashMap<(String, u64), Res> = HashMap::new();
    let mut leader_changes: Vec<u64> = Vec::new();
    let mut last_leader: Option<(Option<u64>, u64)> = None;
    let mut finals: HashMap<String, Final> = HashMap::new();
    let mut runs: HashMap<String, Vec<RunRead>> = HashMap::new();
    let mut digests: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    let mut marks: HashMap<String, u64> = HashMap::new();
    let mut windows: Vec<(String, u64, u64)> = Vec::new();
    let mut open: HashMap<String, u64> = HashMap::new();
    let mut corrupted: BTreeSet<u64> = BTreeSet::new();
    let mut refusals: Vec<(String, u64, String)> = Vec::new();
    // Upgrade windows: (node, what, start, stop).
    let mut steps: Vec<(u64, String, u64, u64)> = Vec::new();
    let mut open_steps: HashMap<u64, (String, u64)> = HashMap::new();
    let end_t = events.iter().map(|e| e.t).max().unwrap_or(0);

    for ev in events {
        match &ev.op {
            Op::Enqueue { value, phase, max_attempts, task_id, .. } => match phase {
                Phase::Invoke => {
                    enq.insert(
                        value.clone(),
                        Enq { phase: Phase::Invoke, task_id: None, max_attempts: *max_attempts, invoke_t: ev.t },
                    );
                }
                p => {
                    if let Some(e) = enq.get_mut(value) {
                        e.phase = *p;
                        e.task_id = task_id.clone();
                    }
                }
            },
            Op::Deliver {
                worker, task_id, value, token, attempts, max_attempts, claimed_at_ms, deadline_ms, ..
            } => deliveries.push(Delivery {
                t: ev.t,
                worker: *worker,
                task_id: task_id.clone(),
                value: value.clone(),
                token: *token,
                attempts: *attempts,
                max_attempts: *max_attempts,
                claimed_at_ms: *claimed_at_ms,
                deadline_ms: *deadline_ms,
            }),
            Op::Result { task_id, token, outcome, phase, reason, .. } => {
                let key = (task_id.clone(), *token);
                match phase {
                    Phase::Invoke => {
                        results.insert(key, Res { invoke_t: ev.t, kind: *outcome, phase: Phase::Invoke, reason: None });
                    }
                    p => {
                        if let Some(r) = results.get_mut(&key) {
                            r.phase = *p;
                            r.reason = reason.clone();
                        }
                    }
                }
            }
            Op::Nemesis { fault, phase, detail, node } => match phase {
                FaultPhase::Start if fault == UPGRADE_STEP => {
                    *a.faults.entry(fault.clone()).or_default() += 1;
                    open_steps.insert(node.unwrap_or(0), (detail.clone(), ev.t));
                }
                FaultPhase::Stop if fault == UPGRADE_STEP => {
                    if let Some((what, s)) = open_steps.remove(&node.unwrap_or(0)) {
                        steps.push((node.unwrap_or(0), what, s, ev.t));
                    }
                }
                FaultPhase::Start => {
                    *a.faults.entry(fault.clone()).or_default() += 1;
                    open.insert(fault.clone(), ev.t);
                    if fault == "corrupt" {
                        corrupted.extend(node);
                    }
                }
                FaultPhase::Stop => {
                    if let Some(s) = open.remove(fault) {
                        windows.push((fault.clone(), s, ev.t));
                    }
                }
                FaultPhase::Note => {
                    if fault == "corrupt" {
                        corrupted.extend(node.filter(|_| !detail.contains(REFUSED_TO_START)));
                    }
                    if detail.contains(REFUSED_TO_START) {
                        refusals.push((fault.clone(), node.unwrap_or(0), detail.clone()));
                    }
                    if detail.contains(EXITED) {
                        a.exited_by_itself.add(format!("at {} ms: {detail}", ev.t));
                    }
                }
            },
            Op::Handover { led_ms, leaderless_ms, .. } => {
                let av = &mut a.availability;
                av.leader_stops += 1;
                match (led_ms, leaderless_ms) {
                    (Some(led), Some(gap)) => {
                        av.longest_leaderless_after_leader_stop_ms =
                            av.longest_leaderless_after_leader_stop_ms.max(*gap);
                        av.longest_leader_stop_to_next_leader_ms = av.longest_leader_stop_to_next_leader_ms.max(*led);
                    }
                    _ => av.leader_stops_without_successor += 1,
                }
            }
            Op::Leader { leader, term } => {
                if last_leader.is_some_and(|l| l != (*leader, *term)) {
                    leader_changes.push(ev.t);
                }
                last_leader = Some((*leader, *term));
            }
            Op::Final { task_id, state, attempts, result } => {
                finals.insert(
                    task_id.clone(),
                    Final { state: state.clone(), attempts: *attempts, result: result.clone() },
                );
            }
            Op::Runs { task_id, runs: r } => {
                runs.insert(task_id.clone(), r.clone());
            }
            Op::Digest { node, applied_index, digest, tasks } => {
                digests.insert(*node, (*applied_index, *digest, *tasks));
            }
            Op::Mark { what } => {
                marks.insert(what.clone(), ev.t);
            }
            Op::Binary { node, binary } => a.upgrade.binaries.push((ev.t, *node, binary.clone())),
            Op::ClusterVersion { node, version, cluster_version } => {
                a.upgrade.versions.push((ev.t, *node, *version, *cluster_version))
            }
            Op::Expect { what, passed, detail } => a.upgrade.expectations.push((what.clone(), *passed, detail.clone())),
            Op::Limits { .. } | Op::Clock { .. } => {}
        }
    }
    for (node, (what, s)) in open_steps {
        steps.push((node, what, s, end_t));
    }
    steps.sort_by_key(|w| w.2);
    windows.extend(steps.iter().map(|(_, _, s, e)| (UPGRADE_STEP.to_string(), *s, *e)));
    // A fault still open when the history ends lasted until the end.
    for (f, s) in open {
        windows.push((f, s, end_t));
    }
    windows.sort_by_key(|w| w.1);

    // Enqueues.
    for e in enq.values() {
        a.enqueues.attempted += 1;
        match e.phase {
            Phase::Ok => a.enqueues.ok += 1,
            Phase::Fail => a.enqueues.failed += 1,
            Phase::Info | Phase::Invoke => a.enqueues.unknown += 1,
        }
    }

    // Deliveries per value and per task.
    a.deliveries = deliveries.len();
    let mut by_value: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut by_task: BTreeMap<&str, Vec<&Delivery>> = BTreeMap::new();
    for d in &deliveries {
        by_value.entry(&d.value).or_default().insert(&d.task_id);
        by_task.entry(&d.task_id).or_default().push(d);
    }
    a.values_delivered = by_value.len();
    // Each task's max_attempts, as its enqueue asked.
    let mut max_of: HashMap<String, u32> = HashMap::new();
    for e in enq.values() {
        if let Some(id) = &e.task_id {
            max_of.insert(id.clone(), e.max_attempts);
        }
    }
    for (value, tasks) in &by_value {
        match enq.get(*value) {
            None => a.unexpected.add(format!("{value} delivered as {tasks:?}, never enqueued")),
            Some(e) => {
                if e.phase == Phase::Fail {
                    a.failed_but_delivered.add(format!("{value}: the enqueue failed, delivered as {tasks:?}"));
                }
                if matches!(e.phase, Phase::Info | Phase::Invoke) {
                    a.enqueues.unknown_delivered += 1;
                }
                if tasks.len() > 1 {
                    a.one_value_two_tasks.add(format!("{value} delivered as tasks {tasks:?}"));
                }
                if let Some(id) = &e.task_id {
                    if !tasks.contains(id.as_str()) {
                        a.one_value_two_tasks.add(format!("{value} enqueued as {id}, delivered as {tasks:?}"));
                    }
                }
                for t in tasks {
                    max_of.insert(t.to_string(), e.max_attempts);
                }
            }
        }
    }
    for (value, e) in &enq {
        if e.phase != Phase::Ok || by_value.contains_key(value.as_str()) {
            continue;
        }
        let fin = e.task_id.as_ref().and_then(|id| finals.get(id));
        match fin {
            Some(f) if f.state == "dead_lettered" => a.dead_lettered_unseen += 1,
            Some(f) => a.lost.add(format!(
                "{value} ({}) acknowledged, never delivered; final state {}",
                e.task_id.as_deref().unwrap_or("?"),
                f.state
            )),
            None => a.lost.add(format!(
                "{value} ({}) acknowledged, never delivered; no final state",
                e.task_id.as_deref().unwrap_or("?")
            )),
        }
    }

    // Results.
    for r in results.values() {
        a.results.sent += 1;
        match r.phase {
            Phase::Ok => a.results.accepted += 1,
            Phase::Fail => *a.results.refused.entry(r.reason.clone().unwrap_or_default()).or_default() += 1,
            Phase::Info | Phase::Invoke => a.results.unknown += 1,
        }
    }

    // Per task: redeliveries, fencing, one outcome.
    for (task, ds) in by_task.iter_mut() {
        ds.sort_by_key(|d| (d.token, d.t));
        let max = max_of.get(*task).copied().unwrap_or(ds[0].max_attempts);
        for d in ds.iter() {
            if d.attempts > d.max_attempts || d.attempts > max {
                a.attempts_above_max
                    .add(format!("{task} delivered with attempts {} of {}", d.attempts, d.max_attempts));
            }
        }
        let accepted: Vec<(u64, &Res)> = ds
            .iter()
            .filter_map(|d| results.get(&(task.to_string(), d.token)).map(|r| (d.token, r)))
            .filter(|(_, r)| r.phase == Phase::Ok)
            .collect();
        let mut seen_tokens = HashSet::new();
        let terminal: Vec<u64> = accepted.iter().filter(|(_, r)| r.kind.terminal()).map(|(t, _)| *t).collect();
        let mut terminal_tokens: Vec<u64> = terminal.clone();
        terminal_tokens.dedup();
        if terminal_tokens.len() > 1 {
            a.two_accepted_outcomes.add(format!("{task}: terminal results accepted for tokens {terminal_tokens:?}"));
        }
        let first_end = terminal_tokens.first().copied();
        for (i, d) in ds.iter().enumerate() {
            if !seen_tokens.insert(d.token) {
                a.token_reused.add(format!("{task}: token {} delivered more than once", d.token));
                continue;
            }
            if let Some(end) = first_end {
                if d.token > end {
                    a.delivered_after_end.add(format!(
                        "{task}: delivered with token {} to worker {} after a terminal result with token {end} was accepted",
                        d.token, d.worker
                    ));
                    continue;
                }
            }
            if i == 0 {
                continue;
            }
            let prev = ds[i - 1];
            if prev.token == d.token {
                continue;
            }
            a.redeliveries.total += 1;
            let prev_res = results.get(&(task.to_string(), prev.token));
            if prev_res.is_some_and(|r| r.phase == Phase::Ok && r.kind == ResultKind::FailRetryable) {
                a.redeliveries.retries += 1;
                continue;
            }
            // A retryable failure sent but never answered may have been applied; the server's own record of the
            // previous run says whether it was, and that it ended before this claim.
            let unanswered_retry = prev_res
                .is_some_and(|r| matches!(r.phase, Phase::Info | Phase::Invoke) && r.kind == ResultKind::FailRetryable);
            let retried_by_server = || {
                runs.get(*task).is_some_and(|rs| {
                    rs.iter().any(|r| {
                        r.token == prev.token
                            && r.outcome == "RETRIED"
                            && r.ended_at_ms > 0
                            && r.ended_at_ms <= d.claimed_at_ms
                    })
                })
            };
            if unanswered_retry && retried_by_server() {
                a.redeliveries.retries += 1;
                a.redeliveries.retries_shown_by_runs += 1;
                continue;
            }
            a.redeliveries.duplicates += 1;
            if d.claimed_at_ms >= prev.deadline_ms {
                a.redeliveries.explained_by_lease_expiry += 1;
            } else if leader_changes.iter().any(|t| *t >= prev.t && *t <= d.t) {
                a.redeliveries.explained_by_leader_change += 1;
            } else {
                a.redeliveries.unexplained.add(format!(
                    "{task} ({}): token {} claimed at {} while token {} was leased until {} (worker {} then {})",
                    d.value, d.token, d.claimed_at_ms, prev.token, prev.deadline_ms, prev.worker, d.worker
                ));
            }
        }
        // Fencing: an accepted result whose token a later delivery had superseded before it was sent.
        for (token, r) in &accepted {
            if let Some(later) = ds.iter().find(|d| d.token > *token && d.t < r.invoke_t) {
                a.stale_token_accepted.add(format!(
                    "{task}: {:?} with token {token} sent at {} ms and accepted, but token {} was delivered at {} ms",
                    r.kind, r.invoke_t, later.token, later.t
                ));
            }
        }
    }

    // Final states.
    let mut known: BTreeSet<&str> = by_task.keys().copied().collect();
    for e in enq.values().filter(|e| e.phase == Phase::Ok) {
        if let Some(id) = &e.task_id {
            known.insert(id);
        }
    }
    for id in &known {
        let Some(f) = finals.get(*id) else {
            a.not_terminal.add(format!("{id}: no final state was read"));
            continue;
        };
        *a.final_states.entry(f.state.clone()).or_default() += 1;
        if !matches!(f.state.as_str(), "completed" | "failed" | "cancelled" | "dead_lettered") {
            a.not_terminal.add(format!("{id}: {} after the drain", f.state));
        }
        let max = max_of.get(*id).copied().or_else(|| by_task.get(id).map(|ds| ds[0].max_attempts));
        if let Some(max) = max {
            if f.attempts > max {
                a.attempts_above_max.add(format!("{id}: final attempts {} of {max}", f.attempts));
            }
        }
        let mine: Vec<(u64, &Res)> =
            results.iter().filter(|((t, _), _)| t == id).map(|((_, tok), r)| (*tok, r)).collect();
        let accepted_complete: Vec<u64> = mine
            .iter()
            .filter(|(_, r)| r.phase == Phase::Ok && r.kind == ResultKind::Complete)
            .map(|(t, _)| *t)
            .collect();
        let accepted_final_fail = mine.iter().any(|(_, r)| r.phase == Phase::Ok && r.kind == ResultKind::FailFinal);
        if f.state == "completed" {
            match f.result.parse::<u64>() {
                Err(_) => {
                    a.final_state_mismatch.add(format!("{id}: completed with result {:?}, not a token", f.result))
                }
                Ok(won) => match mine.iter().find(|(t, r)| *t == won && r.kind == ResultKind::Complete) {
                    None => a.final_state_mismatch.add(format!("{id}: completed by token {won}, which no worker sent")),
                    Some((_, r)) if r.phase == Phase::Fail => a.final_state_mismatch.add(format!(
                        "{id}: completed by token {won}, whose result the server refused ({})",
                        r.reason.as_deref().unwrap_or("?")
                    )),
                    Some(_) => {
                        if let Some(other) = accepted_complete.iter().find(|t| **t != won) {
                            a.final_state_mismatch.add(format!(
                                "{id}: completed by token {won}, but token {other}'s completion was accepted"
                            ));
                        }
                    }
                },
            }
        } else if !accepted_complete.is_empty() {
            a.final_state_mismatch.add(format!(
                "{id}: completion accepted (tokens {accepted_complete:?}) but the task ended {}",
                f.state
            ));
        }
        if accepted_final_fail && f.state != "failed" {
            a.final_state_mismatch.add(format!("{id}: final failure accepted but the task ended {}", f.state));
        }
    }
    if let Some(max_tasks) = digests.values().map(|d| d.2).max() {
        a.unseen_on_server = max_tasks as i64 - known.len() as i64;
    }

    // Convergence.
    a.convergence.nodes = digests.clone();
    let mut it = digests.values();
    a.convergence.agree = match it.next() {
        None => false,
        Some(first) => it.all(|d| d.0 == first.0 && d.1 == first.1),
    };

    // Nodes that would not start.
    a.corrupted_nodes = corrupted.iter().copied().collect();
    for (fault, node, detail) in &refusals {
        if !corrupted.contains(node) {
            a.refused_to_start.add(format!("{fault}: {detail}"));
        }
    }

    // Availability.
    let mut claim_times: Vec<u64> = deliveries.iter().map(|d| d.t).collect();
    claim_times.sort();
    let fstart = marks.get("faults_start").copied().unwrap_or(0);
    let fend = marks.get("faults_end").copied().unwrap_or(end_t);
    let (gap, at) = longest_gap(&claim_times, fstart, fend);
    a.availability.longest_claim_gap_ms = gap;
    a.availability.longest_claim_gap_at_ms = at;
    let in_window = |t: u64| windows.iter().any(|w| t >= w.1 && t <= w.2);
    let done: Vec<&Enq> = enq.values().filter(|e| e.phase != Phase::Invoke).collect();
    a.availability.enqueues = done.len();
    a.availability.ok_share = share(done.iter().filter(|e| e.phase == Phase::Ok).count(), done.len());
    let during: Vec<&&Enq> = done.iter().filter(|e| in_window(e.invoke_t)).collect();
    a.availability.enqueues_during_faults = during.len();
    a.availability.ok_share_during_faults = share(during.iter().filter(|e| e.phase == Phase::Ok).count(), during.len());
    for (fault, s, e) in &windows {
        let fa = a.availability.per_fault.entry(fault.clone()).or_default();
        fa.windows += 1;
        fa.seconds += (e - s) as f64 / 1000.0;
        let (g, _) = longest_gap(&claim_times, *s, *e);
        fa.longest_claim_gap_ms = fa.longest_claim_gap_ms.max(g);
    }
    for (fault, fa) in a.availability.per_fault.iter_mut() {
        let mine: Vec<&&Enq> = done
            .iter()
            .filter(|e| windows.iter().any(|w| &w.0 == fault && e.invoke_t >= w.1 && e.invoke_t <= w.2))
            .collect();
        fa.enqueues = mine.len();
        fa.ok_share = share(mine.iter().filter(|e| e.phase == Phase::Ok).count(), mine.len());
    }

    // The upgrade scenario: each step, and the cluster version against the binaries.
    for (node, what, s, e) in &steps {
        let mine: Vec<&&Enq> = done.iter().filter(|x| x.invoke_t >= *s && x.invoke_t <= *e).collect();
        a.upgrade.steps.push(UpgradeStep {
            node: *node,
            what: what.clone(),
            from_ms: *s,
            seconds: (e - s) as f64 / 1000.0,
            longest_claim_gap_ms: longest_gap(&claim_times, *s, *e).0,
            enqueues: mine.len(),
            ok_share: share(mine.iter().filter(|x| x.phase == Phase::Ok).count(), mine.len()),
        });
    }
    a.upgrade.upgraded_at_ms = marks.get(UPGRADED).copied();
    // Which nodes ran the previous binary at each report of a node's versions.
    let mut old_nodes: BTreeSet<u64> = BTreeSet::new();
    let mut binaries = a.upgrade.binaries.iter().peekable();
    let mut reports = Vec::new();
    for (t, node, version, cv) in &a.upgrade.versions {
        while let Some((_, n, b)) = binaries.next_if(|(bt, _, _)| bt <= t) {
            if b == "old" {
                old_nodes.insert(*n);
            } else {
                old_nodes.remove(n);
            }
        }
        reports.push((*t, *node, *version, *cv, old_nodes.clone()));
    }
    // The previous release's own version (what its nodes reported; 0 for one from before cluster versions): the
    // cluster may run at it, not above, while a node runs that release.
    let old_version = reports.iter().filter(|r| r.4.contains(&r.1)).map(|r| r.2).min().unwrap_or(0);
    for (t, node, _, cv, old_nodes) in &reports {
        // After the upgrade the scenario starts the previous binary once more, to see it refuse the files.
        let before_upgraded = a.upgrade.upgraded_at_ms.is_none_or(|u| *t < u);
        if *cv > old_version && before_upgraded && !old_nodes.is_empty() {
            a.upgrade.switched_early.add(format!(
                "at {t} ms node {node} reported cluster version {cv} while nodes {old_nodes:?} ran the previous binary"
            ));
        }
    }

    // Verdict.
    let mut v = Vec::new();
    for (what, passed, detail) in &a.upgrade.expectations {
        if !passed {
            v.push(format!("upgrade: {what}: {detail}"));
        }
    }
    let mut flag = |name: &str, f: &Finding| {
        if f.count > 0 {
            v.push(format!("{name}: {} (e.g. {})", f.count, f.examples.first().map(String::as_str).unwrap_or("")));
        }
    };
    flag("lost", &a.lost);
    flag("unexpected", &a.unexpected);
    flag("failed enqueue delivered", &a.failed_but_delivered);
    flag("one value, two tasks", &a.one_value_two_tasks);
    flag("unexplained duplicate", &a.redeliveries.unexplained);
    flag("token delivered twice", &a.token_reused);
    flag("stale token accepted", &a.stale_token_accepted);
    flag("two accepted outcomes", &a.two_accepted_outcomes);
    flag("delivered after end", &a.delivered_after_end);
    flag("final state disagrees with results", &a.final_state_mismatch);
    flag("attempts above max", &a.attempts_above_max);
    flag("not terminal after drain", &a.not_terminal);
    flag("node refused to start without corruption", &a.refused_to_start);
    flag("node process exited by itself", &a.exited_by_itself);
    flag("cluster version switched while a node ran the previous binary", &a.upgrade.switched_early);
    a.limits = limits::check(events);
    if let Some(l) = &a.limits {
        flag("more running than the queue's cap", &l.over_cap);
        flag("more running than a key's concurrency limit", &l.over_key_limit);
    }
    if a.unseen_on_server > 0 {
        v.push(format!("undrained: the server holds {} tasks the history never saw delivered", a.unseen_on_server));
    }
    if !a.convergence.agree {
        v.push(format!("convergence: digests differ or are missing after heal: {:?}", a.convergence.nodes));
    }
    a.valid = v.is_empty();
    a.violations = v;
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds histories event by event, with a clock that moves 10 ms per event.
    #[derive(Default)]
    struct H {
        events: Vec<Event>,
    }

    impl H {
        fn push(&mut self, op: Op) -> &mut H {
            let t = self.events.len() as u64 * 10;
            self.events.push(Event { t, op });
            self
        }
        fn mark(&mut self, what: &str) -> &mut H {
            self.push(Op::Mark { what: what.into() })
        }
        fn enqueue(&mut self, value: &str, phase: Phase, id: Option<&str>) -> &mut H {
            self.push(Op::Enqueue {
                process: 0,
                value: value.into(),
                phase: Phase::Invoke,
                max_attempts: 3,
                task_id: None,
                error: None,
            });
            self.push(Op::Enqueue {
                process: 0,
                value: value.into(),
                phase,
                max_attempts: 3,
                task_id: id.map(String::from),
                error: None,
            })
        }
        fn deliver(&mut self, id: &str, value: &str, token: u64, attempts: u32, claimed: i64, deadline: i64) -> &mut H {
            self.push(Op::Deliver {
                worker: 1,
                task_id: id.into(),
                value: value.into(),
                token,
                attempts,
                max_attempts: 3,
                claimed_at_ms: claimed,
                deadline_ms: deadline,
                key: String::new(),
            })
        }
        fn result(&mut self, id: &str, token: u64, kind: ResultKind, phase: Phase) -> &mut H {
            self.push(Op::Result {
                worker: 1,
                task_id: id.into(),
                token,
                outcome: kind,
                phase: Phase::Invoke,
                reason: None,
            });
            let reason = (phase == Phase::Fail).then(|| "LEASE_LOST".to_string());
            self.push(Op::Result { worker: 1, task_id: id.into(), token, outcome: kind, phase, reason })
        }
        fn fin(&mut self, id: &str, state: &str, attempts: u32, result: &str) -> &mut H {
            self.push(Op::Final { task_id: id.into(), state: state.into(), attempts, result: result.into() })
        }
        fn runs(&mut self, id: &str, runs: &[(u64, &str, i64)]) -> &mut H {
            let runs = runs
                .iter()
                .map(|(token, outcome, ended)| RunRead {
                    token: *token,
                    outcome: outcome.to_string(),
                    ended_at_ms: *ended,
                })
                .collect();
            self.push(Op::Runs { task_id: id.into(), runs })
        }
        fn digests(&mut self, tasks: u64) -> &mut H {
            for node in 1..=3 {
                self.push(Op::Digest { node, applied_index: 100, digest: 42, tasks });
            }
            self
        }
        fn check(&self) -> Analysis {
            check(&self.events)
        }
    }

    /// Two tasks enqueued, delivered, completed; one redelivered after its lease expired.
    fn clean() -> H {
        let mut h = H::default();
        h.mark("workload_start").mark("faults_start");
        h.enqueue("p0-1", Phase::Ok, Some("a")).enqueue("p0-2", Phase::Ok, Some("b"));
        h.enqueue("p0-3", Phase::Fail, None).enqueue("p0-4", Phase::Info, None);
        h.deliver("a", "p0-1", 10, 1, 1000, 4000).result("a", 10, ResultKind::Complete, Phase::Ok);
        // b: first delivery's lease runs out; its late result is refused; the second delivery completes.
        h.deliver("b", "p0-2", 20, 1, 1000, 4000);
        h.deliver("b", "p0-2", 30, 2, 4100, 7100);
        h.result("b", 20, ResultKind::Complete, Phase::Fail);
        h.result("b", 30, ResultKind::Complete, Phase::Ok);
        h.mark("faults_end");
        h.fin("a", "completed", 1, "10").fin("b", "completed", 2, "30");
        h.digests(2);
        h
    }

    #[test]
    fn a_clean_history_passes() {
        let a = clean().check();
        assert!(a.valid, "{:#?}", a.violations);
        assert_eq!(a.enqueues.ok, 2);
        assert_eq!(a.enqueues.failed, 1);
        assert_eq!(a.enqueues.unknown, 1);
        assert_eq!(a.redeliveries.duplicates, 1);
        assert_eq!(a.redeliveries.explained_by_lease_expiry, 1);
        assert_eq!(a.results.refused.get("LEASE_LOST"), Some(&1));
    }

    #[test]
    fn a_lost_task_is_flagged() {
        let mut h = clean();
        h.enqueue("p0-9", Phase::Ok, Some("c")).fin("c", "pending", 0, "");
        let a = h.check();
        assert!(!a.valid);
        assert_eq!(a.lost.count, 1, "{a:#?}");
        assert!(a.violations.iter().any(|v| v.starts_with("lost")), "{:?}", a.violations);
        // It is also not terminal.
        assert_eq!(a.not_terminal.count, 1);
    }

    #[test]
    fn an_unexpected_delivery_is_flagged() {
        let mut h = clean();
        h.deliver("z", "never-enqueued", 99, 1, 1, 2).result("z", 99, ResultKind::Complete, Phase::Ok);
        h.fin("z", "completed", 1, "99");
        let a = h.check();
        assert!(!a.valid);
        assert_eq!(a.unexpected.count, 1, "{a:#?}");
    }

    #[test]
    fn a_stale_token_acceptance_is_flagged() {
        let mut h = clean();
        // c's lease expires, token 60 is delivered, then the holder of token 50 sends its result: accepted.
        h.enqueue("p0-5", Phase::Ok, Some("c"));
        h.deliver("c", "p0-5", 50, 1, 1000, 2000);
        h.deliver("c", "p0-5", 60, 2, 2500, 5500);
        h.result("c", 50, ResultKind::Complete, Phase::Ok);
        h.result("c", 60, ResultKind::Complete, Phase::Fail);
        h.fin("c", "completed", 2, "50");
        h.digests(3);
        let a = h.check();
        assert!(!a.valid);
        assert_eq!(a.stale_token_accepted.count, 1, "{a:#?}");
    }

    #[test]
    fn two_accepted_outcomes_are_flagged() {
        let mut h = clean();
        h.enqueue("p0-5", Phase::Ok, Some("c"));
        h.deliver("c", "p0-5", 50, 1, 1000, 2000);
        h.result("c", 50, ResultKind::Complete, Phase::Ok);
        h.deliver("c", "p0-5", 60, 2, 2500, 5500);
        h.result("c", 60, ResultKind::FailFinal, Phase::Ok);
        h.fin("c", "failed", 2, "");
        h.digests(3);
        let a = h.check();
        assert!(!a.valid);
        assert_eq!(a.two_accepted_outcomes.count, 1, "{a:#?}");
        assert_eq!(a.delivered_after_end.count, 1);
        assert!(a.final_state_mismatch.count >= 1, "the accepted completion did not stick");
    }

    #[test]
    fn an_unexplained_duplicate_is_flagged_and_a_retry_is_not_a_duplicate() {
        let mut h = clean();
        h.enqueue("p0-5", Phase::Ok, Some("c"));
        h.deliver("c", "p0-5", 50, 1, 1000, 9000);
        // Redelivered while token 50's lease still ran, no leader change, no failure: a double lease.
        h.deliver("c", "p0-5", 60, 2, 2000, 5000);
        h.result("c", 60, ResultKind::FailRetryable, Phase::Ok);
        h.deliver("c", "p0-5", 70, 3, 6000, 9000);
        h.result("c", 70, ResultKind::Complete, Phase::Ok);
        h.fin("c", "completed", 3, "70");
        h.digests(3);
        let a = h.check();
        assert_eq!(a.redeliveries.unexplained.count, 1, "{a:#?}");
        assert_eq!(a.redeliveries.retries, 1);
        assert!(!a.valid);
    }

    /// A retryable failure whose answer was lost: the redelivery before the old lease ran out is a retry when the
    /// server's runs show the failure applied before the claim, and a duplicate when they do not.
    #[test]
    fn an_unanswered_retryable_failure_counts_as_a_retry_only_when_the_runs_show_it_applied() {
        let history = |runs: &[(u64, &str, i64)]| {
            let mut h = clean();
            h.enqueue("p0-5", Phase::Ok, Some("c"));
            h.deliver("c", "p0-5", 50, 1, 1000, 9000);
            h.result("c", 50, ResultKind::FailRetryable, Phase::Info);
            h.deliver("c", "p0-5", 60, 2, 3000, 9000);
            h.result("c", 60, ResultKind::Complete, Phase::Ok);
            h.fin("c", "completed", 2, "60");
            h.runs("c", runs);
            h.digests(3);
            h.check()
        };
        let applied = history(&[(50, "RETRIED", 2500), (60, "COMPLETED", 4000)]);
        assert_eq!(applied.redeliveries.unexplained.count, 0, "{applied:#?}");
        assert_eq!(applied.redeliveries.retries_shown_by_runs, 1);
        assert!(applied.valid, "{applied:#?}");

        // The server says the first run expired (or ended after the second claim): the failure did not explain it.
        for runs in [&[(50, "LEASE_EXPIRED", 9000), (60, "COMPLETED", 4000)][..], &[(50, "RETRIED", 3500)][..], &[]] {
            let a = history(runs);
            assert_eq!(a.redeliveries.unexplained.count, 1, "{runs:?}: {a:#?}");
            assert_eq!(a.redeliveries.retries_shown_by_runs, 0);
            assert!(!a.valid);
        }
    }

    #[test]
    fn divergent_digests_attempts_and_undrained_tasks_are_flagged() {
        let mut h = clean();
        h.push(Op::Digest { node: 2, applied_index: 100, digest: 43, tasks: 3 });
        let a = h.check();
        assert!(!a.convergence.agree);
        assert_eq!(a.unseen_on_server, 1);
        let mut h = clean();
        h.deliver("a", "p0-1", 11, 4, 1, 2);
        let a = h.check();
        assert!(a.attempts_above_max.count >= 1, "{a:#?}");
    }

    #[test]
    fn a_refused_start_counts_only_without_corruption() {
        let mut h = clean();
        h.push(Op::Nemesis {
            fault: "corrupt".into(),
            phase: FaultPhase::Start,
            detail: "node 2".into(),
            node: Some(2),
        });
        h.push(Op::Nemesis {
            fault: "corrupt".into(),
            phase: FaultPhase::Note,
            detail: format!("node 2 {REFUSED_TO_START}: exited"),
            node: Some(2),
        });
        h.push(Op::Nemesis { fault: "corrupt".into(), phase: FaultPhase::Stop, detail: String::new(), node: None });
        assert!(h.check().valid, "{:?}", h.check().violations);
        h.push(Op::Nemesis {
            fault: "kill".into(),
            phase: FaultPhase::Note,
            detail: format!("node 3 {REFUSED_TO_START}: exited"),
            node: Some(3),
        });
        assert_eq!(h.check().refused_to_start.count, 1);
    }

    #[test]
    fn leader_stops_are_measured() {
        let mut h = clean();
        let stop = |next: Option<u64>, led: Option<u64>, gap: Option<u64>| Op::Handover {
            node: 1,
            exit_ms: 900,
            next,
            led_ms: led,
            leaderless_ms: gap,
        };
        h.push(stop(Some(2), Some(80), Some(40))).push(stop(Some(3), Some(300), Some(20))).push(stop(None, None, None));
        let a = h.check();
        assert!(a.valid, "measured, not judged: {:?}", a.violations);
        let av = &a.availability;
        assert_eq!((av.leader_stops, av.leader_stops_without_successor), (3, 1));
        assert_eq!((av.longest_leaderless_after_leader_stop_ms, av.longest_leader_stop_to_next_leader_ms), (40, 300));
    }

    fn binary(h: &mut H, node: u64, b: &str) {
        h.push(Op::Binary { node, binary: b.into() });
    }

    fn version(h: &mut H, node: u64, version: u32, cluster_version: u32) {
        h.push(Op::ClusterVersion { node, version, cluster_version });
    }

    /// A rolling upgrade of nodes 1-3 that switches only after the last node runs the new binary; node 2 is
    /// started on the old binary once more afterwards (the refusal step), while the others report version 1.
    fn upgraded() -> H {
        let mut h = clean();
        for n in 1..=3 {
            binary(&mut h, n, "old");
            version(&mut h, n, 0, 0);
        }
        for n in 1..=3 {
            h.push(Op::Nemesis {
                fault: UPGRADE_STEP.into(),
                phase: FaultPhase::Start,
                detail: format!("upgrade node {n}"),
                node: Some(n),
            });
            binary(&mut h, n, "new");
            if n == 3 {
                h.mark(UPGRADED);
            }
            version(&mut h, n, 1, 0);
            h.push(Op::Nemesis {
                fault: UPGRADE_STEP.into(),
                phase: FaultPhase::Stop,
                detail: String::new(),
                node: Some(n),
            });
        }
        for n in 1..=3 {
            version(&mut h, n, 1, 1);
        }
        binary(&mut h, 2, "old");
        version(&mut h, 1, 1, 1);
        binary(&mut h, 2, "new");
        h.push(Op::Expect { what: "the previous binary refuses".into(), passed: true, detail: "exit 1".into() });
        h
    }

    #[test]
    fn an_upgrade_that_switches_after_the_last_node_passes_and_each_step_is_measured() {
        let a = upgraded().check();
        assert!(a.valid, "{:?}", a.violations);
        assert_eq!(a.upgrade.steps.len(), 3);
        assert_eq!(a.upgrade.steps[0].node, 1);
        assert_eq!(a.upgrade.expectations.len(), 1);
        assert!(a.upgrade.upgraded_at_ms.is_some());
        assert_eq!(a.faults.get(UPGRADE_STEP), Some(&3));
    }

    #[test]
    fn a_switch_while_a_node_runs_the_old_binary_and_a_failed_expectation_are_flagged() {
        let mut h = clean();
        binary(&mut h, 1, "old");
        binary(&mut h, 2, "new");
        version(&mut h, 2, 1, 1);
        let a = h.check();
        assert_eq!(a.upgrade.switched_early.count, 1, "{a:#?}");
        assert!(!a.valid);
        // A previous release of cluster versions (3): the cluster may run at 3 while a node runs it, not above.
        let from_3 = |last_cv: u32| {
            let mut h = clean();
            binary(&mut h, 1, "old");
            binary(&mut h, 2, "new");
            version(&mut h, 1, 3, 3);
            version(&mut h, 2, 5, last_cv);
            h.check().upgrade.switched_early.count
        };
        assert_eq!((from_3(3), from_3(5)), (0, 1));
        let mut h = upgraded();
        h.push(Op::Expect { what: "data downgrade refuses".into(), passed: false, detail: "exit 0".into() });
        let a = h.check();
        assert_eq!(a.violations, vec!["upgrade: data downgrade refuses: exit 0".to_string()]);
    }

    #[test]
    fn a_run_over_the_cap_is_invalid() {
        // b's first delivery (token 20) and its second (token 30) both count until their results were sent: with
        // no clock sample the checker cannot use token 20's lease deadline, and its refused result was sent after
        // token 30 arrived. Two running at once: within a cap of 2, over a cap of 1.
        let limits = |max_running| Op::Limits { queue: "q".into(), max_running, keys: vec![] };
        let mut h = clean();
        h.push(limits(2));
        let a = h.check();
        assert!(a.valid, "within the cap: {:?}", a.violations);
        assert_eq!(a.limits.as_ref().map(|l| l.most_running), Some(2));
        let mut h = clean();
        h.push(limits(1));
        let a = h.check();
        assert!(!a.valid);
        assert_eq!(a.limits.as_ref().map(|l| l.over_cap.count), Some(1), "{a:#?}");
        assert!(a.violations.iter().any(|v| v.starts_with("more running than the queue's cap")), "{:?}", a.violations);
    }

    #[test]
    fn longest_gap_counts_the_edges() {
        assert_eq!(longest_gap(&[5, 6, 20], 0, 30), (14, 6));
        assert_eq!(longest_gap(&[], 10, 30), (20, 10));
        assert_eq!(longest_gap(&[1, 2], 0, 100), (98, 2));
    }
}
