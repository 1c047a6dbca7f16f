//! Public surfaces: the gRPC task service, worker and producer streams, HTTP health, proto <-> domain conversions, the error mapping.

pub mod admin;
pub mod convert;
pub mod error;
pub mod forward;
pub mod grpc;
pub mod http;
pub mod jobs;
pub mod limits;
pub mod openapi;
pub mod rest;
pub mod stream;
