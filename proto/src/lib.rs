//! Generated gRPC types and services of raftq, package `raftq.v1`.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raftq.v1");
}

/// The encoded file descriptor set of every raftq proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/raftq_descriptor.bin"));
