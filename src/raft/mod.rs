//! openraft glue: the type configuration, the network client, the internal Raft gRPC service.
//! Every openraft type the API uses is named here.

pub mod types;
