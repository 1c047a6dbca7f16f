//! What a handler decides about a task, how that becomes worker-stream events, and how the server's answers
//! are read. Pure: no I/O, so every mapping is tested here.

use std::time::Duration;

use bytes::Bytes;
use raftq_proto::v1 as pb;

use crate::task::duration_ms;

/// What a handler decided about its task. There is no default: every handler picks one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done; the bytes are the result producers read back.
    Completed(Bytes),
    /// The handler tried and could not do it. `retryable: true` retries the task after its backoff while
    /// attempts remain (then dead-letters it); `false` fails it for good.
    Failed {
        /// Why; stored with the task.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// Not now: the task goes back to pending after `delay` (zero: the task's backoff). Uses the attempt.
    Nack {
        /// How long until the task is claimable again.
        delay: Duration,
        /// Why; stored with the task.
        reason: String,
    },
    /// Give the task back at once without using an attempt (a worker that should not run it now).
    Abandon,
    /// Done, and these tasks are created with the completion, all or nothing (one Raft entry): if the
    /// completion is refused (the lease was lost), none of them exists. Follow-ups take no idempotency or
    /// concurrency key.
    CompletedWith {
        /// The result producers read back.
        result: Bytes,
        /// Tasks to create.
        follow_ups: Vec<crate::task::NewTask>,
    },
    /// End the run with an exception. `reason` is one of `malformed-payload` (the task fails for good: another
    /// run would do the same), `worker-shutdown` (retried at once, no attempt used), `resource-unavailable` or
    /// `internal-error` (retried after the backoff, the attempt counts).
    Exception {
        /// One of the four reasons above; anything else is refused with `INVALID_ARGUMENT`.
        reason: String,
        /// Details; stored with the task.
        message: String,
    },
}

/// An outcome the server refused, as sent to [`Worker::rejections`](crate::Worker::rejections).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// The task the outcome was for.
    pub task_id: String,
    /// The stable reason (`LEASE_LOST`: the lease ran out and the task was redelivered; `NOT_IN_PROGRESS`,
    /// `ALREADY_ENDED`, `NOT_FOUND`, `INVALID_ARGUMENT`, ...).
    pub reason: String,
    /// The server's message.
    pub message: String,
    /// The outcome that was refused.
    pub outcome: Outcome,
    /// An earlier send of this outcome got no answer (the stream broke, or the write's outcome was
    /// unknown), so that send may have been applied and this refusal may only report it.
    pub maybe_applied: bool,
}

/// An outcome the server applied, as sent to [`Worker::applied`](crate::Worker::applied): the task's result
/// is recorded (a completion is durable on a quorum), so whatever the handler left to do once it is safe (an
/// offset to commit, a local file to delete) can be done.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// The task the outcome was for.
    pub task_id: String,
    /// The outcome that was applied.
    pub outcome: Outcome,
    /// The task's state after it: `COMPLETED`, `FAILED`, `CANCELLED`, `DEAD_LETTERED`, or `PENDING` when it
    /// will run again (a retryable failure, a nack, an abandon).
    pub state: crate::task::TaskState,
    /// When a task that will run again is claimable (ms since the Unix epoch), else 0.
    pub at_ms: i64,
}

/// One task's outcome on its way to the server, with the delivery it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub task_id: String,
    pub token: u64,
    pub outcome: Outcome,
}

/// What one request carries: one outcome, or several completed/failed outcomes in one `ResultBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unit {
    Single(Item),
    Batch(Vec<Item>),
}

impl Unit {
    pub fn items(&self) -> &[Item] {
        match self {
            Unit::Single(i) => std::slice::from_ref(i),
            Unit::Batch(v) => v,
        }
    }
}

/// Groups outcomes into requests: with `batch`, completed and failed outcomes travel together in one
/// `ResultBatch` (the server has no batch form of nack and abandon, so those go one by one).
pub(crate) fn plan(items: Vec<Item>, batch: bool) -> Vec<Unit> {
    let (results, others): (Vec<Item>, Vec<Item>) = items.into_iter().partition(|i| {
        matches!(i.outcome, Outcome::Completed(_) | Outcome::CompletedWith { .. } | Outcome::Failed { .. })
    });
    let mut units: Vec<Unit> = Vec::new();
    if batch && results.len() > 1 {
        units.push(Unit::Batch(results));
    } else {
        units.extend(results.into_iter().map(Unit::Single));
    }
    units.extend(others.into_iter().map(Unit::Single));
    units
}

fn result(request_id: u64, item: &Item) -> Option<pb::Result> {
    let outcome = match &item.outcome {
        Outcome::Completed(b) => pb::result::Outcome::Completed(pb::Complete { result: b.clone(), follow_ups: vec![] }),
        Outcome::CompletedWith { result, follow_ups } => pb::result::Outcome::Completed(pb::Complete {
            result: result.clone(),
            follow_ups: follow_ups.iter().cloned().map(crate::task::NewTask::into_proto).collect(),
        }),
        Outcome::Failed { error, retryable } => {
            pb::result::Outcome::Failed(pb::Fail { error: error.clone(), retryable: *retryable })
        }
        Outcome::Nack { .. } | Outcome::Abandon | Outcome::Exception { .. } => return None,
    };
    Some(pb::Result { request_id, task_id: item.task_id.clone(), token: item.token, outcome: Some(outcome) })
}

/// The event that sends `unit` as request `request_id`.
pub(crate) fn unit_event(unit: &Unit, request_id: u64) -> pb::WorkerEvent {
    use pb::worker_event::Event;
    let event = match unit {
        Unit::Batch(items) => Event::ResultBatch(pb::ResultBatch {
            request_id,
            results: items.iter().filter_map(|i| result(request_id, i)).collect(),
        }),
        Unit::Single(item) => match &item.outcome {
            Outcome::Completed(_) | Outcome::CompletedWith { .. } | Outcome::Failed { .. } => {
                Event::Result(result(request_id, item).expect("completed and failed map to a Result"))
            }
            Outcome::Nack { delay, reason } => Event::Nack(pb::NackTask {
                request_id,
                task_id: item.task_id.clone(),
                token: item.token,
                delay_ms: duration_ms(*delay),
                reason: reason.clone(),
            }),
            Outcome::Abandon => {
                Event::Abandon(pb::AbandonTask { request_id, task_id: item.task_id.clone(), token: item.token })
            }
            Outcome::Exception { reason, message } => Event::Exception(pb::ExceptionTask {
                request_id,
                task_id: item.task_id.clone(),
                token: item.token,
                exception: Some(pb::Exception { reason: reason.clone(), message: message.clone() }),
            }),
        },
    };
    pb::WorkerEvent { event: Some(event) }
}

/// The unary `Ack` action that reports `outcome`.
pub(crate) fn ack_action(outcome: &Outcome) -> pb::ack_request::Action {
    use pb::ack_request::Action;
    match outcome {
        Outcome::Completed(b) => Action::Complete(pb::Complete { result: b.clone(), follow_ups: vec![] }),
        Outcome::CompletedWith { result, follow_ups } => Action::Complete(pb::Complete {
            result: result.clone(),
            follow_ups: follow_ups.iter().cloned().map(crate::task::NewTask::into_proto).collect(),
        }),
        Outcome::Failed { error, retryable } => Action::Fail(pb::Fail { error: error.clone(), retryable: *retryable }),
        Outcome::Nack { delay, reason } => {
            Action::Nack(pb::Nack { delay_ms: duration_ms(*delay), reason: reason.clone() })
        }
        Outcome::Abandon => Action::Abandon(pb::Abandon {}),
        Outcome::Exception { reason, message } => {
            Action::Exception(pb::Exception { reason: reason.clone(), message: message.clone() })
        }
    }
}

/// A Ready asking for up to `count` tasks of `queues` under a lease of `lease_ms`.
pub(crate) fn ready_event(request_id: u64, queues: &[String], lease_ms: u64, count: u32) -> pb::WorkerEvent {
    pb::WorkerEvent {
        event: Some(pb::worker_event::Event::Ready(pb::Ready {
            request_id,
            queues: queues.to_vec(),
            lease_seconds: 0,
            count,
            lease_ms,
        })),
    }
}

/// A lease extension by `extend_ms` from now.
pub(crate) fn heartbeat_event(request_id: u64, task_id: &str, token: u64, extend_ms: u64) -> pb::WorkerEvent {
    pb::WorkerEvent {
        event: Some(pb::worker_event::Event::Heartbeat(pb::HeartbeatTask {
            request_id,
            task_id: task_id.to_string(),
            token,
            extend_ms,
            progress: None,
        })),
    }
}

/// What a `TaskAck` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Applied,
    Refused { reason: String, message: String },
}

pub(crate) fn verdict(ack: &pb::TaskAck) -> Verdict {
    if ack.applied {
        Verdict::Applied
    } else {
        Verdict::Refused {
            reason: if ack.reason.is_empty() { "UNKNOWN".into() } else { ack.reason.clone() },
            message: ack.message.clone(),
        }
    }
}

/// Pairs the acks of a `ResultBatch` with its items by task id (the server answers in order, one per
/// result); `None` when they do not match one to one.
pub(crate) fn pair_acks<'a>(items: &'a [Item], acks: &'a [pb::TaskAck]) -> Option<Vec<(&'a Item, &'a pb::TaskAck)>> {
    if items.len() != acks.len() {
        return None;
    }
    let pairs: Vec<_> = items.iter().zip(acks).collect();
    pairs.iter().all(|(i, a)| i.task_id == a.task_id).then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::worker_event::Event;

    fn item(id: &str, outcome: Outcome) -> Item {
        Item { task_id: id.into(), token: 7, outcome }
    }

    fn failed() -> Outcome {
        Outcome::Failed { error: "boom".into(), retryable: true }
    }

    #[test]
    fn each_outcome_maps_to_its_event_with_the_fencing_token() {
        let done = unit_event(&Unit::Single(item("a", Outcome::Completed("r".into()))), 1);
        assert_eq!(
            done.event,
            Some(Event::Result(pb::Result {
                request_id: 1,
                task_id: "a".into(),
                token: 7,
                outcome: Some(pb::result::Outcome::Completed(pb::Complete { result: "r".into(), follow_ups: vec![] })),
            }))
        );
        let fail = unit_event(&Unit::Single(item("a", failed())), 2);
        assert!(matches!(
            fail.event,
            Some(Event::Result(pb::Result {
                outcome: Some(pb::result::Outcome::Failed(pb::Fail { retryable: true, .. })),
                token: 7,
                ..
            }))
        ));
        let nack = unit_event(
            &Unit::Single(item("a", Outcome::Nack { delay: Duration::from_millis(1500), reason: "later".into() })),
            3,
        );
        assert_eq!(
            nack.event,
            Some(Event::Nack(pb::NackTask {
                request_id: 3,
                task_id: "a".into(),
                token: 7,
                delay_ms: 1500,
                reason: "later".into()
            }))
        );
        let abandon = unit_event(&Unit::Single(item("a", Outcome::Abandon)), 4);
        assert_eq!(
            abandon.event,
            Some(Event::Abandon(pb::AbandonTask { request_id: 4, task_id: "a".into(), token: 7 }))
        );
    }

    #[test]
    fn batches_group_results_and_send_nacks_and_abandons_alone() {
        let items = vec![
            item("a", Outcome::Completed(Bytes::new())),
            item("b", Outcome::Abandon),
            item("c", failed()),
            item("d", Outcome::Nack { delay: Duration::ZERO, reason: String::new() }),
        ];
        let units = plan(items.clone(), true);
        assert_eq!(units.len(), 3, "{units:?}");
        assert!(matches!(&units[0], Unit::Batch(v) if v.len() == 2 && v[0].task_id == "a" && v[1].task_id == "c"));
        match unit_event(&units[0], 9).event {
            Some(Event::ResultBatch(b)) => {
                assert_eq!(b.request_id, 9);
                assert_eq!(b.results.len(), 2);
            }
            other => panic!("expected a ResultBatch, got {other:?}"),
        }
        // Without batching every outcome is its own request.
        assert_eq!(plan(items, false).len(), 4);
        // A batch of one is a plain Result.
        assert!(matches!(plan(vec![item("a", failed())], true)[0], Unit::Single(_)));
    }

    #[test]
    fn refused_acks_carry_their_reason() {
        let ok = pb::TaskAck { applied: true, ..Default::default() };
        assert_eq!(verdict(&ok), Verdict::Applied);
        let lost = pb::TaskAck {
            applied: false,
            reason: "LEASE_LOST".into(),
            message: "the lease token is not the current one".into(),
            ..Default::default()
        };
        assert_eq!(
            verdict(&lost),
            Verdict::Refused { reason: "LEASE_LOST".into(), message: "the lease token is not the current one".into() }
        );
        let blank = pb::TaskAck { applied: false, ..Default::default() };
        assert!(matches!(verdict(&blank), Verdict::Refused { reason, .. } if reason == "UNKNOWN"));
    }

    #[test]
    fn batch_acks_pair_by_task_id_or_not_at_all() {
        let items = vec![item("a", failed()), item("b", failed())];
        let ack = |id: &str| pb::TaskAck { task_id: id.into(), applied: true, ..Default::default() };
        assert!(pair_acks(&items, &[ack("a"), ack("b")]).is_some());
        assert!(pair_acks(&items, &[ack("b"), ack("a")]).is_none());
        assert!(pair_acks(&items, &[ack("a")]).is_none());
    }

    #[test]
    fn each_outcome_maps_to_its_unary_ack_action() {
        use pb::ack_request::Action;
        let follow_up = crate::task::NewTask::new("next", "p");
        let with = Outcome::CompletedWith { result: "r".into(), follow_ups: vec![follow_up.clone()] };
        assert_eq!(
            ack_action(&with),
            Action::Complete(pb::Complete { result: "r".into(), follow_ups: vec![follow_up.into_proto()] })
        );
        assert_eq!(ack_action(&failed()), Action::Fail(pb::Fail { error: "boom".into(), retryable: true }));
        let nack = Outcome::Nack { delay: Duration::from_millis(1500), reason: "later".into() };
        assert_eq!(ack_action(&nack), Action::Nack(pb::Nack { delay_ms: 1500, reason: "later".into() }));
        assert_eq!(ack_action(&Outcome::Abandon), Action::Abandon(pb::Abandon {}));
        let ex = Outcome::Exception { reason: "internal-error".into(), message: "m".into() };
        assert_eq!(
            ack_action(&ex),
            Action::Exception(pb::Exception { reason: "internal-error".into(), message: "m".into() })
        );
    }

    #[test]
    fn ready_asks_for_the_lease_in_ms() {
        let r = ready_event(5, &["q".into()], 1500, 8);
        assert_eq!(
            r.event,
            Some(Event::Ready(pb::Ready {
                request_id: 5,
                queues: vec!["q".into()],
                lease_seconds: 0,
                count: 8,
                lease_ms: 1500
            }))
        );
    }
}
