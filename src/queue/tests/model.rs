//! The reference model of the property test: what the machine should do, written from the lifecycle rules alone
//! (no indexes, no shards beyond placement), with ranges where the machine chooses (jittered backoff).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::*;

pub(super) const TENANTS: [&str; 2] = ["acme", "bravo"];
pub(super) const QUEUES: [&str; 2] = ["q0", "q1"];
pub(super) const KEYS: [&str; 2] = ["k0", "k1"];
/// Placement of keyed tasks, per key: the proposer puts every task of one key in one shard.
pub(super) const KEY_PLACEMENT: u16 = 1_000;
/// Concurrency keys, their limits and placements (again one shard per key).
pub(super) const CKEYS: [&str; 2] = ["c0", "c1"];
pub(super) const CKEY_LIMITS: [u32; 2] = [1, 2];
pub(super) const CKEY_PLACEMENT: u16 = 2_001;

/// The reference model's view of a task, written from the lifecycle rules alone.
#[derive(Debug, Clone)]
pub(super) struct ModelTask {
    pub(super) tenant: String,
    pub(super) queue: String,
    pub(super) priority: u8,
    pub(super) state: TaskState,
    /// FIFO position: log index (times `MAX_ITEMS_PER_COMMAND`, plus the item's position for an enqueue) of the
    /// entry that last made the task pending.
    pub(super) seq: u64,
    pub(super) visible_at: TimeMs,
    /// A backoff with jitter: the machine chooses the visible time within this range; resolved after the entry.
    pub(super) visible_range: Option<(TimeMs, TimeMs)>,
    pub(super) attempts: u32,
    pub(super) max_attempts: u32,
    pub(super) token: Option<LeaseToken>,
    pub(super) deadline: TimeMs,
    pub(super) ended_at: Option<TimeMs>,
    /// Log index of the entry that ended the task.
    pub(super) ended_in: u64,
    pub(super) retention_ms: u64,
    pub(super) retry: RetryPolicy,
    /// Token and kind of the ack that ended the last delivery: that same ack again is answered as applied.
    pub(super) last_ack: Option<(LeaseToken, u8)>,
    /// The task's own deadline (not the lease's).
    pub(super) task_deadline: Option<TimeMs>,
    /// Every delivery: its token and how it ended.
    pub(super) runs: Vec<(LeaseToken, Option<RunOutcome>)>,
    /// Concurrency key and limit.
    pub(super) ckey: Option<(String, u32)>,
    /// Dependencies not yet resolved, and whether all-resolved (else all-completed) is the rule.
    pub(super) waiting_on: Vec<TaskId>,
    pub(super) all_resolved: bool,
    /// When it was enqueued (a debounce's `max_wait_ms` counts from it).
    pub(super) created_at: TimeMs,
}

#[derive(Debug, Default)]
pub(super) struct Model {
    pub(super) now: TimeMs,
    pub(super) index: u64,
    pub(super) tasks: BTreeMap<TaskId, ModelTask>,
    /// (tenant, key) -> (task, expires_at)
    pub(super) keys: BTreeMap<(String, String), (TaskId, TimeMs)>,
    /// Debounce and singleton keys: (tenant, record key) -> the task holding the key. A key is dropped as soon as
    /// its task no longer holds it (`release_keys`, after each part of an entry that changes tasks).
    pub(super) mode_keys: BTreeMap<(String, String), TaskId>,
    /// Every token each task was ever given.
    pub(super) history: HashMap<TaskId, Vec<LeaseToken>>,
    pub(super) issued: Vec<LeaseToken>,
    /// Paused (tenant, queue): no claims.
    pub(super) paused: BTreeSet<(String, String)>,
    /// Fairness weights other than 1: (tenant, queue, key) -> weight.
    pub(super) weights: BTreeMap<(String, String, String), u32>,
    /// Operators' overrides of concurrency keys: (tenant, key) -> (limit, expiry). Kept past their expiry: the
    /// rule is only that one binds while `now` is before its expiry.
    pub(super) key_limits: BTreeMap<(String, String), (u32, Option<TimeMs>)>,
}

/// The range of a backoff after `attempts` attempts: fixed, or `base * 2^(attempts-1)` capped at `max`, of which
/// at most half is taken off by jitter.
pub(super) fn backoff_range(p: &RetryPolicy, attempts: u32) -> (u64, u64) {
    if !p.exponential {
        return (p.base_ms, p.base_ms);
    }
    let full = p.base_ms.saturating_mul(2u64.saturating_pow(attempts.saturating_sub(1))).min(p.max_ms);
    (full / 2, full)
}

impl ModelTask {
    /// Retry after a delay in `delay` while attempts remain, else dead-letter.
    pub(super) fn retry_or_dead(&mut self, now: TimeMs, delay: (u64, u64), seq: u64) {
        self.token = None;
        if self.attempts >= self.max_attempts {
            self.state = TaskState::DeadLettered;
        } else {
            self.state = TaskState::Pending;
            self.seq = seq;
            self.visible_at = now + delay.0;
            self.visible_range = (delay.0 != delay.1).then_some((now + delay.0, now + delay.1));
        }
    }

    pub(super) fn close_run(&mut self, outcome: RunOutcome) {
        if let (Some(run), Some(token)) = (self.runs.last_mut(), self.token) {
            if run.0 == token && run.1.is_none() {
                run.1 = Some(outcome);
            }
        }
    }

    pub(super) fn end(&mut self, state: TaskState, now: TimeMs, index: u64) {
        self.state = state;
        self.token = None;
        self.ended_at = Some(now);
        self.ended_in = index;
    }

    pub(super) fn ready(&self, now: TimeMs) -> bool {
        self.state == TaskState::Pending && self.visible_at <= now && self.waiting_on.is_empty()
    }
}

pub(super) type Outcome = ItemResult<(TaskState, (TimeMs, TimeMs))>;

impl Model {
    /// The start of every entry: time moves (never back), expired leases retry or dead-letter, ended tasks past
    /// retention go, keys past their window are forgotten.
    pub(super) fn begin(&mut self, time_ms: TimeMs) {
        self.index += 1;
        self.now = self.now.max(time_ms);
        let (now, seq) = (self.now, self.index * MAX_ITEMS_PER_COMMAND);
        for t in self.tasks.values_mut() {
            if t.state == TaskState::InProgress && t.deadline <= now {
                t.close_run(RunOutcome::LeaseExpired);
                let delay = backoff_range(&t.retry, t.attempts);
                t.retry_or_dead(now, delay, seq);
            }
        }
        for t in self.tasks.values_mut() {
            if !t.state.is_terminal() && t.task_deadline.is_some_and(|d| d <= now) {
                t.close_run(RunOutcome::DeadlineExceeded);
                t.end(TaskState::Failed, now, self.index);
            }
        }
        self.tasks.retain(|_, t| match t.ended_at {
            Some(end) if t.state.is_terminal() => end.saturating_add(t.retention_ms) > now,
            _ => true,
        });
        self.keys.retain(|_, (_, expires_at)| *expires_at > now);
        self.release_keys();
    }

    pub(super) fn owned(&mut self, id: &TaskId, tenant: &str) -> Option<&mut ModelTask> {
        self.tasks.get_mut(id).filter(|t| t.tenant == tenant)
    }

    pub(super) fn enqueue(&mut self, pos: u64, n: &NewTask) -> ItemResult<Enqueued> {
        if let Some(key) = &n.idempotency_record_key() {
            if let Some(&(original, expires_at)) = self.keys.get(&(n.tenant.clone(), key.clone())) {
                if expires_at > self.now {
                    return Ok(Enqueued { task_id: original, duplicate: true });
                }
            }
        }
        if self.tasks.contains_key(&n.id) {
            return Err(Rejected::IdExists);
        }
        let t = ModelTask {
            tenant: n.tenant.clone(),
            queue: n.queue.clone(),
            priority: n.priority,
            state: TaskState::Pending,
            seq: self.index * MAX_ITEMS_PER_COMMAND + pos,
            visible_at: n.visible_at,
            visible_range: None,
            attempts: 0,
            max_attempts: n.max_attempts,
            token: None,
            deadline: 0,
            ended_at: None,
            ended_in: 0,
            retention_ms: n.retention_ms,
            retry: n.retry,
            last_ack: None,
            task_deadline: n.deadline,
            runs: vec![],
            ckey: n.concurrency.as_ref().map(|c| (c.key.clone(), c.limit)),
            waiting_on: n.depends_on.clone(),
            all_resolved: n.dependency_rule == DependencyRule::AllResolved,
            created_at: self.now,
        };
        self.tasks.insert(n.id, t);
        if let Some(key) = &n.idempotency_record_key() {
            self.keys.insert((n.tenant.clone(), key.clone()), (n.id, self.now + n.idempotency_window_ms));
        }
        Ok(Enqueued { task_id: n.id, duplicate: false })
    }

    /// A keyed enqueue: while the key's task holds the key, a singleton refuses or skips and a debounce moves
    /// that task (priority, start); otherwise the task is created and takes the key.
    pub(super) fn enqueue_keyed(&mut self, pos: u64, n: &NewTask, mode: &KeyMode) -> ItemResult<Enqueued> {
        let rkey = (n.tenant.clone(), mode.record_key(&n.queue, n.concurrency.as_ref()));
        let now = self.now;
        if let Some(&id) = self.mode_keys.get(&rkey) {
            let t = self.tasks.get_mut(&id).expect("a held key's task exists");
            return match mode {
                KeyMode::Singleton { skip: true, .. } => Ok(Enqueued { task_id: id, duplicate: true }),
                KeyMode::Singleton { skip: false, .. } => Err(Rejected::SingletonActive(id)),
                KeyMode::Debounce { delay_ms, max_wait_ms, .. } => {
                    t.priority = n.priority;
                    t.visible_at = now + delay_ms;
                    if *max_wait_ms > 0 {
                        t.visible_at = t.visible_at.min(t.created_at + max_wait_ms);
                    }
                    Ok(Enqueued { task_id: id, duplicate: true })
                }
            };
        }
        let r = self.enqueue(pos, n);
        if let Ok(Enqueued { task_id, duplicate: false }) = r {
            self.mode_keys.insert(rkey, task_id);
        }
        r
    }

    /// Drops the debounce and singleton keys whose task no longer holds them: a debounce key once its task was
    /// claimed (or ended), a singleton key once its task left pending and in progress.
    pub(super) fn release_keys(&mut self) {
        let tasks = &self.tasks;
        self.mode_keys.retain(|(_, rkey), id| {
            tasks.get(id).is_some_and(|t| {
                if rkey.starts_with("\0debounce\0") {
                    t.state == TaskState::Pending && t.runs.is_empty()
                } else {
                    matches!(t.state, TaskState::Pending | TaskState::InProgress)
                }
            })
        });
    }

    /// The limit of a tenant's concurrency key now: an override before its expiry, else the task's own.
    pub(super) fn key_limit(&self, tenant: &str, key: &str, own: u32) -> u32 {
        match self.key_limits.get(&(tenant.to_string(), key.to_string())) {
            Some((limit, expires_at)) if expires_at.is_none_or(|e| self.now < e) => (*limit).max(1),
            _ => own.max(1),
        }
    }

    /// Running tasks of a tenant's concurrency key.
    pub(super) fn running(&self, tenant: &str, key: &str) -> u32 {
        let with_key = |t: &&ModelTask| t.ckey.as_ref().is_some_and(|(k, _)| k == key);
        let running = |t: &&ModelTask| t.tenant == tenant && t.state == TaskState::InProgress;
        self.tasks.values().filter(running).filter(with_key).count() as u32
    }

    /// The leader's pick with a fresh fairness clock, written from the rules alone: the keys of each queue
    /// (concurrency key, "" without one) all start at pass 0; each step serves, per queue, the first key in
    /// (pass, key) order whose best ready task (priority, FIFO) has a free slot of its concurrency key, lifting
    /// the keys passed over to that key's pass; the best of the queues' heads (priority, FIFO) is taken and its
    /// key's pass grows by `STRIDE_ONE / weight`.
    pub(super) fn ready(&self, tenant: &str, queues: &[String], count: usize) -> Vec<TaskId> {
        type Rk = (Reverse<u8>, u64, TaskId);
        let mut qs: Vec<&String> = Vec::new();
        for q in queues {
            if !qs.contains(&q) && !self.paused.contains(&(tenant.to_string(), q.clone())) {
                qs.push(q);
            }
        }
        let mut lists: Vec<BTreeMap<String, Vec<Rk>>> = vec![BTreeMap::new(); qs.len()];
        for (id, t) in &self.tasks {
            let Some(qi) = qs.iter().position(|q| **q == t.queue) else { continue };
            if t.tenant == tenant && t.ready(self.now) {
                let key = t.ckey.as_ref().map(|c| c.0.clone()).unwrap_or_default();
                lists[qi].entry(key).or_default().push((Reverse(t.priority), t.seq, *id));
            }
        }
        lists.iter_mut().flat_map(|l| l.values_mut()).for_each(|v| v.sort());
        let mut pass: Vec<BTreeMap<String, u64>> =
            lists.iter().map(|l| l.keys().map(|k| (k.clone(), 0)).collect()).collect();
        let mut taken: HashMap<String, u32> = HashMap::new();
        let blocked = |rk: &Rk, taken: &HashMap<String, u32>| match &self.tasks[&rk.2].ckey {
            Some((key, limit)) => {
                self.running(tenant, key) + taken.get(key).copied().unwrap_or(0) >= self.key_limit(tenant, key, *limit)
            }
            None => false,
        };
        let mut out = Vec::new();
        while out.len() < count {
            let mut best: Option<(Rk, usize, String)> = None;
            for qi in 0..qs.len() {
                let mut order: Vec<(u64, String)> = pass[qi].iter().map(|(k, p)| (*p, k.clone())).collect();
                order.sort();
                let mut passed = Vec::new();
                let mut found = None;
                for (p, k) in order {
                    match lists[qi][&k].first() {
                        Some(rk) if !blocked(rk, &taken) => {
                            found = Some((*rk, k, p));
                            break;
                        }
                        _ => passed.push(k),
                    }
                }
                let Some((rk, k, p)) = found else { continue };
                for x in passed {
                    pass[qi].insert(x, p);
                }
                if best.as_ref().is_none_or(|b| rk < b.0) {
                    best = Some((rk, qi, k));
                }
            }
            let Some((rk, qi, k)) = best else { break };
            lists[qi].get_mut(&k).expect("listed").remove(0);
            if !k.is_empty() {
                *taken.entry(k.clone()).or_default() += 1;
            }
            let w = self.weights.get(&(tenant.to_string(), qs[qi].clone(), k.clone())).copied().unwrap_or(1);
            *pass[qi].get_mut(&k).expect("listed") += crate::queue::fair::STRIDE_ONE / u64::from(w);
            out.push(rk.2);
        }
        out
    }

    pub(super) fn claim(&mut self, id: &TaskId, tenant: &str, lease_ms: u64, pos: u64) -> ItemResult<LeaseToken> {
        let (now, token) = (self.now, self.index * MAX_ITEMS_PER_COMMAND + pos);
        let paused = self.paused.clone();
        let full = match self.tasks.get(id).and_then(|t| t.ckey.clone()) {
            Some((key, limit)) => self.running(tenant, &key) >= self.key_limit(tenant, &key, limit),
            None => false,
        };
        let t = self.owned(id, tenant).ok_or(Rejected::NotFound)?;
        if !t.ready(now) || paused.contains(&(t.tenant.clone(), t.queue.clone())) || full {
            return Err(Rejected::NotClaimable);
        }
        t.state = TaskState::InProgress;
        t.attempts += 1;
        t.token = Some(token);
        t.deadline = now + lease_ms;
        if t.runs.len() >= MAX_RUNS_KEPT {
            t.runs.remove(0);
        }
        t.runs.push((token, None));
        self.history.entry(*id).or_default().push(token);
        self.issued.push(token);
        Ok(token)
    }

    pub(super) fn ack(&mut self, id: &TaskId, tenant: &str, token: LeaseToken, action: &AckAction) -> Outcome {
        let current = self
            .tasks
            .get(id)
            .is_some_and(|t| t.tenant == tenant && t.state == TaskState::InProgress && t.token == Some(token));
        // A follow-up must be new and in the completed task's shard, or the completion is refused whole.
        let clash = match action {
            AckAction::CompleteWith { follow_ups, .. } => {
                follow_ups.iter().any(|n| self.tasks.contains_key(&n.id) || n.id.shard(SHARDS) != id.shard(SHARDS))
            }
            _ => false,
        };
        let outcome = self.ack_task(id, tenant, token, action, clash)?;
        if let (AckAction::CompleteWith { follow_ups, .. }, true) = (action, current) {
            for (j, n) in follow_ups.iter().enumerate() {
                self.enqueue(1 + j as u64, n).expect("checked: a new id");
            }
        }
        Ok(outcome)
    }

    pub(super) fn ack_task(
        &mut self,
        id: &TaskId,
        tenant: &str,
        token: LeaseToken,
        action: &AckAction,
        clash: bool,
    ) -> Outcome {
        let (now, index) = (self.now, self.index);
        let seq = index * MAX_ITEMS_PER_COMMAND;
        let t = self.owned(id, tenant).ok_or(Rejected::NotFound)?;
        let current = t.state == TaskState::InProgress && t.token == Some(token);
        if !current && t.last_ack == Some((token, action.kind())) {
            return Ok((t.state, (now, now)));
        }
        if t.state != TaskState::InProgress {
            return Err(Rejected::NotInProgress);
        }
        if t.token != Some(token) {
            return Err(Rejected::LeaseLost);
        }
        if clash {
            return Err(Rejected::IdExists);
        }
        if !action.is_heartbeat() {
            t.last_ack = Some((token, action.kind()));
        }
        let run_end = match action {
            AckAction::Complete { .. } | AckAction::CompleteWith { .. } => Some(RunOutcome::Completed),
            AckAction::Fail { retryable: false, .. } => Some(RunOutcome::Failed),
            AckAction::Fail { .. } | AckAction::Nack { .. } => Some(RunOutcome::Retried),
            AckAction::Abandon => Some(RunOutcome::Abandoned),
            AckAction::Exception { .. } => Some(RunOutcome::Exception),
            AckAction::Heartbeat { .. } | AckAction::Progress { .. } => None,
        };
        if let Some(o) = run_end {
            t.close_run(o);
        }
        match action {
            AckAction::Complete { .. } | AckAction::CompleteWith { .. } => t.end(TaskState::Completed, now, index),
            AckAction::Fail { retryable: false, .. } => t.end(TaskState::Failed, now, index),
            AckAction::Fail { retryable: true, .. } | AckAction::Nack { delay_ms: None, .. } => {
                let delay = backoff_range(&t.retry, t.attempts);
                t.retry_or_dead(now, delay, seq);
            }
            AckAction::Nack { delay_ms: Some(d), .. } => t.retry_or_dead(now, (*d, *d), seq),
            AckAction::Abandon => {
                t.attempts -= 1;
                t.retry_or_dead(now, (0, 0), seq);
            }
            AckAction::Heartbeat { extend_ms } | AckAction::Progress { extend_ms, .. } => {
                t.deadline = t.deadline.max(now + extend_ms)
            }
            AckAction::Exception { reason: ExceptionReason::MalformedPayload, .. } => {
                t.end(TaskState::Failed, now, index)
            }
            AckAction::Exception { reason: ExceptionReason::WorkerShutdown, .. } => {
                t.attempts -= 1;
                t.retry_or_dead(now, (0, 0), seq);
            }
            AckAction::Exception { .. } => {
                let delay = backoff_range(&t.retry, t.attempts);
                t.retry_or_dead(now, delay, seq);
            }
        }
        let at = match t.state {
            TaskState::Pending => t.visible_range.unwrap_or((t.visible_at, t.visible_at)),
            TaskState::InProgress => (t.deadline, t.deadline),
            _ => (now, now),
        };
        Ok((t.state, at))
    }

    pub(super) fn cancel(&mut self, id: &TaskId, tenant: &str) -> ItemResult<TaskState> {
        let (now, index) = (self.now, self.index);
        let t = self.owned(id, tenant).ok_or(Rejected::NotFound)?;
        if t.state.is_terminal() {
            return Err(Rejected::AlreadyEnded);
        }
        t.close_run(RunOutcome::Cancelled);
        t.end(TaskState::Cancelled, now, index);
        Ok(TaskState::Cancelled)
    }

    /// What the leader's resolver proposes: every (held task, dependency) whose dependency ended or is gone.
    pub(super) fn resolutions(&self) -> Vec<DependencyResolved> {
        let mut out = Vec::new();
        for (id, t) in &self.tasks {
            if t.state != TaskState::Pending {
                continue;
            }
            for d in &t.waiting_on {
                let outcome = match self.tasks.get(d) {
                    Some(dt) if dt.state.is_terminal() => Some(dt.state),
                    Some(_) => continue,
                    None => None,
                };
                out.push(DependencyResolved { task_id: *id, dependency: *d, outcome });
            }
        }
        out
    }

    /// Applies resolutions: all-completed cancels on anything but a completion, otherwise the dependency is
    /// crossed off (the task becomes pending from this entry when none is left).
    pub(super) fn resolve(&mut self, items: &[DependencyResolved]) -> u64 {
        let (now, index) = (self.now, self.index);
        let mut changed = 0;
        for (pos, r) in items.iter().enumerate() {
            let Some(t) = self.tasks.get_mut(&r.task_id) else { continue };
            if t.state != TaskState::Pending || !t.waiting_on.contains(&r.dependency) {
                continue;
            }
            changed += 1;
            t.waiting_on.retain(|d| *d != r.dependency);
            if r.outcome != Some(TaskState::Completed) && !t.all_resolved {
                t.end(TaskState::Cancelled, now, index);
            } else if t.waiting_on.is_empty() {
                t.seq = index * MAX_ITEMS_PER_COMMAND + pos as u64;
            }
        }
        changed
    }

    pub(super) fn dead_of(&self, tenant: &str, queue: &str) -> BTreeSet<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.state == TaskState::DeadLettered && t.tenant == tenant && t.queue == queue)
            .map(|(id, _)| *id)
            .collect()
    }

    pub(super) fn redrive(&mut self, tenant: &str, queue: &str) -> BTreeSet<TaskId> {
        let ids = self.dead_of(tenant, queue);
        let (now, seq) = (self.now, self.index * MAX_ITEMS_PER_COMMAND);
        for id in &ids {
            let t = self.tasks.get_mut(id).expect("listed above");
            t.state = TaskState::Pending;
            t.attempts = 0;
            t.visible_at = now;
            t.seq = seq;
        }
        ids
    }

    pub(super) fn purge(&mut self, tenant: &str, queue: &str) -> BTreeSet<TaskId> {
        let ids = self.dead_of(tenant, queue);
        self.tasks.retain(|id, _| !ids.contains(id));
        ids
    }

    pub(super) fn sizes(&self, shard: usize) -> IndexSizes {
        let mut s = IndexSizes::default();
        for (_, t) in self.tasks.iter().filter(|(id, _)| id.shard(SHARDS) == shard) {
            match t.state {
                TaskState::Pending if !t.waiting_on.is_empty() => s.held += 1,
                TaskState::Pending if t.visible_at > self.now => s.delayed += 1,
                TaskState::Pending => s.ready += 1,
                TaskState::InProgress => s.leases += 1,
                TaskState::DeadLettered => s.dead += 1,
                TaskState::Completed | TaskState::Failed | TaskState::Cancelled => s.retention += 1,
            }
        }
        s.deadlines = self
            .tasks
            .iter()
            .filter(|(id, t)| id.shard(SHARDS) == shard && !t.state.is_terminal() && t.task_deadline.is_some())
            .count();
        s.keys = self.keys.values().filter(|(id, _)| id.shard(SHARDS) == shard).count()
            + self.mode_keys.values().filter(|id| id.shard(SHARDS) == shard).count();
        s
    }

    pub(super) fn counts(&self) -> BTreeMap<QueueKey, StateCounts> {
        let mut out: BTreeMap<QueueKey, StateCounts> = BTreeMap::new();
        for t in self.tasks.values() {
            let c = out.entry(QueueKey { tenant: t.tenant.clone(), queue: t.queue.clone() }).or_default();
            let slot = match t.state {
                TaskState::Pending if !t.waiting_on.is_empty() => &mut c.delayed,
                TaskState::Pending if t.visible_at > self.now => &mut c.delayed,
                TaskState::Pending => &mut c.pending,
                TaskState::InProgress => &mut c.in_progress,
                TaskState::Completed => &mut c.completed,
                TaskState::Failed => &mut c.failed,
                TaskState::Cancelled => &mut c.cancelled,
                TaskState::DeadLettered => &mut c.dead_lettered,
            };
            *slot += 1;
        }
        out
    }
}
