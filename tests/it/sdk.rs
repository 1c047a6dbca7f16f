//! The client SDK (`raftq-client`) against a real single-node server: producer calls, the pipelined producer
//! stream, and the worker's whole lifecycle (outcomes, leases, batches, idle re-arm, reconnects, shutdown).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use raftq::config::Config;
use raftq_client::{
    Applied, CancellationToken, Claim, DeadLetters, Error, NewTask, Outcome, Producer, ProducerConfig, Task, TaskState,
    Worker, WorkerConfig, WorkerSummary,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::support::*;

fn addr(n: &TestNode) -> String {
    format!("http://{}", n.node().grpc_addr)
}

/// Retries and lease expiries without waiting: a failed or expired task is claimable again 10 ms later.
fn fast_retry(c: &mut Config) {
    c.retry_base_ms = 10;
    c.retry_max_ms = 10;
    c.retry_exponential = false;
    c.lease_min_ms = 50;
}

async fn producer(n: &TestNode) -> Producer {
    Producer::connect(ProducerConfig { addrs: vec![addr(n)], ..Default::default() }).await.expect("connect")
}

fn worker_cfg(n: &TestNode, queue: &str) -> WorkerConfig {
    WorkerConfig {
        addrs: vec![addr(n)],
        worker_id: "sdk-test".into(),
        queues: vec![queue.into()],
        lease: Duration::from_secs(10),
        heartbeat: None,
        shutdown_grace: Duration::from_secs(2),
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_millis(200),
        ..Default::default()
    }
}

/// A worker running in the background.
struct Running {
    worker: Arc<Worker>,
    stop: CancellationToken,
    handle: JoinHandle<raftq_client::Result<WorkerSummary>>,
}

fn spawn_worker<H, F>(cfg: WorkerConfig, handler: H) -> Running
where
    H: Fn(Task) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Outcome> + Send + 'static,
{
    let worker = Arc::new(Worker::new(cfg).expect("valid worker config"));
    let stop = CancellationToken::new();
    let (w, s) = (worker.clone(), stop.clone());
    let handle = tokio::spawn(async move { w.run(handler, s).await });
    Running { worker, stop, handle }
}

impl Running {
    fn stats(&self) -> WorkerSummary {
        self.worker.stats().snapshot()
    }

    async fn stop(self) -> WorkerSummary {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.handle)
            .await
            .expect("the worker stops within 15 s")
            .expect("the worker task did not panic")
            .expect("the worker ran without a fatal error")
    }
}

/// Polls `f` every 10 ms until it holds; fails the test after `limit`.
async fn until<F: FnMut() -> bool>(limit: Duration, what: &str, mut f: F) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_state(p: &Producer, id: &str, state: TaskState) -> Task {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = p.get(id).await.expect("get");
        if t.state == state {
            return t;
        }
        assert!(Instant::now() < deadline, "task {id} is {:?}, not {state:?}, after 10 s", t.state);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_completes_a_task_and_the_producer_reads_its_result() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-done", "hello").priority(3)).await.expect("enqueue");
    assert!(!e.duplicate);
    let w = spawn_worker(worker_cfg(&n, "sdk-done"), |t: Task| async move {
        Outcome::Completed(Bytes::from(String::from_utf8_lossy(&t.payload).to_uppercase()))
    });
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert!(r.done, "{r:?}");
    assert_eq!(r.state, TaskState::Completed);
    assert_eq!(&r.result[..], b"HELLO");
    assert_eq!(r.attempts, 1);
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.rejected, s.unconfirmed), (1, 1, 0, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_are_retried_until_the_task_is_dead_lettered() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-dlq", "x").max_attempts(3)).await.expect("enqueue");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let w = spawn_worker(worker_cfg(&n, "sdk-dlq"), move |t: Task| {
        s2.lock().unwrap().push(t.attempts);
        async move { Outcome::Failed { error: format!("boom {}", t.attempts), retryable: true } }
    });
    let t = wait_state(&p, &e.task_id, TaskState::DeadLettered).await;
    assert_eq!(t.attempts, 3);
    assert_eq!(t.last_error, "boom 3");
    let s = w.stop().await;
    assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!((s.claimed, s.failed, s.rejected), (3, 3, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_failure_fails_the_task_at_once() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-fail", "x").max_attempts(5)).await.expect("enqueue");
    let w = spawn_worker(worker_cfg(&n, "sdk-fail"), |_t: Task| async {
        Outcome::Failed { error: "bad input".into(), retryable: false }
    });
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!((r.state, r.attempts, r.error.as_str()), (TaskState::Failed, 1, "bad input"), "{r:?}");
    let s = w.stop().await;
    assert_eq!((s.claimed, s.failed), (1, 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_puts_the_task_back_after_its_delay_and_uses_an_attempt() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-nack", "x")).await.expect("enqueue");
    let calls = Arc::new(Mutex::new(Vec::<(Instant, u32, String)>::new()));
    let c2 = calls.clone();
    let w = spawn_worker(worker_cfg(&n, "sdk-nack"), move |t: Task| {
        c2.lock().unwrap().push((Instant::now(), t.attempts, t.last_error.clone()));
        async move {
            if t.attempts == 1 {
                Outcome::Nack { delay: Duration::from_millis(600), reason: "not yet".into() }
            } else {
                Outcome::Completed(Bytes::from_static(b"done"))
            }
        }
    });
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!((r.state, r.attempts), (TaskState::Completed, 2), "{r:?}");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    let gap = calls[1].0 - calls[0].0;
    assert!(gap >= Duration::from_millis(550), "redelivered after {gap:?}, before the nack's 600 ms delay");
    assert_eq!(calls[1].2, "not yet", "the nack reason is the task's last error");
    let s = w.stop().await;
    assert_eq!((s.claimed, s.nacked, s.completed), (2, 1, 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_gives_the_task_back_without_using_an_attempt() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-abandon", "x").max_attempts(1)).await.expect("enqueue");
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a2 = attempts.clone();
    let w = spawn_worker(worker_cfg(&n, "sdk-abandon"), move |t: Task| {
        let first = {
            let mut a = a2.lock().unwrap();
            a.push(t.attempts);
            a.len() == 1
        };
        async move {
            if first {
                Outcome::Abandon
            } else {
                Outcome::Completed(Bytes::new())
            }
        }
    });
    // With max_attempts 1, a consumed attempt would have dead-lettered the task instead.
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!((r.state, r.attempts), (TaskState::Completed, 1), "{r:?}");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 1]);
    let s = w.stop().await;
    assert_eq!((s.claimed, s.abandoned, s.completed), (2, 1, 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_the_lease_of_a_handler_that_outlives_it() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-beat", "x")).await.expect("enqueue");
    let cfg = WorkerConfig {
        lease: Duration::from_millis(400),
        heartbeat: Some(Duration::from_millis(100)),
        ..worker_cfg(&n, "sdk-beat")
    };
    let w = spawn_worker(cfg, |_t: Task| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Outcome::Completed(Bytes::from_static(b"slow but kept"))
    });
    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!((r.state, r.attempts), (TaskState::Completed, 1), "{r:?}");
    assert_eq!(&r.result[..], b"slow but kept");
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.rejected), (1, 1, 0), "{s:?}");
    assert!(s.lease_extensions >= 5, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_redelivered_and_the_late_result_is_rejected_as_lease_lost() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-expire", "x")).await.expect("enqueue");
    let slow_cfg = WorkerConfig {
        worker_id: "slow".into(),
        lease: Duration::from_millis(300),
        heartbeat: None,
        ..worker_cfg(&n, "sdk-expire")
    };
    let slow = spawn_worker(slow_cfg, |_t: Task| async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        Outcome::Completed(Bytes::from_static(b"late"))
    });
    let mut rejections = slow.worker.rejections();
    until(Duration::from_secs(5), "the slow worker claims the task", || slow.stats().claimed == 1).await;

    // The second worker holds the redelivered task until the first one's late result has been refused.
    let release = Arc::new(Notify::new());
    let r2 = release.clone();
    let fresh_cfg = WorkerConfig { worker_id: "fresh".into(), ..worker_cfg(&n, "sdk-expire") };
    let fresh = spawn_worker(fresh_cfg, move |_t: Task| {
        let r2 = r2.clone();
        async move {
            r2.notified().await;
            Outcome::Completed(Bytes::from_static(b"fresh"))
        }
    });
    let rej = tokio::time::timeout(Duration::from_secs(10), rejections.recv())
        .await
        .expect("a rejection within 10 s")
        .expect("rejections channel open");
    assert_eq!(rej.task_id, e.task_id);
    assert_eq!(rej.reason, "LEASE_LOST");
    assert_eq!(rej.outcome, Outcome::Completed(Bytes::from_static(b"late")));
    assert!(!rej.maybe_applied);
    release.notify_one();

    let r = p.result(&e.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!((r.state, r.attempts), (TaskState::Completed, 2), "{r:?}");
    assert_eq!(&r.result[..], b"fresh");
    let s = slow.stop().await;
    assert_eq!((s.claimed, s.completed, s.rejected), (1, 0, 1), "{s:?}");
    let f = fresh.stop().await;
    assert_eq!((f.claimed, f.completed, f.rejected), (1, 1, 0), "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_size_claims_several_tasks_per_ready_and_checks_each_ack_of_the_result_batch() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let payload = |i: usize| match i {
        4 => "fail".to_string(),
        8 => "cancel".to_string(),
        i => format!("ok-{i}"),
    };
    let tasks: Vec<NewTask> = (0..10).map(|i| NewTask::new("sdk-batch", payload(i))).collect();
    let ids: Vec<String> =
        p.enqueue_batch(tasks).await.expect("batch").into_iter().map(|r| r.expect("item").task_id).collect();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let t2 = tokens.clone();
    let p2 = p.clone();
    let cfg = WorkerConfig { batch_size: 5, concurrency: 1, ..worker_cfg(&n, "sdk-batch") };
    let w = spawn_worker(cfg, move |t: Task| {
        t2.lock().unwrap().push(t.token());
        let p = p2.clone();
        async move {
            match &t.payload[..] {
                b"fail" => Outcome::Failed { error: "no".into(), retryable: false },
                // Cancelled while running: this one result of the batch is refused, the others applied.
                b"cancel" => {
                    p.cancel(&t.id).await.expect("cancel");
                    Outcome::Completed(t.payload)
                }
                _ => Outcome::Completed(t.payload),
            }
        }
    });
    let mut rejections = w.worker.rejections();
    until(Duration::from_secs(10), "all ten results are answered", || {
        let s = w.stats();
        s.completed + s.failed + s.rejected == 10
    })
    .await;
    let rej = rejections.try_recv().expect("the refused result was reported");
    assert_eq!((rej.task_id.as_str(), rej.reason.as_str()), (ids[8].as_str(), "NOT_IN_PROGRESS"), "{rej:?}");
    // Tokens are log index * 65536 + position: the tasks of one claim share the high bits.
    let mut claims: Vec<u64> = tokens.lock().unwrap().iter().map(|t| t >> 16).collect();
    claims.dedup();
    assert_eq!(claims.len(), 2, "ten tasks in two claims of five: {claims:?}");
    assert_eq!(p.get(&ids[4]).await.expect("get").state, TaskState::Failed);
    assert_eq!(p.get(&ids[8]).await.expect("get").state, TaskState::Cancelled);
    assert_eq!(p.get(&ids[9]).await.expect("get").state, TaskState::Completed);
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.failed, s.rejected, s.unconfirmed), (10, 8, 1, 1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_ready_answered_empty_is_rearmed_and_then_served() {
    let n = TestNode::start_with(|c| c.ready_hold_ms = 300).await;
    let p = producer(&n).await;
    let w = spawn_worker(worker_cfg(&n, "sdk-idle"), |_t: Task| async { Outcome::Completed(Bytes::new()) });
    // Several hold times pass with nothing to claim: each Ready is answered empty and sent again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(w.stats().claimed, 0);
    let e = p.enqueue(NewTask::new("sdk-idle", "late work")).await.expect("enqueue");
    let r = p.result(&e.task_id, Duration::from_secs(2)).await.expect("result");
    assert_eq!(r.state, TaskState::Completed, "{r:?}");
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.reconnects), (1, 1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_slots_run_handlers_concurrently_on_one_stream() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let batch = (0..8).map(|i| NewTask::new("sdk-slots", format!("{i}"))).collect();
    for r in p.enqueue_batch(batch).await.expect("batch") {
        r.expect("item");
    }
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n2, m2) = (now.clone(), max.clone());
    let cfg = WorkerConfig { concurrency: 8, ..worker_cfg(&n, "sdk-slots") };
    let w = spawn_worker(cfg, move |_t: Task| {
        let (now, max) = (n2.clone(), m2.clone());
        async move {
            let running = now.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(running, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Outcome::Completed(Bytes::new())
        }
    });
    until(Duration::from_secs(10), "eight tasks completed", || w.stats().completed == 8).await;
    assert_eq!(max.load(Ordering::SeqCst), 8, "all eight handlers ran at once");
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.reconnects), (8, 8, 0), "{s:?}");
}

/// A TCP proxy to `target` whose server-to-client bytes can be held back (kept, not dropped) while `hold` is
/// true, then passed on in order, all that was held in one write.
async fn holding_proxy(target: std::net::SocketAddr, hold: tokio::sync::watch::Receiver<bool>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else { return };
            let ((mut cr, mut cw), (mut sr, mut sw)) = (client.into_split(), server.into_split());
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
            let mut hold = hold.clone();
            tokio::spawn(async move {
                let (mut buf, mut pending) = (vec![0u8; 16 * 1024], Vec::new());
                loop {
                    let held = *hold.borrow();
                    if !held && !pending.is_empty() {
                        if cw.write_all(&pending).await.is_err() {
                            return;
                        }
                        pending.clear();
                    }
                    tokio::select! {
                        r = sr.read(&mut buf) => match r {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        },
                        r = hold.changed(), if held => {
                            if r.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_asks_for_its_next_task_before_its_last_outcome_is_acknowledged() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let first = p.enqueue(NewTask::new("sdk-pipe", "1")).await.expect("enqueue").task_id;
    let second = p.enqueue(NewTask::new("sdk-pipe", "2")).await.expect("enqueue").task_id;
    // The worker reaches the node through a proxy that holds back everything the node sends once the first
    // handler has run: the first outcome's ack, and any task, stay with the proxy.
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let hold_tx = Arc::new(hold_tx);
    let proxy = holding_proxy(n.node().grpc_addr, hold_rx).await;
    let handled = Arc::new(Mutex::new(Vec::new()));
    let (h2, hold2, first2) = (handled.clone(), hold_tx.clone(), first.clone());
    let cfg = WorkerConfig { concurrency: 1, batch_size: 1, addrs: vec![proxy], ..worker_cfg(&n, "sdk-pipe") };
    let w = spawn_worker(cfg, move |t: Task| {
        h2.lock().unwrap().push(t.id.clone());
        if t.id == first2 {
            hold2.send_replace(true);
        }
        async move { Outcome::Completed(Bytes::new()) }
    });
    // The node applied the first outcome and, for the slot's next Ready, claimed the second task, while the
    // worker has received neither the ack nor the task: the Ready went out with the outcome, not after its ack.
    wait_state(&p, &first, TaskState::Completed).await;
    wait_state(&p, &second, TaskState::InProgress).await;
    assert_eq!(w.stats().completed, 0, "no ack reached the worker yet");
    assert_eq!(*handled.lock().unwrap(), vec![first.clone()], "only the first task reached the worker");
    // Let the held bytes through: the first ack is counted, and the second task is run and acknowledged.
    hold_tx.send_replace(false);
    until(Duration::from_secs(10), "both outcomes acknowledged", || w.stats().completed == 2).await;
    assert_eq!(*handled.lock().unwrap(), vec![first, second.clone()]);
    assert_eq!(wait_state(&p, &second, TaskState::Completed).await.attempts, 1);
    let s = w.stop().await;
    assert_eq!((s.claimed, s.completed, s.rejected, s.unconfirmed, s.reconnects), (2, 2, 0, 0, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_while_its_slot_waits_for_its_last_acks_is_never_run() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let first = p.enqueue(NewTask::new("sdk-pipe-cancel", "1")).await.expect("enqueue").task_id;
    let second = p.enqueue(NewTask::new("sdk-pipe-cancel", "2")).await.expect("enqueue").task_id;
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let hold_tx = Arc::new(hold_tx);
    let proxy = holding_proxy(n.node().grpc_addr, hold_rx).await;
    // Per handler run: the task and whether it saw its cancellation (within 5 s).
    let handled = Arc::new(Mutex::new(Vec::new()));
    let (h2, hold2, first2) = (handled.clone(), hold_tx.clone(), first.clone());
    let cfg = WorkerConfig { concurrency: 1, batch_size: 1, addrs: vec![proxy], ..worker_cfg(&n, "sdk-pipe-cancel") };
    let w = spawn_worker(cfg, move |t: Task| {
        let handled = h2.clone();
        let is_first = t.id == first2;
        if is_first {
            hold2.send_replace(true);
        }
        async move {
            let cancelled =
                !is_first && tokio::time::timeout(Duration::from_secs(5), t.cancellation().cancelled()).await.is_ok();
            handled.lock().unwrap().push((t.id.clone(), cancelled));
            Outcome::Completed(Bytes::new())
        }
    });
    // The second task is claimed for the slot's next Ready while the node's answers are held, then cancelled:
    // the worker reads the first ack, the second task and the end of its delivery close together, in whatever
    // order its slot and its stream reader get to them. The cancelled task is not run, or its handler is told.
    wait_state(&p, &second, TaskState::InProgress).await;
    assert_eq!(p.cancel(&second).await.expect("cancel"), TaskState::Cancelled);
    hold_tx.send_replace(false);
    until(Duration::from_secs(15), "both deliveries settled", || {
        let s = w.stats();
        s.completed >= 1 && s.revoked == 1 && s.completed + s.rejected + s.abandoned + s.unconfirmed == 2
    })
    .await;
    let runs = handled.lock().unwrap().clone();
    assert_eq!(runs[0], (first, false), "{runs:?}");
    assert!(
        runs.len() == 1 || runs[1] == (second.clone(), true),
        "the cancelled task's handler was not told: {runs:?}"
    );
    assert_eq!(p.get(&second).await.expect("get").state, TaskState::Cancelled);
    let s = w.stop().await;
    assert_eq!((s.claimed, s.revoked, s.unconfirmed), (2, 1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_reconnects_after_a_server_restart_and_sends_a_running_handlers_result_on_the_new_stream() {
    let port = free_port();
    let mut n = TestNode::start_with(|c| c.grpc_addr = format!("127.0.0.1:{port}")).await;
    let p = producer(&n).await;
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s2, r2) = (started.clone(), release.clone());
    let cfg = WorkerConfig { lease: Duration::from_secs(30), ..worker_cfg(&n, "sdk-restart") };
    let w = spawn_worker(cfg, move |t: Task| {
        let (started, release) = (s2.clone(), r2.clone());
        async move {
            if &t.payload[..] == b"slow" {
                started.notify_one();
                release.notified().await;
            }
            Outcome::Completed(t.payload)
        }
    });
    let slow = p.enqueue(NewTask::new("sdk-restart", "slow")).await.expect("enqueue");
    tokio::time::timeout(Duration::from_secs(10), started.notified()).await.expect("the handler starts");

    n.stop().await;
    n.restart().await;
    // The handler finishes after the stream it came from is gone; its lease lives on in the server.
    release.notify_one();
    let r = p.result(&slow.task_id, Duration::from_secs(10)).await.expect("result after restart");
    assert_eq!((r.state, &r.result[..]), (TaskState::Completed, &b"slow"[..]), "{r:?}");

    let after = p.enqueue(NewTask::new("sdk-restart", "after")).await.expect("enqueue after restart");
    let r = p.result(&after.task_id, Duration::from_secs(10)).await.expect("result");
    assert_eq!(r.state, TaskState::Completed, "{r:?}");
    let s = w.stop().await;
    assert!(s.reconnects >= 1, "{s:?}");
    assert_eq!((s.claimed, s.completed, s.rejected), (2, 2, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_handlers_finish_within_the_grace_and_abandons_the_rest() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let quick = p.enqueue(NewTask::new("sdk-grace", "quick")).await.expect("enqueue");
    let stuck = p.enqueue(NewTask::new("sdk-grace", "stuck")).await.expect("enqueue");
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    // The third slot is idle: its Ready is parked on the server when shutdown begins, and must not claim the
    // task the worker abandons.
    let cfg =
        WorkerConfig { concurrency: 3, shutdown_grace: Duration::from_millis(400), ..worker_cfg(&n, "sdk-grace") };
    let w = spawn_worker(cfg, move |t: Task| {
        s2.fetch_add(1, Ordering::SeqCst);
        async move {
            let d = if &t.payload[..] == b"quick" { 200 } else { 30_000 };
            tokio::time::sleep(Duration::from_millis(d)).await;
            Outcome::Completed(t.payload)
        }
    });
    until(Duration::from_secs(5), "both handlers start", || started.load(Ordering::SeqCst) == 2).await;
    let t0 = Instant::now();
    let s = w.stop().await;
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    assert_eq!((s.claimed, s.completed, s.abandoned, s.unconfirmed), (2, 1, 1, 0), "{s:?}");
    assert_eq!(p.get(&quick.task_id).await.expect("get").state, TaskState::Completed);
    let t = p.get(&stuck.task_id).await.expect("get");
    assert_eq!((t.state, t.attempts), (TaskState::Pending, 0), "abandoned without using its attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_the_server_refuses_ends_the_run_with_its_reason() {
    let n = TestNode::start().await;
    // Valid characters, but longer than the server's limit of 128.
    let cfg = worker_cfg(&n, &"q".repeat(200));
    let w = Worker::new(cfg).expect("the client cannot know the server's length limit");
    let r =
        tokio::time::timeout(Duration::from_secs(10), w.run(|_t| async { Outcome::Abandon }, CancellationToken::new()))
            .await
            .expect("the run ends by itself");
    let e = r.expect_err("a refused Ready ends the run");
    assert_eq!(e.reason(), Some("INVALID_ARGUMENT"), "{e:?}");
    assert!(!e.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_items_succeed_or_fail_one_by_one() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let out = p
        .enqueue_batch(vec![
            NewTask::new("sdk-items", "a"),
            NewTask::new("sdk-items", "b").priority(12),
            NewTask::new("sdk-items", "c"),
        ])
        .await
        .expect("the batch as a whole");
    assert_eq!(out.len(), 3);
    assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
    let e = out[1].as_ref().expect_err("priority 12 is refused");
    assert_eq!(e.reason(), Some("INVALID_ARGUMENT"));
    assert!(!e.is_retryable());
    let c = p.get(&out[2].as_ref().expect("ok").task_id).await.expect("get");
    assert_eq!(&c.payload[..], b"c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_reads_cancels_and_deduplicates() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let missing = p.get(&"0".repeat(32)).await.expect_err("no such task");
    assert_eq!(missing.reason(), Some("NOT_FOUND"));
    assert!(!missing.is_retryable());

    let first = p.enqueue(NewTask::new("sdk-misc", "x").idempotency_key("k-1")).await.expect("enqueue");
    let again = p.enqueue(NewTask::new("sdk-misc", "y").idempotency_key("k-1")).await.expect("enqueue");
    assert_eq!((again.task_id.as_str(), again.duplicate), (first.task_id.as_str(), true));

    assert_eq!(p.cancel(&first.task_id).await.expect("cancel"), TaskState::Cancelled);
    let r = p.result(&first.task_id, Duration::ZERO).await.expect("result");
    assert_eq!((r.state, r.done), (TaskState::Cancelled, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_moves_past_an_unreachable_address() {
    let n = TestNode::start().await;
    let dead = format!("127.0.0.1:{}", free_port());
    let p = Producer::connect(ProducerConfig {
        addrs: vec![dead, addr(&n)],
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .expect("the second address answers");
    let e = p.enqueue(NewTask::new("sdk-addrs", "x")).await.expect("enqueue");
    assert_eq!(p.get(&e.task_id).await.expect("get").state, TaskState::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_producer_pipelines_creates_and_matches_each_ack_to_its_create() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let s = p.stream().await.expect("stream");
    let mut pending = Vec::new();
    // Sent back to back, creates are packed into CreateBatch messages on the wire: each must still get its own
    // answer, including the invalid ones among them.
    let bad = |i: usize| i % 50 == 25;
    for i in 0..200 {
        let queue = if bad(i) { "bad name!" } else { "sdk-stream" };
        pending.push(s.create(NewTask::new(queue, format!("{i}"))).await.expect("create sent"));
    }
    let batch = s
        .create_batch(vec![NewTask::new("sdk-stream", "b0"), NewTask::new("bad name!", "b1")])
        .await
        .expect("batch sent");
    let created: Vec<_> = futures::future::join_all(pending).await;
    for (i, r) in created.iter().enumerate() {
        if bad(i) {
            assert_eq!(r.as_ref().expect_err("bad queue name").reason(), Some("INVALID_ARGUMENT"), "create {i}");
            continue;
        }
        let id = &r.as_ref().expect("created").task_id;
        let t = p.get(id).await.expect("get");
        assert_eq!(t.payload, Bytes::from(format!("{i}")), "the ack of create {i} names its own task");
    }
    let b = batch.await.expect("the batch as a whole");
    assert!(b[0].is_ok(), "{b:?}");
    assert_eq!(b[1].as_ref().expect_err("bad queue name").reason(), Some("INVALID_ARGUMENT"));
    let dup = s.create(NewTask::new("sdk-stream", "d").idempotency_key("s-1")).await.expect("sent").await;
    let again = s.create(NewTask::new("sdk-stream", "d").idempotency_key("s-1")).await.expect("sent").await;
    assert!(matches!((&dup, &again), (Ok(a), Ok(b)) if a.task_id == b.task_id && b.duplicate), "{dup:?} {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_connect_to_nothing_is_a_retryable_transport_error() {
    let dead = format!("127.0.0.1:{}", free_port());
    let e = Producer::connect(ProducerConfig {
        addrs: vec![dead],
        connect_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .expect_err("nothing listens");
    assert!(matches!(e, Error::Transport { .. }), "{e:?}");
    assert!(e.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_producer_lets_a_caller_collect_more_pending_creates_than_the_in_flight_limit() {
    // The documented pattern: collect the pending creates, then await them all. Room in the in-flight limit is
    // freed when an ack arrives, not when its future is awaited, so collecting 10x the limit does not block.
    let n = TestNode::start().await;
    let p = Producer::connect(ProducerConfig { addrs: vec![addr(&n)], stream_max_in_flight: 4, ..Default::default() })
        .await
        .expect("connect");
    let s = p.stream().await.expect("stream");
    let collect = async {
        let mut creates = Vec::new();
        let mut batches = Vec::new();
        for i in 0..40 {
            creates.push(s.create(NewTask::new("sdk-room", format!("{i}"))).await.expect("create sent"));
            if i % 10 == 0 {
                let batch = vec![NewTask::new("sdk-room", format!("b{i}")), NewTask::new("sdk-room", format!("c{i}"))];
                batches.push(s.create_batch(batch).await.expect("batch sent"));
            }
        }
        (creates, batches)
    };
    let (creates, batches) = tokio::time::timeout(Duration::from_secs(30), collect)
        .await
        .expect("create waits for room only until acks free it, not until their futures are awaited");
    let mut ids = std::collections::HashSet::new();
    for r in futures::future::join_all(creates).await {
        ids.insert(r.expect("created").task_id);
    }
    for b in futures::future::join_all(batches).await {
        for r in b.expect("batch") {
            ids.insert(r.expect("created").task_id);
        }
    }
    assert_eq!(ids.len(), 48, "each pending create resolved to its own task");
    let stats = p.queue_stats(&["sdk-room"]).await.expect("stats");
    assert_eq!(stats[0].pending, 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_reads_queue_stats_and_lists_redrives_and_purges_dead_letters() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    for i in 0..3 {
        p.enqueue(NewTask::new("sdk-dl", format!("{i}")).max_attempts(1)).await.expect("enqueue");
    }
    p.enqueue(NewTask::new("sdk-dl-other", "x")).await.expect("enqueue");
    let tasks = p.claim(&Claim::new("w", ["sdk-dl"]).count(3)).await.expect("claim");
    assert_eq!(tasks.len(), 3);
    for t in &tasks {
        let failed = Outcome::Failed { error: format!("boom {}", t.payload.len()), retryable: true };
        let acked = p.report(&t.id, t.token(), failed).await.expect("fail");
        assert_eq!(acked.state, TaskState::DeadLettered, "out of attempts");
    }
    let stats = p.queue_stats(&["sdk-dl"]).await.expect("stats");
    assert_eq!(stats.len(), 1, "only the queue asked for: {stats:?}");
    assert_eq!((stats[0].queue.as_str(), stats[0].pending, stats[0].dead_lettered), ("sdk-dl", 0, 3));
    let all = p.stale_reads().queue_stats(&[]).await.expect("stale stats of every queue");
    let names: Vec<&str> = all.iter().map(|q| q.queue.as_str()).collect();
    assert!(names.contains(&"sdk-dl") && names.contains(&"sdk-dl-other"), "{names:?}");

    let dead = p.dead_letters("sdk-dl", 0).await.expect("list");
    assert_eq!(dead.len(), 3);
    assert!(dead.iter().all(|t| t.state == TaskState::DeadLettered && t.last_error == "boom 1"), "{dead:?}");
    assert_eq!(p.dead_letters("sdk-dl", 2).await.expect("list").len(), 2, "the limit holds");

    let first = dead[0].id.clone();
    let redriven = p.redrive("sdk-dl", &DeadLetters::Ids(vec![first.clone()])).await.expect("redrive");
    assert_eq!(redriven, vec![first.clone()]);
    let t = p.get(&first).await.expect("get");
    assert_eq!((t.state, t.attempts), (TaskState::Pending, 0), "back to pending with its attempts reset");
    let purged = p.purge_dead_letters("sdk-dl", &DeadLetters::All).await.expect("purge");
    assert_eq!(purged.len(), 2);
    assert!(!purged.contains(&first));
    assert!(p.dead_letters("sdk-dl", 0).await.expect("list").is_empty());
    let stats = p.queue_stats(&["sdk-dl"]).await.expect("stats");
    assert_eq!((stats[0].pending, stats[0].dead_lettered), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_claims_extends_and_reports_one_request_at_a_time() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    let e = p.enqueue(NewTask::new("sdk-unary", "x")).await.expect("enqueue");
    let got = p.claim(&Claim::new("w1", ["sdk-unary"]).lease(Duration::from_secs(5))).await.expect("claim");
    let t = got.first().expect("one task");
    assert_eq!((t.id.as_str(), t.state), (e.task_id.as_str(), TaskState::InProgress));
    let lease = t.lease.as_ref().expect("a lease");
    assert_eq!(lease.worker_id, "w1");
    let extended = p.extend_lease(&t.id, t.token(), Duration::from_secs(20), Some((40, "half"))).await.expect("extend");
    assert_eq!(extended.state, TaskState::InProgress);
    assert!(extended.at_ms >= lease.deadline_ms + 10_000, "{extended:?} vs {lease:?}");
    let progress = p.get(&t.id).await.expect("get").progress.expect("progress recorded");
    assert_eq!((progress.percent, progress.message.as_str()), (40, "half"));

    let done = Outcome::CompletedWith { result: "r".into(), follow_ups: vec![NewTask::new("sdk-unary-next", "n")] };
    let acked = p.report(&t.id, t.token(), done).await.expect("complete");
    assert_eq!((acked.state, acked.follow_up_ids.len()), (TaskState::Completed, 1), "{acked:?}");
    assert_eq!(p.get(&acked.follow_up_ids[0]).await.expect("follow-up").queue, "sdk-unary-next");
    let again = p.report(&t.id, t.token(), Outcome::Completed("r".into())).await.expect_err("already ended");
    assert!(again.reason().is_some() && !again.is_retryable(), "{again:?}");

    // Nothing ready: a claim with a wait answers empty after it.
    let started = Instant::now();
    let none = p.claim(&Claim::new("w1", ["sdk-unary-empty"]).wait(Duration::from_millis(300))).await.expect("claim");
    assert!(none.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(250), "answered after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_broadcasts_every_outcome_the_server_applied() {
    let n = TestNode::start_with(fast_retry).await;
    let p = producer(&n).await;
    let w = spawn_worker(worker_cfg(&n, "sdk-applied"), |t: Task| async move {
        if &t.payload[..] == b"retry" && t.attempts == 1 {
            Outcome::Failed { error: "once".into(), retryable: true }
        } else {
            Outcome::Completed(t.payload)
        }
    });
    let mut applied = w.worker.applied();
    let ok = p.enqueue(NewTask::new("sdk-applied", "ok")).await.expect("enqueue").task_id;
    let retry = p.enqueue(NewTask::new("sdk-applied", "retry").max_attempts(3)).await.expect("enqueue").task_id;
    let mut seen: Vec<Applied> = Vec::new();
    while seen.iter().filter(|a| a.state == TaskState::Completed).count() < 2 {
        let a = tokio::time::timeout(Duration::from_secs(10), applied.recv()).await.expect("an applied outcome");
        seen.push(a.expect("not lagging"));
    }
    let of =
        |id: &str| seen.iter().filter(|a| a.task_id == id).map(|a| (a.outcome.clone(), a.state)).collect::<Vec<_>>();
    assert_eq!(of(&ok), vec![(Outcome::Completed("ok".into()), TaskState::Completed)]);
    assert_eq!(
        of(&retry),
        vec![
            (Outcome::Failed { error: "once".into(), retryable: true }, TaskState::Pending),
            (Outcome::Completed("retry".into()), TaskState::Completed),
        ]
    );
    let failed = seen.iter().find(|a| a.task_id == retry && a.state == TaskState::Pending).expect("the retry");
    assert!(failed.at_ms > 0, "a retried task says when it is claimable again: {failed:?}");
    let s = w.stop().await;
    assert_eq!((s.completed, s.failed), (2, 1), "the counters agree with the events: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reports_the_nodes_status_members_and_digests() {
    let n = TestNode::start().await;
    let p = producer(&n).await;
    p.enqueue(NewTask::new("sdk-admin", "x")).await.expect("enqueue");
    let admin = p.admin();
    let s = admin.status().await.expect("status");
    assert_eq!((s.node_id, s.role.as_str(), s.leader_id), (1, "LEADER", Some(1)));
    assert_eq!(s.members.len(), 1);
    assert!(s.applied_index >= 2, "{s:?}");
    let all = admin.cluster_status().await.expect("cluster status");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].status.as_ref().expect("reachable").node_id, 1);
    let digests = admin.digests().await.expect("digests");
    let d = digests[0].1.as_ref().expect("reachable");
    assert_eq!((d.node_id, d.tasks), (1, 1));
    let e = admin.transfer_leader(None, Duration::from_secs(1)).await.expect_err("no other voter");
    assert_eq!(e.reason(), Some("INVALID_ARGUMENT"), "{e:?}");
}
