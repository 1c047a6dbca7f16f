//! Compiles raftq's protos with protox (pure Rust; no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "raftq/v1/task.proto",
        "raftq/v1/stream.proto",
        "raftq/v1/admin.proto",
        "raftq/v1/raft.proto",
        "raftq/v1/jobs.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    // The descriptor set is also served by gRPC reflection.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("raftq_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().bytes(".raftq.v1").compile_fds(fds)?;
    Ok(())
}
