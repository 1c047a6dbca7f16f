//! Generated gRPC types and services of raftq, package `raftq.v1`, and the reason codes and header names
//! (`reason`, plain Rust, always compiled) the server and the SDK share.
//!
//! By default: the messages and client stubs of the public services (task, streams, jobs, admin). Features:
//! `server` adds their server stubs and [`FILE_DESCRIPTOR_SET`] (what a node needs); `internal` adds the
//! nodes' own Raft service, which clients never call.

pub mod reason;

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/public/raftq.v1.rs"));
    #[cfg(feature = "internal")]
    include!(concat!(env!("OUT_DIR"), "/internal/raftq.v1.rs"));
}

/// The encoded file descriptor set of the compiled raftq protos, for gRPC reflection.
#[cfg(feature = "server")]
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/raftq_descriptor.bin"));
