//! Faults (nemeses) on a schedule drawn from the run's seed: a quiet pause, one fault chosen among those
//! selected, held for a while, then undone; again until the time limit. The same seed gives the same
//! sequence of choices (what happens in the cluster meanwhile does not repeat exactly: it runs in real time).
//!
//! Every fault records a `start` and a `stop` event (and `note`s for what it saw), so the checkers know the
//! fault windows. `heal` undoes everything at the end: lifts network rules, resumes paused nodes, restarts
//! stopped ones, removes nodes that cannot start and fills their positions with new nodes.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use tokio::time::Instant;

use crate::cluster::{Cluster, NodeState};
use crate::history::{FaultPhase, Op, Recorder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Fault {
    /// kill -9 a random node, restart it later.
    Kill,
    /// kill -9 the leader, restart it later.
    KillLeader,
    /// kill -9 a minority of the nodes at once.
    KillMinority,
    /// SIGSTOP a node (the leader half of the time), SIGCONT later.
    Pause,
    /// Cut the leader off from every other node, both ways.
    PartitionLeader,
    /// Split the nodes in two (a minority and a majority).
    PartitionSplit,
    /// One node cannot send to the others, or cannot hear them.
    PartitionOneWay,
    /// 5-40 ms (sometimes 60-150 ms) of latency with jitter on every link; sometimes every connection reset
    /// at once.
    Delay,
    /// A burst of leadership transfers.
    Transfers,
    /// SIGTERM and restart every node in turn, waiting for each to catch up.
    RollingRestart,
    /// kill -9 every node at once, restart them all.
    CrashAll,
    /// Remove a node from the membership and add a new one under a new id.
    Membership,
    /// Restart a node with its wall clock 2-30 s off (libfaketime) and make it the leader.
    ClockSkew,
    /// Flip bytes in a stopped node's redb files and restart it.
    Corrupt,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::KillLeader => "kill-leader",
            Fault::KillMinority => "kill-minority",
            Fault::Pause => "pause",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionSplit => "partition-split",
            Fault::PartitionOneWay => "partition-one-way",
            Fault::Delay => "delay",
            Fault::Transfers => "transfers",
            Fault::RollingRestart => "rolling-restart",
            Fault::CrashAll => "crash-all",
            Fault::Membership => "membership",
            Fault::ClockSkew => "clock-skew",
            Fault::Corrupt => "corrupt",
        }
    }

    pub const ALL: [Fault; 14] = [
        Fault::Kill,
        Fault::KillLeader,
        Fault::KillMinority,
        Fault::Pause,
        Fault::PartitionLeader,
        Fault::PartitionSplit,
        Fault::PartitionOneWay,
        Fault::Delay,
        Fault::Transfers,
        Fault::RollingRestart,
        Fault::CrashAll,
        Fault::Membership,
        Fault::ClockSkew,
        Fault::Corrupt,
    ];
}

/// Phrase a note uses when a node does not come back; the checker flags it for every fault but `corrupt`.
pub const REFUSED_TO_START: &str = "refused to start";
/// Phrase a note uses when a node process ended without the harness stopping it.
pub const EXITED: &str = "exited by itself";

pub struct Schedule {
    /// Quiet time between faults, ms.
    pub quiet_ms: (u64, u64),
    /// How long a fault is held, ms.
    pub hold_ms: (u64, u64),
}

pub struct Nemesis<'a> {
    pub c: &'a mut Cluster,
    rec: Arc<Recorder>,
    rng: StdRng,
}

impl<'a> Nemesis<'a> {
    pub fn new(c: &'a mut Cluster, rec: Arc<Recorder>, rng: StdRng) -> Nemesis<'a> {
        Nemesis { c, rec, rng }
    }

    fn event(&self, fault: Fault, phase: FaultPhase, detail: impl Into<String>) {
        self.event_on(fault, phase, detail, None);
    }

    fn event_on(&self, fault: Fault, phase: FaultPhase, detail: impl Into<String>, node: Option<u64>) {
        let detail = detail.into();
        eprintln!(
            "[{:>7.1}s] {:<18} {:<5} {detail}",
            self.rec.now() as f64 / 1000.0,
            fault.name(),
            match phase {
                FaultPhase::Start => "start",
                FaultPhase::Stop => "stop",
                FaultPhase::Note => "note",
            }
        );
        self.rec.record(Op::Nemesis { fault: fault.name().into(), phase, detail, node });
    }

    fn between(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(if hi > lo { self.rng.random_range(lo..=hi) } else { lo })
    }

    /// Faults from `faults` until `until`.
    pub async fn run(&mut self, faults: &[Fault], until: Instant, s: &Schedule) {
        while Instant::now() < until {
            let quiet = self.between(s.quiet_ms);
            tokio::time::sleep_until((Instant::now() + quiet).min(until)).await;
            if Instant::now() >= until {
                break;
            }
            let f = *faults.choose(&mut self.rng).expect("at least one fault");
            let hold = self.between(s.hold_ms);
            self.reap(f);
            self.step(f, hold).await;
            self.reap(f);
            // The next fault starts from a cluster with a leader (or after a bounded wait for one).
            if self.c.wait_leader(Duration::from_secs(15)).await.is_err() {
                self.event(f, FaultPhase::Note, "no leader 15 s after the fault stopped");
            }
        }
    }

    async fn leader(&self) -> Option<u64> {
        self.c.leader().await.map(|(l, _)| l)
    }

    /// A running node; the leader with probability `leader_share` when one is known.
    async fn pick(&mut self, leader_share: f64) -> Option<u64> {
        let ups = self.c.up_ids();
        if self.rng.random_bool(leader_share) {
            if let Some(l) = self.leader().await {
                return Some(l);
            }
        }
        ups.choose(&mut self.rng).copied()
    }

    /// Notes every node that exited without the harness stopping it (a crash, or a signal from outside).
    fn reap(&mut self, fault: Fault) {
        for (id, status) in self.c.reap() {
            self.event_on(fault, FaultPhase::Note, format!("node {id} {EXITED} ({status})"), Some(id));
        }
    }

    /// A node that did not come back: noted (with its id, for the checker) and marked broken.
    fn refused(&mut self, fault: Fault, id: u64, e: String) {
        self.event_on(fault, FaultPhase::Note, format!("node {id} {REFUSED_TO_START}: {e}"), Some(id));
        self.c.mark_broken(id);
    }

    /// Like `pick`, among nodes whose files were never corrupted (those stay until the convergence check).
    async fn pick_uncorrupted(&mut self, leader_share: f64) -> Option<u64> {
        let ok: Vec<u64> = self.c.up_ids().into_iter().filter(|id| !self.c.node(*id).corrupted).collect();
        if self.rng.random_bool(leader_share) {
            if let Some(l) = self.leader().await.filter(|l| ok.contains(l)) {
                return Some(l);
            }
        }
        ok.choose(&mut self.rng).copied()
    }

    async fn restart(&mut self, fault: Fault, id: u64) {
        match self.c.restart(id).await {
            Ok(()) => {}
            Err(e) => {
                self.refused(fault, id, e);
            }
        }
    }

    pub async fn step(&mut self, f: Fault, hold: Duration) {
        match f {
            Fault::Kill | Fault::KillLeader => {
                let share = if f == Fault::KillLeader { 1.0 } else { 0.0 };
                let Some(id) = self.pick(share).await else { return };
                self.event(f, FaultPhase::Start, format!("kill -9 node {id}"));
                self.c.kill9(id).await;
                tokio::time::sleep(hold).await;
                self.restart(f, id).await;
                self.event(f, FaultPhase::Stop, format!("node {id} restarted"));
            }
            Fault::KillMinority => {
                let mut ups = self.c.up_ids();
                ups.shuffle(&mut self.rng);
                let k = (self.c.member_ids().len() - 1) / 2;
                let victims: Vec<u64> = ups.into_iter().take(k.max(1)).collect();
                self.event(f, FaultPhase::Start, format!("kill -9 nodes {victims:?}"));
                for id in &victims {
                    self.c.kill9(*id).await;
                }
                tokio::time::sleep(hold).await;
                for id in &victims {
                    self.restart(f, *id).await;
                }
                self.event(f, FaultPhase::Stop, format!("nodes {victims:?} restarted"));
            }
            Fault::Pause => {
                let Some(id) = self.pick(0.5).await else { return };
                self.event(f, FaultPhase::Start, format!("SIGSTOP node {id}"));
                self.c.signal(id, "STOP");
                tokio::time::sleep(hold).await;
                self.c.signal(id, "CONT");
                self.event(f, FaultPhase::Stop, format!("SIGCONT node {id}"));
            }
            Fault::PartitionLeader => {
                let Some(l) = self.leader().await else { return };
                let others: Vec<u64> = self.c.member_ids().into_iter().filter(|x| *x != l).collect();
                self.event(f, FaultPhase::Start, format!("isolate leader {l} from {others:?}"));
                self.c.net.update(|r| {
                    for o in &others {
                        r.blocked.insert((l, *o));
                        r.blocked.insert((*o, l));
                    }
                });
                tokio::time::sleep(hold).await;
                self.c.net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::PartitionSplit => {
                let mut ids = self.c.member_ids();
                ids.shuffle(&mut self.rng);
                let k = self.rng.random_range(1..=((ids.len() - 1) / 2).max(1));
                let (minority, majority) = ids.split_at(k);
                let (minority, majority) = (minority.to_vec(), majority.to_vec());
                self.event(f, FaultPhase::Start, format!("split {minority:?} | {majority:?}"));
                self.c.net.update(|r| {
                    for a in &minority {
                        for b in &majority {
                            r.blocked.insert((*a, *b));
                            r.blocked.insert((*b, *a));
                        }
                    }
                });
                tokio::time::sleep(hold).await;
                self.c.net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::PartitionOneWay => {
                let Some(a) = self.pick(0.5).await else { return };
                let others: Vec<u64> = self.c.member_ids().into_iter().filter(|x| *x != a).collect();
                let deaf = self.rng.random_bool(0.5);
                let what = if deaf { "cannot hear" } else { "cannot send to" };
                self.event(f, FaultPhase::Start, format!("node {a} {what} {others:?}"));
                self.c.net.update(|r| {
                    for o in &others {
                        r.blocked.insert(if deaf { (*o, a) } else { (a, *o) });
                    }
                });
                tokio::time::sleep(hold).await;
                self.c.net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::Delay => {
                // Mostly latency the cluster works through; one time in five more than openraft's append
                // timeout (the heartbeat interval, 100 ms) allows for a round trip, which stalls replication.
                let ms = if self.rng.random_bool(0.8) {
                    self.rng.random_range(5..=40u64)
                } else {
                    self.rng.random_range(60..=150u64)
                };
                let reset = self.rng.random_bool(0.3);
                let ids = self.c.member_ids();
                self.event(
                    f,
                    FaultPhase::Start,
                    format!("{ms} ms +0-{} ms on every link; reset first: {reset}", ms / 2),
                );
                if reset {
                    for a in &ids {
                        for b in &ids {
                            if a < b {
                                self.c.net.reset(*a, *b);
                            }
                        }
                    }
                }
                self.c.net.update(|r| {
                    for a in &ids {
                        for b in &ids {
                            if a != b {
                                r.delay.insert((*a, *b), (ms, ms / 2));
                            }
                        }
                    }
                });
                tokio::time::sleep(hold).await;
                self.c.net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::Transfers => {
                let n = self.rng.random_range(3..=8);
                self.event(f, FaultPhase::Start, format!("{n} leadership transfers"));
                let mut done = Vec::new();
                for _ in 0..n {
                    let leader = self.leader().await;
                    let targets: Vec<u64> = self.c.up_ids().into_iter().filter(|x| Some(*x) != leader).collect();
                    let ups = self.c.up_ids();
                    let (Some(to), Some(via)) =
                        (targets.choose(&mut self.rng).copied(), ups.choose(&mut self.rng).copied())
                    else {
                        break;
                    };
                    match self.c.transfer(via, to).await {
                        Ok(ms) => done.push(format!("{to}:{ms}ms")),
                        Err(e) => done.push(format!("{to}:failed ({e})")),
                    }
                    let pause = self.between((100, 600));
                    tokio::time::sleep(pause).await;
                }
                self.event(f, FaultPhase::Stop, format!("transfers {}", done.join(", ")));
            }
            Fault::RollingRestart => {
                let ids = self.c.member_ids();
                self.event(f, FaultPhase::Start, format!("SIGTERM and restart {ids:?} in turn"));
                for id in ids {
                    if self.c.node(id).state == NodeState::Broken {
                        continue;
                    }
                    let how = self.c.terminate(id).await;
                    if how != "exit status: 0" {
                        self.event(f, FaultPhase::Note, format!("node {id} after SIGTERM: {how}"));
                    }
                    self.restart(f, id).await;
                    if let Err(e) = self.c.wait_caught_up(Duration::from_secs(30)).await {
                        self.event(f, FaultPhase::Note, e.to_string());
                    }
                }
                self.event(f, FaultPhase::Stop, "every node restarted");
            }
            Fault::CrashAll => {
                let ids: Vec<u64> = self
                    .c
                    .nodes
                    .iter()
                    .filter(|n| matches!(n.state, NodeState::Running | NodeState::Paused))
                    .map(|n| n.id)
                    .collect();
                self.event(f, FaultPhase::Start, format!("kill -9 every node {ids:?}"));
                for id in &ids {
                    self.c.kill9(*id).await;
                }
                tokio::time::sleep(self.between((500, 3000))).await;
                for id in &ids {
                    if let Err(e) = self.c.spawn(*id) {
                        self.event(f, FaultPhase::Note, format!("node {id}: {e}"));
                    }
                }
                for id in &ids {
                    if let Err(e) = self.c.wait_serving(*id, crate::cluster::START_WAIT).await {
                        self.refused(f, *id, e);
                    }
                }
                self.event(f, FaultPhase::Stop, "every node restarted");
            }
            Fault::Membership => {
                // A member that cannot run is the one an operator replaces first (removing another while it
                // is down would leave the new configuration without a majority).
                let broken = self.c.nodes.iter().find(|n| n.state == NodeState::Broken).map(|n| n.id);
                let victim = match broken {
                    Some(b) => b,
                    None => match self.pick_uncorrupted(0.3).await {
                        Some(v) => v,
                        None => return,
                    },
                };
                let Some(via) = self.c.up_ids().into_iter().find(|x| *x != victim) else { return };
                self.event(f, FaultPhase::Start, format!("remove node {victim}, then add a new node in its place"));
                self.replace(f, via, victim).await;
                self.event(f, FaultPhase::Stop, format!("members now {:?}", self.c.member_ids()));
            }
            Fault::ClockSkew => {
                if self.c.faketime.is_none() {
                    self.event(f, FaultPhase::Note, "skipped: libfaketime is not installed (apt-get install faketime)");
                    return;
                }
                let Some(id) = self.pick(0.5).await else { return };
                let secs = self.rng.random_range(2..=30);
                let offset = if self.rng.random_bool(0.5) { format!("+{secs}s") } else { format!("-{secs}s") };
                self.event(f, FaultPhase::Start, format!("restart node {id} with its clock {offset}, make it lead"));
                self.c.terminate(id).await;
                self.c.set_skew(id, Some(offset));
                self.restart(f, id).await;
                if self.c.node(id).state == NodeState::Running {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Some(via) = self.c.up_ids().first().copied() {
                        match self.c.transfer(via, id).await {
                            Ok(ms) => self.event(f, FaultPhase::Note, format!("node {id} leads ({ms} ms)")),
                            Err(e) => self.event(f, FaultPhase::Note, format!("transfer to {id} failed: {e}")),
                        }
                    }
                }
                tokio::time::sleep(hold).await;
                self.c.terminate(id).await;
                self.c.set_skew(id, None);
                if self.c.node(id).state != NodeState::Broken {
                    self.restart(f, id).await;
                }
                self.event(f, FaultPhase::Stop, format!("node {id} restarted with the true clock"));
            }
            Fault::Corrupt => {
                let Some(id) = self.pick_uncorrupted(0.3).await else {
                    self.event(f, FaultPhase::Note, "skipped: every running node was corrupted already");
                    return;
                };
                let kill = self.rng.random_bool(0.5);
                self.event(
                    f,
                    FaultPhase::Start,
                    format!(
                        "stop node {id} ({}), corrupt a redb file, restart",
                        if kill { "kill -9" } else { "SIGTERM" }
                    ),
                );
                if kill {
                    self.c.kill9(id).await;
                } else {
                    self.c.terminate(id).await;
                }
                match self.c.corrupt(id, &mut self.rng) {
                    Ok(what) => self.event_on(f, FaultPhase::Note, format!("node {id}: {what}"), Some(id)),
                    Err(e) => self.event(f, FaultPhase::Note, format!("node {id}: corruption failed: {e}")),
                }
                match self.c.restart(id).await {
                    Ok(()) => {
                        self.c.mark_corrupted(id);
                        self.event(f, FaultPhase::Note, format!("node {id} started on the corrupted files"));
                        tokio::time::sleep(hold).await;
                        self.event(f, FaultPhase::Stop, format!("node {id} serves"));
                    }
                    Err(e) => {
                        self.refused(f, id, e);
                        let via = self.c.up_ids().first().copied();
                        if let Some(via) = via {
                            self.replace(f, via, id).await;
                        }
                        self.event(f, FaultPhase::Stop, format!("members now {:?}", self.c.member_ids()));
                    }
                }
            }
        }
    }

    /// Removes `victim` from the membership, stops it, and adds a new node (new id, empty data) in its
    /// position.
    async fn replace(&mut self, f: Fault, via: u64, victim: u64) {
        let mut removed = false;
        for attempt in 1..=3 {
            // Through the leader's node when one is known: a follower forwarding to a leader that just died
            // fails with a transport error.
            let via = match self.c.wait_leader(Duration::from_secs(10)).await {
                Ok(l) if l != victim => l,
                _ => via,
            };
            match self.c.remove_member(via, victim).await {
                Ok(()) => {
                    removed = true;
                    break;
                }
                Err(e) => self.event(f, FaultPhase::Note, format!("remove node {victim} (try {attempt}) failed: {e}")),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if !removed {
            return;
        }
        self.c.kill9(victim).await;
        let slot = self.c.node(victim).slot;
        let via = self.c.up_ids().into_iter().next().unwrap_or(via);
        match self.c.add_new_node(via, slot).await {
            Ok(new) => self.event(f, FaultPhase::Note, format!("node {new} added in place of {victim}")),
            Err(e) => self.event(f, FaultPhase::Note, format!("adding a node in place of {victim} failed: {e}")),
        }
    }

    /// Undoes every fault: network rules, pauses, skewed clocks, stopped nodes, broken nodes, empty positions.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        let f = Fault::Kill; // notes only; the fault name is irrelevant here
        self.reap(f);
        self.c.net.heal();
        let ids: Vec<u64> = self.c.nodes.iter().map(|n| n.id).collect();
        for id in &ids {
            let (state, skewed) = (self.c.node(*id).state, self.c.node(*id).skew.is_some());
            if state == NodeState::Paused {
                self.c.signal(*id, "CONT");
            }
            if skewed {
                self.c.terminate(*id).await;
                self.c.set_skew(*id, None);
            }
            if self.c.node(*id).state == NodeState::Down {
                self.restart(f, *id).await;
            }
        }
        for id in &ids {
            if self.c.node(*id).state == NodeState::Broken {
                if let Some(via) = self.c.up_ids().first().copied() {
                    self.replace(f, via, *id).await;
                }
            }
        }
        for slot in 0..self.c.slots.len() {
            let held = self.c.nodes.iter().any(|n| n.slot == slot && n.member());
            if !held {
                if let Some(via) = self.c.up_ids().first().copied() {
                    match self.c.add_new_node(via, slot).await {
                        Ok(new) => self.event(f, FaultPhase::Note, format!("heal: node {new} fills position {slot}")),
                        Err(e) => self.event(f, FaultPhase::Note, format!("heal: position {slot} stays empty: {e}")),
                    }
                }
            }
        }
        self.c.wait_leader(Duration::from_secs(30)).await?;
        self.c.wait_caught_up(Duration::from_secs(60)).await?;
        Ok(())
    }
}
