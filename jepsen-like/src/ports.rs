//! Ports for what the harness must name before it binds: a node process (its config file holds its ports) or
//! a compose cluster's published ports. A port picked by binding port 0 and letting it go is a race: the
//! kernel hands that same port to the next `bind(0)` or outgoing connection (the relays, the clients), or
//! another process takes it, and the node then dies with "Address already in use" before any fault.
//!
//! A `PortLease` closes both doors. Its port comes from below the kernel's ephemeral range, which neither
//! `bind(0)` nor outgoing connections ever use, and it holds an exclusive lock on a file named after the port
//! (`$TMPDIR/raftq-ports/<port>.lock`) for as long as it lives, so no other lease on this machine (another run,
//! a test binary, `deploy/ci.sh` with flock) takes it; the kernel drops the lock when the process dies, even
//! by SIGKILL. A port is leased only when nothing listens on it either. What is left (a program that binds
//! fixed ports without asking, in the moment between the lease and the node's bind) is met by retrying on a
//! clash: callers recognise it with `address_in_use`.
//!
//! Std only: `tests/it` compiles this file too (`#[path]`), so that test processes and harness runs share one
//! allocator.

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::ops::Range;
use std::path::PathBuf;

/// The lowest port handed out: above the well-known and most registered service ports.
const LOWEST: u16 = 10_000;
/// Where Linux keeps the ephemeral range ("32768 60999" by default).
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// A port reserved for this process until dropped.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// The ports leases come from: `LOWEST` up to the start of the ephemeral range.
pub fn range() -> Range<u16> {
    let low = std::fs::read_to_string(EPHEMERAL_RANGE)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<u16>().ok()))
        .unwrap_or(32768);
    LOWEST..low.max(LOWEST + 1000)
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("raftq-ports")
}

/// A free port from `range()`, starting the search at a random place so concurrent processes rarely meet.
pub fn lease() -> io::Result<PortLease> {
    let r = range();
    let span = u64::from(r.end - r.start);
    let start = std::collections::hash_map::RandomState::new().build_hasher().finish() % span;
    lease_from((0..span).map(|i| r.start + ((start + i) % span) as u16))
}

/// The first of `candidates` that no other lease holds and nothing listens on.
pub fn lease_from(candidates: impl IntoIterator<Item = u16>) -> io::Result<PortLease> {
    let dir = lock_dir();
    std::fs::create_dir_all(&dir)?;
    for port in candidates {
        let lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(format!("{port}.lock")))?;
        // Held by another lease (of this process or another one).
        if lock.try_lock().is_err() {
            continue;
        }
        // Something that does not take leases listens there (another program, a container's published port).
        if TcpListener::bind(("127.0.0.1", port)).is_err() || TcpListener::bind(("0.0.0.0", port)).is_err() {
            continue;
        }
        return Ok(PortLease { port, _lock: lock });
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "no free port left to lease"))
}

/// Whether an error text says a port was taken (a node's "cannot bind ...: Address already in use", Docker's
/// "port is already allocated"): the operation can be tried again.
pub fn address_in_use(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("address already in use") || t.contains("port is already allocated")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_free_and_below_the_ephemeral_range() {
        let r = range();
        let leases: Vec<PortLease> = (0..20).map(|_| lease().expect("lease")).collect();
        let mut ports: Vec<u16> = leases.iter().map(|l| l.port()).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 20, "no port leased twice: {ports:?}");
        for l in &leases {
            assert!(r.contains(&l.port()), "{} outside {r:?}", l.port());
            // Leased, not bound: the node it is for can bind it.
            drop(TcpListener::bind(l.addr()).expect("a leased port is free to bind"));
        }
        // Nothing the kernel hands out by itself lands there.
        let ephemeral = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        assert!(!r.contains(&ephemeral), "bind(0) gave {ephemeral}, inside {r:?}");
    }

    /// A released port leased again. Not always at once: between a fork and its exec (another test spawning a
    /// process) the child shares this process's lock descriptions, and another process on the machine may
    /// lease the port for a moment; so try for a while.
    fn lease_again(port: u16) -> PortLease {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match lease_from([port]) {
                Ok(l) => return l,
                Err(e) if std::time::Instant::now() >= deadline => panic!("{port} never leased again: {e}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }

    #[test]
    fn a_held_or_busy_port_is_skipped_and_a_released_one_leased_again() {
        let (held, busy, free) = (lease().expect("lease"), lease().expect("lease"), lease().expect("lease"));
        let (busy_port, free_port) = (busy.port(), free.port());
        drop(busy);
        drop(free);
        let _listener = TcpListener::bind(("127.0.0.1", busy_port)).expect("bind");
        let got = lease_from([held.port(), busy_port, free_port]).expect("lease");
        assert_eq!(got.port(), free_port, "the held and the busy port were skipped");
        let held_port = held.port();
        drop(held);
        assert_eq!(lease_again(held_port).port(), held_port);
    }

    #[test]
    fn a_port_locked_by_another_process_is_skipped() {
        // flock(1), as deploy/ci.sh takes a lease: the lock belongs to another process for a few seconds.
        let probe = lease().expect("lease");
        let port = probe.port();
        drop(probe);
        let path = lock_dir().join(format!("{port}.lock"));
        // -o: the lock stays with flock itself, so killing it releases the lock.
        let child = std::process::Command::new("flock")
            .args(["-n", "-o"])
            .arg(&path)
            .args(["-c", "echo locked; sleep 5"])
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return eprintln!("flock(1) is not installed ({e}): the cross-process case is not checked"),
        };
        let mut line = String::new();
        let out = child.stdout.take().expect("piped");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("read");
        assert_eq!(line.trim(), "locked", "flock took the lock");
        let skipped = lease_from([port]).is_err();
        let _ = child.kill();
        let _ = child.wait();
        assert!(skipped, "port {port}, locked by another process, was leased");
        assert_eq!(lease_again(port).port(), port);
    }

    #[test]
    fn clashes_are_recognised_in_node_and_docker_errors() {
        assert!(address_in_use(
            "exited (exit status: 1): error: cannot bind 127.0.0.1:15000: Address already in use (os error 98)"
        ));
        assert!(address_in_use("Bind for 127.0.0.1:15001 failed: port is already allocated"));
        assert!(!address_in_use("exited (exit status: 1): error: DB corrupted"));
    }
}
