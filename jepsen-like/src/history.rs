//! The recorded history: one JSON object per line, each an event with its time (ms since the run started) and
//! what happened. Everything the checkers read is in it, so a history file can be checked again offline
//! (`raftq-jepsen check --history FILE`).
//!
//! Operations follow Jepsen's convention: an `invoke` event when a client starts one, then exactly one of
//! `ok` (it happened), `fail` (it certainly did not happen) or `info` (unknown: a timeout, a lost connection,
//! `UNKNOWN_OUTCOME`). An unknown write is never counted as failed.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// The result a worker's handler chose for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultKind {
    /// Completed; the result bytes are the delivery's token, so the final state names the delivery that won.
    Complete,
    /// Failed, retryable: the task goes back to pending (or is dead-lettered when attempts are spent).
    FailRetryable,
    /// Failed for good: the task ends FAILED.
    FailFinal,
}

impl ResultKind {
    /// Whether an accepted result of this kind ends the task.
    pub fn terminal(self) -> bool {
        matches!(self, ResultKind::Complete | ResultKind::FailFinal)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPhase {
    Start,
    Stop,
    /// Something the nemesis observed or could not do (a node refused to start, a transfer failed...).
    Note,
}

/// One delivery as the server keeps it (a task's `runs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRead {
    pub token: u64,
    /// COMPLETED, FAILED, RETRIED, LEASE_EXPIRED, ...; empty while the run is open.
    pub outcome: String,
    /// State-machine time the run ended, or 0.
    pub ended_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Op {
    /// An enqueue of one unique value (the task's payload). `task_id` on `ok`.
    Enqueue {
        process: u32,
        value: String,
        phase: Phase,
        max_attempts: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A task delivered to a worker: one delivery, identified by its fencing token. Times are the leader's
    /// state-machine clock.
    Deliver {
        worker: u32,
        task_id: String,
        value: String,
        token: u64,
        attempts: u32,
        max_attempts: u32,
        claimed_at_ms: i64,
        deadline_ms: i64,
        /// The task's concurrency (fairness) key; empty for a task without one.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        key: String,
    },
    /// A worker's result for one delivery: `invoke` when the handler returns it, then `ok` (the server applied
    /// it), `fail` (refused, with `reason`) or `info` (no answer, or a refusal of a resend whose first send may
    /// have been applied).
    Result {
        worker: u32,
        task_id: String,
        token: u64,
        outcome: ResultKind,
        phase: Phase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A fault: when it started and stopped, and what it did. `node` names the node a corruption or a
    /// refusal to start was about.
    Nemesis {
        fault: String,
        phase: FaultPhase,
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u64>,
    },
    /// A leader stopped by SIGTERM (a rolling restart), as the other nodes saw it: `exit_ms` after the signal its
    /// process had exited; `led_ms` after it another node (`next`) led; `leaderless_ms` is the time between the
    /// last answer that still named the old leader and the first that named the next (at most; they are asked
    /// every 20 ms). None when no other node led within the watch.
    Handover {
        node: u64,
        exit_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        led_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leaderless_ms: Option<u64>,
    },
    /// The leader changed (as seen by the harness polling every node's status).
    Leader { leader: Option<u64>, term: u64 },
    /// A task's state read after the drain; `result` is the completed task's result (the winning token).
    Final {
        task_id: String,
        state: String,
        attempts: u32,
        #[serde(default)]
        result: String,
    },
    /// The server's record of a task's deliveries, read after the drain for each task with a retryable failure
    /// whose outcome the worker never learned: which of them the server ended as a retry, and when.
    Runs { task_id: String, runs: Vec<RunRead> },
    /// One node's state digest after heal and drain.
    Digest { node: u64, applied_index: u64, digest: u64, tasks: u64 },
    /// A step of the run: workload_start, faults_start, faults_end, healed, drained, done; in the upgrade
    /// scenario also `upgraded` (no node runs the previous binary any more).
    Mark { what: String },
    /// The upgrade scenario: from this point node `node` runs `binary` ("old": the previous release, "new": the
    /// build under test), from its next start if it is stopped.
    Binary { node: u64, binary: String },
    /// A node's status named another binary version or cluster version than the last one recorded for it
    /// (polled every 250 ms; a node of the previous release reports 0 and 0).
    ClusterVersion { node: u64, version: u32, cluster_version: u32 },
    /// The limits workload's setup, recorded once every admin call succeeded (before any task was enqueued):
    /// the queue's running cap and each fairness key's concurrency limit, weight and rate limit. The limits
    /// checker reads the limits from here.
    Limits { queue: String, max_running: u32, keys: Vec<KeyLimits> },
    /// The wall clock (ms since the Unix epoch) at this event's `t`: relates the servers' lease deadlines to the
    /// history's clock (recorded at the workload's start and at the end).
    Clock { wall_ms: i64 },
    /// An expectation the upgrade scenario checked as it ran (a command's exit status, a bound on a wait):
    /// the checker reports each one and counts a failed one as a violation.
    Expect { what: String, passed: bool, detail: String },
}

/// One fairness key of the limits workload, as set up on the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyLimits {
    pub key: String,
    /// The concurrency limit every task of the key carries.
    pub limit: u32,
    /// Its fairness weight (1 is the default).
    pub weight: u32,
    /// Its token bucket's rate, claims per second (0: no rate limit), and burst.
    #[serde(default)]
    pub per_second: f64,
    #[serde(default)]
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds since the run started (the harness's monotonic clock).
    pub t: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// Appends events to the history file and keeps them in memory for the checkers.
pub struct Recorder {
    start: Instant,
    inner: Mutex<Inner>,
}

struct Inner {
    out: Option<BufWriter<File>>,
    events: Vec<Event>,
    write_error: Option<String>,
}

impl Recorder {
    pub fn create(path: &Path) -> anyhow::Result<Recorder> {
        let out = BufWriter::new(File::create(path)?);
        Ok(Recorder {
            start: Instant::now(),
            inner: Mutex::new(Inner { out: Some(out), events: Vec::new(), write_error: None }),
        })
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn record(&self, op: Op) {
        let mut g = self.inner.lock().expect("recorder lock poisoned");
        // The time is taken under the lock, so the file is in time order.
        let ev = Event { t: self.now(), op };
        let mut failed = None;
        if let Some(out) = g.out.as_mut() {
            let line = serde_json::to_string(&ev).expect("events serialize");
            if let Err(e) = writeln!(out, "{line}") {
                failed = Some(e.to_string());
            }
        }
        if let Some(e) = failed {
            g.write_error.get_or_insert(e);
        }
        g.events.push(ev);
    }

    /// A copy of everything recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner.lock().expect("recorder lock poisoned").events.clone()
    }

    /// Calls `f` on the events recorded so far without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&self.inner.lock().expect("recorder lock poisoned").events)
    }

    pub fn flush(&self) -> anyhow::Result<()> {
        let mut g = self.inner.lock().expect("recorder lock poisoned");
        if let Some(e) = g.write_error.take() {
            anyhow::bail!("writing the history: {e}");
        }
        if let Some(out) = g.out.as_mut() {
            out.flush()?;
        }
        Ok(())
    }
}

pub fn read_history(path: &Path) -> anyhow::Result<Vec<Event>> {
    let mut events = Vec::new();
    for (i, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let ev: Event =
            serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), i + 1))?;
        events.push(ev);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json_lines() {
        let ev = Event {
            t: 12,
            op: Op::Enqueue {
                process: 1,
                value: "p1-1".into(),
                phase: Phase::Ok,
                max_attempts: 3,
                task_id: Some("ab".into()),
                error: None,
            },
        };
        let line = serde_json::to_string(&ev).expect("serialize");
        assert!(line.contains(r#""f":"enqueue""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("parse"), ev);
        let d = Event { t: 1, op: Op::Digest { node: 1, applied_index: 2, digest: u64::MAX, tasks: 3 } };
        let line = serde_json::to_string(&d).expect("serialize");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("parse"), d);
    }
}
