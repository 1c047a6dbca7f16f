//! `CreateSchedule`, `UpdateSchedule`, `FireSchedule`: a schedule is a record in the shard of its id's
//! placement. The leader's ticker computes occurrences (`queue::cron`, never here) and proposes each as
//! `FireSchedule`; an occurrence at or before the last one recorded is ignored, so each fires exactly once.

use super::context::ApplyContext;
use crate::queue::shard::ShardCore;
use crate::queue::store::TaskStore;
use crate::queue::types::*;

/// The response slot of the schedule commands: the schedule after the command (`None` once deleted).
type ScheduleSlot = Option<ItemResult<Option<Box<Schedule>>>>;

/// What an `UpdateSchedule` does.
#[derive(Debug, Clone, Copy)]
pub(super) enum ScheduleChange {
    Delete,
    SetPaused(bool),
}

impl ShardCore {
    pub(super) fn apply_create_schedule<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        sch: &Schedule,
        slot: &mut ScheduleSlot,
    ) -> Result<(), S::Error> {
        if !self.mine(&sch.id) {
            return Ok(());
        }
        *slot = Some(if self.idx.schedules.contains_key(&sch.id) {
            Err(Rejected::IdExists)
        } else {
            let mut sch = sch.clone();
            sch.created_at = cx.now;
            store.put_schedule(&sch)?;
            self.idx.schedules.insert(sch.id, sch.clone());
            Ok(Some(Box::new(sch)))
        });
        Ok(())
    }

    pub(super) fn apply_update_schedule<S: TaskStore>(
        &mut self,
        store: &mut S,
        _cx: &mut ApplyContext<'_>,
        tenant: &str,
        id: &TaskId,
        change: ScheduleChange,
        slot: &mut ScheduleSlot,
    ) -> Result<(), S::Error> {
        if !self.mine(id) {
            return Ok(());
        }
        *slot = Some(match (self.idx.schedules.get(id).filter(|s| s.tenant == tenant).cloned(), change) {
            (None, _) => Err(Rejected::NotFound),
            (Some(_), ScheduleChange::Delete) => {
                store.remove_schedule(id)?;
                self.idx.schedules.remove(id);
                Ok(None)
            }
            (Some(mut sch), ScheduleChange::SetPaused(paused)) => {
                sch.paused = paused;
                store.put_schedule(&sch)?;
                self.idx.schedules.insert(*id, sch.clone());
                Ok(Some(Box::new(sch)))
            }
        });
        Ok(())
    }

    pub(super) fn apply_fire_schedule<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        id: &TaskId,
        occurrence: TimeMs,
        task: Option<&NewTask>,
        fired: &mut bool,
    ) -> Result<(), S::Error> {
        if self.mine(id) {
            *fired = self.fire(store, cx, id, occurrence, task)?;
        }
        Ok(())
    }

    /// One occurrence of a schedule: exactly once, because an occurrence at or before the last one recorded (in
    /// the same shard, the same transaction) is ignored. The task lands in the schedule's shard.
    fn fire<S: TaskStore>(
        &mut self,
        store: &mut S,
        cx: &mut ApplyContext<'_>,
        id: &TaskId,
        occurrence: TimeMs,
        task: Option<&NewTask>,
    ) -> Result<bool, S::Error> {
        let Some(mut sch) = self.idx.schedules.get(id).cloned() else { return Ok(false) };
        if sch.paused || sch.last_occurrence.is_some_and(|last| occurrence <= last) {
            return Ok(false);
        }
        if let Some(n) = task {
            if !self.mine(&n.id) || store.get(&n.id)?.is_some() {
                return Ok(false);
            }
            let mut n = n.clone();
            n.tenant = sch.tenant.clone();
            let seq = cx.seq_base;
            if self.enqueue(store, cx, &n, seq)?.is_ok() {
                if let Some(t) = store.get(&n.id)? {
                    let mut t = Task::clone(&t);
                    t.scheduled = Some((*id, occurrence));
                    store.put(std::sync::Arc::new(t))?;
                }
                sch.fired += 1;
            }
        }
        sch.last_occurrence = Some(occurrence);
        store.put_schedule(&sch)?;
        self.idx.schedules.insert(*id, sch);
        Ok(true)
    }
}
