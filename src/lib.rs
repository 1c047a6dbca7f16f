//! raftq: a Raft-replicated task queue.
//!
//! - `queue`: the task state machine (pure: commands, lifecycle rules, indexes, claim order).
//! - `storage`: redb log store and sharded state machine, snapshots; openraft's storage traits.
//! - `raft`: openraft type config, network client, internal Raft service, the proposer (group commit, claims).
//! - `api`: public gRPC task service, HTTP health, conversions and the error mapping.
//! - `auth`: JWT verification, scopes and queue patterns, the local secret, the Raft port's credential.
//! - `config`: configuration defaults and validation.
//! - `node`: wires the layers together and runs a node.
//! - `tls`: optional rustls on every port, from PEM files.
//! - `telemetry`: metric names and the Prometheus exposition, per-task trace spans.
//! - `otlp`: optional OTLP/HTTP export of those spans.
pub mod api;
pub mod auth;
pub mod config;
pub mod node;
pub mod otlp;
pub mod queue;
pub mod raft;
pub mod storage;
pub mod telemetry;
pub mod tls;
