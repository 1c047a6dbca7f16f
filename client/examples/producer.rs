//! Enqueues tasks three ways (one, a batch, a pipelined stream) and waits for the first one's result.
//!
//! ```sh
//! cargo run --release -- serve                                   # a server, in another terminal
//! cargo run -p raftq-client --example producer -- http://127.0.0.1:9091 demo
//! ```

use std::time::Duration;

use raftq_client::{NewTask, Producer, ProducerConfig, DEFAULT_ADDR};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| DEFAULT_ADDR.to_string());
    let queue = args.next().unwrap_or_else(|| "demo".to_string());

    let producer = Producer::connect(ProducerConfig { addrs: vec![addr], ..Default::default() }).await?;

    let first = producer.enqueue(NewTask::new(&queue, "hello").priority(5)).await?;
    println!("enqueued {}", first.task_id);

    let batch: Vec<NewTask> = (0..5).map(|i| NewTask::new(&queue, format!("batch item {i}"))).collect();
    for (i, r) in producer.enqueue_batch(batch).await?.into_iter().enumerate() {
        match r {
            Ok(e) => println!("batch item {i}: {}", e.task_id),
            Err(e) => println!("batch item {i} refused: {e}"),
        }
    }

    let stream = producer.stream().await?;
    let mut pending = Vec::new();
    for i in 0..20 {
        pending.push(stream.create(NewTask::new(&queue, format!("streamed {i}"))).await?);
    }
    let mut created = 0;
    for r in futures::future::join_all(pending).await {
        match r {
            Ok(_) => created += 1,
            Err(e) => println!("a streamed create failed: {e} (retryable: {})", e.is_retryable()),
        }
    }
    println!("streamed {created} creates");

    println!("waiting up to 10 s for {} (run the worker example to process it)", first.task_id);
    let r = producer.result(&first.task_id, Duration::from_secs(10)).await?;
    if r.done {
        println!("{}: {:?}, result {:?}", r.id, r.state, String::from_utf8_lossy(&r.result));
    } else {
        println!("{}: still {:?} after {} attempt(s)", r.id, r.state, r.attempts);
    }
    Ok(())
}
