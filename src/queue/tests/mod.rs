//! Tests of the pure task state machine over a `MemMachine`: the harness and invariant checks shared by
//!
//! - `rules`: unit tests of each lifecycle rule;
//! - `webhooks`: the webhook outbox;
//! - `fairness`: weighted fair dispatch across the keys of a queue, and the weights;
//! - `keyed`: debounce and singleton keys (`EnqueueKeyed`) and their records;
//! - `key_limits`: operators' overrides of concurrency keys' limits, their expiry and removal;
//! - `model`: a small reference model written from the rules alone;
//! - `property`: a property test running random command sequences against the machine and the model.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::*;

mod fairness;
mod key_limits;
mod keyed;
mod model;
mod property;
mod rates;
mod rules;
mod webhooks;

// ---- shared helpers ----------------------------------------------------------------------------------------

const SHARDS: usize = 4;
const T0: TimeMs = 1_000_000;
const FIXED: RetryPolicy = RetryPolicy { base_ms: 100, max_ms: 100, exponential: false };
const Q: &str = "q";
const A: &str = "acme";
const B: &str = "bravo";
/// A webhook URL nothing listens on (apply never sends: it only writes the outbox).
const HOOK: &str = "http://127.0.0.1:9/hook";

type Records = Vec<(BTreeMap<TaskId, Task>, BTreeMap<(String, String), KeyRecord>)>;

fn queues(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Every record of every shard, to compare machines (or one machine before and after an entry).
fn records(m: &MemMachine) -> Records {
    m.stores.iter().map(|s| (s.tasks.clone(), s.keys.clone())).collect()
}

fn index_sizes(m: &MemMachine) -> Vec<IndexSizes> {
    m.shards.iter().map(|s| s.index_sizes()).collect()
}

/// Index sizes without the idempotency-key index. That index may hold a stale entry until the next entry: a key
/// replaced within the entry it expired in (a window of 0) leaves its old entry behind, which `advance` skips by
/// deadline (see `ShardCore::enqueue`). The key records themselves are compared exactly wherever this is used.
fn task_index_sizes(m: &MemMachine) -> Vec<IndexSizes> {
    m.shards.iter().map(|s| IndexSizes { keys: 0, ..s.index_sizes() }).collect()
}

fn total_sizes(m: &MemMachine) -> IndexSizes {
    let mut total = IndexSizes::default();
    for s in index_sizes(m) {
        total.ready += s.ready;
        total.delayed += s.delayed;
        total.leases += s.leases;
        total.retention += s.retention;
        total.dead += s.dead;
        total.keys += s.keys;
        total.deadlines += s.deadlines;
        total.held += s.held;
    }
    total
}

/// Per-queue state counts summed over shards, without all-zero entries.
fn machine_counts(m: &MemMachine) -> BTreeMap<QueueKey, StateCounts> {
    let mut out: BTreeMap<QueueKey, StateCounts> = BTreeMap::new();
    for shard in &m.shards {
        for (qk, c) in shard.counts() {
            out.entry(qk.clone()).or_default().add(c);
        }
    }
    out.retain(|_, c| *c != StateCounts::default());
    out
}

/// The indexes agree with the records they are derived from: each task sits in its placement's shard, in exactly
/// the one index its state calls for, the per-queue counts match, and no two live leases share a token.
fn assert_indexes_match_records(m: &MemMachine) {
    let mut tokens = HashSet::new();
    let mut counts: BTreeMap<QueueKey, StateCounts> = BTreeMap::new();
    for (i, (core, store)) in m.shards.iter().zip(&m.stores).enumerate() {
        let now = core.now;
        let mut want = IndexSizes { keys: store.keys.len(), webhooks: store.outbox.len(), ..IndexSizes::default() };
        for t in store.tasks.values() {
            assert_eq!(t.id.shard(m.shards.len()), i, "task {} stored in the wrong shard", t.id);
            assert!(t.attempts <= t.max_attempts, "attempts exceed max: {t:?}");
            assert_eq!(t.state == TaskState::InProgress, t.lease.is_some(), "lease iff in progress: {t:?}");
            assert_eq!(t.state.is_terminal(), t.ended_at.is_some(), "ended_at iff terminal: {t:?}");
            assert_eq!(t.state == TaskState::DeadLettered, t.dead_at.is_some(), "dead_at iff dead: {t:?}");
            if t.deadline.is_some() && !t.state.is_terminal() {
                want.deadlines += 1;
            }
            let c = counts.entry(QueueKey::of(t)).or_default();
            match t.state {
                TaskState::Pending if !t.waiting_on.is_empty() => {
                    want.held += 1;
                    c.delayed += 1;
                }
                TaskState::Pending if t.visible_at > now => {
                    want.delayed += 1;
                    c.delayed += 1;
                }
                TaskState::Pending => {
                    want.ready += 1;
                    c.pending += 1;
                }
                TaskState::InProgress => {
                    want.leases += 1;
                    c.in_progress += 1;
                    let token = t.lease.as_ref().expect("checked above").token;
                    assert!(tokens.insert(token), "token {token} held by two tasks");
                    assert!(t.attempts >= 1, "a claimed task used an attempt: {t:?}");
                }
                TaskState::Completed => {
                    want.retention += 1;
                    c.completed += 1;
                }
                TaskState::Failed => {
                    want.retention += 1;
                    c.failed += 1;
                }
                TaskState::Cancelled => {
                    want.retention += 1;
                    c.cancelled += 1;
                }
                TaskState::DeadLettered => {
                    want.dead += 1;
                    c.dead_lettered += 1;
                }
            }
        }
        for ((tenant, key), rec) in &store.keys {
            assert_eq!(rec.task_id.shard(m.shards.len()), i, "key {tenant}/{key} stored apart from its task");
        }
        // Slot accounting cannot leak: the running count per (tenant, concurrency key) and the pending tasks'
        // keys (of those not held) are exactly what the records say, with no entry left behind at zero.
        let mut running: BTreeMap<(String, String), u32> = BTreeMap::new();
        let mut pending_keys: BTreeMap<TaskId, String> = BTreeMap::new();
        for t in store.tasks.values() {
            match (&t.concurrency, t.state) {
                (Some(ck), TaskState::InProgress) => {
                    *running.entry((t.tenant.clone(), ck.key.clone())).or_default() += 1
                }
                // Tasks held by dependencies are in no claim index until released.
                (Some(ck), TaskState::Pending) if t.waiting_on.is_empty() => {
                    pending_keys.insert(t.id, ck.key.clone());
                }
                _ => {}
            }
        }
        let indexed: BTreeMap<(String, String), u32> = core
            .idx
            .running_keys
            .iter()
            .flat_map(|(tenant, keys)| keys.iter().map(move |(k, n)| ((tenant.clone(), k.clone()), *n)))
            .collect();
        assert_eq!(indexed, running, "shard {i}: running tasks per concurrency key disagree with the records");
        for ((tenant, key), n) in &running {
            assert_eq!(core.running_with_key(tenant, key), *n, "shard {i}: running_with_key({tenant}, {key})");
        }
        // A ready task's key is the set of `by_key` it sits in; a delayed one's is in its `delayed` entry.
        let ready = core.idx.by_key.values().flat_map(|keyed| keyed.keys.iter());
        let ready =
            ready.filter(|(key, _)| !key.is_empty()).flat_map(|(key, (_, set))| set.keys().map(move |rk| (rk.2, key)));
        let delayed = core.idx.delayed.iter().filter_map(|((_, id), d)| Some((*id, &d.key.as_ref()?.key)));
        let indexed: BTreeMap<TaskId, String> = ready.chain(delayed).map(|(id, key)| (id, key.clone())).collect();
        assert_eq!(indexed, pending_keys, "shard {i}: pending tasks' concurrency keys disagree with the records");
        // Key limit overrides: the index holds exactly the records, each expiry once, none already run out.
        let indexed: BTreeMap<(String, String), KeyLimit> = core
            .key_limits()
            .iter()
            .flat_map(|(tenant, keys)| keys.iter().map(move |(k, l)| ((tenant.clone(), k.clone()), *l)))
            .collect();
        assert_eq!(indexed, store.key_limits, "shard {i}: key limit overrides disagree with the records");
        let expiries: BTreeSet<(TimeMs, String, String)> = store
            .key_limits
            .iter()
            .filter_map(|((tenant, key), l)| l.expires_at.map(|at| (at, tenant.clone(), key.clone())))
            .collect();
        assert_eq!(core.idx.key_limit_expiries, expiries, "shard {i}: key limit expiries disagree with the records");
        assert!(store.key_limits.values().all(|l| l.in_force(core.now)), "shard {i}: an override past its expiry");
        let got = core.index_sizes();
        assert_eq!(
            IndexSizes { keys: 0, ..got },
            IndexSizes { keys: 0, ..want },
            "shard {i}: index sizes disagree with its records"
        );
        assert!(got.keys >= want.keys, "shard {i}: a stored key is missing from the key index");
        assert_eq!(
            got.ready + got.delayed + got.leases + got.retention + got.dead + got.held,
            store.tasks.len(),
            "shard {i}: every task is in exactly one index"
        );
    }
    counts.retain(|_, c| *c != StateCounts::default());
    assert_eq!(machine_counts(m), counts, "state counts disagree with the records");
}

/// After `before` (a copy of `m` taken just before an entry) applies a plain tick with the same time and seed,
/// it equals `m`: the entry did nothing beyond what the passing of time does.
fn assert_only_time_moved(mut before: MemMachine, m: &MemMachine, time_ms: TimeMs, seed: u64) {
    before.apply(&Request::new(time_ms, seed, Command::Tick));
    assert_eq!(records(&before), records(m), "a rejected command changed state");
    assert_eq!(task_index_sizes(&before), task_index_sizes(m), "a rejected command changed the indexes");
}

fn token(t: &Task) -> LeaseToken {
    t.lease.as_ref().expect("a claimed task has a lease").token
}

fn ack_item(id: TaskId, tenant: &str, token: LeaseToken, action: AckAction) -> AckItem {
    AckItem { task_id: id, tenant: tenant.to_string(), token, action }
}

fn complete() -> AckAction {
    AckAction::Complete { result: b"ok".to_vec() }
}

fn nack(delay_ms: Option<u64>) -> AckAction {
    AckAction::Nack { delay_ms, reason: "busy".to_string() }
}

fn fail(retryable: bool) -> AckAction {
    AckAction::Fail { error: "boom".to_string(), retryable }
}

fn every_action() -> Vec<AckAction> {
    vec![
        complete(),
        fail(false),
        fail(true),
        nack(None),
        nack(Some(0)),
        AckAction::Abandon,
        AckAction::Heartbeat { extend_ms: 60_000 },
        AckAction::Progress { extend_ms: 60_000, percent: 50, message: "half".into() },
        AckAction::Exception { reason: ExceptionReason::InternalError, message: "boom".into() },
    ]
}

/// A machine of `SHARDS` shards driven the way the leader drives it: it stamps time, ids and seeds, picks claims,
/// and checks the indexes against the records after every entry.
struct Harness {
    m: MemMachine,
    time: TimeMs,
    next_id: u64,
    /// Every entry applied, in order (to replay into replicas of other shard counts).
    log: Vec<Request>,
}

impl Harness {
    fn new() -> Self {
        let mut h = Harness { m: MemMachine::new(SHARDS), time: T0, next_id: 0, log: Vec::new() };
        h.tick_at(T0);
        h
    }

    fn apply_at(&mut self, time: TimeMs, command: Command) -> Response {
        self.time = time;
        let seed = 0x5eed_0000 ^ self.m.last_index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let req = Request::new(time, seed, command);
        let (resp, _) = self.m.apply(&req);
        self.log.push(req);
        assert_indexes_match_records(&self.m);
        resp
    }

    fn apply(&mut self, command: Command) -> Response {
        self.apply_at(self.time, command)
    }

    fn tick_at(&mut self, time: TimeMs) {
        assert_eq!(self.apply_at(time, Command::Tick), Response::Ticked);
    }

    fn advance(&mut self, dt: u64) {
        self.tick_at(self.time + dt);
    }

    fn now(&self) -> TimeMs {
        self.m.now()
    }

    /// A new task with defaults; each gets the next placement, so consecutive tasks land in different shards.
    fn spec(&mut self, tenant: &str, queue: &str) -> NewTask {
        self.next_id += 1;
        NewTask {
            id: TaskId::new(self.time, self.next_id as u16, self.next_id),
            tenant: tenant.to_string(),
            queue: queue.to_string(),
            payload: self.next_id.to_be_bytes().to_vec().into(),
            priority: 0,
            visible_at: self.time,
            max_attempts: 3,
            idempotency_key: None,
            idempotency_window_ms: 60_000,
            webhook_url: None,
            traceparent: None,
            tracestate: None,
            retry: FIXED,
            retention_ms: 60_000,
            deadline: None,
            concurrency: None,
            parent: None,
            depends_on: vec![],
            dependency_rule: DependencyRule::AllCompleted,
        }
    }

    fn enqueue_all(&mut self, tasks: Vec<NewTask>) -> Vec<ItemResult<Enqueued>> {
        match self.apply(Command::Enqueue(tasks)) {
            Response::Enqueued(v) => v,
            other => panic!("enqueue answered {other:?}"),
        }
    }

    fn enqueue(&mut self, task: NewTask) -> TaskId {
        let id = task.id;
        assert_eq!(self.enqueue_all(vec![task]), vec![Ok(Enqueued { task_id: id, duplicate: false })]);
        id
    }

    fn add(&mut self, tenant: &str, queue: &str) -> TaskId {
        let spec = self.spec(tenant, queue);
        self.enqueue(spec)
    }

    fn claim_ids(&mut self, tenant: &str, ids: &[TaskId], lease_ms: u64) -> Vec<ItemResult<Arc<Task>>> {
        let items = ids
            .iter()
            .map(|id| ClaimItem { task_id: *id, tenant: tenant.into(), worker_id: "w1".into(), lease_ms })
            .collect();
        match self.apply(Command::Claim(items)) {
            Response::Claimed(v) => v,
            other => panic!("claim answered {other:?}"),
        }
    }

    /// Picks up to `count` tasks in claim order and claims them, as the leader does.
    fn claim(&mut self, tenant: &str, queue_names: &[&str], count: usize, lease_ms: u64) -> Vec<Task> {
        let ids = self.m.pick(tenant, &queues(queue_names), count);
        let claimed = self.claim_ids(tenant, &ids, lease_ms);
        claimed.into_iter().map(|r| Task::clone(&r.expect("a picked task is claimable"))).collect()
    }

    fn claim_one(&mut self, tenant: &str, lease_ms: u64) -> Task {
        let mut v = self.claim(tenant, &[Q], 1, lease_ms);
        assert_eq!(v.len(), 1, "nothing to claim");
        v.remove(0)
    }

    fn ack_all(&mut self, items: Vec<AckItem>) -> Vec<ItemResult<AckOutcome>> {
        match self.apply(Command::Ack(items)) {
            Response::Acked(v) => v,
            other => panic!("ack answered {other:?}"),
        }
    }

    fn ack(&mut self, id: TaskId, tenant: &str, token: LeaseToken, action: AckAction) -> ItemResult<AckOutcome> {
        self.ack_all(vec![ack_item(id, tenant, token, action)]).remove(0)
    }

    fn cancel(&mut self, tenant: &str, id: TaskId) -> ItemResult<TaskState> {
        match self.apply(Command::Cancel { tenant: tenant.to_string(), task_id: id }) {
            Response::Cancelled(r) => r,
            other => panic!("cancel answered {other:?}"),
        }
    }

    fn redrive(&mut self, tenant: &str, queue: &str, select: DlqSelector) -> Vec<TaskId> {
        match self.apply(Command::Redrive { tenant: tenant.to_string(), queue: queue.to_string(), select }) {
            Response::Redriven(v) => v,
            other => panic!("redrive answered {other:?}"),
        }
    }

    fn purge(&mut self, tenant: &str, queue: &str, select: DlqSelector) -> Vec<TaskId> {
        let cmd = Command::PurgeDeadLetters { tenant: tenant.to_string(), queue: queue.to_string(), select };
        match self.apply(cmd) {
            Response::Purged(v) => v,
            other => panic!("purge answered {other:?}"),
        }
    }

    fn task(&self, id: TaskId) -> Task {
        self.m.task(&id).cloned().unwrap_or_else(|| panic!("task {id} is gone"))
    }

    fn state(&self, id: TaskId) -> Option<TaskState> {
        self.m.task(&id).map(|t| t.state)
    }

    fn pick(&self, tenant: &str, queue_names: &[&str], count: usize) -> Vec<TaskId> {
        self.m.pick(tenant, &queues(queue_names), count)
    }

    /// Claims `id` (the only ready task of `A`/`Q`) and fails it, retryably, until its attempts run out.
    fn dead_letter(&mut self, id: TaskId) {
        loop {
            let t = self.claim_one(A, 1_000);
            assert_eq!(t.id, id);
            let out = self.ack(id, A, token(&t), fail(true)).expect("current token");
            if out.state == TaskState::DeadLettered {
                return;
            }
            self.tick_at(out.at);
        }
    }
}
