//! `raftq-probe`: the container's health check. The image is built FROM scratch, so there is no curl or wget to
//! run; this is a std-only HTTP/1.0 GET, compiled by `deploy/docker/build.sh` with `rustc` alone (no crate, no
//! workspace member, a second or two to build).
//!
//! `raftq-probe [PATH] [HOST:PORT]`: GET PATH (default `/readyz`) from HOST:PORT (default: 127.0.0.1 and the port
//! of `RAFTQ_HTTP_ADDR`, else 8080). Exit 0 on a 200, 1 on anything else; the answer's body is printed so that
//! `docker inspect` shows why a node is not ready.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// Docker's health check has its own timeout (2 s in docker-compose.yml); answer before it.
const TIMEOUT: Duration = Duration::from_millis(1500);
/// `/readyz` answers with a small JSON object; more than this is not a raftq node.
const MAX_RESPONSE_BYTES: u64 = 64 * 1024;

fn default_target() -> String {
    let port = std::env::var("RAFTQ_HTTP_ADDR")
        .ok()
        .and_then(|a| a.rsplit_once(':').map(|(_, p)| p.to_string()))
        .unwrap_or_else(|| "8080".to_string());
    format!("127.0.0.1:{port}")
}

fn get(target: &str, path: &str) -> Result<(u16, String), String> {
    let addr: SocketAddr = target
        .to_socket_addrs()
        .map_err(|e| format!("resolving {target}: {e}"))?
        .next()
        .ok_or_else(|| format!("{target} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {target}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(MAX_RESPONSE_BYTES).read_to_end(&mut buf).map_err(|e| format!("reading the answer: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| "not an HTTP answer".to_string())?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.trim().to_string()).unwrap_or_default();
    Ok((status, body))
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/readyz".to_string());
    let target = args.next().unwrap_or_else(default_target);
    match get(&target, &path) {
        Ok((200, body)) => {
            println!("{body}");
            ExitCode::SUCCESS
        }
        Ok((code, body)) => {
            println!("{code} {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("{e}");
            ExitCode::FAILURE
        }
    }
}
