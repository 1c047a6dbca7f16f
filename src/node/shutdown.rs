//! What keeps a node's shutdown short and bounded, whatever it has in flight (`Node::stop` orders the steps):
//!
//! - `hand_over`: a leader asked to stop first gives its leadership to the voter that answers and holds the
//!   most of its log, and waits briefly for it to lead. Clients then see a transfer (tens of ms), not an
//!   election (an election timeout, a vote, and a term in which nothing commits).
//! - `Connections`: every connection the node's gRPC and HTTP servers accept is registered; `sever` shuts each
//!   socket down both ways. Calls that outlive the drain time (a long poll, a call forwarded to a leader that
//!   never answers, a stream waiting for work, a proposal waiting for a quorum) then end at once: the server
//!   drops their connection, which drops the futures serving them and whatever they hold (the stores).
//!
//! This module decides nothing about the order or the time limits of the shutdown: `node.rs` does.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use openraft::{Instant as _, ServerState};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::raft::types::NodeId;
use crate::storage::Raft;

/// Hands the leadership to the voter (other than `me`) that answered lately and has the longest matched log,
/// and waits up to `wait` until this node sees another leader. Returns who leads then, or None when this node
/// does not lead, no voter answers, or nobody took over in time (then an election follows the shutdown).
pub async fn hand_over(raft: &Raft, me: NodeId, wait: Duration) -> Option<NodeId> {
    let m = crate::raft::metrics(raft);
    if m.state != ServerState::Leader {
        return None;
    }
    // A voter not heard from for two election timeouts is likely down: it could not take over.
    let recent = Duration::from_millis(raft.config().election_timeout_max * 2);
    let heard = m.heartbeat.clone().unwrap_or_default();
    let matched = m.replication.clone().unwrap_or_default();
    let target = m
        .membership_config
        .membership()
        .voter_ids()
        .filter(|v| *v != me)
        .filter(|v| heard.get(v).and_then(|t| t.as_ref()).is_some_and(|t| t.elapsed() < recent))
        .max_by_key(|v| matched.get(v).and_then(|l| l.as_ref()).map(|l| l.index))?;
    // The target elects itself once its log holds everything this leader has; meanwhile this leader proposes
    // nothing new (writes are refused as NOT_LEADER) and keeps replicating.
    if let Err(e) = raft.trigger().transfer_leader(target).await {
        tracing::warn!(error = %e, target, "leadership transfer not started");
        return None;
    }
    let mut rx = raft.metrics();
    let other_leads = |m: &openraft::RaftMetrics<crate::raft::types::TypeConfig>| {
        m.current_leader.filter(|l| *l != me && m.state != ServerState::Leader)
    };
    let led = tokio::time::timeout(wait, async {
        loop {
            if let Some(l) = other_leads(&rx.borrow_watched()) {
                return Some(l);
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    led.ok().flatten()
}

/// The connections a node's servers accepted and still hold, so that `sever` can end them.
#[derive(Default)]
pub struct Connections {
    /// A duplicate of each connection's socket: shutting it down ends the connection for its owner too.
    sockets: Mutex<HashMap<u64, std::net::TcpStream>>,
    next: AtomicU64,
}

impl Connections {
    pub fn new() -> Arc<Connections> {
        Arc::default()
    }

    /// Registers an accepted connection until it is dropped.
    pub fn track(self: &Arc<Self>, io: TcpStream) -> io::Result<Tracked> {
        let dup = std::net::TcpStream::from(io.as_fd().try_clone_to_owned()?);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).insert(id, dup);
        Ok(Tracked { io, id, conns: self.clone() })
    }

    /// Shuts every registered connection down (reads see the end, writes fail); returns how many there were.
    pub fn sever(&self) -> usize {
        let sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        for s in sockets.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        sockets.len()
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// An accepted connection, registered in `Connections` while it lives.
pub struct Tracked {
    io: TcpStream,
    id: u64,
    conns: Arc<Connections>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.conns.sockets.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The HTTP port's listener for axum, registering each connection it accepts.
pub struct TrackedListener {
    pub listener: TcpListener,
    pub conns: Arc<Connections>,
}

impl axum::serve::Listener for TrackedListener {
    type Io = Tracked;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Tracked, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((io, addr)) => match self.conns.track(io) {
                    Ok(t) => return (t, addr),
                    Err(e) => tracing::warn!(error = %e, "http connection not accepted"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    // Out of file descriptors, typically: give the process a moment.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn sever_ends_open_connections_and_dropped_ones_are_forgotten() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let conns = Connections::new();
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let mut served = conns.track(listener.accept().await.expect("accept").0).expect("track");
        let dropped = conns.track({
            let _c = TcpStream::connect(addr).await.expect("connect");
            listener.accept().await.expect("accept").0
        });
        drop(dropped);
        assert_eq!(conns.open(), 1, "a dropped connection is no longer registered");

        client.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        served.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
        // A read waiting for bytes that never come ends when the connection is severed, and the peer sees it.
        let waiting = tokio::spawn(async move {
            let n = served.read(&mut [0u8; 8]).await;
            (n, served)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(conns.sever(), 1);
        let (n, served) = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("ended").expect("join");
        assert_eq!(n.expect("end of stream"), 0);
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await.expect("peer sees it");
        assert_eq!(n.unwrap_or(0), 0);
        drop(served);
        assert_eq!(conns.open(), 0);
    }
}
