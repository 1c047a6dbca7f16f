//! Producer and worker SDK for raftq, a Raft-replicated task queue.
//!
//! Depends on the generated protocol (`raftq-proto`, client stubs only) and tonic's client side only: never on
//! the server's crates (openraft, redb, axum), so worker applications stay small. The `tls` feature (on by
//! default) adds rustls for `https://` servers; without it the SDK speaks plain HTTP/2 only.
//!
//! - [`Producer`]: enqueue (one, or a batch whose items succeed or fail one by one), read a task or its
//!   result, cancel; per-state queue counts ([`QueueStats`]) and the dead-letter queue ([`DeadLetters`]);
//!   pause and resume queues, list tasks ([`TaskQuery`]), the capacity view ([`QueueCapacity`]), schedules;
//!   claim and report one request at a time ([`Claim`], [`Producer::report`]); [`Producer::stream`] opens a
//!   [`StreamProducer`] that keeps many creates in flight on one stream; [`Producer::admin`] gives the
//!   cluster operations ([`Admin`]); [`Producer::stale_reads`] reads a node's own replica.
//! - [`Worker`]: one worker stream shared by many slots running a handler that returns an [`Outcome`];
//!   automatic lease extension, reconnects, graceful shutdown; every answer to an outcome is checked and
//!   reported ([`Worker::applied`], [`Worker::rejections`], [`WorkerStats`]).
//! - [`Error`]: the server's stable reason ([`Error::reason`]) and whether retrying helps
//!   ([`Error::is_retryable`]); [`Error::UnknownOutcome`] for a write that may or may not have happened.
//!
//! Modules:
//!
//! | module | owns |
//! |---|---|
//! | `error` | [`Error`], the mapping of statuses, per-item and stream errors to it |
//! | `connection` | address order, leader following (or forwarding when the leader is unreachable), one cached channel, the bearer token |
//! | `backoff` | [`Backoff`]: exponential delays with jitter |
//! | `task` | [`Task`], [`NewTask`] and the other task types, conversions from and to the protocol |
//! | `producer` | [`Producer`], [`ProducerConfig`], the retry rule of unary calls |
//! | `queues` | queue counts ([`QueueStats`]) and dead letters ([`DeadLetters`]) on the producer |
//! | `claims` | claim and report one request at a time ([`Claim`], [`Acked`]) |
//! | `jobs` | job features on the producer: pause/resume, [`TaskQuery`] listings, [`QueueCapacity`], schedules |
//! | `admin` | [`Admin`]: node and cluster status, leadership transfer, membership, digests |
//! | `producer_stream` | [`StreamProducer`]: creates matched to acks by sequence number |
//! | `worker` | [`Worker`], [`WorkerConfig`], [`Outcome`], [`Applied`], [`Rejection`], [`WorkerStats`]; the stream session, slots, heartbeats |
//!
//! Retry rules: reads are retried on any transient error; writes only when they certainly were not applied
//! (`NOT_LEADER`, a connection that could not be made). An unknown outcome is returned, never retried behind
//! the caller's back. A worker resends an outcome after a lost stream: its fencing token makes the server
//! apply it at most once.

#![warn(missing_docs)]

mod admin;
mod backoff;
mod claims;
mod connection;
mod error;
mod jobs;
mod producer;
mod producer_stream;
mod queues;
mod task;
mod worker;

pub use admin::{Admin, BackupChunk, BackupStream, Digest, Member, MemberStatus, NodeStatus, Transfer};
pub use backoff::Backoff;
pub use claims::{Acked, Claim};
pub use connection::DEFAULT_ADDR;
pub use error::{Error, Result, LEADER_HEADER, LEASE_LOST, NOT_LEADER, REASON_HEADER, UNKNOWN_OUTCOME};
pub use jobs::{
    ConcurrencyOverride, FairnessKey, QueueCapacity, QueueLimits, RateLimit, RateScope, Recurrence, Schedule, TaskPage,
    TaskQuery,
};
pub use producer::{Producer, ProducerConfig};
pub use producer_stream::{PendingBatch, PendingEnqueue, StreamProducer};
pub use queues::{DeadLetters, QueueStats};
pub use task::{Enqueued, Lease, NewTask, Progress, Run, Task, TaskResult, TaskState, TraceContext};
/// The shutdown signal [`Worker::run`] takes (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
pub use worker::{Applied, Outcome, Rejection, TokenProvider, Worker, WorkerConfig, WorkerStats, WorkerSummary};
