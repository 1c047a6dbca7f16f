//! Backup and restore against real nodes: a backup taken under load from a follower of a three-process cluster
//! restored into a new three-node cluster (restore node 1, start it, add nodes 2 and 3), and every way a bad
//! backup or a used data directory is refused with nothing half-applied.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq::storage::backup::{self, RestoreTarget};
use raftq_proto::v1 as pb;
use raftq_proto::v1::admin_client::AdminClient;
use raftq_proto::v1::jobs_client::JobsClient;
use tokio_util::sync::CancellationToken;

use crate::procs::*;
use crate::support::*;

/// Streams a backup from the node at `grpc` into `out`. The request carries no redirect header, so a follower
/// serves it by streaming the leader's backup through.
async fn backup_to(grpc: &str, out: &Path) {
    let mut a = AdminClient::new(channel(grpc).await);
    let mut s = a.backup(pb::BackupRequest {}).await.expect("backup").into_inner();
    let mut f = std::io::BufWriter::new(std::fs::File::create(out).expect("create"));
    while let Some(c) = s.message().await.expect("a chunk") {
        f.write_all(&c.data).expect("write");
    }
    f.flush().expect("flush");
}

/// Runs `raftq` with `args`: (success, stdout and stderr).
fn cli(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_raftq"))
        .args(args)
        .env("RAFTQ_LOG", "error")
        .output()
        .expect("run raftq");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[derive(Default)]
struct Load {
    /// Tasks whose enqueue was acknowledged, and when.
    enqueued: Vec<(String, Instant)>,
    /// Tasks whose completion was acknowledged, and when.
    completed: Vec<(String, Instant)>,
}

/// Enqueues batches of 10 (every fifth task with an idempotency key) until `stop`.
async fn producer(grpc: String, n: usize, stop: Arc<AtomicBool>, load: Arc<Mutex<Load>>) {
    let mut c = connect(&grpc).await;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let items = (0..10)
            .map(|_| {
                i += 1;
                let mut req = enq("bk", &format!("p{n}-{i}"));
                if i % 5 == 0 {
                    req.idempotency_key = format!("key-{n}-{i}");
                }
                req
            })
            .collect();
        if let Ok(r) = c.enqueue_batch(pb::EnqueueBatchRequest { items }).await {
            let at = Instant::now();
            let mut l = load.lock().expect("lock");
            for r in r.into_inner().results {
                if let Some(pb::enqueue_result::Result::Ok(ok)) = r.result {
                    l.enqueued.push((ok.task_id, at));
                }
            }
        }
    }
}

/// Claims with leases far longer than the test, so no lease expires in the restored cluster while it is
/// compared with the backup.
async fn worker(grpc: String, stop: Arc<AtomicBool>, load: Arc<Mutex<Load>>) {
    let mut c = connect(&grpc).await;
    while !stop.load(Ordering::Relaxed) {
        let claim = pb::ClaimRequest {
            worker_id: "w".into(),
            queues: vec!["bk".into()],
            count: 20,
            lease_ms: 600_000,
            wait_ms: 100,
        };
        let Ok(tasks) = c.claim(claim).await else { continue };
        for (k, t) in tasks.into_inner().tasks.into_iter().enumerate() {
            // Every fourth claimed task stays in progress.
            if k % 4 == 3 {
                continue;
            }
            let token = t.lease.as_ref().map(|l| l.token).unwrap_or(0);
            let done = pb::Complete { result: b"ok".to_vec().into(), follow_ups: vec![] };
            let ack =
                pb::AckRequest { task_id: t.id.clone(), token, action: Some(pb::ack_request::Action::Complete(done)) };
            if c.ack(ack).await.is_ok() {
                load.lock().expect("lock").completed.push((t.id, Instant::now()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_from_a_follower_restores_into_a_new_three_node_cluster() {
    let src = ProcCluster::start(3, FAST).await;
    let leader = src.wait_leader(Duration::from_secs(20)).await;
    let follower = src.nodes.iter().find(|n| n.id != leader).expect("a follower");
    for n in &src.nodes {
        n.ready().await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Mutex::new(Load::default()));
    let mut running = Vec::new();
    for (i, n) in src.nodes.iter().enumerate() {
        running.push(tokio::spawn(producer(n.grpc.clone(), i, stop.clone(), load.clone())));
    }
    running.push(tokio::spawn(worker(follower.grpc.clone(), stop.clone(), load.clone())));
    running.push(tokio::spawn(worker(src.nodes[0].grpc.clone(), stop.clone(), load.clone())));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let kept = tempfile::tempdir().expect("dir");
    let file = kept.path().join("cluster.backup");
    let before = Instant::now();
    backup_to(&follower.grpc, &file).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for r in running {
        r.await.expect("load task");
    }
    let load = std::mem::take(&mut *load.lock().expect("lock"));
    let acked: Vec<&String> = load.enqueued.iter().filter(|(_, at)| *at < before).map(|(id, _)| id).collect();
    let done: Vec<&String> = load.completed.iter().filter(|(_, at)| *at < before).map(|(id, _)| id).collect();
    let (n_acked, n_done) = (acked.len(), done.len());
    assert!(n_acked > 100 && n_done > 0, "load before the backup: {n_acked} enqueued, {n_done} completed");
    assert!(load.enqueued.len() > acked.len(), "producers kept going during the backup");

    let info = backup::verify(&file).expect("the backup checks out");
    assert_eq!(info.header.node_id, leader, "the leader wrote it");
    assert_eq!(info.header.membership.membership().voter_ids().count(), 3, "the source's membership is recorded");
    drop(src);

    // A new cluster on new ports: node 1 restored from the file, nodes 2 and 3 empty until added.
    let root = tempfile::tempdir().expect("dir");
    let mut n1 = ProcNode::new(root.path(), 1, FAST);
    let config = n1.config.to_string_lossy().to_string();
    let file_s = file.to_string_lossy().to_string();
    let (ok, out) = cli(&["restore", &file_s, "--config", &config]);
    assert!(ok, "restore: {out}");
    assert!(out.contains("matches the backup"), "{out}");
    // The restored files hold the source's state at the backup's point: its digest, computed by the source over
    // the read transactions the backup was written from.
    let (applied, digest, tasks) = backup::data_dir_digest(&n1.dir).expect("digest of the restored files");
    assert_eq!((applied, digest, tasks), (info.header.applied, info.trailer.state_digest, info.trailer.tasks));
    n1.start();
    let mut c1 = n1.ready().await;
    let mut n2 = ProcNode::new(root.path(), 2, &format!("{FAST}bootstrap = false\n"));
    let mut n3 = ProcNode::new(root.path(), 3, &format!("{FAST}bootstrap = false\n"));
    n2.start();
    n3.start();
    let mut admin = n1.admin().await.expect("admin");
    for n in [&n2, &n3] {
        let add = pb::AddNodeRequest {
            node_id: n.id,
            raft_addr: n.raft.clone(),
            api_addr: n.grpc.clone(),
            learner_only: false,
        };
        admin.add_node(add).await.expect("add node");
    }
    let new = ProcCluster { nodes: vec![n1, n2, n3], root };
    let digests = new.wait_digests_agree(Duration::from_secs(60)).await;
    assert_eq!(digests.len(), 3);
    for d in digests.values() {
        // Only a blank entry and membership changes were applied since: no record differs from the source's.
        assert_eq!((d.digest, d.tasks), (info.trailer.state_digest, info.trailer.tasks), "{digests:?}");
    }
    let status = admin.status(pb::NodeStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(status.members.iter().filter(|m| m.voter).count(), 3, "{:?}", status.members);

    for id in &acked {
        c1.get_task(pb::GetTaskRequest { id: (*id).clone() }).await.unwrap_or_else(|e| panic!("task {id}: {e}"));
    }
    for id in &done {
        let t = c1.get_task(pb::GetTaskRequest { id: (*id).clone() }).await.expect("task").into_inner();
        assert_eq!(t.state(), pb::TaskState::Completed, "task {id} was completed before the backup");
        assert_eq!(t.attempts, 1);
    }
}

/// A node with some of everything: tasks pending, in progress and completed, idempotency keys, a schedule, and
/// (the last id) a task in progress on a short lease.
async fn filled_node() -> (TestNode, Vec<String>, String) {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    let mut ids = Vec::new();
    for i in 0..300 {
        let mut req = enq("r", &i.to_string());
        if i % 3 == 0 {
            req.idempotency_key = format!("k{i}");
        }
        ids.push(c.enqueue(req).await.expect("enqueue").into_inner().task_id);
    }
    let claim =
        pb::ClaimRequest { worker_id: "w".into(), queues: vec!["r".into()], count: 20, lease_ms: 600_000, wait_ms: 0 };
    for t in c.claim(claim).await.expect("claim").into_inner().tasks.into_iter().take(10) {
        let token = t.lease.as_ref().map(|l| l.token).unwrap_or(0);
        let done = pb::Complete { result: b"done".to_vec().into(), follow_ups: vec![] };
        let ack = pb::AckRequest { task_id: t.id, token, action: Some(pb::ack_request::Action::Complete(done)) };
        c.ack(ack).await.expect("ack");
    }
    let ch = channel(&n.node().grpc_addr.to_string()).await;
    let sched = pb::CreateScheduleRequest {
        name: "nightly".into(),
        task: Some(enq("r", "s")),
        interval_ms: 3_600_000,
        ..Default::default()
    };
    JobsClient::new(ch).create_schedule(sched).await.expect("schedule");
    let short = c.enqueue(enq("short", "s")).await.expect("enqueue").into_inner().task_id;
    let claim =
        pb::ClaimRequest { worker_id: "w".into(), queues: vec!["short".into()], count: 1, lease_ms: 1_000, wait_ms: 0 };
    assert_eq!(c.claim(claim).await.expect("claim").into_inner().tasks.len(), 1);
    (n, ids, short)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_newer_or_misplaced_backups_are_refused_and_nothing_is_half_applied() {
    let (mut n, ids, short) = filled_node().await;
    // Over REST this time: the body is the file.
    let (status, _, good) =
        crate::rest::raw_bytes(n.node().http_addr, "GET", "/v1/admin/backup", &[], String::new()).await;
    assert_eq!(status, 200);
    n.stop().await;
    let dir = tempfile::tempdir().expect("dir");
    let put = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    };
    let good_file = put("good.backup", &good);
    let info = backup::verify(&good_file).expect("good");
    assert_eq!(info.trailer.tasks, 301);
    let targets = tempfile::tempdir().expect("targets");
    let target = |name: &str, force: bool| RestoreTarget {
        data_dir: targets.path().join(name),
        node_id: 1,
        node: raftq::raft::types::NodeInfo { raft_addr: "127.0.0.1:0".into(), api_addr: "127.0.0.1:0".into() },
        shards: 4,
        force,
    };
    let refused = |file: &Path, name: &str| {
        let e = backup::restore(file, &target(name, false)).expect_err("refused").to_string();
        assert!(!targets.path().join(name).exists(), "{name}: nothing written ({e})");
        e
    };

    let mut cut = good.clone();
    cut.truncate(good.len() / 2);
    let e = refused(&put("half.backup", &cut), "half");
    assert!(e.contains("truncated"), "{e}");
    let e = refused(&put("short.backup", &good[..good.len() - 1]), "short");
    assert!(e.contains("truncated"), "{e}");
    let e = refused(&put("head.backup", &good[..10]), "head");
    assert!(e.contains("truncated"), "{e}");

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x01;
    let e = refused(&put("flipped.backup", &flipped), "flipped");
    assert!(e.contains("checksum mismatch"), "{e}");

    // Newer versions, refused naming the version found and the newest this binary reads: the file's layout,
    // and the header record's format version.
    let mut layout = good.clone();
    layout[raftq::storage::format::BACKUP_MAGIC_LEN - 2] = b'2';
    let e = refused(&put("layout2.backup", &layout), "layout2");
    assert!(e.contains("format version 2") && e.contains("(version 1)"), "{e}");
    let mut record = good.clone();
    let newer = raftq::storage::format::CURRENT + 1;
    record[raftq::storage::format::BACKUP_MAGIC_LEN + 4] = newer;
    let e = refused(&put("record-newer.backup", &record), "record-newer");
    let (found, supported) = (format!("format version {newer}"), format!("(version {})", newer - 1));
    assert!(e.contains(&format!("backup header has {found}")) && e.contains(&supported), "{e}");

    // Not over a directory that holds something, unless forced: the CLI says why and leaves it as it was.
    let used = targets.path().join("used");
    std::fs::create_dir_all(&used).expect("mkdir");
    std::fs::write(used.join("precious"), "x").expect("write");
    let (used_s, good_s) = (used.to_string_lossy().to_string(), good_file.to_string_lossy().to_string());
    let (ok, out) = cli(&["restore", &good_s, "--data-dir", &used_s, "--node-id", "1"]);
    assert!(!ok && out.contains("already holds data") && out.contains("--force"), "{out}");
    assert!(used.join("precious").exists() && !used.join("sm").exists(), "left as it was");
    let (ok, out) = cli(&["restore", &good_s, "--data-dir", &used_s, "--node-id", "1", "--force"]);
    assert!(ok, "{out}");
    assert!(!used.join("precious").exists() && used.join("sm").exists(), "replaced");
    let left: Vec<_> =
        std::fs::read_dir(targets.path()).expect("list").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(left, ["used"], "no temporary directory left behind");
    let (_, digest, tasks) = backup::data_dir_digest(&used).expect("digest");
    assert_eq!((digest, tasks), (info.trailer.state_digest, info.trailer.tasks));

    // The restored node serves the state: tasks with their states and results, keys, the schedule.
    let cfg = raftq::config::Config { node_id: 1, ..test_config(&used) };
    let listeners = raftq::node::Listeners::bind(&cfg).await.expect("bind");
    let node = raftq::node::Node::start(cfg, listeners, CancellationToken::new()).await.expect("start restored");
    wait_until(Duration::from_secs(10), || raftq::raft::metrics(&node.raft).current_leader == Some(1)).await;
    let mut c = connect(&node.grpc_addr.to_string()).await;
    let mut states = std::collections::BTreeMap::new();
    for id in &ids {
        let t = c.get_task(pb::GetTaskRequest { id: id.clone() }).await.expect("task").into_inner();
        *states.entry(t.state().as_str_name()).or_insert(0) += 1;
        if t.state() == pb::TaskState::Completed {
            let r = c.get_result(pb::GetResultRequest { id: id.clone(), wait_ms: 0 }).await.expect("result");
            assert_eq!(r.into_inner().result.as_ref(), b"done");
        }
    }
    let want = [("TASK_STATE_COMPLETED", 10), ("TASK_STATE_IN_PROGRESS", 10), ("TASK_STATE_PENDING", 280)];
    assert_eq!(states, want.into_iter().collect(), "states as they were");
    let again = c.enqueue(pb::EnqueueRequest { idempotency_key: "k0".into(), ..enq("r", "0") }).await.expect("enqueue");
    assert!(again.get_ref().duplicate && again.get_ref().task_id == ids[0], "the idempotency key is kept");
    let ch = channel(&node.grpc_addr.to_string()).await;
    let s = JobsClient::new(ch).list_schedules(pb::ListSchedulesRequest {}).await.expect("schedules").into_inner();
    assert_eq!(s.schedules.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["nightly"]);
    // A task in progress at the backup keeps its lease; once that has run out the restored leader expires it
    // and it returns to pending for a retry, as after a failover.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = c.get_task(pb::GetTaskRequest { id: short.clone() }).await.expect("task").into_inner();
        if t.state() == pb::TaskState::Pending {
            assert_eq!(t.attempts, 1, "the expired attempt counts");
            break;
        }
        assert!(Instant::now() < deadline, "the restored lease did not expire: {:?}", t.state());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.stop().await;
}
