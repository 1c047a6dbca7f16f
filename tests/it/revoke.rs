//! A delivery the server ends without its worker reaches the handler: the node the worker stream is on pushes
//! `LeaseRevoked` (on a follower too), the SDK fires the task's cancellation token, and `raftq worker` stops its
//! command (SIGTERM, then SIGKILL) after exporting the delivery's fencing token to it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_client::{
    CancellationToken, NewTask, Outcome, Producer, ProducerConfig, Task, TaskState, Worker, WorkerConfig, WorkerSummary,
};

use crate::procs::{ProcCluster, FAST};
use crate::support::*;

/// What a handler saw: the revocation reason and the delivery's fencing token.
type Seen = Arc<Mutex<Vec<(String, u64)>>>;

/// A handler that waits for its delivery to end (at most 20 s) and records why.
fn waiting_handler(seen: Seen) -> impl Fn(Task) -> futures::future::BoxFuture<'static, Outcome> + Send + Sync {
    move |task: Task| {
        let seen = seen.clone();
        Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_secs(20), task.cancellation().cancelled()).await;
            seen.lock().unwrap().push((task.revocation().unwrap_or("").to_string(), task.fencing_token()));
            Outcome::Abandon
        })
    }
}

async fn run_worker(addr: String, queue: &str, lease: Duration, seen: Seen) -> (Arc<Worker>, CancellationToken) {
    let worker = Arc::new(
        Worker::new(WorkerConfig {
            addrs: vec![addr],
            queues: vec![queue.into()],
            lease,
            heartbeat: None,
            reconnect_backoff_min: Duration::from_millis(20),
            ..Default::default()
        })
        .expect("valid config"),
    );
    let stop = CancellationToken::new();
    let (w, s) = (worker.clone(), stop.clone());
    tokio::spawn(async move { w.run(waiting_handler(seen), s).await });
    (worker, stop)
}

async fn producer(addr: String) -> Producer {
    Producer::connect(ProducerConfig { addrs: vec![addr], ..Default::default() }).await.expect("connect")
}

async fn wait_running(p: &Producer, id: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = p.get(id).await.expect("get");
        if t.state == TaskState::InProgress {
            return t.token();
        }
        assert!(Instant::now() < deadline, "task {id} never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn seen_within(seen: &Seen, limit: Duration) -> Vec<(String, u64)> {
    wait_until(limit, || !seen.lock().unwrap().is_empty()).await;
    seen.lock().unwrap().clone()
}

fn summary(w: &Worker) -> WorkerSummary {
    w.stats().snapshot()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_fires_the_running_handlers_cancellation_token() {
    let n = TestNode::start().await;
    let addr = format!("http://{}", n.node().grpc_addr);
    let p = producer(addr.clone()).await;
    let seen = Seen::default();
    let (w, stop) = run_worker(addr, "rv", Duration::from_secs(30), seen.clone()).await;
    let id = p.enqueue(NewTask::new("rv", "x")).await.expect("enqueue").task_id;
    let token = wait_running(&p, &id).await;
    assert_eq!(p.cancel(&id).await.expect("cancel"), TaskState::Cancelled);
    // Pushed by the server: well within the lease (30 s) and with no heartbeat configured.
    assert_eq!(seen_within(&seen, Duration::from_secs(5)).await, vec![("CANCELLED".to_string(), token)]);
    wait_until(Duration::from_secs(5), || summary(&w).rejected == 1).await;
    assert_eq!(summary(&w).revoked, 1);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_and_a_passed_deadline_reach_their_handlers() {
    let n = TestNode::start_with(|c| c.lease_min_ms = 50).await;
    let addr = format!("http://{}", n.node().grpc_addr);
    let p = producer(addr.clone()).await;
    let seen = Seen::default();
    let (w, stop) = run_worker(addr.clone(), "rv-lease", Duration::from_millis(300), seen.clone()).await;
    let id = p.enqueue(NewTask::new("rv-lease", "x").max_attempts(1)).await.expect("enqueue").task_id;
    let token = wait_running(&p, &id).await;
    assert_eq!(seen_within(&seen, Duration::from_secs(5)).await, vec![("LEASE_EXPIRED".to_string(), token)]);
    stop.cancel();
    drop(w);

    let seen = Seen::default();
    let (_w, stop) = run_worker(addr, "rv-deadline", Duration::from_secs(30), seen.clone()).await;
    let t = NewTask::new("rv-deadline", "x").deadline(Duration::from_millis(800));
    let id = p.enqueue(t).await.expect("enqueue").task_id;
    let token = wait_running(&p, &id).await;
    assert_eq!(seen_within(&seen, Duration::from_secs(5)).await, vec![("DEADLINE_EXCEEDED".to_string(), token)]);
    assert_eq!(p.get(&id).await.expect("get").state, TaskState::Failed);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_handler_whose_stream_is_on_a_follower() {
    let c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(30)).await;
    let follower = c.nodes.iter().find(|x| x.id != leader).expect("a follower");
    follower.ready().await;
    let p = producer(format!("http://{}", c.nodes.iter().find(|x| x.id == leader).expect("leader").grpc)).await;
    let seen = Seen::default();
    let (w, stop) =
        run_worker(format!("http://{}", follower.grpc), "rv-f", Duration::from_secs(30), seen.clone()).await;
    let id = p.enqueue(NewTask::new("rv-f", "x")).await.expect("enqueue").task_id;
    let token = wait_running(&p, &id).await;
    p.cancel(&id).await.expect("cancel");
    assert_eq!(seen_within(&seen, Duration::from_secs(5)).await, vec![("CANCELLED".to_string(), token)]);
    assert_eq!(summary(&w).revoked, 1);
    stop.cancel();
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

async fn file_within(path: &Path, limit: Duration) -> String {
    wait_until(limit, || read(path).is_some_and(|s| !s.is_empty())).await;
    read(path).expect("written")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raftq_worker_exports_the_fencing_token_and_stops_the_command_of_a_cancelled_task() {
    let n = TestNode::start().await;
    let addr = format!("http://{}", n.node().grpc_addr);
    let dir = tempfile::tempdir().expect("dir");
    // "term" traps SIGTERM and exits; "ignore" ignores it and so needs SIGKILL.
    let script = r#"read mode
d="$OUT/$RAFTQ_TASK_ID"
echo $$ > "$d.pid"
echo "$RAFTQ_FENCING_TOKEN" > "$d.token"
if [ "$mode" = ignore ]; then trap '' TERM; exec sleep 30; fi
trap 'echo term > "$d.term"; exit 0' TERM
sleep 30 & wait"#;
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_raftq"))
        .args(["worker", "--addr", &addr, "--queue", "cmd", "--concurrency", "2", "--kill-grace", "1s", "--"])
        .args(["sh", "-c", script])
        .env("OUT", dir.path())
        .env("RAFTQ_DATA_DIR", dir.path().join("no-data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn raftq worker");
    let p = producer(addr).await;
    for mode in ["term", "ignore"] {
        let id = p.enqueue(NewTask::new("cmd", mode)).await.expect("enqueue").task_id;
        let token = wait_running(&p, &id).await;
        let f = |ext: &str| dir.path().join(format!("{id}.{ext}"));
        assert_eq!(file_within(&f("token"), Duration::from_secs(10)).await, token.to_string(), "RAFTQ_FENCING_TOKEN");
        let pid = file_within(&f("pid"), Duration::from_secs(10)).await;
        p.cancel(&id).await.expect("cancel");
        // The command is gone within the kill grace (1 s) plus the push.
        wait_until(Duration::from_secs(5), || !Path::new(&format!("/proc/{pid}")).exists()).await;
        assert_eq!(read(&f("term")).as_deref(), (mode == "term").then_some("term"), "{mode}");
    }
    let _ = std::process::Command::new("kill").args(["-TERM", &worker.id().to_string()]).status();
    let status = worker.wait().expect("wait");
    assert!(status.success(), "raftq worker exits cleanly on SIGTERM: {status:?}");
}
