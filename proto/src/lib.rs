//! Generated gRPC types and services of raftq, package `raftq.v1`.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raftq.v1");
}
