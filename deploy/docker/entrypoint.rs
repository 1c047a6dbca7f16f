//! `raftq-entrypoint`: gives a StatefulSet pod its node id from its ordinal, then becomes the server.
//!
//! Kubernetes can hand a pod its own name (`raftq-2`) but no arithmetic on it, and the image built FROM scratch
//! has no shell to do any. So, when `RAFTQ_NODE_ID` is unset and `RAFTQ_POD_NAME` is set, this sets
//! `RAFTQ_NODE_ID` to the number after the name's last `-` plus one (node ids start at 1: pod `raftq-0` is node
//! 1), and then execs its arguments (default: `/usr/local/bin/raftq serve`). Everything else passes through
//! unchanged. Compiled by `deploy/docker/build.sh` with `rustc` alone, like `probe.rs`.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// Node ids are > 0 (raftq's config rejects 0), StatefulSet ordinals start at 0.
const ORDINAL_TO_NODE_ID: u64 = 1;

fn node_id_from_pod_name(name: &str) -> Option<u64> {
    let (_, ordinal) = name.rsplit_once('-')?;
    ordinal.parse::<u64>().ok().map(|o| o + ORDINAL_TO_NODE_ID)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        args = vec!["/usr/local/bin/raftq".into(), "serve".into()];
    }
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..]);
    let have_id = std::env::var("RAFTQ_NODE_ID").map(|v| !v.is_empty()).unwrap_or(false);
    if !have_id {
        if let Ok(pod) = std::env::var("RAFTQ_POD_NAME") {
            match node_id_from_pod_name(&pod) {
                Some(id) => {
                    eprintln!("raftq-entrypoint: pod {pod} is node {id}");
                    cmd.env("RAFTQ_NODE_ID", id.to_string());
                }
                None => {
                    eprintln!("raftq-entrypoint: RAFTQ_POD_NAME={pod:?} does not end in -ORDINAL");
                    return ExitCode::from(2);
                }
            }
        }
    }
    // exec only returns on failure.
    let e = cmd.exec();
    eprintln!("raftq-entrypoint: cannot run {}: {e}", args[0]);
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ordinal_plus_one_is_the_node_id() {
        assert_eq!(node_id_from_pod_name("raftq-0"), Some(1));
        assert_eq!(node_id_from_pod_name("my-raftq-12"), Some(13));
        assert_eq!(node_id_from_pod_name("raftq"), None);
        assert_eq!(node_id_from_pod_name("raftq-x"), None);
    }
}
