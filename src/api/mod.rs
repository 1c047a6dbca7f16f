//! Public surfaces: the gRPC services (task, streams, jobs, admin), REST, HTTP health and metrics, the web console, gRPC
//! reflection and health names, proto <-> domain conversions, the one leader-routing path (`forward`) and the
//! error mapping (`error`). Nothing here names an openraft type: Raft is reached through `raft::control`,
//! `raft::errors` and the proposer.

pub mod admin;
pub mod convert;
pub mod discovery;
pub mod error;
pub mod forward;
pub mod grpc;
pub mod http;
pub mod http2;
pub mod jobs;
pub mod limits;
pub mod openapi;
pub mod rest;
pub mod revoke;
pub mod stream;
pub mod ui;
