//! Checked-in data written by earlier formats (`tests/fixtures/<version>/`), and the tests that decode it with
//! the current code. The generator below wrote `tests/fixtures/v0/` with the unversioned (v0) code of commit
//! 27ebc28; it is kept to show exactly what the fixture holds, and is `#[ignore]`d because the current code
//! writes the current format (running it now would overwrite the v0 fixture with v1 data).

use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::RaftSnapshotBuilder;

use super::{files, LogStore, StateMachine};
use crate::queue::*;
use crate::raft::types::{Entry, LogId, NodeInfo, TypeConfig};

/// The v0 fixture: a data directory (1 shard) with a log, a shard file and a snapshot.
pub(super) fn v0_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0/data")
}

pub(super) fn log_id(index: u64) -> LogId {
    openraft::LogId::new(openraft::impls::leader_id_adv::LeaderId { term: 1, node_id: 1 }, index)
}

pub(super) fn task_id(i: u16) -> TaskId {
    TaskId::new(1_000, i, i as u64)
}

fn new_task(i: u16, max_attempts: u32) -> NewTask {
    NewTask {
        id: task_id(i),
        tenant: "t".into(),
        queue: "q".into(),
        payload: format!("payload-{i}").into_bytes(),
        priority: i as u8,
        visible_at: if i == 6 { 900_000 } else { 0 },
        max_attempts,
        idempotency_key: (i == 1).then(|| "key-1".to_string()),
        idempotency_window_ms: 600_000,
        webhook_url: (i == 4).then(|| "http://127.0.0.1:1/hook".to_string()),
        traceparent: None,
        tracestate: None,
        retry: RetryPolicy { base_ms: 100, max_ms: 1_000, exponential: true },
        retention_ms: 10_000_000,
        deadline: None,
        concurrency: None,
        parent: None,
        depends_on: vec![],
        dependency_rule: DependencyRule::AllCompleted,
    }
}

fn entry(index: u64, time_ms: TimeMs, command: Command) -> Entry {
    Entry { log_id: log_id(index), payload: openraft::EntryPayload::Normal(Request { time_ms, seed: index, command }) }
}

fn ack(sm: &StateMachine, i: u16, action: AckAction) -> AckItem {
    let t = sm.shared.get_task(&task_id(i)).expect("read").expect("task");
    let token = t.lease.expect("leased").token;
    AckItem { task_id: task_id(i), tenant: "t".into(), token, action }
}

async fn append(log: &mut LogStore, entries: &[Entry]) {
    let (tx, rx) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
    log.append(entries.to_vec(), openraft::storage::IOFlushed::signal(tx)).await.expect("append");
    rx.await.expect("flushed").expect("flush ok");
}

async fn apply(log: &mut LogStore, sm: &mut StateMachine, entries: Vec<Entry>) {
    append(log, &entries).await;
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.expect("apply");
}

pub(super) fn schedule() -> Schedule {
    Schedule {
        id: TaskId::new(1_200, 5, 5),
        tenant: "t".into(),
        name: "nightly".into(),
        spec: ScheduleSpec::Interval { every_ms: 60_000 },
        missed: MissedPolicy::Skip,
        paused: false,
        created_at: 1_000,
        last_occurrence: None,
        fired: 0,
        template: new_task(99, 3),
    }
}

/// Writes `dir` as the fixture describes: tasks 1..=7 (1 completed, with an idempotency key; 2 in progress;
/// 3 dead-lettered; 4 cancelled, its webhook delivery in the outbox; 5 pending; 6 pending, delayed; 7 enqueued
/// after the snapshot), a paused queue and a schedule, a snapshot at index 7, log entries 4..=9 (1..=3 purged),
/// a vote and the committed index.
pub(super) async fn write_fixture(dir: &Path) {
    let mut log = LogStore::open(&files::log_path(dir)).expect("open log");
    let mut sm = StateMachine::open(dir, 1).expect("open state machine");
    let vote = openraft::impls::Vote::new_committed(1, 1);
    log.save_vote(&vote).await.expect("vote");
    let members = std::collections::BTreeMap::from([(
        1u64,
        NodeInfo { raft_addr: "127.0.0.1:7001".into(), api_addr: "127.0.0.1:8001".into() },
    )]);
    let membership = openraft::Membership::new(vec![[1u64].into()], members).expect("valid membership");
    let first = Entry { log_id: log_id(1), payload: openraft::EntryPayload::Membership(membership) };
    let tasks: Vec<NewTask> = (1..=6).map(|i| new_task(i, if i == 3 { 1 } else { 3 })).collect();
    let claim = (1..=3)
        .map(|i| ClaimItem { task_id: task_id(i), tenant: "t".into(), worker_id: "w".into(), lease_ms: 600_000 })
        .collect();
    apply(
        &mut log,
        &mut sm,
        vec![first, entry(2, 1_000, Command::Enqueue(tasks)), entry(3, 1_001, Command::Claim(claim))],
    )
    .await;
    let acks = vec![
        ack(&sm, 1, AckAction::Complete { result: b"done".to_vec() }),
        ack(&sm, 3, AckAction::Fail { error: "boom".into(), retryable: true }),
    ];
    let paused = Command::SetQueuePaused { tenant: "t".into(), queue: "paused".into(), paused: true };
    apply(
        &mut log,
        &mut sm,
        vec![
            entry(4, 1_002, Command::Ack(acks)),
            entry(5, 1_003, Command::Cancel { tenant: "t".into(), task_id: task_id(4) }),
            entry(6, 1_004, paused),
            entry(7, 1_005, Command::CreateSchedule(Box::new(schedule()))),
        ],
    )
    .await;
    let snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("snapshot");
    assert_eq!(snap.meta.last_log_id, Some(log_id(7)));
    apply(
        &mut log,
        &mut sm,
        vec![entry(8, 1_006, Command::Enqueue(vec![new_task(7, 3)])), entry(9, 1_007, Command::Tick)],
    )
    .await;
    log.save_committed(Some(log_id(9))).await.expect("committed");
    log.purge(log_id(3)).await.expect("purge");
    log.save_vote(&vote).await.expect("vote, and an fsync for the writes before it");
    sm.shared.digest().expect("digest writes every layer");
    let state = |i| sm.shared.get_task(&task_id(i)).expect("read").expect("task").state;
    use TaskState::*;
    let states: Vec<TaskState> = (1..=7).map(state).collect();
    assert_eq!(states, [Completed, InProgress, DeadLettered, Cancelled, Pending, Pending, Pending]);
}

/// Wrote `tests/fixtures/v0/` with the v0 code (see the module doc). Run by hand only:
/// `cargo test -p raftq --lib storage::fixtures::write_v0_fixture -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "wrote the checked-in v0 fixture with the v0 code; the current code writes v1"]
async fn write_v0_fixture() {
    let dir = v0_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove the old fixture");
    }
    std::fs::create_dir_all(&dir).expect("mkdir");
    write_fixture(&dir).await;
}
