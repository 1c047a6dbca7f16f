//! Apply: committed entries into each shard's in-memory layer of changes (`shard::Layer`), which the flusher
//! writes into the shard files with the shard's `last_applied` (`flush.rs`). A shard skips entries at or below
//! its own `last_applied`, and `applied_state` reports the minimum, so after a crash between two shard writes each
//! shard replays exactly what it lacks (every effect on a shard depends only on that shard, see
//! `queue::ShardCore`). The rules themselves are `queue`'s.

use std::io;

use futures::StreamExt;
use openraft::storage::EntryResponder;
use openraft::{EntryPayload, OptionalSend};

use super::codec::io_err;
use super::shard::CachedStore;
use super::state_machine::{Shards, SmShared, StateMachine};
use crate::queue::{ApplyContext, Command, Effects, Response};
use crate::raft::types::{Entry, StoredMembership, TypeConfig};
use crate::raft::version;
use crate::telemetry::EntryKind;

/// Task items (creates, claims, acks) a batch may hold and still be applied on the async runtime's thread: about
/// a millisecond of apply at most. 512 rather than 64: at half of three nodes' peak the batches hold ~115 items on
/// average, and handing each to a blocking thread and back cost ~2 % more CPU per task (docs/performance.md,
/// "Huge pages and the latency tail").
const INLINE_ITEMS: usize = 512;

/// An entry's kind for the metrics and for `light`, and the task items (creates, claims, acks) it carries.
fn kind_of(e: &Entry) -> (EntryKind, usize) {
    match &e.payload {
        EntryPayload::Blank | EntryPayload::Membership(_) => (EntryKind::Raft, 0),
        EntryPayload::Normal(req) => match &*req.command {
            Command::Enqueue(v) => (EntryKind::Enqueue, v.len()),
            Command::Claim(v) => (EntryKind::Claim, v.len()),
            Command::Ack(v) => (EntryKind::Ack, v.len()),
            _ => (EntryKind::Other, 0),
        },
    }
}

/// Whether `batch` is cheap to apply: only the per-task commands, at most `INLINE_ITEMS` items in all. Others (a
/// tick's expiries, redrives, purges) may touch any number of tasks, and go to a blocking thread.
fn light(batch: &[Entry]) -> bool {
    let mut items = 0;
    for e in batch {
        let (kind, n) = kind_of(e);
        items += n;
        if kind == EntryKind::Other || items > INLINE_ITEMS {
            return false;
        }
    }
    true
}

/// Counts a batch of committed entries by kind, and the task items each carries (`raftq_applied_entries_total`).
fn count_entries(m: &crate::telemetry::Metrics, batch: &[Entry]) {
    m.apply_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for e in batch {
        let (kind, items) = kind_of(e);
        m.applied(kind, items as u64);
    }
}

impl StateMachine {
    /// `RaftStateMachine::apply`: applies the entries (off the async runtime unless `light`), answers each entry's
    /// responder, then notifies the node (metrics, result waiters, parked claims, the webhook sender, the applied
    /// index).
    pub(super) async fn apply_entries<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            batch.push(entry);
            responders.push(responder);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let last = batch.last().map(|e| e.log_id.index).unwrap_or(0);
        count_entries(&self.shared.metrics, &batch);
        let shared = self.shared.clone();
        // A light batch is applied right here: handing it to a blocking thread and back costs two thread wake-ups,
        // more than applying a few commands.
        let (responses, fx) = if light(&batch) && !shared.flush_behind() {
            Self::apply_batch(&shared, &batch)?
        } else {
            tokio::task::spawn_blocking(move || Self::apply_batch(&shared, &batch)).await.map_err(io_err)??
        };
        for (responder, resp) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(resp);
            }
        }
        self.record(&fx);
        for id in fx.ended {
            let _ = self.shared.ended.send(id);
        }
        for r in fx.revoked {
            let _ = self.shared.revoked.send(r);
        }
        if !fx.ready.is_empty() {
            self.shared.work.send_modify(|v| *v += 1);
        }
        if fx.webhooks_added > 0 {
            self.shared.webhooks.send_modify(|v| *v += 1);
        }
        self.shared.applied.send_replace(last);
        Ok(())
    }

    /// Applies a batch of committed entries into each shard's in-memory layer (the flusher writes them to the
    /// files), each shard skipping entries at or below its own `last_applied`.
    fn apply_batch(shared: &SmShared, entries: &[Entry]) -> io::Result<(Vec<Response>, Effects)> {
        shared.before_apply()?;
        let mut g = shared.write();
        let Shards { dbs, cores, metas, dirty, frozen, newest, file_newest, .. } = &mut *g;
        let mut fx = Effects::default();
        let mut responses = Vec::with_capacity(entries.len());
        {
            let mut stores: Vec<CachedStore> = dirty
                .iter_mut()
                .zip(frozen.iter())
                .zip(dbs.iter())
                .zip(newest.iter_mut().zip(file_newest.iter()))
                .map(|(((d, f), db), (n, filed))| CachedStore::new(d, f, db, n, *filed))
                .collect();
            for entry in entries {
                let log_id = entry.log_id;
                let idx = log_id.index;
                let behind: Vec<bool> =
                    metas.iter().map(|m| m.last_applied.as_ref().is_none_or(|l| l.index < idx)).collect();
                let resp = match &entry.payload {
                    EntryPayload::Blank => Response::None,
                    EntryPayload::Membership(mem) => {
                        for (m, _) in metas.iter_mut().zip(&behind).filter(|(_, b)| **b) {
                            m.membership = StoredMembership::new(Some(log_id), mem.clone());
                        }
                        Response::None
                    }
                    EntryPayload::Normal(req) => {
                        if let Command::SetClusterVersion { version } = *req.command {
                            version::check_can_apply(version)?;
                        }
                        let mut cx = ApplyContext::new(idx, req, &mut fx);
                        for i in 0..cores.len() {
                            if behind[i] {
                                cores[i].apply(&mut stores[i], &mut cx, req)?;
                                metas[i].now = cores[i].now;
                            }
                        }
                        cx.finish()
                    }
                };
                for (m, _) in metas.iter_mut().zip(&behind).filter(|(_, b)| **b) {
                    m.last_applied = Some(log_id);
                }
                responses.push(resp);
            }
        }
        let changed = dirty.iter().map(|d| d.len()).sum();
        shared.limits_set.store(g.any_limits(), std::sync::atomic::Ordering::Relaxed);
        shared.rates_set.store(g.any_rates(), std::sync::atomic::Ordering::Relaxed);
        shared.set_dependents(g.any_dependents());
        drop(g);
        shared.note_changed(changed);
        Ok((responses, fx))
    }

    /// Feeds the task metrics from a batch's effects.
    fn record(&self, fx: &Effects) {
        use crate::telemetry::TaskEvent::*;
        let m = &self.shared.metrics;
        let c = &fx.counts;
        for (e, n) in [
            (Enqueued, c.enqueued),
            (Claimed, c.claimed),
            (Completed, c.completed),
            (Failed, c.failed),
            (Cancelled, c.cancelled),
            (Retried, c.retried),
            (DeadLettered, c.dead_lettered),
            (LeaseExpired, c.lease_expired),
        ] {
            if n > 0 {
                m.count(e, n);
            }
        }
        for (h, v) in [
            (&m.enqueue_to_claim, &fx.enqueue_to_claim_ms),
            (&m.claim_to_end, &fx.claim_to_end_ms),
            (&m.enqueue_to_end, &fx.enqueue_to_end_ms),
        ] {
            for ms in v {
                h.observe_us(ms.saturating_mul(1000));
            }
        }
    }
}
