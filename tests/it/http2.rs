//! HTTP/2 on the gRPC ports: a burst of cancelled requests, as clients send when a partition heals or a paused
//! node resumes (every request whose deadline passed meanwhile is reset at once), leaves the connection served;
//! the rapid-reset protection still ends a connection that goes far past any honest burst.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::Request;

use crate::support::*;

/// On one HTTP/2 connection: `n` gRPC calls to `path`, each cancelled (HEADERS, then RST_STREAM) as soon as it
/// is sent, all in one burst; then one whole call. Whether that last call is answered (any gRPC status will do:
/// the connection is still served) or why not.
async fn burst_then_call(addr: SocketAddr, path: &str, n: usize) -> Result<(), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (client, conn) = h2::client::handshake(tcp).await.map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(conn);
    let request = || {
        Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a request")
    };
    let mut client = client.ready().await.map_err(|e| format!("ready: {e}"))?;
    for i in 0..n {
        let (_answer, mut stream) = client.send_request(request(), false).map_err(|e| format!("call {i}: {e}"))?;
        stream.send_reset(h2::Reason::CANCEL);
        client = client.ready().await.map_err(|e| format!("ready after {i}: {e}"))?;
    }
    let (answer, mut stream) = client.send_request(request(), false).map_err(|e| format!("last call: {e}"))?;
    // An empty message: a 5-byte gRPC frame header with length 0.
    stream.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true).map_err(|e| format!("last body: {e}"))?;
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| format!("last call refused: {e}"))?;
    drop(driver);
    match answer.status().as_u16() {
        200 => Ok(()),
        s => Err(format!("HTTP {s}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cancelled_calls_keeps_the_connection_on_both_grpc_ports() {
    let n = TestNode::start().await;
    let node = n.node();
    // The size of an SDK client's in-flight window cancelled at once: far past h2's default of 20.
    let burst = 500;
    burst_then_call(node.grpc_addr, "/raftq.v1.TaskService/QueueStats", burst).await.expect("public port");
    // On the Raft port the call is refused by the cluster credential check, but the connection is served.
    burst_then_call(node.raft_addr, "/raftq.v1.RaftService/Vote", burst).await.expect("raft port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_far_past_any_honest_burst_is_still_ended() {
    let n = TestNode::start().await;
    let e = burst_then_call(n.node().grpc_addr, "/raftq.v1.TaskService/QueueStats", 20_000).await;
    assert!(e.is_err(), "20,000 cancelled calls on one connection look like an attack: {e:?}");
    // The node serves other connections all the same.
    let mut c = n.client().await;
    c.queue_stats(raftq_proto::v1::QueueStatsRequest { queues: vec![] }).await.expect("served");
}
