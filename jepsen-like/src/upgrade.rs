//! The upgrade scenario (`run --scenario upgrade --old-bin PATH`): a rolling upgrade from the previous release
//! under the normal workload, in place of the random faults. The cluster starts on the previous binary; then
//!
//! 1. one follower is upgraded; it is made leader and an old follower is stopped long enough to catch up by a
//!    snapshot the new binary built (snapshots are frequent in this scenario); then the upgraded node is
//!    downgraded again (`raftq data downgrade`, then the previous binary), which must work while the cluster
//!    version is 0;
//! 2. the followers are upgraded one at a time, leadership moves to an upgraded node, the old leader goes last;
//! 3. the cluster version must reach 1 on every node within `SWITCH_BOUND` of the last node serving;
//! 4. after the switch one node is stopped: `raftq data downgrade` must refuse (naming the cluster version) and
//!    the previous binary must exit non-zero on its files without serving; it is started again on the current
//!    binary, and the final convergence check compares its digest with the others'.
//!
//! Each node's step is a fault window named `upgrade` (start and stop events, with the node), so the checker
//! measures the claim gap and the enqueues of each step. Which binary each node runs is recorded
//! (`Op::Binary`), the cluster version each node reports comes from the run's status monitor
//! (`Op::ClusterVersion`), and what can only be judged as it happens (exit statuses, bounded waits) is
//! recorded as `Op::Expect`; the checker turns every failed expectation into a violation, and flags a node
//! reporting cluster version 1 while another still ran the previous binary.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, NodeState};
use crate::history::{FaultPhase, Op, Recorder};

/// The fault name of every step's window.
pub const STEP: &str = "upgrade";
/// The mark recorded once no node runs the previous binary (the cluster version may switch from then on).
pub const UPGRADED: &str = "upgraded";
/// How long the cluster version may take to reach 1 on every node after the last node serves the new binary:
/// the leader asks the members every second, then the switch is one entry of the log.
pub const SWITCH_BOUND: Duration = Duration::from_secs(15);
/// How long the previous binary may take to exit on files it cannot read.
const REFUSAL_BOUND: Duration = Duration::from_secs(10);
/// How long a node may take to catch up after a restart.
const CATCH_UP: Duration = Duration::from_secs(60);
/// How long an old follower stays down while the current binary leads: long enough, under the workload, for
/// the leader to snapshot and purge past it with `SNAPSHOT_SETTINGS`.
const LAG: Duration = Duration::from_secs(4);
/// Snapshots much more often than in fault runs, so nodes restarted during the upgrade catch up by snapshot
/// (built by the previous binary, or by the current one for an old follower) rather than from the log.
const SNAPSHOT_SETTINGS: [(&str, u64); 2] = [("snapshot_every_entries", 300), ("snapshot_keep_entries", 20)];
/// Load between steps, so each step's claim gap is measured against a running workload.
const BETWEEN_STEPS: Duration = Duration::from_secs(2);

/// The fault runs' server settings with the scenario's snapshot settings in place of theirs.
pub fn server_settings(base: &str) -> String {
    let mut out = String::new();
    for line in base.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        match SNAPSHOT_SETTINGS.iter().find(|(k, _)| *k == key) {
            Some((k, v)) => out.push_str(&format!("{k} = {v}\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

pub struct Upgrade<'a, B: Backend> {
    c: &'a mut B,
    rec: Arc<Recorder>,
    /// The binary version the previous release reports (0 for one from before cluster versions, which does not
    /// answer the call), read from the nodes as the run starts.
    old_version: u32,
}

/// The newest cluster version the current build applies (`raft::version::SUPPORTED` in the server: 5 since Raft
/// messages in variable-length integers, 4 since snapshots of v2 records, 3 since SetKeyLimit, 2 since SetLimits,
/// SetFairnessWeight and SetRateLimit); the harness links only the SDK, so the number is written here.
const CURRENT_VERSION: u32 = 5;

impl<'a, B: Backend> Upgrade<'a, B> {
    pub fn new(c: &'a mut B, rec: Arc<Recorder>) -> Upgrade<'a, B> {
        Upgrade { c, rec, old_version: 0 }
    }

    fn say(&self, phase: FaultPhase, node: Option<u64>, detail: impl Into<String>) {
        let detail = detail.into();
        let ph = match phase {
            FaultPhase::Start => "start",
            FaultPhase::Stop => "stop",
            FaultPhase::Note => "note",
        };
        eprintln!("[{:>7.1}s] {STEP:<18} {ph:<5} {detail}", self.rec.now() as f64 / 1000.0);
        self.rec.record(Op::Nemesis { fault: STEP.into(), phase, detail, node });
    }

    fn expect(&self, what: &str, passed: bool, detail: impl Into<String>) {
        let detail = detail.into();
        eprintln!(
            "[{:>7.1}s] {STEP:<18} {:<5} {what}: {detail}",
            self.rec.now() as f64 / 1000.0,
            if passed { "ok" } else { "FAIL" }
        );
        self.rec.record(Op::Expect { what: what.into(), passed, detail });
    }

    fn binary(&mut self, id: u64, old: bool) {
        if let Err(e) = self.c.set_old_binary(id, old) {
            self.expect("swap the binary", false, format!("node {id}: {e:#}"));
        }
        self.rec.record(Op::Binary { node: id, binary: if old { "old" } else { "new" }.into() });
    }

    /// SIGTERM; a node that does not exit cleanly is noted.
    async fn stop(&mut self, id: u64) {
        let how = self.c.terminate(id).await;
        if how != "exit status: 0" {
            self.say(FaultPhase::Note, Some(id), format!("node {id} after SIGTERM: {how}"));
        }
    }

    /// Starts the stopped node, waits until it serves and the cluster has caught up; checks the binary version
    /// its status reports (0 for the previous release).
    async fn start(&mut self, id: u64, old: bool) -> bool {
        if let Err(e) = self.c.restart(id).await {
            let which = if old { "the previous" } else { "the current" };
            self.expect(&format!("node {id} starts on {which} binary"), false, e);
            return false;
        }
        if let Err(e) = self.c.wait_caught_up(CATCH_UP).await {
            self.say(FaultPhase::Note, Some(id), format!("{e:#}"));
        }
        let version = self.c.admins().status(id).await.map(|s| s.version);
        let want = if old { self.old_version } else { CURRENT_VERSION };
        if version != Some(want) {
            self.expect(
                "a node reports its binary's version",
                false,
                format!("node {id}: {version:?}, expected {want}"),
            );
        }
        true
    }

    /// A stopped node on the previous binary; if that cannot run, back on the current one so the scenario
    /// goes on (the failed start is an expectation failed).
    async fn start_old(&mut self, id: u64) {
        self.binary(id, true);
        if !self.start(id, true).await {
            self.binary(id, false);
            self.start(id, false).await;
        }
    }

    async fn leader(&self) -> Option<u64> {
        self.c.wait_leader(Duration::from_secs(15)).await.ok()
    }

    /// A running follower, the lowest id.
    async fn follower(&self) -> Option<u64> {
        let leader = self.leader().await;
        self.c.up_ids().into_iter().find(|id| Some(*id) != leader)
    }

    /// The whole scenario; `load` is the time the workload runs on the previous release first.
    pub async fn run(&mut self, load: Duration) {
        let ids = self.c.member_ids();
        for id in &ids {
            let old = self.c.runs_old_binary(*id);
            self.rec.record(Op::Binary { node: *id, binary: if old { "old" } else { "new" }.into() });
        }
        // The previous release: one from before cluster versions (version 0), or a later one below this build's
        // version; every node runs it, at a cluster version it applies.
        let versions = self.c.admins().statuses(&ids).await;
        self.old_version = versions.values().map(|s| s.version).min().unwrap_or(0);
        let all_old = ids.iter().all(|id| {
            versions.get(id).is_some_and(|s| {
                s.version == self.old_version && s.version < CURRENT_VERSION && s.cluster_version <= s.version
            })
        });
        let seen: Vec<String> =
            versions.values().map(|s| format!("{}:v{}/cv{}", s.node_id, s.version, s.cluster_version)).collect();
        self.expect(
            &format!("every node starts on the previous release (version {})", self.old_version),
            all_old,
            seen.join(" "),
        );
        tokio::time::sleep(load).await;

        // 1. Up and down again before the switch.
        if let Some(f) = self.follower().await {
            self.say(FaultPhase::Start, Some(f), format!("upgrade follower {f} (before a downgrade)"));
            self.stop(f).await;
            self.binary(f, false);
            self.start(f, false).await;
            self.say(FaultPhase::Stop, Some(f), format!("node {f} runs the current binary"));
            tokio::time::sleep(BETWEEN_STEPS).await;
            self.old_follower_under_new_leader(f).await;

            self.say(FaultPhase::Start, Some(f), format!("downgrade node {f}: data downgrade, previous binary"));
            self.stop(f).await;
            let down = self.c.data_downgrade(f).await;
            let ok = down.is_ok();
            self.expect("data downgrade before the switch succeeds", ok, format!("node {f}: {}", text(&down)));
            if ok {
                self.start_old(f).await;
            } else {
                self.start(f, false).await;
            }
            self.say(FaultPhase::Stop, Some(f), format!("node {f} runs the {} binary", which(self.c, f)));
            tokio::time::sleep(BETWEEN_STEPS).await;
        } else {
            self.expect("a follower to upgrade and downgrade", false, "no running follower");
        }

        // 2. Rolling upgrade: followers first, then leadership to an upgraded node, the old leader last.
        let leader = self.leader().await;
        let mut order: Vec<u64> = ids.iter().copied().filter(|id| Some(*id) != leader).collect();
        order.extend(leader);
        let last = order.len().saturating_sub(1);
        for (i, id) in order.iter().copied().enumerate() {
            if !self.c.runs_old_binary(id) {
                continue;
            }
            if i == last {
                let to = order.iter().copied().find(|x| *x != id && self.c.state(*x) == NodeState::Running);
                if self.leader().await == Some(id) {
                    if let Some(to) = to {
                        let r = self.c.transfer(id, to).await;
                        let moved = self.leader().await;
                        self.expect(
                            "leadership moves to an upgraded node",
                            moved.is_some_and(|l| l != id),
                            format!("transfer {id} -> {to}: {r:?}; leader now {moved:?}"),
                        );
                    }
                }
            }
            self.say(FaultPhase::Start, Some(id), format!("upgrade node {id} ({} of {})", i + 1, order.len()));
            self.stop(id).await;
            self.binary(id, false);
            if ids.iter().all(|x| !self.c.runs_old_binary(*x)) {
                self.rec.record(Op::Mark { what: UPGRADED.into() });
            }
            let since = Instant::now();
            self.start(id, false).await;
            self.say(FaultPhase::Stop, Some(id), format!("node {id} runs the current binary"));
            if i == last {
                self.wait_switch(&ids, since).await;
            }
            tokio::time::sleep(BETWEEN_STEPS).await;
        }

        // 4. After the switch the previous binary refuses the data; the current one still reads it.
        let Some(y) = self.follower().await else {
            return self.expect("a follower for the refusal", false, "no running follower");
        };
        self.say(FaultPhase::Start, Some(y), format!("node {y}: downgrade and the previous binary after the switch"));
        self.stop(y).await;
        let down = self.c.data_downgrade(y).await;
        let named = down.as_ref().err().is_some_and(|e| e.to_lowercase().contains("cluster version"));
        self.expect(
            "data downgrade after the switch refuses, naming the cluster version",
            named,
            format!("node {y}: {}", text(&down)),
        );
        self.binary(y, true);
        let started = Instant::now();
        let r = match self.c.start(y).await {
            Ok(()) => self.c.wait_serving(y, REFUSAL_BOUND).await,
            Err(e) => Err(format!("not started: {e:#}")),
        };
        let took = started.elapsed();
        let refused = matches!(&r, Err(e) if e.starts_with("exited (") && !e.starts_with("exited (exit status: 0)"));
        self.expect(
            "the previous binary exits non-zero on the files after the switch, without serving",
            refused,
            format!("node {y} after {} ms: {}", took.as_millis(), text(&r.map(|()| "it served".to_string()))),
        );
        if self.c.state(y) == NodeState::Running {
            self.c.kill(y).await.ok();
        }
        self.binary(y, false);
        self.start(y, false).await;
        self.say(FaultPhase::Stop, Some(y), format!("node {y} runs the current binary again"));
        tokio::time::sleep(BETWEEN_STEPS).await;
    }

    /// The current binary leads a mixed cluster: leadership moves to `f` (upgraded), and an old follower is
    /// stopped long enough for the leader to purge the entries it misses (the scenario's snapshot settings), so
    /// it catches up by installing a snapshot the new binary built, which must hold records it can read.
    async fn old_follower_under_new_leader(&mut self, f: u64) {
        let Some(g) = self.c.up_ids().into_iter().find(|x| *x != f && self.c.runs_old_binary(*x)) else { return };
        let r = self.c.transfer(f, f).await;
        let leader = self.leader().await;
        self.expect(
            "leadership moves to the upgraded node",
            leader == Some(f),
            format!("to {f}: {r:?}; leader now {leader:?}"),
        );
        if leader != Some(f) {
            return;
        }
        self.say(
            FaultPhase::Start,
            Some(g),
            format!("node {f} (current binary) leads; stop old follower {g}, restart it"),
        );
        let before = self.c.admins().status(g).await.map(|s| s.applied_index).unwrap_or(0);
        self.stop(g).await;
        tokio::time::sleep(LAG).await;
        let purged = self.c.admins().status(f).await.map(|s| s.purged_index).unwrap_or(0);
        let started = self.start(g, true).await;
        let after = self.c.admins().status(g).await.map(|s| (s.applied_index, s.snapshot_index));
        self.say(
            FaultPhase::Note,
            Some(g),
            format!(
                "node {g}: applied {before} before the stop, leader {f} had purged up to {purged}; after: \
                 (applied, snapshot) {after:?}{}",
                if purged > before { " (caught up by snapshot)" } else { "" }
            ),
        );
        if !started {
            self.binary(g, false);
            self.start(g, false).await;
        }
        self.say(FaultPhase::Stop, Some(g), format!("node {g} runs the {} binary", which(self.c, g)));
        tokio::time::sleep(BETWEEN_STEPS).await;
    }

    /// Waits until every node reports a cluster version above what the previous release applies; records how
    /// long it took from `since`.
    async fn wait_switch(&mut self, ids: &[u64], since: Instant) {
        let deadline = since + SWITCH_BOUND;
        loop {
            let st = self.c.admins().statuses(ids).await;
            let all = ids.iter().all(|id| st.get(id).is_some_and(|s| s.cluster_version > self.old_version));
            if all || Instant::now() >= deadline {
                let seen: Vec<String> = st.values().map(|s| format!("{}:cv{}", s.node_id, s.cluster_version)).collect();
                let detail =
                    format!("{} ms after the last node was started ({})", since.elapsed().as_millis(), seen.join(" "));
                let what =
                    format!("cluster version above {} on every node within 15 s of the last upgrade", self.old_version);
                return self.expect(&what, all, detail);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn which(c: &impl Backend, id: u64) -> &'static str {
    if c.runs_old_binary(id) {
        "previous"
    } else {
        "current"
    }
}

fn text(r: &Result<String, String>) -> String {
    match r {
        Ok(s) => format!("ok: {s}"),
        Err(e) => format!("failed: {e}"),
    }
}
