//! The one leader-routing path. Every request that needs the leader (unary gRPC and REST calls, the requests of
//! worker and producer streams, admin calls) goes through [`Forwarder::call`]: it serves the request here when
//! this node leads, else forwards it to the leader, and classifies what came back:
//!
//! - an answer (a result, or a refusal by raftq's rules) is passed on as it is;
//! - nothing applied (`NOT_LEADER`: leadership moved, the leader could not be reached, no leader is known; or
//!   the leader's `UNAVAILABLE`): routed again with backoff until the call's deadline, then answered as it is
//!   (`NOT_LEADER` carries the leader's address when one is known, none when no leader is). The deadline bounds
//!   the search for a leader: time a leader spent on the call before it answered `NOT_LEADER` (it stopped leading
//!   while an enqueue waited there for room) is added to it;
//! - an unknown outcome (the forwarded call may have reached the leader and no answer came: the connection broke,
//!   or the leader stopped leading while the call was in flight): sent again only for calls that are safe to
//!   repeat ([`Kind`]); a write answers `UNKNOWN_OUTCOME`.
//!
//! Clients that prefer redirects send `x-raftq-redirect: 1` and get `NOT_LEADER` with the leader's address. A
//! forwarded request carries `x-raftq-forwarded: 1` and is served where it arrives, never forwarded again (a node
//! that has lost the leadership meanwhile answers `NOT_LEADER`, and the node that forwarded it routes again).
//! A read with `x-raftq-read: stale` is served from this node's replica.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use raftq_proto::reason::{header, Reason};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::error::ApiError;
use crate::raft::types::NodeId;
use crate::storage::Raft;

/// How long a client request is routed (no leader known, the leader unreachable, leadership moving) before
/// it is answered `NOT_LEADER`: a few election timeouts, enough for a failover to finish.
pub const LEADER_WAIT: Duration = Duration::from_secs(5);
/// How long a write forwarded to a leader that has stopped leading may still take to be answered. A live old
/// leader answers its pending writes as soon as it steps down (`NOT_LEADER`, or the outcome); one that does not
/// answer within this is paused or cut off, and the write's outcome is unknown.
const STEPPED_DOWN_GRACE: Duration = Duration::from_secs(1);
/// How often a connection to the leader with calls in flight is pinged, and how long an answer may take.
const FORWARD_PING_INTERVAL: Duration = Duration::from_secs(1);
const FORWARD_PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Backoff between routing attempts: short first (a transfer takes ~50 ms), capped so a failover is noticed
/// within a heartbeat or two.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What repeating a call can do, which decides what happens when its outcome is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A read: sent again on an unknown outcome; `x-raftq-read: stale` serves it here.
    Read,
    /// A write that is safe to repeat, sent again on an unknown outcome: an ack names its fencing token and
    /// outcome (a repeat is answered as applied), a claim's lost tasks come back when their leases expire, a
    /// pause sets a state. A call to a leader that stops leading meanwhile is abandoned and sent again at once.
    Repeatable,
    /// A write that could apply twice: sent again only when surely nothing was applied; once it may have reached
    /// the leader, a failure is `UNKNOWN_OUTCOME`.
    Write,
    /// A leadership transfer: a write whose success is the leader changing, so never abandoned for that.
    Transfer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Here when this node leads, else on the leader.
    Route,
    /// Here, whoever leads: a forwarded request, or a stale read.
    Here,
    /// Here when this node leads, else `NOT_LEADER` with the leader's address.
    Redirect,
}

/// How one call is routed, and until when.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    kind: Kind,
    mode: Mode,
    deadline: Instant,
    /// Routed only while no other node is the live leader; then `NOT_LEADER` with its address, for a client that
    /// follows redirects (a stream that asked for them), as long as nothing may have been applied.
    move_to_leader: bool,
}

impl Plan {
    /// A client's request: its metadata says whether to forward, redirect or read locally; routed for up to
    /// [`LEADER_WAIT`].
    pub fn of<T>(req: &Request<T>, kind: Kind) -> Plan {
        let mode = if flag(req, header::FORWARDED) || (kind == Kind::Read && stale_read(req)) {
            Mode::Here
        } else if flag(req, header::REDIRECT) {
            Mode::Redirect
        } else {
            Mode::Route
        };
        Plan { kind, mode, deadline: Instant::now() + LEADER_WAIT, move_to_leader: false }
    }

    /// Whether a client's request asks for `NOT_LEADER` instead of forwarding (and is not itself forwarded).
    pub fn asks_redirect<T>(req: &Request<T>) -> bool {
        flag(req, header::REDIRECT) && !flag(req, header::FORWARDED)
    }

    /// A request made on a stream's behalf, routed until `deadline`.
    pub fn until(kind: Kind, deadline: Instant) -> Plan {
        Plan { kind, mode: Mode::Route, deadline, move_to_leader: false }
    }

    /// With `yes`, see [`Plan::move_to_leader`].
    pub fn moving_to_leader(self, yes: bool) -> Plan {
        Plan { move_to_leader: yes, ..self }
    }
}

/// What one attempt came to.
enum Outcome<R> {
    /// Passed on as it is.
    Answer(Result<R, ApiError>),
    /// Nothing was applied: route again (until the deadline, then answer this).
    Retry(ApiError),
    /// The node the call went to as the leader answered `NOT_LEADER`: it stopped leading while it served it (an
    /// enqueue waiting for room, say), or had stopped before. Nothing was applied; routed again, and the time
    /// spent there is not counted against the deadline, which bounds the search for a leader, not a leader's work.
    Left(ApiError),
    /// The call may have been applied (an `UNKNOWN_OUTCOME` error).
    Unknown(ApiError),
}

pub struct Forwarder {
    raft: Raft,
    node_id: NodeId,
    tls: Option<std::sync::Arc<crate::tls::Tls>>,
    channels: Mutex<HashMap<String, Channel>>,
    /// How recently this node heard from a leader.
    contact: crate::raft::control::Contact,
    /// When this node last began naming another leader (or none): a leader named a moment ago (from a vote's
    /// answer, before its first heartbeat) is not one this node has gone without hearing from.
    named: crate::raft::control::Contact,
}

fn flag<T>(req: &Request<T>, name: &str) -> bool {
    req.metadata().get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v == "1" || v == "true")
}

/// Whether a read asks to be served from this node's replica (`x-raftq-read: stale`).
pub fn stale_read<T>(req: &Request<T>) -> bool {
    req.metadata().get(header::READ).and_then(|v| v.to_str().ok()).is_some_and(|v| v == "stale")
}

/// A copy of a request: message, metadata (the caller's token) and extensions (the authenticated caller).
pub fn copy<T: Clone>(req: &Request<T>) -> Request<T> {
    Request::from_parts(req.metadata().clone(), req.extensions().clone(), req.get_ref().clone())
}

/// The same request, marked as forwarded, with the caller's metadata (its token) kept.
pub fn forwarded<T>(req: Request<T>) -> Request<T> {
    let (mut md, _, msg) = req.into_parts();
    md.insert(header::FORWARDED, "1".parse().expect("ascii"));
    Request::from_parts(md, Default::default(), msg)
}

/// True when the status says the connection to the leader could not be made: the request was never sent.
fn never_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(e) = source {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Whether the leader's refusal means nothing was applied and another leader may serve: `NOT_LEADER`, and
/// `UNAVAILABLE` (it is shutting down, or has no quorum) except for a transfer, whose `UNAVAILABLE` says the target
/// did not take over in time (a second transfer is not what was asked).
fn route_again(kind: Kind, e: &ApiError) -> bool {
    match e.reason() {
        Reason::NotLeader => true,
        Reason::Unavailable => kind != Kind::Transfer,
        _ => false,
    }
}

/// This node's own answer: routed again only when it no longer leads. Its `UNAVAILABLE` (shutting down) is
/// answered at once, so a node going down does not hold requests; the client tries another node.
fn local_outcome<R>(r: Result<R, ApiError>) -> Outcome<R> {
    match r {
        Err(e) if e.reason() == Reason::NotLeader => Outcome::Left(e),
        Err(e @ ApiError::Unknown(_)) => Outcome::Unknown(e),
        r => Outcome::Answer(r),
    }
}

fn remote_outcome<R>(kind: Kind, r: Result<R, Status>) -> Outcome<R> {
    let s = match r {
        Ok(v) => return Outcome::Answer(Ok(v)),
        Err(s) => s,
    };
    match ApiError::from_status(&s) {
        Some(e) if route_again(kind, &e) => match e.reason() {
            Reason::NotLeader => Outcome::Left(e),
            _ => Outcome::Retry(e),
        },
        Some(e) if e.reason() == Reason::UnknownOutcome => Outcome::Unknown(e),
        Some(e) => Outcome::Answer(Err(e)),
        // No raftq reason: the transport answered, not the leader.
        None if never_sent(&s) => Outcome::Retry(ApiError::NotLeader { leader_addr: None }),
        None => Outcome::Unknown(ApiError::Unknown(format!("the leader did not answer: {}", s.message()))),
    }
}

/// Marks `named` each time the leader this node names changes, until Raft stops.
async fn mark_leader_changes(raft: Raft, named: crate::raft::control::Contact) {
    let mut rx = raft.metrics();
    let mut leader = rx.borrow_watched().current_leader;
    named.touch();
    while rx.changed().await.is_ok() {
        let now = rx.borrow_watched().current_leader;
        if now != leader {
            leader = now;
            named.touch();
        }
    }
}

impl Forwarder {
    pub fn new(
        raft: Raft,
        node_id: NodeId,
        tls: Option<std::sync::Arc<crate::tls::Tls>>,
        contact: crate::raft::control::Contact,
    ) -> Forwarder {
        let named = crate::raft::control::Contact::default();
        tokio::spawn(mark_leader_changes(raft.clone(), named.clone()));
        Forwarder { raft, node_id, tls, channels: Mutex::new(HashMap::new()), contact, named }
    }

    /// Serves a call per `plan`: `local` runs it on this node, `remote` sends it to the leader over a channel.
    /// Each is called again for each attempt.
    pub async fn call<R, L, LF, M, MF>(&self, plan: Plan, mut local: L, mut remote: M) -> Result<R, ApiError>
    where
        L: FnMut() -> LF,
        LF: Future<Output = Result<R, ApiError>>,
        M: FnMut(Channel) -> MF,
        MF: Future<Output = Result<R, Status>>,
    {
        match plan.mode {
            Mode::Here => return local().await,
            Mode::Redirect if self.leader().0 == Some(self.node_id) => return local().await,
            Mode::Redirect | Mode::Route => {}
        }
        // A redirect names only a live leader (one that died or stopped is still named until the election ends,
        // and sending the client there would only bring it back): without one, the call is routed as a forwarding
        // client's is, until one is known.
        let plan = if plan.mode == Mode::Redirect { plan.moving_to_leader(true) } else { plan };
        let mut pause = FIRST_PAUSE;
        // A repeatable write sent again after an unknown outcome may have been applied by then: if it then runs
        // out of time, its answer is that unknown outcome, not a "nothing applied".
        let mut maybe_applied = None;
        let mut deadline = plan.deadline;
        loop {
            if plan.move_to_leader {
                if let Some(addr) = self.live_leader_elsewhere() {
                    // The client goes to the leader itself: told where when nothing was applied; else it gets the
                    // unknown outcome, and may send the call again there. Forwarding it would wait on a leader
                    // this node may hear but not reach (a one-way cut), as long as the call's deadline.
                    return Err(maybe_applied.unwrap_or(ApiError::NotLeader { leader_addr: Some(addr) }));
                }
            }
            let routed_to = self.leader();
            // The leader this node names has not been heard from for the cut-off limit: this node is cut off from
            // it (it may not even hear that another was elected). A call sent there would wait for an answer that
            // cannot come, so none is sent; a client that follows redirects tries another node now, as a cut-off
            // leader's clients do.
            let unheard = self.leader_unheard();
            if unheard && plan.move_to_leader {
                return Err(maybe_applied.unwrap_or(ApiError::NotLeader { leader_addr: None }));
            }
            let began = Instant::now();
            let outcome = match routed_to.clone() {
                (Some(l), _) if l == self.node_id => match local_outcome(local().await) {
                    // This node leads but is cut off from its quorum: the others have elected a leader it cannot
                    // hear of. A client that follows redirects tries another node now instead of waiting here.
                    Outcome::Left(e) if plan.move_to_leader && crate::raft::control::cut_off(&self.raft) => {
                        return Err(maybe_applied.unwrap_or(e));
                    }
                    o => o,
                },
                (Some(l), Some(addr)) if !unheard => match self.channel(&addr) {
                    Ok(ch) => self.forward(l, plan.kind, remote(ch)).await,
                    Err(e) => Outcome::Answer(Err(e)),
                },
                // No leader known (an election), one this node has no address for yet, or one it no longer hears.
                _ => Outcome::Retry(ApiError::NotLeader { leader_addr: None }),
            };
            let again = match outcome {
                Outcome::Answer(r) => return r,
                Outcome::Retry(e) => e,
                Outcome::Left(e) => {
                    deadline += began.elapsed();
                    e
                }
                Outcome::Unknown(e) if plan.kind == Kind::Read => e,
                Outcome::Unknown(e) if plan.kind == Kind::Repeatable => {
                    maybe_applied = Some(e.clone());
                    e
                }
                Outcome::Unknown(e) => return Err(e),
            };
            if Instant::now() + pause >= deadline {
                return Err(maybe_applied.unwrap_or(again));
            }
            tracing::debug!(error = %again, "routing the call again");
            // A new leader (or the news that there is none) ends the pause at once: after a failover the call
            // goes to the new leader as soon as this node hears from it, not at the backoff's next step.
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = crate::raft::control::leader_changed(&self.raft, routed_to.0) => {}
            }
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// A unary request, served here or on the leader as its metadata asks.
    pub async fn unary<T, R, L, LF, M, MF>(
        &self,
        req: Request<T>,
        kind: Kind,
        local: L,
        remote: M,
    ) -> Result<R, ApiError>
    where
        T: Clone,
        L: Fn(Request<T>) -> LF,
        LF: Future<Output = Result<R, ApiError>>,
        M: Fn(Channel, Request<T>) -> MF,
        MF: Future<Output = Result<Response<R>, Status>>,
    {
        let plan = Plan::of(&req, kind);
        let remote = |ch| {
            let call = remote(ch, forwarded(copy(&req)));
            async move { call.await.map(Response::into_inner) }
        };
        self.call(plan, || local(copy(&req)), remote).await
    }

    /// One forwarded attempt. A call to a leader that stops leading meanwhile is abandoned (a paused or cut-off
    /// old leader keeps the connection open and may never answer): a repeatable one at once, a write after a
    /// grace, a transfer never. So is a call to a leader this node stops hearing from for the cut-off limit
    /// ([`Forwarder::leader_unheard`]): cut off from it, this node may never hear that it stopped leading, and the
    /// call would wait for the partition to heal.
    async fn forward<R>(&self, to: NodeId, kind: Kind, call: impl Future<Output = Result<R, Status>>) -> Outcome<R> {
        let stepped_down = async {
            match kind {
                Kind::Transfer => std::future::pending().await,
                Kind::Read | Kind::Repeatable => crate::raft::control::leader_changed(&self.raft, Some(to)).await,
                Kind::Write => {
                    crate::raft::control::leader_changed(&self.raft, Some(to)).await;
                    tokio::time::sleep(STEPPED_DOWN_GRACE).await;
                }
            }
        };
        let unheard = async {
            match kind {
                Kind::Transfer => std::future::pending().await,
                _ => self.leader_goes_unheard().await,
            }
        };
        tokio::select! {
            // An answer already here is taken first (after a stall of this node, say, when the silence and
            // the answer are both ready at once).
            biased;
            r = call => remote_outcome(kind, r),
            _ = stepped_down => {
                Outcome::Unknown(ApiError::Unknown(format!("node {to} stopped leading while the call was in flight")))
            }
            silent = unheard => Outcome::Unknown(ApiError::Unknown(format!(
                "this node has not heard from the leader (node {to}) for {} ms while the call was in flight",
                silent.as_millis()
            ))),
        }
    }

    /// How long, at most, a follower may go without an AppendEntries (entries or a heartbeat) from the leader it
    /// names before it counts as cut off from it: the limit after which a leader without a quorum counts as cut
    /// off ([`crate::raft::control::quorum_silence_limit`]), a second by default. A live leader sends a heartbeat
    /// every 50 ms, and an election ends well within it.
    fn unheard_limit(&self) -> Duration {
        crate::raft::control::quorum_silence_limit(&self.raft)
    }

    /// How long this node has gone without hearing from the leader it names, when that is another node; `None`
    /// when it leads or names none. Counted from when it began naming that leader, if that is more recent than
    /// the last AppendEntries, and from the node's start when it never heard from one.
    fn leader_silence(&self) -> Option<Duration> {
        match self.raft.metrics().borrow_watched().current_leader {
            Some(l) if l != self.node_id => Some(self.contact.since_or_start().min(self.named.since_or_start())),
            _ => None,
        }
    }

    /// Whether this node names another node as the leader but has not heard from it for [`Self::unheard_limit`].
    /// It is cut off from that leader, or that leader is gone and no other has reached this node: no call should
    /// wait on it. (A leader that died is refused at once; one cut off or paused keeps the connection open.)
    pub fn leader_unheard(&self) -> bool {
        self.leader_silence().is_some_and(|s| s >= self.unheard_limit())
    }

    /// Why clients are better served by another node, when this one is cut off: it follows a leader it has not
    /// heard from for [`Self::unheard_limit`], or it leads and no quorum has answered it for as long. `None` when
    /// neither holds (a single voter is never cut off). Readiness (`/readyz`, gRPC health) says no while it holds.
    pub fn cut_off(&self) -> Option<String> {
        let limit = self.unheard_limit();
        if let Some(s) = self.leader_silence().filter(|s| *s >= limit) {
            return Some(format!("no word from the leader for {} ms", s.as_millis()));
        }
        crate::raft::control::quorum_silence(&self.raft)
            .filter(|s| *s >= limit)
            .map(|s| format!("this leader has heard from no quorum for {} ms", s.as_millis()))
    }

    /// Resolves, with the silence, once [`Self::leader_unheard`] holds, and still holds a heartbeat interval
    /// later: a node that was itself stalled (paused, starved of CPU) finds the silence past the limit the moment
    /// it runs again, before it has read the heartbeats that wait for it. Wakes when the silence could first
    /// reach the limit (a heartbeat only moves that later), about once a limit while the leader is heard.
    async fn leader_goes_unheard(&self) -> Duration {
        let recheck = Duration::from_millis(self.raft.config().heartbeat_interval);
        loop {
            let limit = self.unheard_limit();
            match self.leader_silence() {
                Some(s) if s >= limit => {
                    tokio::time::sleep(recheck).await;
                    match self.leader_silence() {
                        Some(again) if again >= limit => return again,
                        _ => {}
                    }
                }
                Some(s) => tokio::time::sleep(limit - s).await,
                None => tokio::time::sleep(limit).await,
            }
        }
    }

    /// For a stream that asks for redirects: `NOT_LEADER` with the address of the leader when another node leads
    /// and was heard from within the shortest election timeout. Right after a leader died or stopped (the node
    /// still names it, but has not heard from it), the answer waits for the election's outcome, for up to three
    /// of the longest election timeouts: a stream redirected to a dead leader would only come back. Served here
    /// when this node leads, and when no live leader is known by then (its requests are routed to the leader
    /// once there is one, as a forwarding client's are).
    pub async fn stream_redirect(&self) -> Result<(), ApiError> {
        let give_up = Instant::now() + Duration::from_millis(self.raft.config().election_timeout_max * 3);
        loop {
            let (leader, _) = self.leader();
            if leader == Some(self.node_id) {
                return Ok(());
            }
            if let Some(addr) = self.live_leader_elsewhere() {
                return Err(ApiError::NotLeader { leader_addr: Some(addr) });
            }
            // Cut off from the leader it names: the client tries another node.
            if self.leader_unheard() {
                return Err(ApiError::NotLeader { leader_addr: None });
            }
            if Instant::now() >= give_up {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = crate::raft::control::leader_changed(&self.raft, leader) => {}
            }
        }
    }

    /// The address of the leader when another node leads, its address is known, and this node heard from a leader
    /// within three heartbeat intervals (a leader that died or stopped is still named until an election ends).
    fn live_leader_elsewhere(&self) -> Option<String> {
        let c = self.raft.config();
        let fresh = Duration::from_millis((c.heartbeat_interval * 3).min(c.election_timeout_min));
        match self.leader() {
            (Some(l), Some(addr)) if l != self.node_id && self.contact.since().is_some_and(|d| d < fresh) => Some(addr),
            _ => None,
        }
    }

    /// The leader's id and public address, as this node knows them.
    pub fn leader(&self) -> (Option<NodeId>, Option<String>) {
        crate::raft::control::leader(&self.raft)
    }

    pub fn channel(&self, addr: &str) -> Result<Channel, ApiError> {
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
            // A leader that no longer answers this node's pings (the node cannot reach it, though it may still
            // hear it: a one-way cut) breaks the calls in flight within ~3 s: a repeatable one is sent again
            // (routed anew), a write answers UNKNOWN_OUTCOME. A live leader answers a ping at once, busy or not.
            .http2_keep_alive_interval(FORWARD_PING_INTERVAL)
            .keep_alive_timeout(FORWARD_PING_TIMEOUT)
            .connect_lazy();
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Rejected;

    fn what<R>(o: Outcome<R>) -> (&'static str, Option<Reason>) {
        match o {
            Outcome::Answer(Ok(_)) => ("answer", None),
            Outcome::Answer(Err(e)) => ("answer", Some(e.reason())),
            Outcome::Retry(e) => ("retry", Some(e.reason())),
            Outcome::Left(e) => ("left", Some(e.reason())),
            Outcome::Unknown(e) => ("unknown", Some(e.reason())),
        }
    }

    #[test]
    fn the_leaders_answers_are_classified_by_what_they_say_was_applied() {
        let status = |e: ApiError| Err::<(), _>(Status::from(e));
        let cases = [
            (Kind::Write, Ok(()), ("answer", None)),
            (Kind::Write, status(ApiError::Rejected(Rejected::LeaseLost)), ("answer", Some(Reason::LeaseLost))),
            // The leader stopped leading while it had the call: routed again, its time there not counted.
            (Kind::Write, status(ApiError::NotLeader { leader_addr: None }), ("left", Some(Reason::NotLeader))),
            (Kind::Write, status(ApiError::Unavailable("x".into())), ("retry", Some(Reason::Unavailable))),
            (Kind::Transfer, status(ApiError::Unavailable("x".into())), ("answer", Some(Reason::Unavailable))),
            (Kind::Write, status(ApiError::Unknown("x".into())), ("unknown", Some(Reason::UnknownOutcome))),
            // No reason: the transport answered. Nothing was sent when the connection could not be made.
            (Kind::Write, Err(Status::unknown("transport error")), ("unknown", Some(Reason::UnknownOutcome))),
            (
                Kind::Write,
                Err(Status::from_error(Box::new(tonic::ConnectError("connection refused".into())))),
                ("retry", Some(Reason::NotLeader)),
            ),
        ];
        for (kind, r, want) in cases {
            let shown = format!("{kind:?} {r:?}");
            assert_eq!(what(remote_outcome(kind, r)), want, "{shown}");
        }
        // This node's own NOT_LEADER is routed again (it led when the call came); its UNAVAILABLE (shutting down)
        // and UNKNOWN_OUTCOME are not taken for "nothing applied".
        assert_eq!(what(local_outcome::<()>(Err(ApiError::NotLeader { leader_addr: None }))).0, "left");
        assert_eq!(what(local_outcome::<()>(Err(ApiError::Unavailable("down".into())))).0, "answer");
        assert_eq!(what(local_outcome::<()>(Err(ApiError::Unknown("timeout".into())))).0, "unknown");
    }

    #[test]
    fn metadata_chooses_forwarding_redirect_or_here() {
        let with = |name: &str, v: &str| {
            let mut r = Request::new(());
            r.metadata_mut().insert(
                tonic::metadata::MetadataKey::from_bytes(name.as_bytes()).expect("key"),
                v.parse().expect("ascii"),
            );
            r
        };
        assert_eq!(Plan::of(&Request::new(()), Kind::Write).mode, Mode::Route);
        assert_eq!(Plan::of(&with(header::FORWARDED, "1"), Kind::Write).mode, Mode::Here);
        assert_eq!(Plan::of(&with(header::REDIRECT, "1"), Kind::Write).mode, Mode::Redirect);
        assert_eq!(Plan::of(&with(header::READ, "stale"), Kind::Read).mode, Mode::Here);
        // A stale read header does not make a write local.
        assert_eq!(Plan::of(&with(header::READ, "stale"), Kind::Write).mode, Mode::Route);
    }
}
