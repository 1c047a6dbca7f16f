//! Time: what falls due when shard time moves. Runs at the start of every entry, before its command; `Tick`
//! is an entry with nothing else to do, which the leader proposes when something is due and nobody writes.
//!
//! In order: delayed tasks become ready, expired leases are retried or dead-lettered, tasks past their deadline
//! fail, ended tasks past retention are removed, idempotency keys past their window are forgotten, concurrency
//! key overrides past their expiry are removed (`key_limits.rs`).

use std::cmp::Reverse;

use super::context::ApplyContext;
use super::lifecycle::{backoff, close_run, count_requeue, note_ended, retry_or_dead};
use crate::queue::index::fairness_key;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

impl ShardCore {
    /// Does everything that fell due at `cx.now` (the shard's time, already moved to the entry's).
    pub(super) fn advance<S: TaskStore>(&mut self, store: &mut S, cx: &mut ApplyContext<'_>) -> Result<(), S::Error> {
        self.promote_delayed(cx);
        self.expire_leases(store, cx)?;
        self.expire_deadlines(store, cx)?;
        self.expire_retention(store, cx.now)?;
        self.expire_keys(store, cx.now)?;
        self.expire_key_limits(store, cx)
    }

    /// Delayed tasks whose visible time has come move to the ready index (their records do not change).
    fn promote_delayed(&mut self, cx: &mut ApplyContext<'_>) {
        let idx = &mut self.idx;
        while let Some(entry) = idx.delayed.first_entry() {
            if entry.key().0 > cx.now {
                break;
            }
            let ((_, id), d) = entry.remove_entry();
            if let Some(c) = idx.counts.get_mut(&d.qk) {
                c.delayed = c.delayed.saturating_sub(1);
                c.pending += 1;
            }
            let limit = d.key.as_ref().map_or(0, |c| c.limit);
            idx.ready_insert(&d.qk, fairness_key(d.key.as_ref()), (Reverse(d.priority), d.seq, id), limit);
            cx.fx.ready.insert(d.qk);
        }
    }

    /// A running task whose lease deadline passed is retried after its backoff, or dead-lettered.
    fn expire_leases<S: TaskStore>(&mut self, store: &mut S, cx: &mut ApplyContext<'_>) -> Result<(), S::Error> {
        let now = cx.now;
        while let Some(&(deadline, id)) = self.idx.leases.first() {
            if deadline > now {
                break;
            }
            let before = match store.get(&id)? {
                Some(t)
                    if t.state == TaskState::InProgress && t.lease.as_ref().map(|l| l.deadline) == Some(deadline) =>
                {
                    t
                }
                _ => {
                    self.idx.leases.remove(&(deadline, id));
                    continue;
                }
            };
            let mut t = Task::clone(&before);
            let delay = backoff(&t, cx.seed);
            t.last_error = Some("lease expired".to_string());
            close_run(&mut t, now, RunOutcome::LeaseExpired, "");
            retry_or_dead(&mut t, now, delay, cx.seq_base);
            let t = self.update(store, cx, &before, t)?;
            self.note_pending(&t, cx.fx);
            cx.fx.counts.lease_expired += 1;
            count_requeue(&t, cx.fx);
        }
        Ok(())
    }

    /// A task not ended by its deadline fails with `DEADLINE_EXCEEDED`, whatever its state.
    fn expire_deadlines<S: TaskStore>(&mut self, store: &mut S, cx: &mut ApplyContext<'_>) -> Result<(), S::Error> {
        let now = cx.now;
        while let Some(&(due, id)) = self.idx.deadlines.first() {
            if due > now {
                break;
            }
            let before = match store.get(&id)? {
                Some(t) if !t.state.is_terminal() && t.deadline == Some(due) => t,
                _ => {
                    self.idx.deadlines.remove(&(due, id));
                    continue;
                }
            };
            let mut t = Task::clone(&before);
            close_run(&mut t, now, RunOutcome::DeadlineExceeded, DEADLINE_EXCEEDED);
            t.state = TaskState::Failed;
            t.last_error = Some(DEADLINE_EXCEEDED.to_string());
            t.lease = None;
            t.dead_at = None;
            t.ended_at = Some(now);
            t.updated_at = now;
            let t = self.update(store, cx, &before, t)?;
            cx.fx.counts.failed += 1;
            note_ended(&t, now, cx.fx);
        }
        Ok(())
    }

    /// Ended tasks past their retention are removed.
    fn expire_retention<S: TaskStore>(&mut self, store: &mut S, now: TimeMs) -> Result<(), S::Error> {
        while let Some(&(due, id)) = self.idx.retention.first() {
            if due > now {
                break;
            }
            self.idx.retention.remove(&(due, id));
            if let Some(t) = store.get(&id)? {
                if let Some(c) = self.idx.counts.get_mut(&QueueKey::of(&t)) {
                    let slot = c.slot(t.state, false);
                    *slot = slot.saturating_sub(1);
                }
                store.remove(&id)?;
            }
        }
        Ok(())
    }

    /// Idempotency keys past their window are forgotten. An index entry left behind by a key replaced after
    /// expiry no longer matches its record, and only the entry goes.
    fn expire_keys<S: TaskStore>(&mut self, store: &mut S, now: TimeMs) -> Result<(), S::Error> {
        while let Some(first) = self.idx.keys.first() {
            if first.0 > now {
                break;
            }
            let (expires_at, tenant, key) = self.idx.keys.pop_first().expect("checked first");
            if let Some(rec) = store.get_key(&tenant, &key)? {
                if rec.expires_at == expires_at {
                    store.remove_key(&tenant, &key)?;
                }
            }
        }
        Ok(())
    }
}
