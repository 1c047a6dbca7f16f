//! Works tasks of one queue until Ctrl-C: completes each with its payload upper-cased, and prints every
//! outcome the server refuses.
//!
//! ```sh
//! cargo run --release -- serve                                   # a server, in another terminal
//! cargo run -p raftq-client --example worker -- http://127.0.0.1:9091 demo
//! ```

use bytes::Bytes;
use raftq_client::{CancellationToken, Outcome, Task, Worker, WorkerConfig, DEFAULT_ADDR};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| DEFAULT_ADDR.to_string());
    let queue = args.next().unwrap_or_else(|| "demo".to_string());

    let worker =
        Worker::new(WorkerConfig { addrs: vec![addr], queues: vec![queue], concurrency: 4, ..Default::default() })?;

    let mut rejections = worker.rejections();
    let watch = tokio::spawn(async move {
        while let Ok(r) = rejections.recv().await {
            println!("refused: task {} ({}): {}", r.task_id, r.reason, r.message);
        }
    });

    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            println!("stopping; running handlers get the shutdown grace to finish");
            stop.cancel();
        }
    });

    println!("working (Ctrl-C to stop)");
    let summary = worker
        .run(
            |task: Task| async move {
                let text = String::from_utf8_lossy(&task.payload).to_string();
                println!("task {} (attempt {}): {text}", task.id, task.attempts);
                Outcome::Completed(Bytes::from(text.to_uppercase()))
            },
            shutdown,
        )
        .await?;
    watch.abort();
    println!("{summary:?}");
    Ok(())
}
