//! Crash safety with real processes: `kill -9` a loaded `raftq serve`, restart it, and check that nothing
//! acknowledged is lost and that the stored state is exactly what replaying the log gives.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::RaftLogReader;
use raftq::queue::{MemMachine, TaskId, TaskState};
use raftq_proto::v1 as pb;

use crate::procs::ProcNode;
use crate::support::*;

#[derive(Default)]
struct Acked {
    enqueued: Vec<String>,
    completed: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().expect("dir");
    // No snapshot during the test, so the whole log is there to replay and compare with.
    let mut server = ProcNode::new(tmp.path(), 1, "snapshot_every_entries = 10000000\nshards = 4");
    let dir = server.dir.clone();
    server.start();
    let client = server.ready().await;

    let acked = Arc::new(Mutex::new(Acked::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut jobs = Vec::new();
    for p in 0..24 {
        let (mut c, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        jobs.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                if p % 4 == 0 {
                    let items = (0..10).map(|k| enq("crash", &format!("p{p}-{i}-{k}"))).collect();
                    match c.enqueue_batch(pb::EnqueueBatchRequest { items }).await {
                        Ok(r) => {
                            let mut a = acked.lock().expect("lock");
                            for x in r.into_inner().results {
                                if let Some(pb::enqueue_result::Result::Ok(ok)) = x.result {
                                    a.enqueued.push(ok.task_id);
                                }
                            }
                        }
                        Err(_) => break,
                    }
                } else {
                    match c.enqueue(enq("crash", &format!("p{p}-{i}"))).await {
                        Ok(r) => acked.lock().expect("lock").enqueued.push(r.into_inner().task_id),
                        Err(_) => break,
                    }
                }
            }
        }));
    }
    for w in 0..4 {
        let (mut c, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        jobs.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let req = pb::ClaimRequest {
                    worker_id: format!("w{w}"),
                    queues: vec!["crash".into()],
                    count: 8,
                    lease_ms: 60_000,
                    wait_ms: 100,
                };
                let Ok(r) = c.claim(req).await else { break };
                for t in r.into_inner().tasks {
                    let token = t.lease.as_ref().map(|l| l.token).unwrap_or(0);
                    let action = pb::ack_request::Action::Complete(pb::Complete {
                        result: b"ok".to_vec().into(),
                        follow_ups: vec![],
                    });
                    match c.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(action) }).await {
                        Ok(_) => acked.lock().expect("lock").completed.push(t.id),
                        Err(_) => return,
                    }
                }
            }
        }));
    }
    // Let the load run, then kill the server in the middle of it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for j in jobs {
        j.await.expect("join");
    }
    let (enqueued, completed) = {
        let a = acked.lock().expect("lock");
        (a.enqueued.clone(), a.completed.clone())
    };
    assert!(enqueued.len() > 100, "the load ran: {} enqueues acknowledged", enqueued.len());

    server.start();
    let mut c = server.ready().await;
    let done: HashSet<&String> = completed.iter().collect();
    for id in &enqueued {
        let t = c.get_task(pb::GetTaskRequest { id: id.clone() }).await.expect("acknowledged task kept").into_inner();
        if done.contains(id) {
            assert_eq!(t.state, pb::TaskState::Completed as i32, "acknowledged completion kept for {id}");
        }
    }
    server.terminate();

    // The stored state is exactly what replaying the log gives, and the indexes agree with the records.
    let log = raftq::storage::LogStore::open(&dir.join("raft-log.redb")).expect("open log");
    let mut reader = log.clone();
    let entries = reader.try_get_log_entries(0..u64::MAX).await.expect("read log");
    drop(reader);
    drop(log);
    let mut model = MemMachine::new(4);
    for e in &entries {
        if let openraft::EntryPayload::Normal(req) = &e.payload {
            model.apply_at(e.log_id.index, req);
        }
    }
    let sm = raftq::storage::StateMachine::open(&dir, 4).expect("open state machine");
    sm.shared.check_indexes().expect("indexes agree with records");
    let mut stored = 0u64;
    for counts in sm.shared.counts(None).iter().map(|(_, c)| c) {
        stored += counts.pending + counts.delayed + counts.in_progress + counts.completed + counts.failed;
        stored += counts.cancelled + counts.dead_lettered;
    }
    let replayed: BTreeMap<TaskId, _> = model.tasks().map(|t| (t.id, t.clone())).collect();
    assert_eq!(stored as usize, replayed.len(), "same number of tasks as the replayed log");
    for (id, t) in &replayed {
        let s = sm.shared.get_task(id).expect("read").expect("replayed task is stored");
        assert_eq!(&s, t, "stored task equals the replayed one");
    }
    for id in &enqueued {
        let id: TaskId = id.parse().expect("id");
        assert!(replayed.contains_key(&id));
    }
    for id in &completed {
        let id: TaskId = id.parse().expect("id");
        assert_eq!(replayed[&id].state, TaskState::Completed);
    }
}

/// The variables of a running process's environment (`/proc/<pid>/environ`).
fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("read environ");
    raw.split(|b| *b == 0)
        .filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// `raftq serve` runs with a longer allocator purge delay than mimalloc's 1 s (memory a flush frees is reused,
/// not given back and faulted in again) and without transparent huge pages (a first touch does not zero 2 MiB at
/// once on a request's path): it re-runs itself with the variables set, as the same process (the pid a
/// supervisor holds, and signals it sends, still reach the node), and a value the user set is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_with_the_allocator_options_set_unless_the_user_set_them() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = ProcNode::new(root.path(), 1, "");
    node.start();
    let mut c = node.ready().await;
    let pid = node.pid().expect("runs");
    let env = environ(pid);
    assert_eq!(env.get("MIMALLOC_PURGE_DELAY").map(String::as_str), Some("10000"));
    assert_eq!(env.get("MIMALLOC_ALLOW_THP").map(String::as_str), Some("0"));
    let id = c.enqueue(enq("q", "x")).await.expect("the node serves").into_inner().task_id;
    assert_eq!(id.len(), 32);
    // The spawned process is the node: SIGTERM to its pid stops it cleanly.
    node.terminate();

    let mut node = ProcNode::new(root.path(), 2, "");
    // One option set by the user: kept, and the other still set.
    node.start_with_env(&[], &[("MIMALLOC_PURGE_DELAY", "-1")]);
    node.ready().await;
    let env = environ(node.pid().expect("runs"));
    assert_eq!(env.get("MIMALLOC_PURGE_DELAY").map(String::as_str), Some("-1"));
    assert_eq!(env.get("MIMALLOC_ALLOW_THP").map(String::as_str), Some("0"));
    node.terminate();
}
