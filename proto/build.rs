//! Compiles raftq's protos with protox (pure Rust; no system protoc).
//!
//! What is generated depends on the crate's features, so a user of the SDK compiles client code only:
//! - always: the public services' messages and client stubs (`$OUT_DIR/public/raftq.v1.rs`);
//! - `server`: their server stubs too, and the encoded descriptor set gRPC reflection serves;
//! - `internal`: the nodes' own Raft service (`raft.proto`), client stubs and, with `server`, server stubs
//!   (`$OUT_DIR/internal/raftq.v1.rs`).

use std::path::PathBuf;

/// The services clients call.
const PUBLIC: &[&str] =
    &["raftq/v1/task.proto", "raftq/v1/stream.proto", "raftq/v1/admin.proto", "raftq/v1/jobs.proto"];
/// The service nodes call on each other; not part of the client surface.
const INTERNAL: &[&str] = &["raftq/v1/raft.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PUBLIC.iter().chain(INTERNAL) {
        println!("cargo:rerun-if-changed={p}");
    }
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    let internal = std::env::var_os("CARGO_FEATURE_INTERNAL").is_some();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let generate = |protos: &[&str], dir: &str| -> Result<(), Box<dyn std::error::Error>> {
        let dir = out.join(dir);
        std::fs::create_dir_all(&dir)?;
        let fds = protox::compile(protos, ["."])?;
        tonic_prost_build::configure().bytes(".raftq.v1").build_server(server).out_dir(&dir).compile_fds(fds)?;
        Ok(())
    };
    generate(PUBLIC, "public")?;
    let mut described = PUBLIC.to_vec();
    if internal {
        generate(INTERNAL, "internal")?;
        described.extend(INTERNAL);
    }
    // The descriptor set gRPC reflection serves (written always, exposed with `server`).
    let fds = protox::compile(&described, ["."])?;
    std::fs::write(out.join("raftq_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    Ok(())
}
