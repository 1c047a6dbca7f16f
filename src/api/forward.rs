//! Followers serve clients: a request that needs the leader is forwarded to it and answered as if sent there.
//!
//! Clients that prefer redirects send `x-raftq-redirect: 1` and get `NOT_LEADER` with the leader's address.
//! A forwarded request carries `x-raftq-forwarded: 1` and is never forwarded again (a node that has lost the
//! leadership meanwhile answers `NOT_LEADER`, and the first node routes again). While no leader is known (right
//! after an election) requests wait with backoff, up to a bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::error::ApiError;
use crate::raft::types::{NodeId, Raft};

pub const FORWARDED_HEADER: &str = "x-raftq-forwarded";
pub const REDIRECT_HEADER: &str = "x-raftq-redirect";
/// `x-raftq-read: stale` serves a read from this node's replica without asking the leader.
pub const READ_HEADER: &str = "x-raftq-read";

/// How long a request waits for a leader to be known before it fails with `UNAVAILABLE`.
const LEADER_WAIT: Duration = Duration::from_secs(5);

pub enum Route {
    Local,
    Leader(Channel),
}

pub struct Forwarder {
    raft: Raft,
    node_id: NodeId,
    tls: Option<std::sync::Arc<crate::tls::Tls>>,
    channels: Mutex<HashMap<String, Channel>>,
}

fn flag<T>(req: &Request<T>, name: &str) -> bool {
    req.metadata().get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v == "1" || v == "true")
}

pub fn stale_read<T>(req: &Request<T>) -> bool {
    req.metadata().get(READ_HEADER).and_then(|v| v.to_str().ok()).is_some_and(|v| v == "stale")
}

/// The same request, marked as forwarded, with the caller's metadata (its token) kept.
pub fn forwarded<T>(req: Request<T>) -> Request<T> {
    let (mut md, _, msg) = req.into_parts();
    md.insert(FORWARDED_HEADER, "1".parse().expect("ascii"));
    Request::from_parts(md, Default::default(), msg)
}

fn copy_request<T: Clone>(req: &Request<T>) -> Request<T> {
    let mut r = Request::new(req.get_ref().clone());
    *r.metadata_mut() = req.metadata().clone();
    r
}

fn status_reason(s: &Status) -> &str {
    s.metadata().get(super::error::REASON_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("")
}

impl Forwarder {
    /// Serves a request here when this node leads (or a stale read was asked for), else forwards it to the
    /// leader over `remote`; a local `NOT_LEADER` (leadership moved meanwhile) is routed once more.
    pub async fn serve<T, R, LF, RF, RFut>(
        &self,
        req: Request<T>,
        local: impl FnOnce(Request<T>) -> LF,
        remote: RF,
    ) -> Result<Response<R>, Status>
    where
        T: Clone + Send + 'static,
        LF: std::future::Future<Output = Result<Response<R>, Status>>,
        RF: Fn(Channel, Request<T>) -> RFut,
        RFut: std::future::Future<Output = Result<Response<R>, Status>>,
    {
        if stale_read(&req) {
            return local(req).await;
        }
        if let Route::Leader(ch) = self.route(&req).await? {
            return remote(ch, forwarded(req)).await;
        }
        let retry = (!flag(&req, FORWARDED_HEADER)).then(|| copy_request(&req));
        let r = local(req).await;
        match (r, retry) {
            (Err(s), Some(again)) if status_reason(&s) == "NOT_LEADER" => match self.leader_route().await? {
                Route::Leader(ch) => remote(ch, forwarded(again)).await,
                Route::Local => Err(s),
            },
            (r, _) => r,
        }
    }

    pub fn new(raft: Raft, node_id: NodeId, tls: Option<std::sync::Arc<crate::tls::Tls>>) -> Forwarder {
        Forwarder { raft, node_id, tls, channels: Mutex::new(HashMap::new()) }
    }

    /// Where a client request goes.
    pub async fn route<T>(&self, req: &Request<T>) -> Result<Route, ApiError> {
        if flag(req, FORWARDED_HEADER) {
            return Ok(Route::Local);
        }
        if flag(req, REDIRECT_HEADER) {
            let (leader, addr) = self.leader();
            return match leader {
                Some(l) if l == self.node_id => Ok(Route::Local),
                _ => Err(ApiError::NotLeader { leader_addr: addr }),
            };
        }
        self.leader_route().await
    }

    /// This node when it leads, else a channel to the leader, waiting with backoff while no leader is known.
    pub async fn leader_route(&self) -> Result<Route, ApiError> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut pause = Duration::from_millis(10);
        loop {
            match self.leader() {
                (Some(l), _) if l == self.node_id => return Ok(Route::Local),
                (Some(_), Some(addr)) => return Ok(Route::Leader(self.channel(&addr)?)),
                _ => {}
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(ApiError::Unavailable("no leader is known".into()));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// The leader's id and public address, as this node knows them.
    pub fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let m = crate::raft::metrics(&self.raft);
        let addr = m.current_leader.and_then(|l| m.membership_config.get_node(&l).map(|n| n.api_addr.clone()));
        (m.current_leader, addr)
    }

    /// Resolves once this node sees a leader other than `from` (or none). A call forwarded to `from` may then
    /// never be answered (a paused or cut-off old leader keeps the connection open), so the caller routes it
    /// again instead of waiting for the old leader to come back.
    pub async fn leader_moved(&self, from: Option<NodeId>) {
        let mut rx = self.raft.metrics();
        loop {
            if rx.borrow_watched().current_leader != from {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, ApiError> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let bad = |e: tonic::transport::Error| ApiError::Internal(format!("bad leader address {addr}: {e}"));
        let mut ep = Endpoint::from_shared(crate::tls::url(addr, self.tls.is_some())).map_err(bad)?;
        if let Some(t) = &self.tls {
            ep = ep.tls_config(t.client()).map_err(bad)?;
        }
        let ch = ep
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .connect_lazy();
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}
