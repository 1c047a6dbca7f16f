//! The cluster under test as the nemesis (`nemesis.rs`) and the run (`main.rs`) see it: one trait, implemented
//! by node processes behind relays (`cluster.rs`) and by the docker-compose cluster (`compose.rs`). Fault
//! scripts, waits, leadership transfers, digests and the final reads are written once, against the trait; a
//! backend supplies only mechanisms: how to kill, stop, pause, cut off or start a node, and where its admin
//! port is. What only node processes can do (relay faults, clock skew, corruption, membership changes) has a
//! default that says so, and `faults()` keeps such faults out of a run before it starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::nemesis::Fault;
use crate::relay::Net;

/// How long a (re)started node may take to serve its Status again.
pub const START_WAIT: Duration = Duration::from_secs(30);
/// How long a status call may take before the node counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Running,
    Paused,
    /// Stopped by the harness (kill or SIGTERM); it will be started again.
    Down,
    /// Cut off from the others (a container disconnected from the project's network).
    Cut,
    /// Removed from the membership; its id is never used again.
    Removed,
    /// Refused to start (after corruption): it stays down until removed.
    Broken,
}

/// The mechanisms behind a fault, as a backend names them in the history (`kill -9`, `docker pause`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Kill,
    Pause,
    Resume,
    Terminate,
    /// Appended to a partition's description (how it is made, and whether clients are cut off too).
    Partition,
}

/// Adds `authorization: Bearer <token>` to every call (nothing when there is no token).
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Bearer {
        Bearer(token.and_then(|t| AsciiMetadataValue::try_from(format!("Bearer {t}")).ok()))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// An admin client for `addr` (host:port) with an optional token; it connects on first use.
pub fn admin_client(addr: &str, token: Option<&str>, connect: Duration, timeout: Duration) -> anyhow::Result<Admin> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(connect).timeout(timeout).connect_lazy();
    Ok(AdminClient::with_interceptor(ch, Bearer::new(token)))
}

/// Admin clients by node id. Cheap to clone (the clients are shared), so a watcher can poll statuses while the
/// backend is busy stopping a node.
#[derive(Clone)]
pub struct Admins {
    token: Option<String>,
    clients: Arc<Mutex<HashMap<u64, Admin>>>,
}

impl Admins {
    pub fn new(token: Option<String>) -> Admins {
        Admins { token, clients: Arc::default() }
    }

    /// The admin port of node `id` (host:port).
    pub fn add(&self, id: u64, addr: &str) -> anyhow::Result<()> {
        let c = admin_client(addr, self.token.as_deref(), Duration::from_millis(500), Duration::from_secs(10))?;
        self.clients.lock().expect("admins lock").insert(id, c);
        Ok(())
    }

    pub fn get(&self, id: u64) -> Option<Admin> {
        self.clients.lock().expect("admins lock").get(&id).cloned()
    }

    /// Node `id`'s own status, or None when it does not answer within 1.5 s.
    pub async fn status(&self, id: u64) -> Option<pb::NodeStatus> {
        let mut a = self.get(id)?;
        let call = a.status(pb::NodeStatusRequest {});
        tokio::time::timeout(STATUS_TIMEOUT, call).await.ok()?.ok().map(|r| r.into_inner())
    }

    /// Statuses of `ids`, asked at once; nodes that do not answer are left out.
    pub async fn statuses(&self, ids: &[u64]) -> BTreeMap<u64, pb::NodeStatus> {
        let mut set = tokio::task::JoinSet::new();
        for &id in ids {
            let a = self.clone();
            set.spawn(async move { (id, a.status(id).await) });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((id, Some(s))) = r {
                out.insert(id, s);
            }
        }
        out
    }

    /// State digests of `ids`, asked at once.
    pub async fn digests(&self, ids: &[u64]) -> BTreeMap<u64, pb::DigestResponse> {
        let mut set = tokio::task::JoinSet::new();
        for &id in ids {
            let Some(mut a) = self.get(id) else { continue };
            set.spawn(async move {
                let call = a.digest(pb::DigestRequest {});
                (id, tokio::time::timeout(Duration::from_secs(10), call).await.ok().and_then(|r| r.ok()))
            });
        }
        let mut out = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            if let Ok((id, Some(d))) = r {
                out.insert(id, d.into_inner());
            }
        }
        out
    }
}

/// The leader with the highest term among `statuses` that say they lead.
pub fn leader_of(statuses: &BTreeMap<u64, pb::NodeStatus>) -> Option<&pb::NodeStatus> {
    statuses.values().filter(|s| s.role == "LEADER").max_by_key(|s| s.term)
}

fn unsupported<T>(what: &str) -> anyhow::Result<T> {
    Err(anyhow!("{what} is not available with this cluster"))
}

/// A cluster under test. Node ids are the Raft ids; positions (0..) are the client addresses the run started
/// with, which a node replacing another takes over.
#[allow(async_fn_in_trait)] // used with static dispatch only (the run is generic over the backend)
pub trait Backend {
    /// The faults this backend can make.
    fn faults(&self) -> &'static [Fault];
    /// How it makes a fault, for the history.
    fn mechanism(&self, m: Mechanism) -> &'static str;

    // -- clients

    /// The client (public gRPC) address of each position.
    fn client_addrs(&self) -> Vec<String>;
    /// The position node `id` holds.
    fn position(&self, id: u64) -> Option<usize>;
    /// The bearer token clients need, if the cluster authenticates.
    fn token(&self) -> Option<String>;
    fn admins(&self) -> &Admins;

    // -- nodes

    /// Every node the run started, in the membership or not.
    fn node_ids(&self) -> Vec<u64>;
    fn state(&self, id: u64) -> NodeState;
    /// Whether node `id` runs with a skewed clock now.
    fn skewed(&self, _id: u64) -> bool {
        false
    }
    /// Whether node `id`'s files were corrupted (it then stays until the final convergence check).
    fn corrupted(&self, _id: u64) -> bool {
        false
    }

    /// SIGKILL.
    async fn kill(&mut self, id: u64) -> anyhow::Result<()>;
    /// SIGTERM and a wait for the exit; how it ended (`exit status: 0` when clean).
    async fn terminate(&mut self, id: u64) -> String;
    /// Starts a stopped node; `wait_serving` says whether it really came up.
    async fn start(&mut self, id: u64) -> anyhow::Result<()>;
    /// Waits until the node answers its Status; `Err` with why not (it exited, no answer in time).
    async fn wait_serving(&mut self, id: u64, limit: Duration) -> Result<(), String>;
    /// SIGSTOP (`on`) or SIGCONT.
    async fn pause(&mut self, id: u64, on: bool) -> anyhow::Result<()>;
    /// Nodes that stopped without the harness stopping them: (id, what happened). Heal starts them again.
    async fn reap(&mut self) -> Vec<(u64, String)>;
    /// A node that did not come back: heal replaces it where the backend can.
    fn mark_broken(&mut self, id: u64);

    /// Cuts `minority` off from `majority`, both ways.
    async fn partition(&mut self, minority: &[u64], majority: &[u64]) -> anyhow::Result<()>;
    /// Lifts every network fault.
    async fn heal_network(&mut self) -> anyhow::Result<()>;
    /// The relays between nodes, for one-way partitions, delays and resets.
    fn relays(&self) -> Option<Arc<Net>> {
        None
    }

    // -- only node processes (defaults: not available)

    /// Whether clocks can be skewed (libfaketime is installed).
    fn can_skew(&self) -> bool {
        false
    }
    /// The clock offset (`+12s`) node `id` runs with from its next start, or none.
    fn set_skew(&mut self, _id: u64, _skew: Option<String>) -> anyhow::Result<()> {
        unsupported("clock skew")
    }
    /// Flips bytes in one of a stopped node's files; says which file and where.
    fn corrupt(&mut self, _id: u64, _rng: &mut StdRng) -> anyhow::Result<String> {
        unsupported("corruption")
    }
    fn mark_corrupted(&mut self, _id: u64) {}
    /// Removes `id` from the membership through node `via`.
    async fn remove_member(&mut self, _via: u64, _id: u64) -> Result<(), String> {
        Err("membership changes are not available with this cluster".into())
    }
    /// Starts a node under a new id with empty data in `position` and adds it to the membership through `via`.
    async fn add_node(&mut self, _via: u64, _position: usize) -> Result<u64, String> {
        Err("membership changes are not available with this cluster".into())
    }
    /// Positions no member holds (after a removal whose replacement failed).
    fn empty_positions(&self) -> Vec<usize> {
        Vec::new()
    }
    /// Whether node `id` runs (or, stopped, will run) the previous release's binary.
    fn runs_old_binary(&self, _id: u64) -> bool {
        false
    }
    /// The binary node `id` runs from its next start: the previous release's (`old`) or the current one.
    fn set_old_binary(&mut self, _id: u64, _old: bool) -> anyhow::Result<()> {
        unsupported("another binary")
    }
    /// Rewrites a stopped node's files for the previous release (`raftq data downgrade` of the current
    /// binary): its output, or why it failed (exit status and output).
    async fn data_downgrade(&mut self, _id: u64) -> Result<String, String> {
        Err("downgrading data is not available with this cluster".into())
    }

    // -- the end of a run

    /// Connections to relays that came from the harness, never faulted.
    fn external_connections(&self) -> u64 {
        0
    }
    /// Stops every node (and removes what the backend created).
    async fn shutdown(&mut self);
    /// Deletes the nodes' data (a passing run).
    fn discard_data(&self) {}

    // -- provided: written once for every backend

    /// Nodes in the membership (running or not).
    fn member_ids(&self) -> Vec<u64> {
        self.node_ids().into_iter().filter(|id| self.state(*id) != NodeState::Removed).collect()
    }

    /// Members that run, are not paused and not cut off.
    fn up_ids(&self) -> Vec<u64> {
        self.node_ids().into_iter().filter(|id| self.state(*id) == NodeState::Running).collect()
    }

    /// Starts a stopped node and waits until it serves.
    async fn restart(&mut self, id: u64) -> Result<(), String> {
        self.start(id).await.map_err(|e| format!("{e:#}"))?;
        self.wait_serving(id, START_WAIT).await
    }

    async fn statuses(&self) -> BTreeMap<u64, pb::NodeStatus> {
        self.admins().statuses(&self.up_ids()).await
    }

    /// The leader with the highest term among the running nodes that say they lead.
    async fn leader(&self) -> Option<u64> {
        leader_of(&self.statuses().await).map(|s| s.node_id)
    }

    async fn wait_leader(&self, limit: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                bail!("no leader within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running member has applied what the leader has committed (a healed cluster).
    async fn wait_caught_up(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let st = self.statuses().await;
            if let Some(l) = leader_of(&st) {
                let target = l.committed_index;
                if self.up_ids().iter().all(|id| st.get(id).is_some_and(|s| s.applied_index >= target)) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let view: Vec<String> =
                    st.values().map(|s| format!("{}:{}@{}/{}", s.node_id, s.role, s.applied_index, s.term)).collect();
                bail!("the cluster did not catch up within {limit:?}: {}", view.join(" "));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks node `via` (it forwards to the leader) for a transfer to `to`; how long it took.
    async fn transfer(&self, via: u64, to: u64) -> Result<u64, String> {
        let mut a = self.admins().get(via).ok_or_else(|| format!("no node {via}"))?;
        a.transfer_leader(pb::TransferLeaderRequest { to, timeout_ms: 5_000 })
            .await
            .map(|r| r.into_inner().took_ms)
            .map_err(|e| e.message().to_string())
    }

    /// The state digest of every running member.
    async fn digests(&self) -> BTreeMap<u64, pb::DigestResponse> {
        self.admins().digests(&self.up_ids()).await
    }

    /// Addresses for the final reader, the leader's first: a containers' follower answers the SDK with
    /// NOT_LEADER naming the leader's in-network address (`node3:9091`), which the host cannot resolve, and
    /// the SDK then goes back to that same follower (see jepsen-like/README.md), so a reader that started on a
    /// follower would read nothing.
    async fn reader_addrs(&self) -> Vec<String> {
        let mut addrs = self.client_addrs();
        if let Some(p) = self.leader().await.and_then(|l| self.position(l)) {
            addrs.swap(0, p);
        }
        addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn bearer_adds_the_token_only_when_there_is_one() {
        let r = Bearer::new(Some("abc")).call(tonic::Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer abc"));
        let r = Bearer::new(None).call(tonic::Request::new(())).unwrap();
        assert!(r.metadata().get("authorization").is_none());
    }
}
