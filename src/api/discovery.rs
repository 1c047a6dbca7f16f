//! What the public gRPC port says it serves: gRPC server reflection, both `grpc.reflection.v1` and the older
//! `grpc.reflection.v1alpha` (still what Python's grpcio-reflection, older grpcurl, grpc_cli, Evans and Postman
//! speak), and the service names the standard health service reports. One list for both, so neither names a
//! service the port does not serve (the internal `raftq.v1.RaftService` is on the Raft port only).

use raftq_proto::v1::{admin_server, jobs_server, producer_stream_server, task_service_server, worker_stream_server};
use tonic_reflection::pb::{v1, v1alpha};

/// The raftq services of the public port: the gRPC health service reports each (and "", the whole server).
pub const RAFTQ_SERVICES: [&str; 5] = [
    task_service_server::SERVICE_NAME,
    worker_stream_server::SERVICE_NAME,
    producer_stream_server::SERVICE_NAME,
    admin_server::SERVICE_NAME,
    jobs_server::SERVICE_NAME,
];

/// Every service of the public port, as reflection lists them: raftq's, health, and reflection itself.
pub fn public_services() -> Vec<&'static str> {
    let mut all = RAFTQ_SERVICES.to_vec();
    all.extend([
        tonic_health::pb::health_server::SERVICE_NAME,
        v1::server_reflection_server::SERVICE_NAME,
        v1alpha::server_reflection_server::SERVICE_NAME,
    ]);
    all
}

fn builder() -> tonic_reflection::server::Builder<'static> {
    let mut b = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(raftq_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(v1alpha::FILE_DESCRIPTOR_SET);
    // Named explicitly: the descriptor set also describes services this port does not serve.
    for name in public_services() {
        b = b.with_service_name(name);
    }
    b
}

/// The reflection services, v1 and v1alpha, listing [`public_services`].
#[allow(clippy::type_complexity)] // two opaque server types, named by the caller only through `add_service`
pub fn reflection() -> Result<
    (
        v1::server_reflection_server::ServerReflectionServer<impl v1::server_reflection_server::ServerReflection>,
        v1alpha::server_reflection_server::ServerReflectionServer<
            impl v1alpha::server_reflection_server::ServerReflection,
        >,
    ),
    String,
> {
    let v1 = builder().build_v1().map_err(|e| format!("reflection v1: {e}"))?;
    let v1alpha = builder().build_v1alpha().map_err(|e| format!("reflection v1alpha: {e}"))?;
    Ok((v1, v1alpha))
}
