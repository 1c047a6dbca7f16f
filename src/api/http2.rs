//! HTTP/2 settings of the two gRPC ports (public and Raft): the rapid-reset protection, sized so the burst of
//! cancelled requests that follows a healed partition or a resumed pause is not taken for an attack.
//!
//! h2 counts, per connection, the streams a peer opened and reset before the server accepted them, and ends the
//! connection (GOAWAY `ENHANCE_YOUR_CALM`) past a limit: that bounds the memory a peer can make the server hold
//! with the "rapid reset" attack (CVE-2023-44487), where each stream costs the attacker one HEADERS and one
//! RST_STREAM frame. h2's default limit, 20, is sized for browsers. raftq's peers multiplex hundreds of requests
//! on one connection and cancel them when their deadlines pass; while a partition or a pause lasts, the HEADERS and
//! RST_STREAM frames of every cancelled request wait in the TCP buffers, and at the heal the server reads them in
//! one burst, before its accept loop has run: the connection was dropped (25 times in a 12-minute fault run),
//! forcing yet another reconnect at the worst moment. The limits below stay bounds (a pending reset stream costs a
//! few hundred bytes; past the limit the connection still ends), sized from what an honest peer can have queued.

/// Public port: the SDK keeps up to 1,024 requests in flight on one connection (`stream_max_in_flight` and the
/// producer's pipelining), and a client whose deadlines pass during a partition cancels all of them at once.
pub const PUBLIC_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1024;

/// Raft port: a peer sends a heartbeat or an append every heartbeat interval (50 to 100 ms) to each replication
/// stream, each with a timeout, so a partition of a minute leaves over a thousand cancelled requests queued on the
/// connection; 4,096 covers several minutes. The port takes calls from cluster peers only (cluster credential,
/// mutual TLS when configured), which makes a larger bound acceptable there.
pub const RAFT_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 4096;

/// The public port's server, with its HTTP/2 limits.
pub fn public<L>(server: tonic::transport::Server<L>) -> tonic::transport::Server<L> {
    server.http2_max_pending_accept_reset_streams(Some(PUBLIC_MAX_PENDING_ACCEPT_RESET_STREAMS))
}

/// The Raft port's server, with its HTTP/2 limits.
pub fn raft<L>(server: tonic::transport::Server<L>) -> tonic::transport::Server<L> {
    server.http2_max_pending_accept_reset_streams(Some(RAFT_MAX_PENDING_ACCEPT_RESET_STREAMS))
}
