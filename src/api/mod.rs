//! Public surfaces: the gRPC task service, HTTP health, proto <-> domain conversions, the error mapping.

pub mod convert;
pub mod error;
pub mod grpc;
pub mod http;
