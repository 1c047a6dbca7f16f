//! Which server to talk to: the configured addresses in order, a leader named by a `NOT_LEADER` answer first,
//! one cached channel at a time. Also the bearer token on every request. Owns no retry policy.
//!
//! Requests ask for redirects (`x-raftq-redirect`) so the client talks to the leader directly, until a leader
//! named that way cannot be reached (its address resolves only inside the servers' network: a container or a
//! pod name): from then on requests let the node they reach forward them, which every node does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

/// The address the examples and the server default to.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:9091";

/// Asks a follower to answer `NOT_LEADER` with the leader's address instead of forwarding the request: the
/// SDK follows it and sends every later request straight to the leader, saving a hop each time.
const REDIRECT_HEADER: &str = raftq_proto::reason::header::REDIRECT;

/// `stale` asks the node to answer a read from its own replica, without asking the leader.
const READ_HEADER: &str = raftq_proto::reason::header::READ;

/// HTTP/2 pings once a connection has been silent for the interval: a server that stopped without closing the
/// socket (paused, powered off, cut off by a partition) is noticed within interval + timeout, and the streams on
/// it move to another node. Short, because the SDK keeps its streams on the leader: a leader that stops is
/// replaced within a second, and its clients should follow about as soon. A busy connection sends no pings.
const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(500);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// The largest message the SDK sends or accepts: a batch of tasks with large payloads. Matches the
/// server's public API limit.
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Longest wait for a stream's HelloAck; the server itself gives a client 10 s to send its Hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Events queued for a stream's send side before senders wait: flow control without unbounded memory (the
/// server uses the same depth for its side).
pub(crate) const STREAM_SEND_BUFFER: usize = 256;

/// `host:port`, `http://host:port` or `https://host:port` as a URI tonic can dial (a bare `host:port` is https
/// when `tls`); explains what is wrong otherwise.
pub(crate) fn normalize_addr(addr: &str, tls: bool) -> std::result::Result<String, String> {
    let a = addr.trim();
    if a.is_empty() {
        return Err("an address is empty".into());
    }
    let uri = match a.split_once("://") {
        Some(("http", _)) | Some(("https", _)) => a.to_string(),
        Some((scheme, _)) => return Err(format!("address {a:?}: unknown scheme {scheme:?}")),
        None if tls => format!("https://{a}"),
        None => format!("http://{a}"),
    };
    match Endpoint::from_shared(uri.clone()) {
        Ok(_) => Ok(uri),
        Err(e) => Err(format!("address {a:?} is not a valid URI: {e}")),
    }
}

/// Checks an address list, a token and a CA; pushes one line per problem.
pub(crate) fn validate_target(addrs: &[String], token: Option<&str>, ca: Option<&[u8]>, errors: &mut Vec<String>) {
    if addrs.is_empty() {
        errors.push("addrs must list at least one server address".into());
    }
    for a in addrs {
        match normalize_addr(a, ca.is_some()) {
            Err(e) => errors.push(e),
            Ok(u) if u.starts_with("https://") && ca.is_none() => {
                errors.push(format!("address {a:?} is https: give tls_ca_pem, the CA to verify the server with"))
            }
            Ok(_) => {}
        }
    }
    if ca.is_some_and(|c| !String::from_utf8_lossy(c).contains("-----BEGIN CERTIFICATE-----")) {
        errors.push("tls_ca_pem must hold a PEM certificate".into());
    }
    if ca.is_some() && !cfg!(feature = "tls") {
        errors.push("tls_ca_pem needs the `tls` feature of raftq-client".into());
    }
    if let Some(t) = token {
        if bearer(t).is_none() {
            errors.push("token must be printable ASCII".into());
        }
    }
}

fn bearer(token: &str) -> Option<AsciiMetadataValue> {
    MetadataValue::try_from(format!("Bearer {token}")).ok()
}

struct State {
    /// Index into `addrs` of the next address to try.
    next: usize,
    /// A leader named by a NOT_LEADER answer: tried before the list, once.
    leader: Option<String>,
    /// A leader address that could not be reached (a name that resolves only inside the servers' network,
    /// say): later redirects to it are ignored, and the list is walked instead.
    unreachable_leader: Option<String>,
    /// A named leader that refused the connection, and when: a node that just died is still named by the others
    /// until they elect another, and redirects to it are ignored meanwhile.
    down: Option<(String, std::time::Instant)>,
    current: Option<(String, Channel)>,
}

/// How long redirects to a named leader that could not be connected to are ignored: about an election.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// Chooses and caches the channel to the server that should be leader.
pub(crate) struct Connector {
    addrs: Vec<String>,
    auth: Option<AsciiMetadataValue>,
    /// Asked for the token of each request when set (instead of `auth`).
    provider: Option<crate::TokenProvider>,
    /// The CA (PEM) servers are verified with, for https addresses.
    tls_ca: Option<Vec<u8>>,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// Requests ask to be redirected to the leader; cleared once a named leader could not be reached.
    ask_redirects: AtomicBool,
}

impl Connector {
    /// `addrs` and `token` must have passed [`validate_target`].
    pub(crate) fn new(
        addrs: &[String],
        token: Option<&str>,
        ca: Option<&[u8]>,
        connect_timeout: Duration,
    ) -> Result<Connector> {
        let mut errors = Vec::new();
        validate_target(addrs, token, ca, &mut errors);
        if !errors.is_empty() {
            return Err(Error::Config(errors));
        }
        Ok(Connector {
            addrs: addrs.iter().map(|a| normalize_addr(a, ca.is_some()).expect("validated above")).collect(),
            auth: token.and_then(bearer),
            provider: None,
            tls_ca: ca.map(<[u8]>::to_vec),
            connect_timeout,
            state: Mutex::new(State { next: 0, leader: None, unreachable_leader: None, down: None, current: None }),
            ask_redirects: AtomicBool::new(true),
        })
    }

    /// `false`: requests never ask for redirects; the node reached forwards them to the leader.
    pub(crate) fn with_redirects(self, redirects: bool) -> Connector {
        self.ask_redirects.store(redirects, Ordering::Relaxed);
        self
    }

    /// Takes each request's token from `provider` from now on.
    pub(crate) fn with_provider(mut self, provider: Option<crate::TokenProvider>) -> Connector {
        self.provider = provider;
        self
    }

    /// The token requests carry now: the provider's, else the configured one.
    pub(crate) fn token(&self, configured: Option<&str>) -> String {
        match &self.provider {
            Some(p) => p().unwrap_or_default(),
            None => configured.unwrap_or_default().to_string(),
        }
    }

    /// A request carrying the bearer token (if one is configured) and asking for redirects (until a named
    /// leader proved unreachable: then the node forwards it).
    pub(crate) fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if self.ask_redirects.load(Ordering::Relaxed) {
            r.metadata_mut().insert(REDIRECT_HEADER, AsciiMetadataValue::from_static("1"));
        }
        let auth = match &self.provider {
            Some(p) => p().as_deref().and_then(bearer),
            None => self.auth.clone(),
        };
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a);
        }
        r
    }

    /// [`Connector::request`] for a read; `stale` lets the node answer from its own replica.
    pub(crate) fn read_request<T>(&self, msg: T, stale: bool) -> tonic::Request<T> {
        let mut r = self.request(msg);
        if stale {
            r.metadata_mut().insert(READ_HEADER, AsciiMetadataValue::from_static("stale"));
        }
        r
    }

    /// The cached channel, or a new one: to the leader last named, then to each address in order from the
    /// one after the last that failed. The error is the last connect failure.
    pub(crate) async fn channel(&self) -> Result<(String, Channel)> {
        let (candidates, start, named) = {
            let mut st = self.state.lock().expect("connector lock poisoned");
            if let Some(c) = &st.current {
                return Ok(c.clone());
            }
            let named = st.leader.take();
            let mut c: Vec<String> = named.clone().into_iter().collect();
            let n = self.addrs.len();
            c.extend((0..n).map(|i| self.addrs[(st.next + i) % n].clone()));
            (c, st.next, named)
        };
        let mut last = None;
        for addr in candidates {
            match self.connect(&addr).await {
                Ok(ch) => {
                    let mut st = self.state.lock().expect("connector lock poisoned");
                    if let Some(i) = self.addrs.iter().position(|a| *a == addr) {
                        st.next = i;
                    }
                    st.current = Some((addr.clone(), ch.clone()));
                    return Ok((addr, ch));
                }
                Err(e) => {
                    tracing::debug!(addr = %addr, error = %e, "cannot connect");
                    if named.as_deref() == Some(addr.as_str()) {
                        self.state.lock().expect("connector lock poisoned").down =
                            Some((addr.clone(), std::time::Instant::now()));
                    }
                    if named.as_deref() == Some(addr.as_str()) && !self.addrs.contains(&addr) {
                        self.state.lock().expect("connector lock poisoned").unreachable_leader = Some(addr.clone());
                        if self.ask_redirects.swap(false, Ordering::Relaxed) {
                            tracing::info!(leader = %addr, "the leader's address cannot be reached from here; \
                                letting the nodes forward requests to it");
                        }
                    }
                    last = Some(e);
                }
            }
        }
        let mut st = self.state.lock().expect("connector lock poisoned");
        st.next = (start + 1) % self.addrs.len();
        Err(last.unwrap_or_else(|| Error::Transport { message: "no address to connect to".into(), source: None }))
    }

    /// The channel to `addr` failed: forget it and move on to the next address.
    pub(crate) fn failed(&self, addr: &str) {
        let mut st = self.state.lock().expect("connector lock poisoned");
        if st.current.as_ref().is_some_and(|(a, _)| a == addr) {
            st.current = None;
        }
        if let Some(i) = self.addrs.iter().position(|a| a == addr) {
            st.next = (i + 1) % self.addrs.len();
        }
    }

    /// `addr` is not the leader: forget its channel and try `leader` (when known) first next time. `false` when
    /// the leader is not followed (none named, or one that cannot be reached or just refused a connection): the
    /// next address of the list is tried instead, after the caller's backoff.
    pub(crate) fn redirect(&self, addr: &str, leader: Option<&str>) -> bool {
        let leader = leader.and_then(|l| match normalize_addr(l, self.tls_ca.is_some()) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(leader = %l, error = %e, "ignoring an unusable leader address");
                None
            }
        });
        let known_unreachable = {
            let st = self.state.lock().expect("connector lock poisoned");
            let down = st.down.as_ref().is_some_and(|(a, at)| leader.as_ref() == Some(a) && at.elapsed() < DOWN_FOR);
            leader.is_some() && (st.unreachable_leader == leader || down)
        };
        // Without a leader (an election is running), or with one this client cannot reach, stay on the list:
        // move on to the next address.
        if leader.is_none() || leader.as_deref() == Some(addr) || known_unreachable {
            self.failed(addr);
            return false;
        }
        let mut st = self.state.lock().expect("connector lock poisoned");
        if st.current.as_ref().is_some_and(|(a, _)| a == addr) {
            st.current = None;
        }
        st.leader = leader;
        true
    }

    /// A stream on `addr` broke without the client closing it (`None`: the server ended it): the next stream
    /// goes to the leader the node named, or to the next address, never back to a node that may have stopped
    /// answering (a paused or cut-off leader would cost another keepalive timeout first).
    pub(crate) fn stream_broke(&self, addr: &str, error: Option<&Error>) {
        match error {
            Some(Error::NotLeader { leader }) => {
                self.redirect(addr, leader.as_deref());
            }
            _ => self.failed(addr),
        }
    }

    async fn connect(&self, addr: &str) -> Result<Channel> {
        #[allow(unused_mut)] // Only the `tls` feature changes it.
        let mut ep = Endpoint::from_shared(addr.to_string()).map_err(Error::transport_error)?;
        #[cfg(feature = "tls")]
        if let (true, Some(ca)) = (addr.starts_with("https://"), &self.tls_ca) {
            let ca = tonic::transport::Certificate::from_pem(ca);
            let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(ca);
            ep = ep.tls_config(tls).map_err(Error::transport_error)?;
        }
        let ep = ep
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        match tokio::time::timeout(self.connect_timeout, ep.connect()).await {
            Ok(r) => r.map_err(Error::transport_error),
            Err(_) => Err(Error::Transport { message: format!("connecting to {addr} timed out"), source: None }),
        }
    }
}

/// The outbound half of a stream: what is queued on `rx`, ending when `closed` fires (after what is already
/// queued) or every sender is gone.
pub(crate) fn outbound<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
    closed: CancellationToken,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold((rx, closed), |(mut rx, closed)| async move {
        tokio::select! {
            biased;
            m = rx.recv() => m.map(|m| (m, (rx, closed))),
            _ = closed.cancelled() => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port_gets_http_scheme() {
        assert_eq!(normalize_addr("127.0.0.1:9091", false).as_deref(), Ok("http://127.0.0.1:9091"));
        assert_eq!(normalize_addr("127.0.0.1:9091", true).as_deref(), Ok("https://127.0.0.1:9091"));
        assert_eq!(normalize_addr(" http://node-2:9091 ", false).as_deref(), Ok("http://node-2:9091"));
    }

    #[test]
    fn https_and_garbage_are_rejected_with_the_address_named() {
        assert_eq!(normalize_addr("https://x:1", false).as_deref(), Ok("https://x:1"));
        assert!(normalize_addr("ftp://x:1", false).unwrap_err().contains("ftp"));
        assert!(normalize_addr("", false).is_err());
        assert!(normalize_addr("a b:1", false).unwrap_err().contains("a b:1"));
    }

    #[test]
    fn validate_target_reports_every_problem() {
        let mut errors = Vec::new();
        validate_target(&[], Some("bad\ntoken"), None, &mut errors);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[tokio::test]
    async fn redirect_tries_the_named_leader_first_and_then_the_list() {
        let c =
            Connector::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into()], Some("t"), None, Duration::from_millis(200))
                .expect("valid");
        let r = c.request(());
        assert_eq!(r.metadata().get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer t"));
        assert_eq!(r.metadata().get(REDIRECT_HEADER).and_then(|v| v.to_str().ok()), Some("1"));
        c.redirect("http://127.0.0.1:1", Some("127.0.0.1:3"));
        assert_eq!(c.state.lock().unwrap().leader.as_deref(), Some("http://127.0.0.1:3"));
        // Nothing listens on these ports: every candidate is tried, the hint is used once.
        assert!(c.channel().await.is_err());
        assert!(c.state.lock().unwrap().leader.is_none());
    }

    #[test]
    fn redirect_without_leader_moves_to_the_next_address() {
        let c = Connector::new(&["a:1".into(), "b:1".into()], None, None, Duration::from_secs(1)).expect("valid");
        c.redirect("http://a:1", None);
        assert_eq!(c.state.lock().unwrap().next, 1);
        assert!(c.state.lock().unwrap().leader.is_none());
    }

    #[tokio::test]
    async fn a_named_leader_that_cannot_be_reached_is_not_followed_again() {
        // The servers name their leader by an address only their own network resolves (node3:9091 in
        // docker-compose): after it failed once, a follower's redirect to it moves on along the list.
        let c = Connector::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into()], None, None, Duration::from_millis(200))
            .expect("valid");
        c.redirect("http://127.0.0.1:1", Some("127.0.0.1:3"));
        assert!(c.channel().await.is_err());
        assert_eq!(c.state.lock().unwrap().unreachable_leader.as_deref(), Some("http://127.0.0.1:3"));
        // As if connected to the first address, which answers NOT_LEADER naming the same leader.
        c.state.lock().unwrap().next = 0;
        c.redirect("http://127.0.0.1:1", Some("127.0.0.1:3"));
        let st = c.state.lock().unwrap();
        assert!(st.leader.is_none(), "not tried again");
        assert_eq!(st.next, 1, "on to the next listed address");
        drop(st);
        // Another leader is followed as before.
        c.redirect("http://127.0.0.1:2", Some("127.0.0.1:4"));
        assert_eq!(c.state.lock().unwrap().leader.as_deref(), Some("http://127.0.0.1:4"));
    }

    #[tokio::test]
    async fn a_listed_leader_that_refused_a_connection_is_not_followed_for_a_while() {
        // A leader that just died is still named by the followers until they elect another one.
        let c = Connector::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into()], None, None, Duration::from_millis(200))
            .expect("valid");
        assert!(c.redirect("http://127.0.0.1:2", Some("127.0.0.1:1")), "a named leader is followed");
        assert!(c.channel().await.is_err());
        assert!(c.request(()).metadata().get(REDIRECT_HEADER).is_some(), "a listed address: redirects stay on");
        assert!(!c.redirect("http://127.0.0.1:2", Some("127.0.0.1:1")), "not followed again at once");
        assert!(c.state.lock().unwrap().leader.is_none());
        // A second later it may lead again (restarted): followed.
        c.state.lock().unwrap().down.as_mut().expect("down").1 -= DOWN_FOR;
        assert!(c.redirect("http://127.0.0.1:2", Some("127.0.0.1:1")));
    }

    #[tokio::test]
    async fn requests_stop_asking_for_redirects_once_a_named_leader_is_unreachable() {
        // With one address (a port published on the host) every redirect to an unreachable leader would bring
        // the client back to the same follower: let it forward instead.
        let c = Connector::new(&["127.0.0.1:1".into()], None, None, Duration::from_millis(200)).expect("valid");
        assert!(c.request(()).metadata().get(REDIRECT_HEADER).is_some());
        c.redirect("http://127.0.0.1:1", Some("127.0.0.1:3"));
        assert!(c.request(()).metadata().get(REDIRECT_HEADER).is_some(), "the named leader is not tried yet");
        assert!(c.channel().await.is_err());
        assert!(c.request(()).metadata().get(REDIRECT_HEADER).is_none());
    }

    #[test]
    fn without_redirects_requests_let_the_node_forward() {
        let c = Connector::new(&["127.0.0.1:1".into()], None, None, Duration::from_secs(1)).expect("valid");
        assert!(c.with_redirects(false).request(()).metadata().get(REDIRECT_HEADER).is_none());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_ca_without_the_tls_feature_is_a_configuration_error() {
        let mut errors = Vec::new();
        let pem = b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
        validate_target(&["127.0.0.1:1".into()], None, Some(pem), &mut errors);
        assert!(errors.iter().any(|e| e.contains("`tls` feature")), "{errors:?}");
    }
}
