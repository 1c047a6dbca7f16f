//! The run's JSON summary and its readable report.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use crate::checker::{Analysis, Finding};

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub seed: u64,
    pub nodes: u64,
    pub faults: Vec<String>,
    pub time_limit_s: u64,
    pub duration_s: f64,
    pub history: String,
    /// How heal and drain went.
    pub notes: Vec<String>,
    /// Connections to node relays that came from the harness (following leader hints), never faulted.
    pub external_relay_connections: u64,
    pub analysis: Analysis,
}

impl Summary {
    /// A summary for a history checked offline.
    pub fn offline(history: &Path, analysis: Analysis) -> Summary {
        Summary {
            seed: 0,
            nodes: 0,
            faults: Vec::new(),
            time_limit_s: 0,
            duration_s: 0.0,
            history: history.display().to_string(),
            notes: Vec::new(),
            external_relay_connections: 0,
            analysis,
        }
    }
}

fn finding(out: &mut String, name: &str, f: &Finding) {
    let _ = writeln!(out, "  {name:<38} {}", f.count);
    for e in f.examples.iter().take(5) {
        let _ = writeln!(out, "      {e}");
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

pub fn text(s: &Summary) -> String {
    let a = &s.analysis;
    let mut o = String::new();
    let _ = writeln!(o, "== raftq-jepsen report");
    if s.nodes > 0 {
        let _ = writeln!(
            o,
            "seed {}  nodes {}  faults [{}]  fault time {} s  run {:.0} s",
            s.seed,
            s.nodes,
            s.faults.join(","),
            s.time_limit_s,
            s.duration_s
        );
    }
    let _ = writeln!(o, "history {}", s.history);
    for n in &s.notes {
        let _ = writeln!(o, "note: {n}");
    }
    let _ = writeln!(o, "faults injected: {:?}", a.faults);
    let _ = writeln!(o, "\n-- total queue");
    let e = &a.enqueues;
    let _ = writeln!(
        o,
        "  enqueues: {} attempted, {} ok, {} failed, {} unknown ({} of them delivered)",
        e.attempted, e.ok, e.failed, e.unknown, e.unknown_delivered
    );
    let _ = writeln!(o, "  deliveries: {} of {} distinct values", a.deliveries, a.values_delivered);
    finding(&mut o, "lost", &a.lost);
    finding(&mut o, "unexpected", &a.unexpected);
    finding(&mut o, "failed enqueue delivered", &a.failed_but_delivered);
    finding(&mut o, "one value, two tasks", &a.one_value_two_tasks);
    let r = &a.redeliveries;
    let _ = writeln!(
        o,
        "  redeliveries {}: {} retries after a failure ({} of them unanswered, shown applied by the task's runs), \
         {} duplicates ({} lease expired, {} leader change)",
        r.total,
        r.retries,
        r.retries_shown_by_runs,
        r.duplicates,
        r.explained_by_lease_expiry,
        r.explained_by_leader_change
    );
    finding(&mut o, "unexplained duplicates", &r.unexplained);
    finding(&mut o, "one token delivered twice", &a.token_reused);
    let _ = writeln!(o, "  dead-lettered without a seen delivery: {}", a.dead_lettered_unseen);
    let _ = writeln!(o, "\n-- fencing and outcomes");
    let _ = writeln!(
        o,
        "  results: {} sent, {} accepted, {} unknown, refused {:?}",
        a.results.sent, a.results.accepted, a.results.unknown, a.results.refused
    );
    finding(&mut o, "stale token accepted", &a.stale_token_accepted);
    finding(&mut o, "two accepted outcomes", &a.two_accepted_outcomes);
    finding(&mut o, "delivered after a terminal result", &a.delivered_after_end);
    finding(&mut o, "final state disagrees with results", &a.final_state_mismatch);
    let _ = writeln!(o, "\n-- attempts and drain");
    finding(&mut o, "attempts above max", &a.attempts_above_max);
    finding(&mut o, "not terminal after the drain", &a.not_terminal);
    let _ = writeln!(o, "  final states: {:?}", a.final_states);
    let _ = writeln!(o, "  tasks on the server the history never saw: {}", a.unseen_on_server);
    let _ = writeln!(o, "\n-- convergence");
    let _ = writeln!(o, "  digests agree: {}", a.convergence.agree);
    for (node, (applied, digest, tasks)) in &a.convergence.nodes {
        let _ = writeln!(o, "    node {node}: applied {applied}, digest {digest:016x}, {tasks} tasks");
    }
    finding(&mut o, "node refused to start (not corrupted)", &a.refused_to_start);
    finding(&mut o, "node process exited by itself", &a.exited_by_itself);
    if !a.corrupted_nodes.is_empty() {
        let _ = writeln!(o, "  nodes whose files were corrupted: {:?}", a.corrupted_nodes);
    }
    let av = &a.availability;
    let _ = writeln!(o, "\n-- availability");
    let _ = writeln!(
        o,
        "  enqueues ok: {} of {} overall, {} of {} during faults",
        pct(av.ok_share),
        av.enqueues,
        pct(av.ok_share_during_faults),
        av.enqueues_during_faults
    );
    let _ = writeln!(
        o,
        "  longest time without a delivery during the fault phase: {} ms (from {:.1} s)",
        av.longest_claim_gap_ms,
        av.longest_claim_gap_at_ms as f64 / 1000.0
    );
    for (f, fa) in &av.per_fault {
        let _ = writeln!(
            o,
            "    {f:<18} {:>2} windows {:>6.1} s  enqueues ok {:>6} of {:<5} longest claim gap {} ms",
            fa.windows,
            fa.seconds,
            pct(fa.ok_share),
            fa.enqueues,
            fa.longest_claim_gap_ms
        );
    }
    if av.leader_stops > 0 {
        let _ = writeln!(
            o,
            "  leaders stopped by SIGTERM: {}, {} without a successor; next leader after at most {} ms, \
             leaderless at most {} ms",
            av.leader_stops,
            av.leader_stops_without_successor,
            av.longest_leader_stop_to_next_leader_ms,
            av.longest_leaderless_after_leader_stop_ms
        );
    }
    upgrade(&mut o, s);
    limits(&mut o, a);
    let _ = writeln!(o, "\n== {}", if a.valid { "VALID: no violation" } else { "INVALID" });
    for v in &a.violations {
        let _ = writeln!(o, "  violation: {v}");
    }
    o
}

/// The upgrade scenario's section: each step, the cluster version timeline, the expectations, and a summary.
fn upgrade(o: &mut String, s: &Summary) {
    let a = &s.analysis;
    let u = &a.upgrade;
    if u.steps.is_empty() && u.expectations.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n-- upgrade");
    for st in &u.steps {
        let _ = writeln!(
            o,
            "  {:>6.1} s  {:>5.1} s  node {}  longest claim gap {:>5} ms  enqueues ok {:>6} of {:<4} {}",
            st.from_ms as f64 / 1000.0,
            st.seconds,
            st.node,
            st.longest_claim_gap_ms,
            pct(st.ok_share),
            st.enqueues,
            st.what
        );
    }
    let mut timeline = String::new();
    for (t, node, version, cv) in &u.versions {
        let _ = write!(timeline, " {:.1}s:n{node}=v{version}/cv{cv}", *t as f64 / 1000.0);
    }
    let _ = writeln!(o, "  versions (binary/cluster) as each node reported them:{timeline}");
    if let Some(at) = u.upgraded_at_ms {
        let first: Vec<String> = u
            .versions
            .iter()
            .filter(|(t, _, _, cv)| *t >= at && *cv >= 1)
            .fold(Vec::<(u64, u64)>::new(), |mut acc, (t, n, _, _)| {
                if !acc.iter().any(|(m, _)| m == n) {
                    acc.push((*n, *t));
                }
                acc
            })
            .iter()
            .map(|(n, t)| format!("node {n} +{} ms", t - at))
            .collect();
        let _ = writeln!(
            o,
            "  last node swapped at {:.1} s; cluster version 1 reported by {}",
            at as f64 / 1000.0,
            first.join(", ")
        );
    }
    for (what, passed, detail) in &u.expectations {
        let _ = writeln!(o, "  [{}] {what}: {detail}", if *passed { "ok" } else { "FAIL" });
    }
    finding(o, "cluster version 1 while a node was old", &u.switched_early);
    let worst = u.steps.iter().map(|st| st.longest_claim_gap_ms).max().unwrap_or(0);
    let _ = writeln!(
        o,
        "  summary: {} tasks acknowledged, {} lost, {} duplicate deliveries ({} unexplained), worst claim gap of a \
         step {} ms, {} of {} expectations met",
        a.enqueues.ok,
        a.lost.count,
        a.redeliveries.duplicates,
        a.redeliveries.unexplained.count,
        worst,
        u.expectations.iter().filter(|e| e.1).count(),
        u.expectations.len()
    );
}

/// The limits workload's section: how close the run came to each limit, what bounded the intervals, the shares.
fn limits(o: &mut String, a: &Analysis) {
    let Some(l) = &a.limits else { return };
    let _ = writeln!(o, "\n-- limits (queue {}, cap {})", l.queue, l.max_running);
    let _ = writeln!(
        o,
        "  deliveries {}: {} ended by an accepted result, {} by the lease deadline or a send, {} left out; \
         deadlines {}",
        l.deliveries,
        l.ended_by_ack,
        l.ended_by_deadline,
        l.left_out,
        if l.deadlines_used { "used" } else { "not used" }
    );
    let _ = writeln!(o, "  most running at once (a lower bound): {} of cap {}", l.most_running, l.max_running);
    for k in &l.keys {
        let limit = if k.limit == 0 { "-".to_string() } else { k.limit.to_string() };
        let rate = if k.per_second > 0.0 { format!("  rate {}/s", k.per_second) } else { String::new() };
        let _ = writeln!(
            o,
            "    key {:<6} weight {:>2} ({:>5})  claims during faults {:>5} ({:>5})  most running {} of {limit}{rate}",
            format!("{:?}", k.key),
            k.weight,
            pct(k.weight_share),
            k.claims,
            pct(k.share),
            k.most_running
        );
    }
    finding(o, "more running than the cap", &l.over_cap);
    finding(o, "more running than a key's limit", &l.over_key_limit);
}
