//! Fault-injecting TCP relays on loopback: how faults between nodes are made without privileges.
//!
//! raftq nodes reach each other at the addresses in the Raft membership, which every node shares, so a relay
//! cannot be told apart by address per link (i -> j). Instead each node gets two relays owned by the harness,
//! one in front of its Raft port and one in front of its API port (followers forward client requests to the
//! leader's API address), and those relay addresses are what the membership holds (`advertise_*_addr` and
//! the `peers` list). When a connection arrives, the relay finds which node process opened it: the peer's
//! source port names a socket in `/proc/net/tcp`, whose inode is one of that process's file descriptors
//! (what `ss -p` does; our own child processes, so no privileges). Connections from anything else (the
//! harness's clients, admin calls) are "external" and never faulted.
//!
//! Rules are per direction: `blocked (a, b)` holds back every byte node `a` sends to node `b`, on connections
//! either of them opened (a request from `a`, or `a`'s answer to `b`'s request), which is what a one-way
//! partition does to TCP. Held bytes are delivered in order once the rule is lifted, like TCP retransmission
//! after a partition heals; gRPC deadlines and HTTP/2 keepalives on the nodes break connections stalled for
//! long. `delay (a, b)` delays every chunk by a fixed time plus jitter, keeping order. `reset` closes every
//! connection between two nodes at once (both sides see a broken connection and reconnect).
//!
//! Clients (the workload) connect to the nodes' own API ports, not through relays: a client sits on both
//! sides of every partition, as an application's clients usually do, and a node that is down refuses the
//! connection instead of a relay accepting it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

/// Bytes read from a socket at once.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks buffered per direction before the relay stops reading (TCP backpressure to the sender).
const CHUNKS_IN_FLIGHT: usize = 256;
/// How long a relay waits for its upstream to accept a connection (a node that is down refuses at once).
const UPSTREAM_CONNECT: Duration = Duration::from_secs(2);

/// Who opened a connection: a node, or something else (the harness).
pub type Source = Option<u64>;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    /// Bytes from `.0` to `.1` are held back.
    pub blocked: HashSet<(u64, u64)>,
    /// Bytes from `.0` to `.1` are delayed by (ms, jitter ms).
    pub delay: HashMap<(u64, u64), (u64, u64)>,
}

impl Rules {
    fn blocks(&self, from: Source, to: Source) -> bool {
        matches!((from, to), (Some(a), Some(b)) if self.blocked.contains(&(a, b)))
    }

    fn delay_of(&self, from: Source, to: Source) -> Option<(u64, u64)> {
        match (from, to) {
            (Some(a), Some(b)) => self.delay.get(&(a, b)).copied(),
            _ => None,
        }
    }
}

/// The network between nodes as the harness controls it.
pub struct Net {
    rules: watch::Sender<Rules>,
    /// Node processes: pid -> node id, to name the source of a connection.
    pids: Mutex<HashMap<u32, u64>>,
    /// Closes every connection between the two nodes (either order).
    resets: broadcast::Sender<(u64, u64)>,
    /// Connections from something other than a node (the harness following a leader hint), never faulted.
    pub external: std::sync::atomic::AtomicU64,
}

impl Net {
    pub fn new() -> Arc<Net> {
        Arc::new(Net {
            rules: watch::Sender::new(Rules::default()),
            pids: Mutex::new(HashMap::new()),
            resets: broadcast::channel(64).0,
            external: Default::default(),
        })
    }

    pub fn set_pid(&self, pid: u32, node: u64) {
        self.pids.lock().expect("pids lock").insert(pid, node);
    }

    pub fn forget_pid(&self, pid: u32) {
        self.pids.lock().expect("pids lock").remove(&pid);
    }

    pub fn update(&self, f: impl FnOnce(&mut Rules)) {
        self.rules.send_modify(f);
    }

    /// Lifts every rule.
    pub fn heal(&self) {
        self.rules.send_replace(Rules::default());
    }

    /// Breaks every open connection between `a` and `b`.
    pub fn reset(&self, a: u64, b: u64) {
        let _ = self.resets.send((a, b));
    }

    /// Which node process has the socket that connected from `peer` to our `listen` address.
    fn source_of(&self, peer: SocketAddr, listen: SocketAddr) -> Source {
        let pids: Vec<(u32, u64)> = self.pids.lock().expect("pids lock").iter().map(|(p, n)| (*p, *n)).collect();
        let inode = socket_inode(peer, listen)?;
        let want = format!("socket:[{inode}]");
        for (pid, node) in pids {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
            for fd in fds.flatten() {
                if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                    return Some(node);
                }
            }
        }
        None
    }
}

/// `/proc/net/tcp` prints an IPv4 socket address as the address's 4 bytes read as a native u32 (`%08X`),
/// a colon, and the port (`%04X`).
fn proc_addr(a: SocketAddr) -> Option<String> {
    match a {
        SocketAddr::V4(v4) => Some(format!("{:08X}:{:04X}", u32::from_ne_bytes(v4.ip().octets()), v4.port())),
        SocketAddr::V6(_) => None,
    }
}

/// The inode of the socket whose local address is `local` and remote address is `remote`.
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (l, r) = (proc_addr(local)?, proc_addr(remote)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == l && f[2] == r).then(|| f[9].parse().ok()).flatten()
    })
}

/// A relay for connections to node `dest`.
pub struct Relay {
    pub addr: SocketAddr,
}

impl Relay {
    /// Binds 127.0.0.1:0 and relays every connection to `upstream` until the process ends.
    pub async fn start(net: Arc<Net>, dest: u64, upstream: SocketAddr) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            loop {
                let Ok((conn, peer)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(serve(net.clone(), conn, peer, addr, Some(dest), upstream));
            }
        });
        Ok(Relay { addr })
    }
}

async fn serve(net: Arc<Net>, conn: TcpStream, peer: SocketAddr, listen: SocketAddr, dest: Source, target: SocketAddr) {
    let n = net.clone();
    let source = tokio::task::spawn_blocking(move || n.source_of(peer, listen)).await.ok().flatten();
    if source.is_none() {
        net.external.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let Ok(Ok(up)) = tokio::time::timeout(UPSTREAM_CONNECT, TcpStream::connect(target)).await else {
        return;
    };
    let _ = conn.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let mut resets = net.resets.subscribe();
    let (cr, cw) = conn.into_split();
    let (ur, uw) = up.into_split();
    let forward = pump(net.clone(), cr, uw, source, dest);
    let backward = pump(net.clone(), ur, cw, dest, source);
    let reset = async {
        loop {
            match resets.recv().await {
                Ok((a, b)) if (Some(a), Some(b)) == (source, dest) || (Some(b), Some(a)) == (source, dest) => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    // Either direction ending (or a reset) ends the connection: dropping both halves closes both sockets.
    tokio::select! {
        _ = forward => {}
        _ = backward => {}
        _ = reset => {}
    }
}

/// Copies one direction, `from` -> `to`, applying the rules for that direction.
async fn pump(
    net: Arc<Net>,
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    from: Source,
    to: Source,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    let reader = async move {
        loop {
            let mut buf = vec![0u8; CHUNK_BYTES];
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send((Instant::now(), buf)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        let mut rules = net.rules.subscribe();
        let mut last_due = Instant::now();
        while let Some((arrived, chunk)) = rx.recv().await {
            // Held back while blocked; the rule is read again whenever it changes.
            loop {
                let blocked = rules.borrow_and_update().blocks(from, to);
                if !blocked {
                    break;
                }
                if rules.changed().await.is_err() {
                    return;
                }
            }
            let delay = rules.borrow().delay_of(from, to);
            if let Some((ms, jitter)) = delay {
                let extra = if jitter > 0 { rand::rng().random_range(0..=jitter) } else { 0 };
                // Never before an earlier chunk: order is kept.
                let due = (arrived + Duration::from_millis(ms + extra)).max(last_due);
                last_due = due;
                tokio::time::sleep_until(due).await;
            }
            if w.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    // The writer ends when the reader's side closed and everything read was written (or on an error).
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_match_the_kernel_format() {
        // 127.0.0.1:8080 as /proc/net/tcp prints it on a little-endian machine.
        if cfg!(target_endian = "little") {
            assert_eq!(proc_addr("127.0.0.1:8080".parse().expect("addr")).as_deref(), Some("0100007F:1F90"));
        }
        assert_eq!(proc_addr("[::1]:1".parse().expect("addr")), None);
    }

    #[tokio::test]
    async fn relay_names_the_process_that_connected_and_holds_blocked_bytes() {
        let net = Net::new();
        // This test process plays node 7; the echo server is node 9.
        net.set_pid(std::process::id(), 7);
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let echo_addr = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut c, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let relay = Relay::start(net.clone(), 9, echo_addr).await.expect("relay");
        let mut c = TcpStream::connect(relay.addr).await.expect("connect");
        c.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.expect("echo");
        assert_eq!(&buf, b"ping");
        assert_eq!(net.external.load(std::sync::atomic::Ordering::Relaxed), 0, "the source was found");

        // 7 -> 9 blocked: nothing arrives until healed, then everything does, in order.
        net.update(|r| {
            r.blocked.insert((7, 9));
        });
        c.write_all(b"pong").await.expect("write");
        let stalled = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut buf)).await;
        assert!(stalled.is_err(), "blocked bytes were held back");
        net.heal();
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf)).await.expect("healed").expect("read");
        assert_eq!(&buf, b"pong");

        // A reset closes the connection.
        net.reset(9, 7);
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await.expect("closed").unwrap_or(0);
        assert_eq!(n, 0);
    }
}
