//! openraft's storage suite against the redb log store and state machine, and snapshot round trips.

use std::collections::BTreeMap;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{RaftSnapshotBuilder, StorageError};

use super::{LogStore, StateMachine};
use crate::queue::*;
use crate::raft::types::{Entry, LogId, TypeConfig};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("raft-log.redb")).expect("open log");
        let sm = StateMachine::open(dir.path(), 4).expect("open state machine");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() {
    Suite::test_all(Builder).await.expect("openraft storage suite");
}

fn log_id(term: u64, index: u64) -> LogId {
    openraft::LogId::new(openraft::impls::leader_id_adv::LeaderId { term, node_id: 1 }, index)
}

fn entry(index: u64, req: Request) -> Entry {
    Entry { log_id: log_id(1, index), payload: openraft::EntryPayload::Normal(req) }
}

fn new_task(i: u64, key: Option<&str>) -> NewTask {
    NewTask {
        id: TaskId::new(1_000, i as u16, i),
        tenant: "t".into(),
        queue: "q".into(),
        payload: vec![i as u8; 10].into(),
        priority: (i % 10) as u8,
        visible_at: if i.is_multiple_of(3) { 5_000 } else { 0 },
        max_attempts: 3,
        idempotency_key: key.map(String::from),
        idempotency_window_ms: 60_000,
        webhook_url: i.is_multiple_of(5).then(|| format!("http://127.0.0.1:1/hook/{i}")),
        traceparent: None,
        tracestate: None,
        retry: RetryPolicy { base_ms: 100, max_ms: 1_000, exponential: true },
        retention_ms: 1_000_000,
        deadline: None,
        concurrency: None,
        parent: None,
        depends_on: vec![],
        dependency_rule: DependencyRule::AllCompleted,
    }
}

async fn apply(sm: &mut StateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.expect("apply");
}

/// All records of a state machine, by id.
fn dump(sm: &StateMachine) -> BTreeMap<TaskId, Task> {
    let ids: Vec<TaskId> = (0..40u64).map(|i| TaskId::new(1_000, i as u16, i)).collect();
    ids.iter().filter_map(|id| sm.shared.get_task(id).expect("read").map(|t| (*id, t))).collect()
}

fn cancel(i: u64) -> Command {
    Command::Cancel { tenant: "t".into(), task_id: TaskId::new(1_000, i as u16, i) }
}

async fn populated(dir: &std::path::Path, shards: usize) -> StateMachine {
    let mut sm = StateMachine::open(dir, shards).expect("open");
    let items: Vec<NewTask> = (0..40).map(|i| new_task(i, if i % 4 == 0 { Some("k") } else { None })).collect();
    let claim: Vec<ClaimItem> = (1..6)
        .map(|i| ClaimItem {
            task_id: TaskId::new(1_000, i, i as u64),
            tenant: "t".into(),
            worker_id: "w".into(),
            lease_ms: 500,
        })
        .collect();
    apply(
        &mut sm,
        vec![
            entry(1, Request::new(1_000, 1, Command::Enqueue(items))),
            entry(2, Request::new(1_001, 2, Command::Claim(claim))),
            entry(3, Request::new(1_200, 3, Command::Tick)),
            // Ends two tasks with a webhook URL: their deliveries wait in the outbox.
            entry(4, Request::new(1_300, 4, cancel(10))),
            entry(5, Request::new(1_300, 5, cancel(25))),
            entry(
                6,
                Request::new(
                    1_300,
                    6,
                    Command::SetQueuePaused { tenant: "t".into(), queue: "paused".into(), paused: true },
                ),
            ),
            entry(
                7,
                Request::new(
                    1_300,
                    7,
                    Command::CreateSchedule(Box::new(Schedule {
                        id: TaskId::new(1_200, 5, 5),
                        tenant: "t".into(),
                        name: "s".into(),
                        spec: ScheduleSpec::Interval { every_ms: 1_000 },
                        missed: MissedPolicy::Skip,
                        paused: false,
                        created_at: 0,
                        last_occurrence: None,
                        fired: 0,
                        template: new_task(99, None),
                    })),
                ),
            ),
        ],
    )
    .await;
    sm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_build_and_install_round_trips_the_state_exactly() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 4).await;
    let before = dump(&leader);
    assert!(before.len() > 20);
    assert!(before.values().any(|t| t.state == TaskState::InProgress));

    let snap = leader.get_snapshot_builder().await.build_snapshot().await.expect("build");
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 7)));
    let none_due = Default::default();
    let outbox = leader.shared.due_deliveries(u64::MAX, 100, &none_due).expect("outbox");
    assert_eq!(outbox.len(), 2, "{outbox:?}");

    // A follower with a different shard count installs it and holds the same records and time.
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(dump(&follower), before);
    assert_eq!(follower.applied_state().await.expect("applied").0, Some(log_id(1, 7)));
    assert_eq!(follower.shared.due_deliveries(u64::MAX, 100, &none_due).expect("outbox"), outbox);
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    assert_eq!(follower.shared.now(), leader.shared.now());
    follower.shared.check_indexes().expect("indexes agree with records");
    assert!(follower.shared.is_paused("t", "paused"), "paused queues travel in the snapshot");
    let schedules = follower.shared.schedules(Some("t"));
    assert_eq!(schedules.len(), 1, "schedules travel in the snapshot");
    assert_eq!(schedules[0].id, TaskId::new(1_200, 5, 5));
    assert_eq!(follower.shared.paused_queues("t"), vec!["paused".to_string()]);
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    let queues = vec!["q".to_string()];
    let none = Default::default();
    let pick = |sm: &StateMachine| sm.shared.pick_ready(&mut Default::default(), "t", &queues, 50, &none, None);
    assert_eq!(pick(&follower), pick(&leader));

    // The installed state survives a reopen, and the snapshot is kept as the follower's current one.
    let cur = follower.get_current_snapshot().await.expect("current").expect("some");
    assert_eq!(cur.meta.last_log_id, Some(log_id(1, 7)));
    drop(follower);
    let reopened = StateMachine::open(b.path(), 3).expect("reopen");
    assert_eq!(dump(&reopened), before);
    assert_eq!(reopened.shared.due_deliveries(u64::MAX, 100, &none_due).expect("outbox"), outbox);
    assert!(reopened.shared.is_paused("t", "paused"), "and survive a reopen");
    reopened.shared.check_indexes().expect("indexes agree with records");
}

/// Taking a snapshot's point writes nothing and waits for no flush: apply stops only to freeze the layers. The
/// snapshot holds the changes applied before the point (some in the files, some only in memory) and none after,
/// and the shard files hold the point once the snapshot is built (openraft may then purge the log up to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_point_is_taken_without_a_flush_and_the_files_hold_it_once_built() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 4).await;
    // Part of the state in the files, part only in memory.
    leader.shared.flush(false).expect("flush");
    apply(&mut leader, vec![entry(8, Request::new(1_400, 8, cancel(30)))]).await;
    let at_point = dump(&leader);
    assert_eq!(at_point[&TaskId::new(1_000, 30, 30)].state, TaskState::Cancelled);

    // A flush in progress holds the flush lock: the point is taken all the same, and apply goes on.
    let shared = leader.shared.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let flush = std::thread::spawn(move || {
        let _held = shared.flush_lock.lock().expect("flush lock");
        locked_tx.send(()).expect("send");
        let _ = release_rx.recv();
    });
    locked_rx.recv().expect("the lock is held");
    let mut builder = tokio::time::timeout(std::time::Duration::from_secs(5), leader.get_snapshot_builder())
        .await
        .expect("the point is taken while a flush runs");
    apply(&mut leader, vec![entry(9, Request::new(1_500, 9, cancel(31)))]).await;
    drop(release_tx);
    flush.join().expect("the holder");
    let snap = builder.build_snapshot().await.expect("build");
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 8)));
    {
        let g = leader.shared.read();
        for db in &g.dbs {
            let meta = super::shard::read_meta(db).expect("meta");
            assert!(meta.last_applied.is_some_and(|l| l.index >= 8), "the files hold the point: {meta:?}");
        }
    }

    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(dump(&follower), at_point, "the snapshot holds the state at its point, no later change");
    follower.shared.check_indexes().expect("indexes agree with records");
    assert_eq!(dump(&leader)[&TaskId::new(1_000, 31, 31)].state, TaskState::Cancelled);
}

/// Random entries over tasks `0..*made` (making new ones): enqueues, claims, cancels and ticks, at times that go on
/// from `*index`.
fn random_entries(rng: &mut rand::rngs::StdRng, index: &mut u64, made: &mut u64, n: usize) -> Vec<Entry> {
    use rand::Rng;
    let id = |i: u64| TaskId::new(1_000, i as u16, i);
    (0..n)
        .map(|_| {
            *index += 1;
            let cmd = match rng.random_range(0..4) {
                0 | 1 if *made < 5 || rng.random_bool(0.5) => {
                    let k = rng.random_range(1..6);
                    let tasks = (*made..*made + k).map(|i| new_task(i, None)).collect();
                    *made += k;
                    Command::Enqueue(tasks)
                }
                0 | 1 => Command::Claim(
                    (0..rng.random_range(1..4))
                        .map(|_| ClaimItem {
                            task_id: id(rng.random_range(0..*made)),
                            tenant: "t".into(),
                            worker_id: "w".into(),
                            lease_ms: 500,
                        })
                        .collect(),
                ),
                2 => cancel(rng.random_range(0..*made)),
                _ => Command::Tick,
            };
            entry(*index, Request::new(1_000 + *index * 10, *index, cmd))
        })
        .collect()
}

/// Snapshots (and backups) taken at random points, amid flushes (some running while the point is taken and the
/// snapshot is written) and further applies, hold exactly the state at their point: a follower that installs one
/// has the digest of a state machine that applied the same entries, never snapshotted, at that point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_backups_taken_amid_flushes_and_applies_hold_exactly_the_state_at_their_point() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (a, r) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let mut leader = StateMachine::open(a.path(), 4).expect("open");
    let mut reference = StateMachine::open(r.path(), 2).expect("open");
    let (mut index, mut made) = (0u64, 0u64);
    for round in 0..8 {
        for step in 0..2 {
            let n = rng.random_range(1..12);
            let es = random_entries(&mut rng, &mut index, &mut made, n);
            apply(&mut leader, es.clone()).await;
            apply(&mut reference, es).await;
            if step == 0 && rng.random_bool(0.5) {
                leader.shared.flush(false).expect("flush");
            }
        }
        let point = index;
        let expected = reference.shared.digest().expect("digest");
        let flusher = rng.random_bool(0.5).then(|| {
            let shared = leader.shared.clone();
            std::thread::spawn(move || (0..3).for_each(|_| shared.flush(false).expect("flush")))
        });
        let mut builder = leader.get_snapshot_builder().await;
        let backup = leader.shared.backup_source().expect("backup point");
        let n = rng.random_range(1..12);
        let es = random_entries(&mut rng, &mut index, &mut made, n);
        apply(&mut leader, es.clone()).await;
        apply(&mut reference, es).await;
        let snap = builder.build_snapshot().await.expect("build");
        if let Some(f) = flusher {
            f.join().expect("flusher");
        }
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(point), "round {round}");
        // A backup's point is taken the same way.
        let trailer = backup.write(1, 0, Vec::new(), &mut |_| {}).expect("backup");
        assert_eq!((trailer.state_digest, trailer.tasks), (expected.1, expected.2), "round {round}: the backup");

        let f = tempfile::tempdir().expect("dir");
        let mut follower = StateMachine::open(f.path(), 3).expect("open");
        follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
        assert_eq!(follower.shared.digest().expect("digest"), expected, "round {round}: {made} tasks");
        follower.shared.check_indexes().expect("indexes agree with records");
    }
    assert_eq!(leader.shared.digest().expect("digest"), reference.shared.digest().expect("digest"));
}

/// A snapshot whose point was taken before a newer snapshot was installed is built, but does not replace the
/// installed one as the snapshot the node sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_finished_after_an_install_does_not_replace_the_installed_one() {
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let mut leader = populated(a.path(), 4).await;
    let mut follower = populated(b.path(), 3).await;
    let mut older = follower.get_snapshot_builder().await;
    apply(&mut leader, vec![entry(8, Request::new(1_400, 8, cancel(30)))]).await;
    let newer = leader.get_snapshot_builder().await.build_snapshot().await.expect("build");
    follower.install_snapshot(&newer.meta, newer.snapshot).await.expect("install");
    let built = older.build_snapshot().await.expect("build");
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 7)));
    let cur = follower.get_current_snapshot().await.expect("current").expect("some");
    assert_eq!(cur.meta.last_log_id, Some(log_id(1, 8)), "the installed snapshot stays current");
    assert_eq!(dump(&follower), dump(&leader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_refused_and_leaves_the_state_as_it_was() {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    let snap = leader.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let mut file = snap.snapshot;
    file.seek(std::io::SeekFrom::Start(0)).await.expect("seek");
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).await.expect("read");

    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 2).expect("open");
    let damaged_dir = tempfile::tempdir().expect("dir");
    let mut reasons = std::collections::BTreeSet::new();
    // One flipped bit anywhere, from the header to the digest, and the install is refused.
    for pos in (11..bytes.len()).step_by((bytes.len() / 60).max(1)).chain([bytes.len() - 1]) {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x10;
        let path = damaged_dir.path().join(format!("bad-{pos}.snap"));
        std::fs::write(&path, &bad).expect("write");
        let f = tokio::fs::File::open(&path).await.expect("open");
        let e = follower.install_snapshot(&snap.meta, f).await.expect_err(&format!("byte {pos} flipped"));
        reasons.insert(e.to_string());
        assert!(dump(&follower).is_empty(), "nothing of a damaged snapshot is installed");
        assert_eq!(follower.applied_state().await.expect("applied").0, None);
    }
    assert!(reasons.iter().any(|r| r.contains("checksum")), "some damage only the digest catches: {reasons:?}");
    // The undamaged file installs.
    let path = damaged_dir.path().join("good.snap");
    std::fs::write(&path, &bytes).expect("write");
    follower.install_snapshot(&snap.meta, tokio::fs::File::open(&path).await.expect("open")).await.expect("install");
    assert_eq!(dump(&follower), dump(&leader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_install_leaves_the_old_state() {
    let a = tempfile::tempdir().expect("dir");
    let sm = populated(a.path(), 2).await;
    let before = dump(&sm);
    drop(sm);
    // A crash mid-install leaves an incomplete sm.new behind: it is discarded at open.
    std::fs::create_dir_all(a.path().join("sm.new")).expect("mkdir");
    std::fs::write(a.path().join("sm.new").join("shard-0.redb"), b"partial").expect("write");
    let sm = StateMachine::open(a.path(), 2).expect("reopen");
    assert_eq!(dump(&sm), before);
    assert!(!a.path().join("sm.new").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_store_reopens_with_entries_vote_and_purge() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("raft-log.redb");
    {
        let mut log = LogStore::open(&path).expect("open");
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, Request::new(i, 0, Command::Tick))).collect();
        let (tx, rx) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
        log.append(entries, openraft::storage::IOFlushed::signal(tx)).await.expect("append");
        rx.await.expect("flushed").expect("flush ok");
        let vote = openraft::impls::Vote::new(7, 1);
        log.save_vote(&vote).await.expect("vote");
        log.purge(log_id(1, 3)).await.expect("purge");
        log.truncate_after(Some(log_id(1, 8))).await.expect("truncate");
        // One more durable write so the purge and truncate above are on disk.
        log.save_vote(&vote).await.expect("vote");
    }
    let mut log = LogStore::open(&path).expect("reopen");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(1, 8)));
    use openraft::RaftLogReader;
    let got = log.try_get_log_entries(0..100).await.expect("read");
    assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![4, 5, 6, 7, 8]);
    assert_eq!(log.read_vote().await.expect("vote"), Some(openraft::impls::Vote::new(7, 1)));
}

/// Appends `entries` and waits until the writer reports them durable.
async fn append_synced(log: &LogStore, entries: Vec<Entry>) {
    let mut log = log.clone();
    let (tx, rx) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
    log.append(entries, openraft::storage::IOFlushed::signal(tx)).await.expect("append");
    rx.await.expect("flushed").expect("flush ok");
}

/// A node killed between checkpoints: the log file has only what its last synced commit wrote (here, as it was
/// at open), and the journal holds every turn since, synced or not. The reopen replays them in order: appends,
/// a truncation and the entries of a new term over it, a purge, the committed id; a torn record after them is
/// ignored. Then the next crash finds the replayed writes in the log file itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_checkpoints_is_replayed_from_the_journal() {
    use openraft::RaftLogReader;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("raft-log.redb");
    let hour = std::time::Duration::from_secs(3600);
    let tick = |i: u64| Request::new(i, i, Command::Tick);
    let term2 = |i: u64| Entry { log_id: log_id(2, i), payload: openraft::EntryPayload::Normal(tick(i)) };
    let want: Vec<(u64, u64)> = (4..=7).map(|i| (1, i)).chain((8..=10).map(|i| (2, i))).collect();
    let indexes = |v: &[Entry]| v.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect::<Vec<_>>();
    let at_open = {
        let mut log = LogStore::open_checkpointing(&path, hour).expect("open");
        let at_open = std::fs::read(&path).expect("the log file as its open left it");
        append_synced(&log, (1..=9).map(|i| entry(i, tick(i))).collect()).await;
        log.truncate_after(Some(log_id(1, 7))).await.expect("truncate");
        append_synced(&log, vec![term2(8), term2(9)]).await;
        log.purge(log_id(1, 3)).await.expect("purge");
        log.save_committed(Some(log_id(2, 9))).await.expect("committed");
        append_synced(&log, vec![term2(10)]).await;
        assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want);
        log.close_as_crashed();
        at_open
    };
    // The crash: redb's unsynced commits are lost (the file as the open left it), and a torn record follows.
    std::fs::write(&path, &at_open).expect("restore the synced log file");
    let journal = super::files::journal_path(&path);
    // The file ends with the last record (one generation was written, from the start of a new file).
    let mut bytes = std::fs::read(&journal).expect("journal");
    bytes.extend_from_slice(&[7u8; 40]);
    std::fs::write(&journal, &bytes).expect("torn tail");
    let check = |mut log: LogStore| {
        let want = want.clone();
        async move {
            assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want);
            let state = log.get_log_state().await.expect("state");
            assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(1, 3)), Some(log_id(2, 10))));
            assert_eq!(log.read_committed().await.expect("committed"), Some(log_id(2, 9)));
            log
        }
    };
    let log = check(LogStore::open_checkpointing(&path, hour).expect("reopen")).await;
    // The replay was checkpointed at open: a second crash with the journal gone loses nothing.
    log.close_as_crashed();
    std::fs::remove_file(&journal).expect("remove the journal");
    check(LogStore::open_checkpointing(&path, hour).expect("reopen again")).await;
}

/// Between checkpoints the log file gets nothing: the tail keeps every entry since the last one, past its size,
/// and serves them. A checkpoint (here, each vote) writes them all, after which the oldest leave the tail and are
/// read back from the file, also across a truncation whose new entries replaced ones the file held; a crash after
/// the last checkpoint loses nothing (the journal has the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_wait_in_the_tail_for_the_next_checkpoint_and_are_read_from_the_file_after_it() {
    use openraft::RaftLogReader;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("raft-log.redb");
    let hour = std::time::Duration::from_secs(3600);
    let total = super::log_store::CACHE_ENTRIES as u64 + 5_000;
    let tick = |i: u64| Request::new(i, i, Command::Tick);
    let term = |t: u64, i: u64| Entry { log_id: log_id(t, i), payload: openraft::EntryPayload::Normal(tick(i)) };
    let indexes = |v: &[Entry]| v.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect::<Vec<_>>();
    let file_bytes = |p: &std::path::Path| std::fs::read(p).expect("log file");
    let mut log = LogStore::open_checkpointing(&path, hour).expect("open");
    let empty = file_bytes(&path);
    for chunk in (1..=total).collect::<Vec<_>>().chunks(1000) {
        append_synced(&log, chunk.iter().map(|i| term(1, *i)).collect()).await;
    }
    assert!(file_bytes(&path) == empty, "no checkpoint yet: the log file was not written");
    let want: Vec<(u64, u64)> = (1..=total).map(|i| (1, i)).collect();
    assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want, "all served by the tail");
    log.save_vote(&openraft::impls::Vote::new(1, 1)).await.expect("vote: a checkpoint");
    assert!(file_bytes(&path) != empty, "the checkpoint wrote the entries");
    // A conflict: the last 5,000 entries are replaced by a new term's, which the next checkpoint writes over the
    // ones the file holds.
    log.truncate_after(Some(log_id(1, total - 5_000))).await.expect("truncate");
    append_synced(&log, (total - 4_999..=total).map(|i| term(2, i)).collect()).await;
    log.save_vote(&openraft::impls::Vote::new(2, 1)).await.expect("vote: a checkpoint");
    // More entries than the tail holds since, so the oldest have left it: they come from the file.
    for chunk in (total + 1..=total + 100).collect::<Vec<_>>().chunks(50) {
        append_synced(&log, chunk.iter().map(|i| term(2, *i)).collect()).await;
    }
    let want: Vec<(u64, u64)> =
        (1..=total - 5_000).map(|i| (1, i)).chain((total - 4_999..=total + 100).map(|i| (2, i))).collect();
    let all = log.try_get_log_entries(..).await.expect("read");
    assert_eq!(indexes(&all), want);
    assert!(all.iter().all(|e| e.payload == openraft::EntryPayload::Normal(tick(e.log_id.index))));
    // Killed after the last checkpoint: the last 100 entries are only in the journal.
    log.close_as_crashed();
    let mut log = LogStore::open_checkpointing(&path, hour).expect("reopen");
    assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want);
    assert_eq!(log.get_log_state().await.expect("state").last_log_id, Some(log_id(2, total + 100)));
}

/// The tail is bounded by its entries' bytes, not only their count: entries of large payloads leave it once a
/// checkpoint has written them and are read back from the file whole; a truncation and a purge
/// keep its byte count in step with what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_tail_holds_at_most_its_byte_bound_of_written_entries() {
    use openraft::RaftLogReader;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("raft-log.redb");
    let hour = std::time::Duration::from_secs(3600);
    let big = |i: u64| {
        let mut t = new_task(i, None);
        t.payload = vec![i as u8; 1 << 20].into();
        entry(i, Request::new(1_000 + i, i, Command::Enqueue(vec![t])))
    };
    let total = (super::log_store::CACHE_BYTES >> 20) as u64 + 40;
    let mut log = LogStore::open_checkpointing(&path, hour).expect("open");
    for chunk in (1..=total).collect::<Vec<_>>().chunks(8) {
        append_synced(&log, chunk.iter().map(|i| big(*i)).collect()).await;
    }
    // Journaling 8 MiB makes a checkpoint too; a vote makes one now.
    log.save_vote(&openraft::impls::Vote::new(1, 1)).await.expect("vote: a checkpoint");
    let (n, bytes) = log.cached();
    assert!(bytes <= super::log_store::CACHE_BYTES && (n as u64) < total, "{n} entries, {bytes} bytes held");
    assert!(n > 0, "the newest entries stay");
    let all = log.try_get_log_entries(..).await.expect("read");
    assert_eq!(all.len() as u64, total);
    assert!(all.iter().zip(1..).all(|(e, i)| *e == big(i)), "every entry reads back whole, from the file or the tail");
    // A truncation and a purge take their entries' bytes with them.
    log.truncate_after(Some(log_id(1, total - 2))).await.expect("truncate");
    let (n2, bytes2) = log.cached();
    assert_eq!(n2, n - 2);
    assert!(bytes2 < bytes && bytes2 > 0);
    log.purge(log_id(1, total - 3)).await.expect("purge");
    let (n3, bytes3) = log.cached();
    assert_eq!(n3, 1);
    assert!((1 << 20..(1 << 20) + 4096).contains(&bytes3), "one entry of ~1 MiB is left: {bytes3} bytes");
}

/// Entries past the in-memory tail are read back from the file; a truncation inside the tail and the entries
/// appended over it (a new term) read back the same before and after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_reads_span_the_file_and_the_cached_tail_across_truncation_and_reopen() {
    use openraft::RaftLogReader;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("raft-log.redb");
    let total = super::log_store::CACHE_ENTRIES as u64 + 5_000;
    let tick = |i: u64| Request::new(i, i, Command::Tick);
    let indexes = |v: &[Entry]| v.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect::<Vec<_>>();
    let want: Vec<(u64, u64)> = (1..=total - 10).map(|i| (1, i)).chain((total - 9..=total).map(|i| (2, i))).collect();
    {
        let mut log = LogStore::open(&path).expect("open");
        for chunk in (1..=total).collect::<Vec<_>>().chunks(1000) {
            append_synced(&log, chunk.iter().map(|i| entry(*i, tick(*i))).collect()).await;
        }
        // Written at a checkpoint (every 100 ms), the oldest entries leave the cache; before, the cache holds them.
        let all = log.try_get_log_entries(1..=total).await.expect("read all");
        assert_eq!(all.len() as u64, total);
        assert!(all
            .iter()
            .zip(1..)
            .all(|(e, i)| e.log_id.index == i && e.payload == openraft::EntryPayload::Normal(tick(i))));
        // A conflict in the tail: the last 10 entries are replaced by a new term's.
        log.truncate_after(Some(log_id(1, total - 10))).await.expect("truncate");
        assert_eq!(log.try_get_log_entries(total - 12..).await.expect("read").len(), 3, "nothing past the truncation");
        let new: Vec<Entry> = (total - 9..=total)
            .map(|i| Entry { log_id: log_id(2, i), payload: openraft::EntryPayload::Normal(tick(i)) })
            .collect();
        append_synced(&log, new).await;
        assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want);
        assert_eq!(log.get_log_state().await.expect("state").last_log_id, Some(log_id(2, total)));
    }
    let mut log = LogStore::open(&path).expect("reopen");
    assert_eq!(indexes(&log.try_get_log_entries(..).await.expect("read")), want);
    assert_eq!(log.get_log_state().await.expect("state").last_log_id, Some(log_id(2, total)));
}

/// Reads see applied changes before the flusher writes them (from the layers) and after (from the files), the
/// same; a reopen after the state machine is dropped finds them in the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_unflushed_changes_and_a_reopen_finds_them_written() {
    let dir = tempfile::tempdir().expect("dir");
    let mut sm = populated(dir.path(), 3).await;
    sm.shared.digest().expect("digest writes every layer");
    // More changes, read at once: still in memory (the flusher runs every 200 ms).
    let more: Vec<NewTask> = (40..60).map(|i| new_task(i, None)).collect();
    apply(
        &mut sm,
        vec![
            entry(8, Request::new(1_400, 8, Command::Enqueue(more))),
            entry(9, Request::new(1_400, 9, cancel(7))),
            entry(
                10,
                Request {
                    time_ms: 1_400,
                    seed: 10,
                    command: Command::PurgeDeadLetters {
                        tenant: "t".into(),
                        queue: "q".into(),
                        select: DlqSelector::All,
                    }
                    .into(),
                },
            ),
        ],
    )
    .await;
    let filter = TaskFilter::default();
    let listed = |sm: &StateMachine| {
        let (tasks, more) = sm.shared.list_tasks("t", &filter, None, 1_000).expect("list");
        assert!(!more);
        tasks
    };
    let before = listed(&sm);
    // 60 enqueued, less the 7 that repeated an idempotency key already taken in their shard (see `populated`).
    assert_eq!(before.len(), 53);
    assert_eq!(before.iter().find(|t| t.id == TaskId::new(1_000, 7, 7)).map(|t| t.state), Some(TaskState::Cancelled));
    assert!(before.windows(2).all(|w| w[0].id < w[1].id), "in id order");
    let paged: Vec<TaskId> = {
        let (first, more) = sm.shared.list_tasks("t", &filter, None, 25).expect("page 1");
        assert!(more);
        let (second, _) = sm.shared.list_tasks("t", &filter, first.last().map(|t| t.id), 1_000).expect("page 2");
        first.iter().chain(&second).map(|t| t.id).collect()
    };
    assert_eq!(paged, before.iter().map(|t| t.id).collect::<Vec<_>>(), "pages join without gap or repeat");
    let (applied, digest, tasks) = sm.shared.digest().expect("digest");
    assert_eq!(listed(&sm), before, "the same once written");
    assert_eq!(tasks, 53);
    drop(sm);
    let sm = StateMachine::open(dir.path(), 3).expect("reopen");
    assert_eq!(listed(&sm), before);
    assert_eq!(sm.shared.digest().expect("digest"), (applied, digest, tasks));
}

/// An enqueue whose id is taken changes nothing, whether the task is in the layers or only in the files (after a
/// reopen), and an id below the newest stored one that is free is taken: the shard's bound on its ids
/// (`shard::CachedStore`) only ever skips looking for ids above every stored one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_task_id_is_refused_from_the_layers_and_from_the_files_after_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let mut sm = StateMachine::open(dir.path(), 3).expect("open");
    let task = |time: u64, i: u64, byte: u8| NewTask {
        id: TaskId::new(time, i as u16, i),
        payload: vec![byte; 4].into(),
        visible_at: 0,
        idempotency_key: None,
        webhook_url: None,
        ..new_task(i, None)
    };
    let first: Vec<NewTask> = (0..6).map(|i| task(2_000, i, 1)).collect();
    apply(&mut sm, vec![entry(1, Request::new(2_000, 1, Command::Enqueue(first)))]).await;
    let cancel_0 = Command::Cancel { tenant: "t".into(), task_id: TaskId::new(2_000, 0, 0) };
    apply(&mut sm, vec![entry(2, Request::new(2_001, 2, cancel_0))]).await;
    let check = |sm: &StateMachine, label: &str| {
        for i in 0..6u64 {
            let t = sm.shared.get_task(&TaskId::new(2_000, i as u16, i)).expect("read").expect(label);
            assert_eq!(t.payload, vec![1; 4], "{label}: task {i} kept its payload");
            let state = if i == 0 { TaskState::Cancelled } else { TaskState::Pending };
            assert_eq!(t.state, state, "{label}: task {i} kept its state");
        }
    };
    // Taken ids, the tasks still in the layers.
    let again: Vec<NewTask> = (0..6).map(|i| task(2_000, i, 2)).collect();
    apply(&mut sm, vec![entry(3, Request::new(2_002, 3, Command::Enqueue(again.clone())))]).await;
    check(&sm, "in the layers");
    sm.shared.digest().expect("digest writes every layer");
    drop(sm);
    // Taken ids, the tasks only in the files; and a free id older than the newest stored one.
    let mut sm = StateMachine::open(dir.path(), 3).expect("reopen");
    let older = task(1_500, 9, 3);
    let mut batch = again;
    batch.push(older.clone());
    apply(&mut sm, vec![entry(4, Request::new(2_003, 4, Command::Enqueue(batch)))]).await;
    check(&sm, "in the files");
    let t = sm.shared.get_task(&older.id).expect("read").expect("the free older id is taken");
    assert_eq!((t.payload.to_vec(), t.state), (vec![3; 4], TaskState::Pending));
}

/// The snapshot file of a built snapshot, whole.
async fn snapshot_bytes(sm: &mut StateMachine) -> (crate::raft::types::Snapshot, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let mut bytes = Vec::new();
    snap.snapshot.seek(std::io::SeekFrom::Start(0)).await.expect("seek");
    snap.snapshot.read_to_end(&mut bytes).await.expect("read");
    snap.snapshot.seek(std::io::SeekFrom::Start(0)).await.expect("seek");
    (snap, bytes)
}

fn set_version(index: u64, version: u32) -> Entry {
    entry(index, Request::new(1_400, index, Command::SetClusterVersion { version }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_keep_v0_records_until_the_cluster_version_is_raised_and_the_version_travels() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    assert_eq!(leader.shared.cluster_version(), 0, "a cluster starts at version 0");

    // At version 0 a member of an older binary may receive the snapshot: layout 2, records without a version
    // byte (its first task frame decodes as bare bincode, as the older binary decodes it).
    let (_, bytes) = snapshot_bytes(&mut leader).await;
    assert!(bytes.starts_with(b"RAFTQSNAP2\n"), "{:?}", &bytes[..11]);
    // The first task frame (after the magic and the header frame).
    fn first_task(bytes: &[u8]) -> &[u8] {
        let mut at = 11;
        let mut frame = || {
            let (kind, len) = (bytes[at], u32::from_be_bytes(bytes[at + 1..at + 5].try_into().expect("4")) as usize);
            at += 5 + len;
            (kind, &bytes[at - len..at])
        };
        let _header = frame();
        let (kind, body) = frame();
        assert_eq!(kind, 2, "a task frame follows the header");
        body
    }
    let task: Task = bincode::deserialize(first_task(&bytes)).expect("a v0 task record");
    assert!(dump(&leader).contains_key(&task.id));

    // The switch: raised once, never lowered, kept by every shard across a reopen.
    apply(&mut leader, vec![set_version(8, 1), set_version(9, 0)]).await;
    assert_eq!(leader.shared.cluster_version(), 1);
    let (snap, bytes) = snapshot_bytes(&mut leader).await;
    assert!(bytes.starts_with(b"RAFTQSNAP3\n"), "v1 records once the cluster runs version 1");
    // The files hold v2 records; a member at cluster version 1 to 3 may be of a binary that reads only v1.
    let body = first_task(&bytes);
    assert_eq!(body[0], crate::storage::format::V1);
    let v1: Task = bincode::deserialize(&body[1..]).expect("a v1 task record");
    assert_eq!(dump(&leader).get(&v1.id), Some(&v1));

    // A follower installs it and runs at the same version; so does a reopen. It holds the v1 records of the
    // snapshot, the leader v2 records: the same state, the same digest.
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(follower.shared.cluster_version(), 1);
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    drop(follower);
    assert_eq!(StateMachine::open(b.path(), 3).expect("reopen").shared.cluster_version(), 1);

    // Version 4: v2 records travel as they are stored.
    apply(&mut leader, vec![set_version(10, 4)]).await;
    let (snap, bytes) = snapshot_bytes(&mut leader).await;
    assert!(bytes.starts_with(crate::storage::format::SNAPSHOT_MAGIC), "{:?}", &bytes[..11]);
    assert_eq!(first_task(&bytes)[0], crate::storage::format::V2);
    let c = tempfile::tempdir().expect("dir");
    let mut other = StateMachine::open(c.path(), 1).expect("open");
    other.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(other.shared.cluster_version(), 4);
    assert_eq!(dump(&other), dump(&leader));
    assert_eq!(other.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    drop(leader);
    assert_eq!(StateMachine::open(a.path(), 2).expect("reopen").shared.cluster_version(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_version_past_this_binary_stops_apply_and_changes_nothing() {
    let a = tempfile::tempdir().expect("dir");
    let mut sm = populated(a.path(), 2).await;
    let before = sm.shared.digest().expect("digest");
    let next = crate::raft::version::SUPPORTED + 1;
    let stream = futures::stream::iter([Ok((set_version(8, next), None))]);
    let msg = sm.apply(stream).await.expect_err("a version this binary cannot apply").to_string();
    assert!(msg.contains(&format!("cluster runs at version {next}")), "{msg}");
    assert_eq!(sm.shared.digest().expect("digest"), before, "nothing applied");
    assert_eq!(sm.shared.cluster_version(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_held_by_every_shard_and_travel_in_snapshots_and_reopens() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    let set = |index: u64, queue: &str, limits: Limits| {
        let command = Command::SetLimits { tenant: "t".into(), queue: queue.into(), limits };
        entry(index, Request::new(1_500, index, command))
    };
    let capped = Limits { max_running: Some(3), max_depth: Some(100) };
    let tenant = Limits { max_running: None, max_depth: Some(1_000) };
    apply(
        &mut leader,
        vec![
            set_version(8, 2),
            set(9, "q", capped),
            set(10, "", tenant),
            set(11, "gone", capped),
            set(12, "gone", Limits::default()),
        ],
    )
    .await;
    let expect = vec![(String::new(), tenant), ("q".to_string(), capped)];
    assert_eq!(leader.shared.tenant_limits("t"), expect, "a limit set to nothing is removed");
    assert_eq!(leader.shared.limits("t", "q"), Some(capped));
    assert!(leader.shared.tenant_limits("other").is_empty(), "per tenant");

    // A follower with another shard count installs the snapshot: every one of its shards holds the limits.
    let (snap, _) = snapshot_bytes(&mut leader).await;
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(follower.shared.tenant_limits("t"), expect);
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    follower.shared.check_indexes().expect("indexes agree with records");
    drop(follower);
    assert_eq!(StateMachine::open(b.path(), 3).expect("reopen").shared.tenant_limits("t"), expect);
    drop(leader);
    let reopened = StateMachine::open(a.path(), 2).expect("reopen");
    assert_eq!(reopened.shared.tenant_limits("t"), expect);
    assert_eq!(reopened.shared.queue_counts("t", "q"), reopened.shared.counts(Some("t"))[0].1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fairness_weights_are_written_to_every_shard_and_survive_a_snapshot_and_a_reopen() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    let weight = |index: u64, key: &str, weight: u32| {
        let command = Command::SetFairnessWeight { tenant: "t".into(), queue: "q".into(), key: key.into(), weight };
        entry(index, Request::new(1_400, index, command))
    };
    apply(&mut leader, vec![set_version(8, 2), weight(9, "k", 3), weight(10, "", 5), weight(11, "gone", 4)]).await;
    apply(&mut leader, vec![weight(12, "gone", 1)]).await;
    let weights = |sm: &StateMachine| -> Vec<(String, u32)> {
        sm.shared.fairness("t", Some("q"), 0).into_iter().filter(|r| r.weight != 1).map(|r| (r.key, r.weight)).collect()
    };
    let want = vec![(String::new(), 5), ("k".to_string(), 3)];
    assert_eq!(weights(&leader), want);

    let (snap, _) = snapshot_bytes(&mut leader).await;
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(weights(&follower), want, "weights travel in the snapshot, to every shard of another count");
    assert!(follower.shared.read().cores.iter().all(|c| c.fairness_weight(&QueueKey::new("t", "q"), "k") == 3));
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    drop(follower);
    drop(leader);
    assert_eq!(weights(&StateMachine::open(a.path(), 2).expect("reopen")), want, "loaded from the shard files");
    assert_eq!(weights(&StateMachine::open(b.path(), 3).expect("reopen")), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_buckets_are_identical_in_every_shard_and_survive_a_snapshot_and_a_reopen() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    let set = |index: u64, key: Option<&str>, milli_per_s: u64, burst: u32| {
        let limit = RateLimit { milli_per_s, burst };
        let command = Command::SetRateLimit { tenant: "t".into(), queue: "q".into(), key: key.map(Into::into), limit };
        entry(index, Request::new(1_500, index, command))
    };
    // Tasks 8 (key "k") and 7 (no key) are ready; the claim charges the key's bucket and the queue's.
    let items = [8u64, 7]
        .iter()
        .map(|i| ClaimItem {
            task_id: TaskId::new(1_000, *i as u16, *i),
            tenant: "t".into(),
            worker_id: "w".into(),
            lease_ms: 60_000,
        })
        .collect();
    let charge = |key: Option<&str>, tokens: u32| RateCharge {
        tenant: "t".into(),
        queue: "q".into(),
        key: key.map(Into::into),
        tokens,
    };
    let charges = vec![charge(None, 2), charge(Some("k"), 1), charge(Some("gone"), 1)];
    let claim = entry(14, Request::new(1_600, 14, Command::RatedClaim { items, charges }));
    apply(
        &mut leader,
        vec![
            set_version(8, 2),
            set(9, Some("k"), 2_000, 3),
            set(10, None, 500, 4),
            set(11, Some(""), 1_000, 0),
            set(12, Some("gone"), 1_000, 1),
            set(13, Some("gone"), 0, 0),
            claim,
        ],
    )
    .await;
    let rows = |sm: &StateMachine| -> Vec<(Option<String>, RateLimit, f64)> {
        sm.shared.rate_limits("t", Some("q"), 1_600).into_iter().map(|r| (r.key, r.limit, r.tokens)).collect()
    };
    let want = vec![
        (None, RateLimit { milli_per_s: 500, burst: 4 }, 2.0),
        (Some(String::new()), RateLimit { milli_per_s: 1_000, burst: 1 }, 1.0),
        (Some("k".to_string()), RateLimit { milli_per_s: 2_000, burst: 3 }, 2.0),
    ];
    assert_eq!(rows(&leader), want, "charged by the claim; a removed bucket takes nothing");
    let every_shard = |sm: &StateMachine| {
        let g = sm.shared.read();
        let qk = QueueKey::new("t", "q");
        let first = g.cores[0].rates(&qk).cloned();
        assert!(first.is_some());
        assert!(g.cores.iter().all(|c| c.rates(&qk).cloned() == first), "every shard holds the same buckets");
        first
    };
    let buckets = every_shard(&leader);
    leader.shared.check_indexes().expect("the indexed buckets agree with their records");

    // A follower with another shard count installs the snapshot: every one of its shards holds the buckets.
    let (snap, _) = snapshot_bytes(&mut leader).await;
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(every_shard(&follower), buckets);
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    follower.shared.check_indexes().expect("indexes agree with records");
    assert!(follower.shared.any_rates());
    drop(follower);
    drop(leader);
    for (dir, shards) in [(a.path(), 2), (b.path(), 3)] {
        let reopened = StateMachine::open(dir, shards).expect("reopen");
        assert_eq!(every_shard(&reopened), buckets, "loaded from the shard files");
        assert_eq!(rows(&reopened), want);
        assert!(reopened.shared.any_rates());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_limit_overrides_are_in_every_shard_run_out_by_time_and_survive_a_snapshot_and_a_reopen() {
    let a = tempfile::tempdir().expect("dir");
    let mut leader = populated(a.path(), 2).await;
    let set = |index: u64, time_ms: TimeMs, key: &str, limit: Option<(u32, Option<TimeMs>)>| {
        let limit = limit.map(|(limit, expires_at)| KeyLimit { limit, expires_at });
        let command = Command::SetKeyLimit { tenant: "t".into(), key: key.into(), limit };
        entry(index, Request::new(time_ms, index, command))
    };
    let tick = |index: u64, time_ms: TimeMs| entry(index, Request::new(time_ms, index, Command::Tick));
    apply(
        &mut leader,
        vec![
            set_version(8, 3),
            set(9, 1_500, "k", Some((7, None))),
            set(10, 1_500, "short", Some((2, Some(1_700)))),
            set(11, 1_500, "later", Some((3, Some(90_000)))),
            set(12, 1_500, "gone", Some((4, None))),
            set(13, 1_500, "gone", None),
        ],
    )
    .await;
    let rows = |sm: &StateMachine| -> Vec<(String, u32, Option<TimeMs>)> {
        sm.shared.key_limits("t", None, 0).into_iter().map(|r| (r.key, r.limit, r.expires_at)).collect()
    };
    let all = vec![("k".to_string(), 7, None), ("later".into(), 3, Some(90_000)), ("short".into(), 2, Some(1_700))];
    assert_eq!(rows(&leader), all);
    assert_eq!(leader.shared.next_due().map(|d| d <= 1_700), Some(true), "the leader ticks by the expiry");
    // Time passes the first expiry: the sweep removes it (record and index) in every shard.
    apply(&mut leader, vec![tick(14, 1_700)]).await;
    let want = all[..2].to_vec();
    assert_eq!(rows(&leader), want);
    leader.shared.check_indexes().expect("indexes agree with records");
    assert!(leader.shared.key_limits("t", None, 90_000).iter().all(|r| r.key == "k"), "a view at 90 s: in force");

    let (snap, _) = snapshot_bytes(&mut leader).await;
    let b = tempfile::tempdir().expect("dir");
    let mut follower = StateMachine::open(b.path(), 3).expect("open");
    follower.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert_eq!(rows(&follower), want, "overrides travel in the snapshot, to every shard of another count");
    assert!(follower.shared.read().cores.iter().all(|c| c.key_limits()["t"].len() == 2));
    assert_eq!(follower.shared.digest().expect("digest").1, leader.shared.digest().expect("digest").1);
    follower.shared.check_indexes().expect("indexes agree with records");
    drop(follower);
    drop(leader);
    assert_eq!(rows(&StateMachine::open(a.path(), 2).expect("reopen")), want, "loaded from the shard files");
    assert_eq!(rows(&StateMachine::open(b.path(), 3).expect("reopen")), want);
}

/// Ids stamped in one millisecond are not in creation order (placement and random bytes follow the time), so an
/// enqueue's check for a taken id often falls below the shard's `newest`; above the file's bound it is answered
/// from the layers alone. Tasks the flusher wrote into the file (no reopen) are still found, in or out of order,
/// and a free id below `newest` is still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_ids_are_refused_after_the_flusher_wrote_them_and_free_ids_of_the_same_millisecond_are_taken() {
    let dir = tempfile::tempdir().expect("dir");
    let mut sm = StateMachine::open(dir.path(), 1).expect("open");
    let task = |random: u64, byte: u8| NewTask {
        id: TaskId::new(3_000, 7, random),
        payload: vec![byte; 4].into(),
        visible_at: 0,
        idempotency_key: None,
        webhook_url: None,
        ..new_task(random, None)
    };
    // Out of id order within the millisecond, as a leader stamps them.
    let first: Vec<NewTask> = [50, 10, 40, 20].into_iter().map(|r| task(r, 1)).collect();
    apply(&mut sm, vec![entry(1, Request::new(3_000, 1, Command::Enqueue(first)))]).await;
    sm.shared.flush(false).expect("the flusher writes the layer");
    // Taken (in the file only now, below and at `newest`) and free ones (below `newest`, between taken ones, and
    // above it), all in one millisecond.
    let second: Vec<NewTask> = [10, 50, 30, 5, 60, 40].into_iter().map(|r| task(r, 2)).collect();
    apply(&mut sm, vec![entry(2, Request::new(3_001, 2, Command::Enqueue(second.clone())))]).await;
    // Again, with the free ones of `second` in the layer and the rest in the file.
    let third: Vec<NewTask> = [30, 20, 60, 5].into_iter().map(|r| task(r, 3)).collect();
    apply(&mut sm, vec![entry(3, Request::new(3_002, 3, Command::Enqueue(third)))]).await;
    for (random, byte) in [(10, 1), (20, 1), (40, 1), (50, 1), (30, 2), (5, 2), (60, 2)] {
        let t = sm.shared.get_task(&TaskId::new(3_000, 7, random)).expect("read").expect("stored");
        assert_eq!(t.payload, vec![byte; 4], "task {random} kept the payload it was first enqueued with");
    }
    assert_eq!(sm.shared.digest().expect("digest").2, 7, "seven tasks, no duplicate");
}

/// Applies commands to one shard's core over a `CachedStore`, as apply does, without a log or a flusher.
struct Applier {
    core: ShardCore,
    fx: Effects,
}

impl Applier {
    fn new() -> Applier {
        Applier { core: ShardCore::new(0, 1), fx: Effects::default() }
    }

    fn run(&mut self, store: &mut super::shard::CachedStore, time: u64, index: u64, command: Command) -> Response {
        let req = Request::new(time, index, command);
        let mut cx = ApplyContext::new(index, &req, &mut self.fx);
        self.core.apply(store, &mut cx, &req).expect("apply");
        cx.finish()
    }
}

/// Claims and acks change a task's record in place when apply holds the only reference to it, and copy it when
/// another holder shares it (a layer being flushed, a reader): a record someone holds never changes under them.
#[test]
fn claim_and_ack_change_an_unshared_record_in_place_and_never_a_shared_one() {
    use std::sync::Arc;

    use super::shard::{CachedStore, Layer};

    let dir = tempfile::tempdir().expect("dir");
    let db = super::codec::open_db(&dir.path().join("shard.redb")).expect("open");
    let (mut dirty, mut newest) = (Layer::default(), None);
    let mut store = CachedStore::new(&mut dirty, &[], &db, &mut newest, None);
    let mut applier = Applier::new();
    let mut run = |store: &mut CachedStore, index: u64, command: Command| applier.run(store, 2_000, index, command);
    let (alone, shared) = (TaskId::new(2_000, 1, 1), TaskId::new(2_000, 2, 2));
    let task =
        |id: TaskId| NewTask { id, visible_at: 0, webhook_url: None, idempotency_key: None, ..new_task(1, None) };
    run(&mut store, 1, Command::Enqueue(vec![task(alone), task(shared)]));
    let record = |store: &mut CachedStore, id: &TaskId| store.get(id).expect("read").expect("stored");
    let alone_at = Arc::as_ptr(&record(&mut store, &alone));
    let held = record(&mut store, &shared);
    let claim = |id: TaskId| ClaimItem { task_id: id, tenant: "t".into(), worker_id: "w".into(), lease_ms: 1_000 };
    run(&mut store, 2, Command::Claim(vec![claim(alone), claim(shared)]));

    let now = record(&mut store, &alone);
    assert_eq!(now.state, TaskState::InProgress);
    assert_eq!(Arc::as_ptr(&now), alone_at, "the only reference: changed in place");
    assert_eq!(held.state, TaskState::Pending, "the held record is as it was");
    assert!(held.lease.is_none() && held.runs.is_empty() && held.attempts == 0);
    let claimed = record(&mut store, &shared);
    assert_eq!((claimed.state, claimed.attempts, claimed.runs.len()), (TaskState::InProgress, 1, 1));

    let token = now.lease.as_ref().expect("leased").token;
    drop(now);
    let complete =
        AckItem { task_id: alone, tenant: "t".into(), token, action: AckAction::Complete { result: b"done".to_vec() } };
    run(&mut store, 3, Command::Ack(vec![complete]));
    let done = record(&mut store, &alone);
    assert_eq!((done.state, done.result.as_deref()), (TaskState::Completed, Some(&b"done"[..])));
    assert_eq!(Arc::as_ptr(&done), alone_at, "still the same record");
}

/// The flusher is background work: its thread runs at `FLUSHER_NICE`, below the threads that answer requests
/// (Linux reports a thread's nice value in `/proc/self/task/TID/stat`).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flusher_thread_runs_below_the_default_priority() {
    let dir = tempfile::tempdir().expect("dir");
    let _sm = StateMachine::open(dir.path(), 2).expect("open");
    let nice_of_flushers = || -> Vec<i32> {
        let mut found = vec![];
        for t in std::fs::read_dir("/proc/self/task").expect("tasks").flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != "raftq-sm-flush" {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis start at the 3rd; nice is the 19th.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
            if let Some(n) = after.split_whitespace().nth(16).and_then(|f| f.parse().ok()) {
                found.push(n);
            }
        }
        found
    };
    // The thread lowers its own priority as it starts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let found = loop {
        let found = nice_of_flushers();
        if (!found.is_empty() && found.iter().all(|&n| n == super::flush::FLUSHER_NICE))
            || std::time::Instant::now() > deadline
        {
            break found;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(!found.is_empty(), "a flusher thread runs");
    assert!(found.iter().all(|&n| n == super::flush::FLUSHER_NICE), "flusher threads' nice values: {found:?}");
}

/// v2's variable-length integers make a task record about a quarter smaller than v1's fixed-width ones, in each
/// state of a full cycle. `--nocapture` prints the sizes (docs/performance.md, "Smaller records").
#[test]
fn v2_task_records_are_smaller() {
    use super::format::{self, V1};
    use super::shard::{CachedStore, Layer};

    let dir = tempfile::tempdir().expect("dir");
    let db = super::codec::open_db(&dir.path().join("shard.redb")).expect("open");
    let (mut dirty, mut newest) = (Layer::default(), None);
    let mut store = CachedStore::new(&mut dirty, &[], &db, &mut newest, None);
    let mut applier = Applier::new();
    // A timestamp of 2026 and a log position in the millions, as a running cluster stamps them.
    let (now, base) = (1_795_000_000_000, 4_000_000);
    let mut run =
        |store: &mut CachedStore, index: u64, command: Command| applier.run(store, now, base + index, command);
    let id = TaskId::new(now, 1, 1);
    let task = NewTask {
        id,
        tenant: "default".into(),
        queue: "bench".into(),
        payload: vec![7u8; 100].into(),
        visible_at: 0,
        webhook_url: None,
        idempotency_key: None,
        ..new_task(1, None)
    };
    let sizes = |store: &mut CachedStore, state: &str| {
        let t = store.get(&id).expect("read").expect("stored");
        let (v1, v2) = (format::encode_as(V1, &*t).expect("v1").len(), format::encode(&*t).expect("v2").len());
        eprintln!("{state}: v1 {v1} bytes, v2 {v2} bytes ({:.0} %)", 100.0 * v2 as f64 / v1 as f64);
        assert!(v2 * 100 <= v1 * 80, "{state}: v2 {v2} bytes against v1 {v1}");
    };
    run(&mut store, 1, Command::Enqueue(vec![task]));
    sizes(&mut store, "pending");
    let worker = "worker-3f2a9c1e-0b7d-4c55-9e61-2d8f0a7b1c44";
    let claim = ClaimItem { task_id: id, tenant: "default".into(), worker_id: worker.into(), lease_ms: 30_000 };
    run(&mut store, 2, Command::Claim(vec![claim]));
    sizes(&mut store, "claimed");
    let token = store.get(&id).expect("read").expect("stored").lease.as_ref().expect("leased").token;
    let done = AckItem { task_id: id, tenant: "default".into(), token, action: AckAction::Complete { result: vec![] } };
    run(&mut store, 3, Command::Ack(vec![done]));
    sizes(&mut store, "completed");
}

/// Whether any task waits on a dependency (what wakes the leader's dependency resolver) follows apply, and is
/// read again at open and after a snapshot install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whether_a_task_waits_on_a_dependency_follows_apply_reopen_and_install() {
    let a = tempfile::tempdir().expect("dir");
    let mut sm = populated(a.path(), 4).await;
    let waits = |sm: &StateMachine| *sm.shared.dependents.borrow();
    assert!(!waits(&sm), "no task of the populated state waits on a dependency");
    let mut changed = sm.shared.dependents.subscribe();
    changed.mark_unchanged();

    // A task waiting on a pending one: the flag rises, once.
    let (dep, waiter) = (TaskId::new(1_000, 1, 1), TaskId::new(2_000, 7, 77));
    let mut t = new_task(77, None);
    t.id = waiter;
    t.depends_on = vec![dep];
    apply(&mut sm, vec![entry(8, Request::new(2_000, 8, Command::Enqueue(vec![t])))]).await;
    assert!(waits(&sm) && changed.has_changed().expect("open"), "a dependent task raises it");
    changed.mark_unchanged();
    apply(&mut sm, vec![entry(9, Request::new(2_001, 9, Command::Tick))]).await;
    assert!(waits(&sm) && !changed.has_changed().expect("open"), "an entry that changes nothing wakes no one");

    // It travels in a snapshot and is read at open.
    let snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let b = tempfile::tempdir().expect("dir");
    let mut other = StateMachine::open(b.path(), 3).expect("open");
    assert!(!waits(&other));
    other.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert!(waits(&other), "an installed snapshot's dependents count");
    drop(other);
    assert!(waits(&StateMachine::open(b.path(), 3).expect("reopen")), "and a reopened state's");

    // Resolved, the task waits on nothing: the flag falls.
    let done = DependencyResolved { task_id: waiter, dependency: dep, outcome: Some(TaskState::Completed) };
    apply(&mut sm, vec![entry(10, Request::new(2_002, 10, Command::ResolveDependencies(vec![done])))]).await;
    assert!(!waits(&sm) && changed.has_changed().expect("open"), "no dependent left lowers it");
}
