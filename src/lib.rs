//! raftq: a Raft-replicated task queue.
//!
//! Layers, each importing only the ones below it: `api` -> `leader` -> `storage` -> `raft` -> `queue`
//! (`node` wires them all; `auth`, `config`, `tls`, `telemetry` are used across).
//!
//! - `queue`: the task state machine, pure (no tokio, tonic, redb or clock): commands, lifecycle rules (one file
//!   per command family in `queue/apply/`), derived indexes, the leader's claim order, the reference model.
//! - `raft`: openraft glue: the type configuration, the network client, the internal Raft service, helpers.
//! - `storage`: redb: tables and key layouts, the Raft log store with group commit, the sharded state machine
//!   (apply, read view, snapshots, data-dir layout); openraft's storage traits; `storage::Raft`, the node's handle.
//! - `leader`: leader-only services: the proposer (group commit), the claim dispatcher, the tick loop, the
//!   dependency resolver, the schedule ticker, the webhook sender, and their one "while leading" loop.
//! - `api`: public gRPC services (tasks, streams, jobs, admin), REST and its OpenAPI document, HTTP health,
//!   forwarding to the leader, per-tenant limits, proto <-> domain conversions, the error mapping.
//! - `auth`: JWT verification, scopes and queue patterns, the local secret, the Raft port's credential.
//! - `config`: configuration defaults, validation, and its layering (file < environment < flags, `Config::load`).
//! - `node`: wires the layers together and runs a node.
//! - `tls`: optional rustls on every port, from PEM files.
//! - `telemetry`: metric names and the Prometheus exposition, per-task trace spans.
//! - `otlp`: optional OTLP/HTTP export of those spans.
pub mod api;
pub mod auth;
pub mod config;
pub mod leader;
pub mod node;
pub mod otlp;
pub mod queue;
pub mod raft;
pub mod storage;
pub mod telemetry;
pub mod tls;
