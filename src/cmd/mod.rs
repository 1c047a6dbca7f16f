//! Subcommands of the `raftq` binary that are more than a request: the benchmark and the command runner.

pub mod bench;
pub mod jobs;
pub mod worker;
