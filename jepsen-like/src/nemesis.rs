//! Faults (nemeses) on a schedule drawn from the run's seed: a quiet pause, one fault chosen among those
//! selected, held for a while, then undone; again until the time limit. The same seed gives the same
//! sequence of choices (what happens in the cluster meanwhile does not repeat exactly: it runs in real time).
//!
//! Every fault records a `start` and a `stop` event (and `note`s for what it saw), so the checkers know the
//! fault windows. `heal` undoes everything at the end: lifts network faults, resumes paused nodes, restarts
//! stopped ones, removes nodes that cannot start and fills their positions with new nodes.
//!
//! One nemesis for every cluster: it drives the `Backend` trait (node processes or containers), which only
//! knows how to make each fault happen; the schedule, the targets and the records are the same.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use tokio::time::Instant;

use crate::backend::{leader_of, Admins, Backend, Mechanism, NodeState};
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

pub struct Nemesis<'a, B: Backend> {
    pub c: &'a mut B,
    rec: Arc<Recorder>,
    rng: StdRng,
}

/// How often the other nodes are asked who leads while a leader stops.
const HANDOVER_POLL: Duration = Duration::from_millis(20);
/// How long they are watched for a next leader after a leader's SIGTERM.
const HANDOVER_WATCH: Duration = Duration::from_secs(30);

/// What the other nodes said while a leader stopped, measured from its SIGTERM: the last time one still named
/// it, and who led next and when.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Handover {
    last_named_old: Duration,
    next: Option<(u64, Duration)>,
}

/// Asks `others` who leads every `HANDOVER_POLL` until one names a node other than `old` (or `HANDOVER_WATCH`).
async fn watch_handover(admins: Admins, others: Vec<u64>, old: u64, since: Instant) -> Handover {
    let mut h = Handover::default();
    while since.elapsed() < HANDOVER_WATCH {
        let asked = since.elapsed();
        let st = admins.statuses(&others).await;
        for s in st.values().filter(|s| s.has_leader) {
            if s.leader_id == old {
                h.last_named_old = h.last_named_old.max(asked);
            } else {
                // The leader as its own status says, if it answered; else as a follower names it.
                let next = leader_of(&st).map(|l| l.node_id).filter(|l| *l != old).unwrap_or(s.leader_id);
                h.next = Some((next, since.elapsed()));
                return h;
            }
        }
        tokio::time::sleep(HANDOVER_POLL).await;
    }
    h
}

impl<'a, B: Backend> Nemesis<'a, B> {
    pub fn new(c: &'a mut B, rec: Arc<Recorder>, rng: StdRng) -> Nemesis<'a, B> {
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

    fn failed(&self, f: Fault, what: &str, e: anyhow::Error) {
        self.event(f, FaultPhase::Note, format!("{what} failed: {e:#}"));
    }

    fn how(&self, m: Mechanism) -> &'static str {
        self.c.mechanism(m)
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
            self.reap(f).await;
            self.step(f, hold).await;
            self.reap(f).await;
            // The next fault starts from a cluster with a leader (or after a bounded wait for one).
            if self.c.wait_leader(Duration::from_secs(15)).await.is_err() {
                self.event(f, FaultPhase::Note, "no leader 15 s after the fault stopped");
            }
        }
    }

    /// A running node; the leader with probability `leader_share` when one is known.
    async fn pick(&mut self, leader_share: f64) -> Option<u64> {
        let ups = self.c.up_ids();
        if self.rng.random_bool(leader_share) {
            if let Some(l) = self.c.leader().await {
                return Some(l);
            }
        }
        ups.choose(&mut self.rng).copied()
    }

    /// Notes every node that stopped without the harness stopping it (a crash, or a signal from outside).
    async fn reap(&mut self, fault: Fault) {
        for (id, status) in self.c.reap().await {
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
        let ok: Vec<u64> = self.c.up_ids().into_iter().filter(|id| !self.c.corrupted(*id)).collect();
        if self.rng.random_bool(leader_share) {
            if let Some(l) = self.c.leader().await.filter(|l| ok.contains(l)) {
                return Some(l);
            }
        }
        ok.choose(&mut self.rng).copied()
    }

    async fn restart(&mut self, fault: Fault, id: u64) {
        if let Err(e) = self.c.restart(id).await {
            self.refused(fault, id, e);
        }
    }

    /// SIGTERM; when `id` leads, the other nodes are watched meanwhile for the next leader and the time without
    /// one is recorded (`Op::Handover`). Returns how the node ended.
    async fn terminate(&mut self, f: Fault, id: u64) -> String {
        let leader = self.c.leader().await;
        if leader != Some(id) {
            return self.c.terminate(id).await;
        }
        let others: Vec<u64> = self.c.up_ids().into_iter().filter(|x| *x != id).collect();
        let admins = self.c.admins().clone();
        let since = Instant::now();
        let (how, h) = tokio::join!(
            async {
                let how = self.c.terminate(id).await;
                (how, since.elapsed())
            },
            watch_handover(admins, others, id, since)
        );
        let ((how, exit), ms) = (how, |d: Duration| d.as_millis() as u64);
        let leaderless = h.next.map(|(_, at)| at.saturating_sub(h.last_named_old));
        let detail = match h.next {
            Some((next, at)) => format!(
                "leader {id} after {}: {how} in {} ms; node {next} led {} ms after the signal, leaderless at most {} ms",
                self.how(Mechanism::Terminate),
                ms(exit),
                ms(at),
                leaderless.map(ms).unwrap_or(0)
            ),
            None => format!(
                "leader {id} after {}: {how} in {} ms; no other node led within {HANDOVER_WATCH:?}",
                self.how(Mechanism::Terminate),
                ms(exit)
            ),
        };
        self.event_on(f, FaultPhase::Note, detail, Some(id));
        self.rec.record(Op::Handover {
            node: id,
            exit_ms: ms(exit),
            next: h.next.map(|(n, _)| n),
            led_ms: h.next.map(|(_, at)| ms(at)),
            leaderless_ms: leaderless.map(ms),
        });
        how
    }

    pub async fn step(&mut self, f: Fault, hold: Duration) {
        // Refused before the run; kept out here too, so that a fault never half happens.
        if !self.c.faults().contains(&f) {
            return self.event(f, FaultPhase::Note, "skipped: not available with this cluster");
        }
        match f {
            Fault::Kill | Fault::KillLeader => {
                let share = if f == Fault::KillLeader { 1.0 } else { 0.0 };
                let Some(id) = self.pick(share).await else { return };
                self.event(f, FaultPhase::Start, format!("{} node {id}", self.how(Mechanism::Kill)));
                if let Err(e) = self.c.kill(id).await {
                    return self.failed(f, self.how(Mechanism::Kill), e);
                }
                tokio::time::sleep(hold).await;
                self.restart(f, id).await;
                self.event(f, FaultPhase::Stop, format!("node {id} restarted"));
            }
            Fault::KillMinority => {
                let mut ups = self.c.up_ids();
                ups.shuffle(&mut self.rng);
                let k = (self.c.member_ids().len() - 1) / 2;
                let victims: Vec<u64> = ups.into_iter().take(k.max(1)).collect();
                self.event(f, FaultPhase::Start, format!("{} nodes {victims:?}", self.how(Mechanism::Kill)));
                for id in &victims {
                    if let Err(e) = self.c.kill(*id).await {
                        self.failed(f, self.how(Mechanism::Kill), e);
                    }
                }
                tokio::time::sleep(hold).await;
                for id in &victims {
                    self.restart(f, *id).await;
                }
                self.event(f, FaultPhase::Stop, format!("nodes {victims:?} restarted"));
            }
            Fault::Pause => {
                let Some(id) = self.pick(0.5).await else { return };
                self.event(f, FaultPhase::Start, format!("{} node {id}", self.how(Mechanism::Pause)));
                if let Err(e) = self.c.pause(id, true).await {
                    return self.failed(f, self.how(Mechanism::Pause), e);
                }
                tokio::time::sleep(hold).await;
                if let Err(e) = self.c.pause(id, false).await {
                    self.failed(f, self.how(Mechanism::Resume), e);
                }
                self.event(f, FaultPhase::Stop, format!("{} node {id}", self.how(Mechanism::Resume)));
            }
            Fault::PartitionLeader | Fault::PartitionSplit => {
                let minority: Vec<u64> = if f == Fault::PartitionLeader {
                    let Some(l) = self.c.leader().await else { return };
                    vec![l]
                } else {
                    let mut ids = self.c.member_ids();
                    ids.shuffle(&mut self.rng);
                    let k = self.rng.random_range(1..=((ids.len() - 1) / 2).max(1));
                    ids.into_iter().take(k).collect()
                };
                let majority: Vec<u64> = self.c.member_ids().into_iter().filter(|x| !minority.contains(x)).collect();
                let what = if f == Fault::PartitionLeader {
                    format!("isolate leader {} from {majority:?}", minority[0])
                } else {
                    format!("split {minority:?} | {majority:?}")
                };
                self.event(f, FaultPhase::Start, format!("{what}{}", self.how(Mechanism::Partition)));
                if let Err(e) = self.c.partition(&minority, &majority).await {
                    self.failed(f, "partition", e);
                }
                tokio::time::sleep(hold).await;
                if let Err(e) = self.c.heal_network().await {
                    self.failed(f, "healing the partition", e);
                }
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::PartitionOneWay => {
                let Some(net) = self.c.relays() else {
                    return self.event(f, FaultPhase::Note, "skipped: needs the relays of node processes");
                };
                let Some(a) = self.pick(0.5).await else { return };
                let others: Vec<u64> = self.c.member_ids().into_iter().filter(|x| *x != a).collect();
                let deaf = self.rng.random_bool(0.5);
                let what = if deaf { "cannot hear" } else { "cannot send to" };
                self.event(f, FaultPhase::Start, format!("node {a} {what} {others:?}"));
                net.update(|r| {
                    for o in &others {
                        r.blocked.insert(if deaf { (*o, a) } else { (a, *o) });
                    }
                });
                tokio::time::sleep(hold).await;
                net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::Delay => {
                let Some(net) = self.c.relays() else {
                    return self.event(f, FaultPhase::Note, "skipped: needs the relays of node processes");
                };
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
                                net.reset(*a, *b);
                            }
                        }
                    }
                }
                net.update(|r| {
                    for a in &ids {
                        for b in &ids {
                            if a != b {
                                r.delay.insert((*a, *b), (ms, ms / 2));
                            }
                        }
                    }
                });
                tokio::time::sleep(hold).await;
                net.heal();
                self.event(f, FaultPhase::Stop, "healed");
            }
            Fault::Transfers => {
                let n = self.rng.random_range(3..=8);
                self.event(f, FaultPhase::Start, format!("{n} leadership transfers"));
                let mut done = Vec::new();
                for _ in 0..n {
                    let leader = self.c.leader().await;
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
                self.event(
                    f,
                    FaultPhase::Start,
                    format!("{} and restart {ids:?} in turn", self.how(Mechanism::Terminate)),
                );
                for id in ids {
                    if self.c.state(id) == NodeState::Broken {
                        continue;
                    }
                    let how = self.terminate(f, id).await;
                    if how != "exit status: 0" {
                        self.event(
                            f,
                            FaultPhase::Note,
                            format!("node {id} after {}: {how}", self.how(Mechanism::Terminate)),
                        );
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
                    .node_ids()
                    .into_iter()
                    .filter(|id| matches!(self.c.state(*id), NodeState::Running | NodeState::Paused))
                    .collect();
                self.event(f, FaultPhase::Start, format!("{} every node {ids:?}", self.how(Mechanism::Kill)));
                for id in &ids {
                    if let Err(e) = self.c.kill(*id).await {
                        self.failed(f, self.how(Mechanism::Kill), e);
                    }
                }
                tokio::time::sleep(self.between((500, 3000))).await;
                for id in &ids {
                    if let Err(e) = self.c.start(*id).await {
                        self.event(f, FaultPhase::Note, format!("node {id}: {e:#}"));
                    }
                }
                for id in &ids {
                    if let Err(e) = self.c.wait_serving(*id, crate::backend::START_WAIT).await {
                        self.refused(f, *id, e);
                    }
                }
                self.event(f, FaultPhase::Stop, "every node restarted");
            }
            Fault::Membership => {
                // A member that cannot run is the one an operator replaces first (removing another while it
                // is down would leave the new configuration without a majority).
                let broken = self.c.node_ids().into_iter().find(|id| self.c.state(*id) == NodeState::Broken);
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
                if !self.c.can_skew() {
                    self.event(f, FaultPhase::Note, "skipped: libfaketime is not installed (apt-get install faketime)");
                    return;
                }
                let Some(id) = self.pick(0.5).await else { return };
                let secs = self.rng.random_range(2..=30);
                let offset = if self.rng.random_bool(0.5) { format!("+{secs}s") } else { format!("-{secs}s") };
                self.event(f, FaultPhase::Start, format!("restart node {id} with its clock {offset}, make it lead"));
                self.c.terminate(id).await;
                if let Err(e) = self.c.set_skew(id, Some(offset)) {
                    self.failed(f, "clock skew", e);
                }
                self.restart(f, id).await;
                if self.c.state(id) == NodeState::Running {
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
                if let Err(e) = self.c.set_skew(id, None) {
                    self.failed(f, "clock skew", e);
                }
                if self.c.state(id) != NodeState::Broken {
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
                        self.how(if kill { Mechanism::Kill } else { Mechanism::Terminate })
                    ),
                );
                if kill {
                    if let Err(e) = self.c.kill(id).await {
                        self.failed(f, self.how(Mechanism::Kill), e);
                    }
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
        if let Err(e) = self.c.kill(victim).await {
            self.failed(f, self.how(Mechanism::Kill), e);
        }
        let Some(position) = self.c.position(victim) else { return };
        let via = self.c.up_ids().into_iter().next().unwrap_or(via);
        match self.c.add_node(via, position).await {
            Ok(new) => self.event(f, FaultPhase::Note, format!("node {new} added in place of {victim}")),
            Err(e) => self.event(f, FaultPhase::Note, format!("adding a node in place of {victim} failed: {e}")),
        }
    }

    /// Undoes every fault: network faults, pauses, skewed clocks, stopped nodes, broken nodes, empty positions.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        let f = Fault::Kill; // notes only; the fault name is irrelevant here
        self.reap(f).await;
        if let Err(e) = self.c.heal_network().await {
            self.event(f, FaultPhase::Note, format!("heal: {e:#}"));
        }
        let ids = self.c.node_ids();
        for id in &ids {
            if self.c.state(*id) == NodeState::Paused {
                if let Err(e) = self.c.pause(*id, false).await {
                    self.event(f, FaultPhase::Note, format!("heal: node {id}: {e:#}"));
                }
            }
            if self.c.skewed(*id) {
                self.c.terminate(*id).await;
                if let Err(e) = self.c.set_skew(*id, None) {
                    self.event(f, FaultPhase::Note, format!("heal: node {id}: {e:#}"));
                }
            }
            if self.c.state(*id) == NodeState::Down {
                self.restart(f, *id).await;
            }
        }
        for id in &ids {
            if self.c.state(*id) == NodeState::Broken {
                if let Some(via) = self.c.up_ids().first().copied() {
                    self.replace(f, via, *id).await;
                }
            }
        }
        for position in self.c.empty_positions() {
            if let Some(via) = self.c.up_ids().first().copied() {
                match self.c.add_node(via, position).await {
                    Ok(new) => self.event(f, FaultPhase::Note, format!("heal: node {new} fills position {position}")),
                    Err(e) => self.event(f, FaultPhase::Note, format!("heal: position {position} stays empty: {e}")),
                }
            }
        }
        self.c.wait_leader(Duration::from_secs(30)).await?;
        self.c.wait_caught_up(Duration::from_secs(60)).await?;
        Ok(())
    }
}
