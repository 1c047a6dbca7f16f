//! What the API layer asks of Raft besides proposing commands, in raftq's own types: this node's view of the
//! cluster (role, leader, indexes, members), waiting for the leader to change, and the operator's actions
//! (leadership transfer, adding and removing nodes). Errors come back as [`RaftFailure`]; no openraft type leaves
//! this file, so `api/` needs no openraft.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use openraft::{ChangeMembers, ServerState};

use super::errors::RaftFailure;
use openraft::storage::RaftStateMachine;

use super::types::{NodeId, NodeInfo, TypeConfig};

/// The node's Raft handle, whatever its state machine (`raft/` never names `storage`).
type Raft<SM> = openraft::Raft<TypeConfig, SM>;

/// When this node last received an AppendEntries (entries or a heartbeat): on a follower, how recently the leader
/// it knows was heard from. openraft's metrics say who leads, not whether that leader is still alive; a leader that
/// was killed or paused is still named until an election ends.
#[derive(Clone)]
pub struct Contact(std::sync::Arc<(std::time::Instant, std::sync::atomic::AtomicU64)>);

impl Default for Contact {
    fn default() -> Contact {
        Contact(std::sync::Arc::new((std::time::Instant::now(), std::sync::atomic::AtomicU64::new(u64::MAX))))
    }
}

impl Contact {
    /// An AppendEntries arrived now.
    pub fn touch(&self) {
        let ms = self.0 .0.elapsed().as_millis() as u64;
        self.0 .1.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long ago the last AppendEntries arrived; `None` when none ever did.
    pub fn since(&self) -> Option<Duration> {
        let at = self.0 .1.load(std::sync::atomic::Ordering::Relaxed);
        (at != u64::MAX).then(|| self.0 .0.elapsed().saturating_sub(Duration::from_millis(at)))
    }

    /// How long ago the last AppendEntries arrived, or the node started when none ever did.
    pub fn since_or_start(&self) -> Duration {
        self.since().unwrap_or_else(|| self.0 .0.elapsed())
    }
}

/// A node's role in Raft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "LEADER",
            Role::Follower => "FOLLOWER",
            Role::Candidate => "CANDIDATE",
            Role::Learner => "LEARNER",
            Role::Shutdown => "SHUTDOWN",
        }
    }
}

/// A member of the cluster's membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node_id: NodeId,
    pub raft_addr: String,
    pub api_addr: String,
    /// A voter, not a learner.
    pub voter: bool,
}

/// This node's view of Raft at one moment.
#[derive(Debug, Clone)]
pub struct RaftStatus {
    pub node_id: NodeId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: u64,
    pub committed_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    /// On the leader: each other node and the index of its log that matches the leader's.
    pub replication: Vec<(NodeId, u64)>,
    pub members: Vec<Member>,
}

impl RaftStatus {
    /// Whether this node leads.
    pub fn leading(&self) -> bool {
        self.leader == Some(self.node_id)
    }

    /// The leader's public address, when this node knows the leader.
    pub fn leader_addr(&self) -> Option<String> {
        let leader = self.leader?;
        self.members.iter().find(|m| m.node_id == leader).map(|m| m.api_addr.clone())
    }
}

/// This node's view of Raft now.
pub fn status<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>) -> RaftStatus {
    let m = super::metrics(raft);
    let index = |l: &Option<super::types::LogId>| l.as_ref().map(|l| l.index).unwrap_or(0);
    let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
    RaftStatus {
        node_id: m.id,
        role: match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        },
        term: m.current_term,
        leader: m.current_leader,
        last_log_index: m.last_log_index.unwrap_or(0),
        committed_index: index(&m.local_committed),
        applied_index: index(&m.last_applied),
        snapshot_index: index(&m.snapshot),
        purged_index: index(&m.purged),
        replication: m
            .replication
            .as_ref()
            .map(|r| r.iter().filter(|(id, _)| **id != m.id).map(|(id, matched)| (*id, index(matched))).collect())
            .unwrap_or_default(),
        members: m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, n)| Member {
                node_id: *id,
                raft_addr: n.raft_addr.clone(),
                api_addr: n.api_addr.clone(),
                voter: voters.contains(id),
            })
            .collect(),
    }
}

/// The leader's id and public address, as this node knows them (cheaper than a whole [`status`]).
pub fn leader<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>) -> (Option<NodeId>, Option<String>) {
    let m = raft.metrics().borrow_watched().clone();
    let addr = m.current_leader.and_then(|l| m.membership_config.get_node(&l).map(|n| n.api_addr.clone()));
    (m.current_leader, addr)
}

/// How long a leader may go without a quorum of voters acknowledging it before it stops taking writes: twice the
/// longest election timeout, and at least a second. By then the other voters have elected a new leader (they
/// stand after the leader lease plus an election timeout), so this one is cut off or stalled, and a client waiting
/// on it would wait for its write timeout.
pub fn quorum_silence_limit<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>) -> Duration {
    Duration::from_millis((raft.config().election_timeout_max * 2).max(1000))
}

/// What a node's Raft metrics say of its hold on the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Not the leader (as far as this node knows).
    NotLeading,
    /// Leads, but no quorum silence applies: a single voter, or not yet acknowledged by a quorum.
    Unchecked,
    /// Leads more than one voter; a quorum last acknowledged it this long ago.
    QuorumSilent(Duration),
}

/// The node's hold on the cluster, from its metrics (the one place that reads `last_quorum_acked`).
pub fn hold(m: &openraft::RaftMetrics<TypeConfig>) -> Hold {
    use openraft::Instant as _;
    if m.current_leader != Some(m.id) {
        return Hold::NotLeading;
    }
    match (m.membership_config.membership().voter_ids().nth(1), m.last_quorum_acked.as_ref()) {
        (Some(_), Some(t)) => Hold::QuorumSilent(t.elapsed()),
        _ => Hold::Unchecked,
    }
}

/// On a leader of more than one voter that a quorum has acknowledged: how long ago that last happened. `None`
/// elsewhere (not leading, a single voter, not yet acknowledged).
pub fn quorum_silence<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>) -> Option<Duration> {
    match hold(&raft.metrics().borrow_watched()) {
        Hold::QuorumSilent(s) => Some(s),
        Hold::NotLeading | Hold::Unchecked => None,
    }
}

/// Whether this node leads but has heard from no quorum for [`quorum_silence_limit`]: cut off by a partition, or
/// stalled. Its clients are better served elsewhere (the other voters have elected a leader by then).
pub fn cut_off<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>) -> bool {
    quorum_silence(raft).is_some_and(|s| s >= quorum_silence_limit(raft))
}

/// Resolves with the silence once this node leads and has not heard from a quorum for `limit`.
pub async fn quorum_lost<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>, limit: Duration) -> Duration {
    loop {
        match quorum_silence(raft) {
            Some(s) if s >= limit => return s,
            Some(s) => tokio::time::sleep(limit - s).await,
            None => tokio::time::sleep(limit).await,
        }
    }
}

/// For a write in flight on this node (the leader when it was proposed): resolves, saying why, once its outcome
/// can no longer come from here in good time. Either no quorum has answered for `limit` (this node is cut off or
/// stalled), or this node stopped leading and its answer did not come within `grace` of that (a deposed leader's
/// uncommitted entries may be kept by the new leader or dropped; openraft may not say which until much later).
/// Polls every 100 ms at most, which costs nothing next to a write.
pub async fn write_stranded<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<SM>,
    limit: Duration,
    grace: Duration,
) -> String {
    const POLL: Duration = Duration::from_millis(100);
    let rx = raft.metrics();
    loop {
        let h = hold(&rx.borrow_watched());
        let wait = match h {
            Hold::NotLeading => None,
            Hold::Unchecked => Some(POLL),
            Hold::QuorumSilent(silent) if silent >= limit => {
                return format!(
                    "this leader has heard from no quorum for {} ms (cut off or stalled); the write may still apply",
                    silent.as_millis()
                );
            }
            Hold::QuorumSilent(silent) => Some((limit - silent).min(POLL)),
        };
        match wait {
            Some(w) => tokio::time::sleep(w).await,
            None => {
                tokio::time::sleep(grace).await;
                return "this node stopped leading while the write was in flight; it may still apply".into();
            }
        }
    }
}

/// Resolves once this node sees a leader other than `from` (or none); never, if Raft has stopped.
pub async fn leader_changed<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>, from: Option<NodeId>) {
    let mut rx = raft.metrics();
    loop {
        if rx.borrow_watched().current_leader != from {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves once `target` leads, or fails after `timeout` (with the leader at that time).
pub async fn wait_leader<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<SM>,
    target: NodeId,
    timeout: Duration,
) -> Result<(), Option<NodeId>> {
    let mut rx = raft.metrics();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = rx.borrow_watched().current_leader;
        if now == Some(target) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return Err(now),
        }
    }
}

/// Asks this node (the leader) to hand its leadership to `to`; returns at once (see [`wait_leader`]).
pub async fn transfer_leader<SM: RaftStateMachine<TypeConfig>>(raft: &Raft<SM>, to: NodeId) -> Result<(), RaftFailure> {
    Ok(raft.trigger().transfer_leader(to).await?)
}

/// Adds a node: as a learner first, which catches up (by snapshot if the log was purged) before it counts for
/// quorum, then as a voter unless `learner_only`.
pub async fn add_node<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<SM>,
    id: NodeId,
    node: NodeInfo,
    learner_only: bool,
) -> Result<(), RaftFailure> {
    raft.add_learner(id, node, true).await?;
    if !learner_only {
        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await?;
    }
    Ok(())
}

/// Removes a node (a voter first becomes a learner, then leaves). Unless `force`, refused when the change could
/// not commit (see [`check_removal_commits`]).
pub async fn remove_node<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<SM>,
    id: NodeId,
    force: bool,
) -> Result<(), RaftFailure> {
    let m = super::metrics(raft);
    let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
    if voters.contains(&id) {
        if !force {
            check_removal_commits(raft, &m, &voters, id)?;
        }
        raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await?;
    }
    if super::metrics(raft).membership_config.membership().get_node(&id).is_some() {
        raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await?;
    }
    Ok(())
}

/// Removing a voter goes through a joint configuration that needs a majority of the old voters and of the new
/// ones: with another voter down it may never commit, and the cluster would stop. Refused unless enough voters
/// have answered the leader lately (twice the longest election timeout).
fn check_removal_commits<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<SM>,
    m: &openraft::RaftMetrics<super::types::TypeConfig>,
    voters: &BTreeSet<NodeId>,
    id: NodeId,
) -> Result<(), RaftFailure> {
    use openraft::Instant as _;
    let recent = Duration::from_millis(raft.config().election_timeout_max * 2);
    let heard = m.heartbeat.clone().unwrap_or_default();
    let live = |n: &NodeId| *n == m.id || heard.get(n).and_then(|t| t.as_ref()).is_some_and(|t| t.elapsed() < recent);
    let new: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
    let (old_live, new_live) = (voters.iter().filter(|v| live(v)).count(), new.iter().filter(|v| live(v)).count());
    if old_live * 2 > voters.len() && new_live * 2 > new.len() {
        return Ok(());
    }
    let down: Vec<String> = voters.iter().filter(|v| !live(v)).map(|v| v.to_string()).collect();
    Err(RaftFailure::MembershipUnsafe(format!(
        "removing node {id} needs a majority of the remaining voters to answer, and node(s) {} do not: bring them \
         back or remove them first (or force it)",
        down.join(", ")
    )))
}
