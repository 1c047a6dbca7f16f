//! Measures how fast a cancel reaches a running handler through the SDK: enqueue, wait until the handler runs,
//! cancel, and time until the handler's cancellation token fires; `-n` times, one task at a time. Prints one JSON
//! line: the milliseconds from each cancel's acknowledgement (0 when the handler saw it first) and from its
//! sending. `python/bench.py cancel` runs it against one node and against a follower of a 3-node cluster.
//!
//! ```sh
//! cargo run --release -p raftq-client --example cancel_latency -- \
//!     --producer 127.0.0.1:9091 --worker 127.0.0.1:9092 --token "$RAFTQ_TOKEN" -n 50
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_client::{CancellationToken, NewTask, Outcome, Producer, ProducerConfig, Task, Worker, WorkerConfig};
use tokio::sync::Notify;

/// When a task's handler started, and when it saw the cancellation.
type Moments = (Option<Instant>, Option<Instant>);
/// Per task id.
type Times = Arc<Mutex<HashMap<String, Moments>>>;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let producer_addr = arg(&args, "--producer").unwrap_or_else(|| raftq_client::DEFAULT_ADDR.into());
    let worker_addr = arg(&args, "--worker").unwrap_or_else(|| producer_addr.clone());
    let token = arg(&args, "--token");
    let n: usize = arg(&args, "-n").map_or(Ok(50), |v| v.parse())?;
    let queue = format!("cancel-rs-{}", std::process::id());

    let times = Times::default();
    let changed = Arc::new(Notify::new());
    let (t, c) = (times.clone(), changed.clone());
    let handler = move |task: Task| {
        let (times, changed) = (t.clone(), c.clone());
        async move {
            times.lock().expect("lock").insert(task.id.clone(), (Some(Instant::now()), None));
            changed.notify_waiters();
            if tokio::time::timeout(Duration::from_secs(30), task.cancellation().cancelled()).await.is_ok() {
                times.lock().expect("lock").entry(task.id.clone()).or_default().1 = Some(Instant::now());
                changed.notify_waiters();
            }
            Outcome::Abandon
        }
    };
    let worker = Worker::new(WorkerConfig {
        addrs: vec![worker_addr],
        token: token.clone(),
        queues: vec![queue.clone()],
        lease: Duration::from_secs(60),
        ..Default::default()
    })?;
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(handler, stop).await }
    });
    let p = Producer::connect(ProducerConfig { addrs: vec![producer_addr], token, ..Default::default() }).await?;
    let (mut from_ack, mut from_send) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let id = p.enqueue(NewTask::new(queue.clone(), "x")).await?.task_id;
        let wait = |pick: fn(&Moments) -> Option<Instant>| {
            let (times, changed, id) = (times.clone(), changed.clone(), id.clone());
            async move {
                loop {
                    let notified = changed.notified();
                    if let Some(at) = times.lock().expect("lock").get(&id).and_then(pick) {
                        return at;
                    }
                    notified.await;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait(|t| t.0)).await?;
        let sent = Instant::now();
        p.cancel(&id).await?;
        let acked = Instant::now();
        let seen = tokio::time::timeout(Duration::from_secs(10), wait(|t| t.1)).await?;
        from_ack.push(seen.saturating_duration_since(acked).as_secs_f64() * 1000.0);
        from_send.push(seen.saturating_duration_since(sent).as_secs_f64() * 1000.0);
    }
    stop.cancel();
    run.await??;
    println!("{{\"from_ack_ms\": {from_ack:?}, \"from_send_ms\": {from_send:?}}}");
    Ok(())
}
