//! Checked-in data written by earlier formats (`tests/fixtures/<version>/`), and the tests that decode it with
//! the current code. The generator below wrote `tests/fixtures/v0/` with the unversioned (v0) code of commit
//! 27ebc28; it is kept to show exactly what the fixture holds, and is `#[ignore]`d because the current code
//! writes the current format (running it now would overwrite the v0 fixture with v2 data). `tests/fixtures/v1/`
//! holds what the same generator wrote with the v1 code of commit 86e2f28, then opened once by it as a data
//! directory (so of directory version 2, with the log's journal).

use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::RaftSnapshotBuilder;

use super::{files, format, LogStore, StateMachine};
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
        payload: format!("payload-{i}").into_bytes().into(),
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

/// Applies the switch to cluster version 1 at `index`, after which snapshots carry v1 records.
async fn raise_cluster_version(sm: &mut StateMachine, index: u64) {
    set_cluster_version(sm, index, 1).await;
}

/// Applies the switch to cluster version `version` at `index`.
async fn set_cluster_version(sm: &mut StateMachine, index: u64, version: u32) {
    let e = entry(index, 1_100, Command::SetClusterVersion { version });
    sm.apply(futures::stream::iter([Ok((e, None))])).await.expect("apply");
}

fn entry(index: u64, time_ms: TimeMs, command: Command) -> Entry {
    Entry { log_id: log_id(index), payload: openraft::EntryPayload::Normal(Request::new(time_ms, index, command)) }
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
#[ignore = "wrote the checked-in v0 fixture with the v0 code; the current code writes v2"]
async fn write_v0_fixture() {
    let dir = v0_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove the old fixture");
    }
    std::fs::create_dir_all(&dir).expect("mkdir");
    write_fixture(&dir).await;
}

/// The v1 fixture: what `write_fixture` writes, written by the v1 code of commit 86e2f28 (fixed-width bincode
/// behind a version byte) and opened once by it, so a data directory of version 2 with the log's journal.
fn v1_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/data")
}

/// Copies the checked-in v0 data directory to a temp dir (tests never change the fixture).
fn copy_v0() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    copy_dir(&v0_dir(), tmp.path());
    tmp
}

/// Copies the checked-in v1 data directory to a temp dir.
fn copy_v1() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    copy_dir(&v1_dir(), tmp.path());
    tmp
}

/// The first byte of every record of the shard file's `table`, by key.
fn record_versions(dir: &Path, table: redb::TableDefinition<&[u8], &[u8]>) -> Vec<(Vec<u8>, u8)> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::ReadOnlyDatabase::open(files::shard_path(&files::sm_dir(dir), 0)).expect("open");
    let txn = db.begin_read().expect("read");
    let t = txn.open_table(table).expect("table");
    t.iter().expect("iter").map(|item| item.expect("item")).map(|(k, v)| (k.value().to_vec(), v.value()[0])).collect()
}

/// A data directory written by the v1 code opens with its state; opening writes the v2 markers and leaves every
/// record as it was (each says its version), a record changed later is written in v2, and both kinds read back,
/// hash alike and downgrade to v0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_data_dir_opens_with_its_tasks_and_keeps_its_records_until_they_change() {
    use super::tables::*;
    use openraft::RaftLogReader;
    let tmp = copy_v1();
    let dir = tmp.path();
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::DIR_V2));
    let records = |c: &std::collections::BTreeMap<(String, String, Vec<u8>), Vec<u8>>| {
        c.iter()
            .filter(|((_, table, _), _)| table != "meta" && table != "log")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let before = records(&contents(dir));
    assert!(before.iter().all(|(_, v)| v[0] == format::V1), "the fixture holds v1 records");
    let digest = {
        let (mut log, mut sm) = super::open_data_dir(dir, 4).expect("open the v1 directory");
        assert_fixture_state(&sm, true);
        assert_eq!(sm.shared.read().count(), 1, "the directory keeps its shard count");
        let entries = log.try_get_log_entries(..).await.expect("entries");
        assert_eq!(entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (4..=9).collect::<Vec<_>>());
        assert_eq!(log.read_vote().await.expect("vote"), Some(openraft::impls::Vote::new_committed(1, 1)));
        let cur = sm.get_current_snapshot().await.expect("current").expect("the fixture's snapshot");
        assert_eq!(cur.meta.last_log_id, Some(log_id(7)));
        sm.shared.digest().expect("digest")
    };
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::DIR_V3));
    for (path, meta) in [(files::log_path(dir), LOG_META), (files::shard_path(&files::sm_dir(dir), 0), SHARD_META)] {
        let db = super::codec::open_db(&path).expect("open");
        assert_eq!(format::file_version(&db, meta, &path).expect("marker"), Some(format::V2), "{}", path.display());
    }
    assert_eq!(records(&contents(dir)), before, "the upgrade rewrote no record");

    // Task 5 cancelled: its record is written again, in v2; the others stay v1.
    {
        let (mut log, mut sm) = super::open_data_dir(dir, 1).expect("reopen");
        assert_eq!(sm.shared.digest().expect("digest"), digest);
        let cancel = Command::Cancel { tenant: "t".into(), task_id: task_id(5) };
        apply(&mut log, &mut sm, vec![entry(10, 1_010, cancel)]).await;
        sm.shared.digest().expect("digest writes every layer");
    }
    let versions: std::collections::BTreeMap<Vec<u8>, u8> = record_versions(dir, TASKS).into_iter().collect();
    assert_eq!(versions.get(task_id(5).0.as_slice()), Some(&format::V2));
    assert_eq!(versions.get(task_id(6).0.as_slice()), Some(&format::V1));
    let (log, sm) = super::open_data_dir(dir, 1).expect("reopen");
    assert_eq!(task(&sm, 5).state, TaskState::Cancelled);
    assert_eq!((task(&sm, 6).state, task(&sm, 6).visible_at), (TaskState::Pending, 900_000));
    drop((log, sm));

    // Before the switch to cluster version 1 a downgrade is allowed: both kinds become bare v0 values.
    super::downgrade::downgrade_data_dir(dir).expect("downgrade").expect("was v2");
    let v0 = contents(dir);
    let task5 = &v0[&("shard-0.redb".to_string(), TASKS.to_string(), task_id(5).0.to_vec())];
    let task6 = &v0[&("shard-0.redb".to_string(), TASKS.to_string(), task_id(6).0.to_vec())];
    assert_eq!(bincode::deserialize::<Task>(task5).expect("v0 task 5").state, TaskState::Cancelled);
    assert_eq!(bincode::deserialize::<Task>(task6).expect("v0 task 6").visible_at, 900_000);
    let (_log, sm) = super::open_data_dir(dir, 1).expect("the v0 directory opens");
    assert_eq!(task(&sm, 5).state, TaskState::Cancelled);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read fixture dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// Every file under `dir` with its bytes.
fn all_bytes(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("read dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            out.extend(all_bytes(&e.path()));
        } else {
            out.insert(e.path(), std::fs::read(e.path()).expect("read"));
        }
    }
    out
}

/// Every file under `dir` holds the bytes of `before`, and no file came or went.
fn assert_unchanged(dir: &Path, before: &std::collections::BTreeMap<PathBuf, Vec<u8>>) {
    let after = all_bytes(dir);
    let changed: Vec<&PathBuf> =
        before.keys().chain(after.keys()).filter(|p| before.get(*p) != after.get(*p)).collect();
    assert!(changed.is_empty(), "nothing may be rewritten, yet these changed: {changed:?}");
}

fn task(sm: &StateMachine, i: u16) -> Task {
    sm.shared.get_task(&task_id(i)).expect("read").unwrap_or_else(|| panic!("task {i}"))
}

/// The state the v0 fixture holds (see `write_fixture`), asserted value by value.
fn assert_fixture_state(sm: &StateMachine, with_task_7: bool) {
    use TaskState::*;
    let t1 = task(sm, 1);
    assert_eq!((t1.state, t1.result.as_deref(), t1.attempts), (Completed, Some(b"done".as_slice()), 1));
    assert_eq!(t1.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(&t1.payload[..], b"payload-1");
    let t2 = task(sm, 2);
    assert_eq!(t2.state, InProgress);
    let lease = t2.lease.expect("task 2 is leased");
    assert_eq!(&*lease.worker_id, "w");
    let t3 = task(sm, 3);
    assert_eq!((t3.state, t3.last_error.as_deref(), t3.max_attempts), (DeadLettered, Some("boom"), 1));
    assert_eq!(t3.dead_at, Some(1_002));
    assert_eq!(sm.shared.dead_letters("t", "q", 10).expect("dead letters").len(), 1);
    let t4 = task(sm, 4);
    assert_eq!((t4.state, t4.webhook_url.as_deref()), (Cancelled, Some("http://127.0.0.1:1/hook")));
    assert_eq!((task(sm, 5).state, task(sm, 5).priority), (Pending, 5));
    assert_eq!((task(sm, 6).state, task(sm, 6).visible_at), (Pending, 900_000));
    assert_eq!(sm.shared.get_task(&task_id(7)).expect("read").map(|t| t.state), with_task_7.then_some(Pending));
    assert!(sm.shared.is_paused("t", "paused"));
    assert_eq!(sm.shared.schedules(Some("t")), vec![Schedule { created_at: 1_005, ..schedule() }], "stamped by apply");
    let outbox = sm.shared.due_deliveries(u64::MAX, 10, &Default::default()).expect("outbox");
    assert_eq!(outbox.len(), 1, "task 4's webhook delivery: {outbox:?}");
    sm.shared.check_indexes().expect("indexes agree with records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v0_data_dir_opens_with_its_tasks_and_is_upgraded_to_v2() {
    use openraft::RaftLogReader;
    let tmp = copy_v0();
    let dir = tmp.path();
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::V0));
    {
        let (mut log, mut sm) = super::open_data_dir(dir, 4).expect("open the v0 directory");
        assert_fixture_state(&sm, true);
        assert_eq!(sm.shared.read().count(), 1, "the directory keeps its shard count");
        assert_eq!(sm.applied_state().await.expect("applied").0, Some(log_id(9)));
        let state = log.get_log_state().await.expect("log state");
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(3)), Some(log_id(9))));
        let entries = log.try_get_log_entries(..).await.expect("entries");
        assert_eq!(entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (4..=9).collect::<Vec<_>>());
        let openraft::EntryPayload::Normal(req) = &entries[1].payload else { panic!("entry 5 is a command") };
        assert_eq!(*req.command, Command::Cancel { tenant: "t".into(), task_id: task_id(4) });
        assert_eq!(log.read_vote().await.expect("vote"), Some(openraft::impls::Vote::new_committed(1, 1)));
        assert_eq!(log.read_committed().await.expect("committed"), Some(log_id(9)));
        let cur = sm.get_current_snapshot().await.expect("current").expect("the v0 snapshot");
        assert_eq!(cur.meta.last_log_id, Some(log_id(7)));
    }
    // Upgraded: the directory says version 3 (v2 files and the log's journal), every file v2, and a reopen (no v0
    // decoding) finds the same.
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::DIR_V3));
    for path in [files::log_path(dir), files::shard_path(&files::sm_dir(dir), 0)] {
        let db = super::codec::open_db(&path).expect("open");
        let meta = if path == files::log_path(dir) { super::tables::LOG_META } else { super::tables::SHARD_META };
        assert_eq!(format::file_version(&db, meta, &path).expect("marker"), Some(format::V2), "{}", path.display());
    }
    let (mut log, sm) = super::open_data_dir(dir, 1).expect("reopen");
    assert_fixture_state(&sm, true);
    assert_eq!(log.try_get_log_entries(..).await.expect("entries").len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v0_snapshot_installs_and_a_v1_snapshot_round_trips() {
    use tokio::io::AsyncReadExt;
    let tmp = copy_v0();
    let meta = openraft::SnapshotMeta { last_log_id: Some(log_id(7)), last_membership: Default::default() };
    let snap = std::fs::read_dir(files::snap_dir(tmp.path()))
        .expect("snapshots")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "snap"))
        .expect("the fixture's snapshot file");
    assert!(std::fs::read(&snap).expect("read").starts_with(b"RAFTQSNAP2\n"), "a v0 snapshot");

    let a = tempfile::tempdir().expect("dir");
    let mut sm = StateMachine::open(a.path(), 2).expect("open");
    sm.install_snapshot(&meta, tokio::fs::File::open(&snap).await.expect("open")).await.expect("install v0");
    assert_fixture_state(&sm, false);
    assert_eq!(sm.shared.now(), 1_005);

    // Built again by this code at cluster version 0: v0 records still, as a member of the old binary reads them.
    let mut again = sm.get_snapshot_builder().await.build_snapshot().await.expect("build").snapshot;
    let mut magic = [0u8; 11];
    tokio::io::AsyncSeekExt::seek(&mut again, std::io::SeekFrom::Start(0)).await.expect("seek");
    again.read_exact(&mut magic).await.expect("read");
    assert_eq!(&magic, b"RAFTQSNAP2\n", "v0 records until the cluster version is raised");
    // Once the cluster runs version 1: a v1 snapshot, which installs to the same state.
    raise_cluster_version(&mut sm, 100).await;
    let built = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let mut bytes = Vec::new();
    let mut f = built.snapshot;
    tokio::io::AsyncSeekExt::seek(&mut f, std::io::SeekFrom::Start(0)).await.expect("seek");
    f.read_to_end(&mut bytes).await.expect("read");
    assert!(bytes.starts_with(b"RAFTQSNAP3\n"), "v1 records at cluster versions 1 to 3");
    let b = tempfile::tempdir().expect("dir");
    let mut other = StateMachine::open(b.path(), 3).expect("open");
    let path = b.path().join("v1.snap");
    std::fs::write(&path, &bytes).expect("write");
    other.install_snapshot(&built.meta, tokio::fs::File::open(&path).await.expect("open")).await.expect("install v1");
    assert_fixture_state(&other, false);
    assert_eq!(other.shared.digest().expect("digest").1, sm.shared.digest().expect("digest").1);
}

fn assert_newer(err: impl std::fmt::Display, found: &str, supported: &str) {
    let msg = err.to_string();
    assert!(msg.contains(&format!("format version {found}")), "names the version found: {msg}");
    assert!(msg.contains(&format!("supports (version {supported})")), "names the version supported: {msg}");
}

#[test]
fn a_newer_data_dir_is_refused_at_start_and_left_byte_identical() {
    let tmp = copy_v0();
    let dir = tmp.path();
    std::fs::write(dir.join(format::DATA_DIR_MARKER), "99\n").expect("write marker");
    let before = all_bytes(dir);
    let err = super::open_data_dir(dir, 1).err().expect("a v99 directory is refused");
    assert_newer(&err, "99", "3");
    assert!(err.to_string().contains("data directory"), "{err}");
    assert_unchanged(dir, &before);
}

/// Sets a redb file's format marker, as a newer binary would have written it.
fn set_file_marker(path: &Path, meta: redb::TableDefinition<&str, &[u8]>, version: u8) {
    let db = redb::Database::open(path).expect("open");
    let txn = db.begin_write().expect("write");
    txn.open_table(meta).expect("meta").insert(super::tables::META_FORMAT, [version].as_slice()).expect("insert");
    txn.commit().expect("commit");
}

#[test]
fn a_newer_log_or_shard_file_is_refused_at_start_and_left_byte_identical() {
    let tmp = copy_v0();
    let dir = tmp.path();
    drop(super::open_data_dir(dir, 1).expect("upgrade to v1"));
    let shard = files::shard_path(&files::sm_dir(dir), 0);
    for (path, meta) in [(files::log_path(dir), super::tables::LOG_META), (shard, super::tables::SHARD_META)] {
        set_file_marker(&path, meta, 7);
        let before = all_bytes(dir);
        let err = super::open_data_dir(dir, 1).err().expect("a v7 file is refused");
        assert_newer(&err, "7", "2");
        assert!(err.to_string().contains(&path.display().to_string()), "names the file: {err}");
        assert_unchanged(dir, &before);
        set_file_marker(&path, meta, format::V2);
    }
    drop(super::open_data_dir(dir, 1).expect("opens again once both files are v1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_records_and_log_entries_are_refused_by_name() {
    use openraft::RaftLogReader;
    let tmp = copy_v0();
    let dir = tmp.path();
    drop(super::open_data_dir(dir, 1).expect("upgrade to v1"));
    // A log entry and a task record written by a newer binary into v1 files.
    let newer_value = |path: &Path, write: &dyn Fn(&redb::WriteTransaction)| {
        let db = redb::Database::open(path).expect("open");
        let txn = db.begin_write().expect("write");
        write(&txn);
        txn.commit().expect("commit");
    };
    newer_value(&files::log_path(dir), &|txn| {
        txn.open_table(super::tables::LOG).expect("log").insert(10u64, [99u8, 0, 0].as_slice()).expect("insert");
    });
    let mut log = LogStore::open(&files::log_path(dir)).expect("the file is v1");
    assert_eq!(log.try_get_log_entries(4..10).await.expect("v1 entries").len(), 6);
    let err = log.try_get_log_entries(4..=10).await.expect_err("entry 10 is v99");
    assert_newer(&err, "99", "2");
    assert!(err.to_string().contains("log entry"), "{err}");
    drop(log);

    newer_value(&files::shard_path(&files::sm_dir(dir), 0), &|txn| {
        let mut t = txn.open_table(super::tables::TASKS).expect("tasks");
        t.insert(task_id(5).0.as_slice(), [99u8, 1, 2, 3].as_slice()).expect("insert");
    });
    let err = StateMachine::open(dir, 1).err().expect("a v99 task is refused at start");
    assert_newer(&err, "99", "2");
    assert!(err.to_string().contains("task record"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_snapshot_is_refused_and_the_state_stays() {
    let tmp = copy_v0();
    let (_log, mut sm) = super::open_data_dir(tmp.path(), 1).expect("open");
    raise_cluster_version(&mut sm, 100).await;
    let built = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let meta = built.meta.clone();
    let cur = sm.get_current_snapshot().await.expect("current").expect("some");
    drop(cur);
    let path = std::fs::read_dir(files::snap_dir(tmp.path()))
        .expect("snapshots")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "snap"))
        .expect("the built snapshot");
    let good = std::fs::read(&path).expect("read");
    let bad_dir = tempfile::tempdir().expect("dir");
    let mut layout = good.clone();
    layout[..format::SNAPSHOT_MAGIC_LEN].copy_from_slice(b"RAFTQSNAP9\n");
    // The header frame's version byte (after the magic and the frame's kind and length).
    let mut header = good.clone();
    header[format::SNAPSHOT_MAGIC_LEN + 5] = 99;
    let mut target = StateMachine::open(bad_dir.path(), 1).expect("open");
    for (bytes, found, supported) in [(layout, "9", "4"), (header, "99", "2")] {
        let p = bad_dir.path().join("bad.snap");
        std::fs::write(&p, &bytes).expect("write");
        let err = target.install_snapshot(&meta, tokio::fs::File::open(&p).await.expect("open")).await;
        assert_newer(err.expect_err("refused"), found, supported);
        assert_eq!(target.applied_state().await.expect("applied").0, None, "nothing installed");
    }
    // A current snapshot of a newer layout is refused at start.
    drop(sm);
    std::fs::write(&path, {
        let mut b = good.clone();
        b[..format::SNAPSHOT_MAGIC_LEN].copy_from_slice(b"RAFTQSNAP9\n");
        b
    })
    .expect("write");
    assert_newer(super::open_data_dir(tmp.path(), 1).err().expect("refused at start"), "9", "4");
}

/// Every stored value of a data directory, by (file, table, key): what a release reads, whatever the file bytes.
fn contents(dir: &Path) -> std::collections::BTreeMap<(String, String, Vec<u8>), Vec<u8>> {
    use super::tables::*;
    use redb::{ReadableDatabase, ReadableTable};
    let mut out = std::collections::BTreeMap::new();
    let mut files = vec![files::log_path(dir)];
    files.extend((0..).map(|i| files::shard_path(&files::sm_dir(dir), i)).take_while(|p| p.exists()));
    for path in files {
        let name = path.file_name().expect("name").to_string_lossy().to_string();
        let db = redb::ReadOnlyDatabase::open(&path).expect("open");
        let txn = db.begin_read().expect("read");
        let mut put = |table: &str, k: Vec<u8>, v: &[u8]| out.insert((name.clone(), table.to_string(), k), v.to_vec());
        if path == files::log_path(dir) {
            for item in txn.open_table(LOG).expect("log").iter().expect("iter") {
                let (k, v) = item.expect("item");
                put("log", k.value().to_be_bytes().to_vec(), v.value());
            }
        } else {
            for def in [TASKS, IDEMPOTENCY_KEYS, WEBHOOK_OUTBOX, SHARD_RECORDS] {
                for item in txn.open_table(def).expect("table").iter().expect("iter") {
                    let (k, v) = item.expect("item");
                    put(&def.to_string(), k.value().to_vec(), v.value());
                }
            }
        }
        let meta = if path == files::log_path(dir) { LOG_META } else { SHARD_META };
        for item in txn.open_table(meta).expect("meta").iter().expect("iter") {
            let (k, v) = item.expect("item");
            put("meta", k.value().as_bytes().to_vec(), v.value());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_before_the_switch_gives_back_the_v0_values_and_after_it_is_refused() {
    let tmp = copy_v0();
    let dir = tmp.path();
    let v0 = contents(dir);
    let v0_meta = std::fs::read(files::current_meta_path(dir)).expect("current snapshot meta");
    drop(super::open_data_dir(dir, 1).expect("upgrade to v1"));
    assert_ne!(contents(dir), v0, "upgraded");

    // Before the switch: every value is the v0 one again, markers and all, and the directory reads as v0.
    let done = super::downgrade::downgrade_data_dir(dir).expect("downgrade").expect("was v1");
    assert_eq!(done.files, 2, "the log and the one shard");
    assert_eq!(contents(dir), v0, "value for value what the previous release wrote");
    assert_eq!(std::fs::read(files::current_meta_path(dir)).expect("meta"), v0_meta);
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::V0));
    assert_eq!(super::downgrade::downgrade_data_dir(dir).expect("again"), None, "already v0: nothing to do");

    // Upgraded again, the node runs on with its state; then it applies this release's switch (a member of a
    // release of v1 records applies up to 3).
    {
        let (_log, mut sm) = super::open_data_dir(dir, 1).expect("upgrade again");
        assert_fixture_state(&sm, true);
        set_cluster_version(&mut sm, 100, 4).await;
    }
    let before = all_bytes(dir);
    let msg = super::downgrade::downgrade_data_dir(dir).expect_err("after the switch").to_string();
    assert!(msg.contains("applied cluster version 4") && msg.contains("nothing was changed"), "{msg}");
    assert_unchanged(dir, &before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_is_refused_while_the_log_holds_the_switch_unapplied() {
    let tmp = copy_v0();
    let dir = tmp.path();
    {
        let (mut log, _sm) = super::open_data_dir(dir, 1).expect("upgrade to v1");
        append(&mut log, &[entry(10, 1_100, Command::SetClusterVersion { version: 1 })]).await;
    }
    let before = all_bytes(dir);
    let msg = super::downgrade::downgrade_data_dir(dir).expect_err("logged switch").to_string();
    assert!(msg.contains("at index 10") && msg.contains("cluster version 1"), "{msg}");
    assert_unchanged(dir, &before);
}

/// A node upgraded from a release of v1 records (cluster versions 1 to 3) goes back to it before this release's
/// switch: v2 records decoded and written as v1, v1 records left as they were, the files' markers and the
/// directory's back to what that release wrote. Once the log holds the switch to 4, it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_at_cluster_version_3_gives_back_v1_files() {
    use super::tables::*;
    let tmp = copy_v1();
    let dir = tmp.path();
    let v1_meta = std::fs::read(files::current_meta_path(dir)).expect("current snapshot meta");
    {
        let (mut log, mut sm) = super::open_data_dir(dir, 1).expect("upgrade");
        set_cluster_version(&mut sm, 10, 3).await;
        let cancel = Command::Cancel { tenant: "t".into(), task_id: task_id(5) };
        apply(&mut log, &mut sm, vec![entry(11, 1_011, cancel)]).await;
        sm.shared.digest().expect("digest writes every layer");
    }
    let versions = |dir: &Path| record_versions(dir, TASKS).into_iter().map(|(_, v)| v).collect::<Vec<_>>();
    assert!(versions(dir).contains(&format::V2), "task 5 was written in v2");
    let digest = super::backup::data_dir_digest(dir).expect("digest");

    let done = super::downgrade::downgrade_data_dir(dir).expect("downgrade").expect("was v2");
    assert_eq!((done.to, done.files), (format::V1, 2));
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::DIR_V2));
    for (path, meta) in [(files::log_path(dir), LOG_META), (files::shard_path(&files::sm_dir(dir), 0), SHARD_META)] {
        let db = redb::ReadOnlyDatabase::open(&path).expect("open");
        assert_eq!(format::file_version(&db, meta, &path).expect("marker"), Some(format::V1), "{}", path.display());
    }
    // Every value as a v1 build reads it: the version byte 1, then fixed-width bincode.
    for ((file, table, key), v) in contents(dir) {
        if key == META_FORMAT.as_bytes() {
            continue;
        }
        assert_eq!(v.first(), Some(&format::V1), "{file} {table} {key:?}");
    }
    let task5 = &contents(dir)[&("shard-0.redb".to_string(), TASKS.to_string(), task_id(5).0.to_vec())];
    let t: Task = bincode::deserialize(&task5[1..]).expect("a v1 task record");
    assert_eq!(t.state, TaskState::Cancelled);
    assert_eq!(std::fs::read(files::current_meta_path(dir)).expect("meta"), v1_meta, "as the v1 build wrote it");
    assert_eq!(super::backup::data_dir_digest(dir).expect("digest"), digest, "the same state");
    assert_eq!(super::downgrade::downgrade_data_dir(dir).expect("again"), None, "already v1: nothing to do");

    // This build opens it again; once its log holds the switch to 4, there is no way back.
    {
        let (mut log, sm) = super::open_data_dir(dir, 1).expect("upgrade again");
        assert_eq!(task(&sm, 5).state, TaskState::Cancelled);
        append(&mut log, &[entry(12, 1_100, Command::SetClusterVersion { version: 4 })]).await;
    }
    let before = all_bytes(dir);
    let msg = super::downgrade::downgrade_data_dir(dir).expect_err("logged switch").to_string();
    assert!(msg.contains("at index 12") && msg.contains("cluster version 4"), "{msg}");
    assert_unchanged(dir, &before);
}

/// A node killed between checkpoints left writes in its log's journal that only its next start puts into the
/// log file: a downgrade then would lose them, so it is refused, reading only; after one start and a clean stop
/// it goes through and removes the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_is_refused_while_the_journal_holds_writes_of_a_killed_node() {
    let tmp = copy_v0();
    let dir = tmp.path();
    let journal = super::files::journal_path(&files::log_path(dir));
    {
        let (log, _sm) = super::open_data_dir(dir, 1).expect("upgrade");
        let mut log2 = log.clone();
        log2.save_committed(Some(log_id(9))).await.expect("committed");
        drop(log2);
        log.close_as_crashed();
    }
    assert!(journal.exists());
    let before = all_bytes(dir);
    let msg = super::downgrade::downgrade_data_dir(dir).expect_err("a journal to replay").to_string();
    assert!(msg.contains("did not stop cleanly") && msg.contains("nothing was changed"), "{msg}");
    assert_unchanged(dir, &before);
    drop(super::open_data_dir(dir, 1).expect("one start"));
    super::downgrade::downgrade_data_dir(dir).expect("downgrade").expect("was v2");
    assert!(!journal.exists(), "the downgrade removes the journal");
    assert_eq!(format::data_dir_version(dir).expect("version"), Some(format::V0));
}
