//! The `raftq` binary: `raftq serve` runs a node; the other subcommands are the operator and user CLI, one file
//! each in `cmd/`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

mod cmd;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's options for `raftq serve`, each set unless the user set it.
///
/// - `MIMALLOC_PURGE_DELAY`: how long memory freed by the process waits before mimalloc returns it to the OS.
///   mimalloc's default (1 s) is no longer than the state machine's flush interval (1 s, `storage::flush`):
///   memory a flush freed was given back, and apply faulted it in again, zeroed by the kernel (a sixth of a
///   follower's CPU went to `clear_page_erms`). Memory freed and reused within this delay stays with the
///   process; memory idle for longer still goes back.
/// - `MIMALLOC_ALLOW_THP=0`: no transparent huge pages for the heap. A node's memory grows for its first
///   seconds and with the tasks it keeps, and each first touch of a huge page zeroes 2 MiB at once in whichever
///   thread touched it (about 1.6 ms on this kind of VM), often a thread on a request's path: enqueue→claim p99
///   at `latency-3` fell from 25–37 ms to 16–18 ms without them, at the same CPU per task (docs/performance.md,
///   "Huge pages and the latency tail").
const ALLOCATOR_OPTIONS: [(&str, &str); 2] = [("MIMALLOC_PURGE_DELAY", "10000"), ("MIMALLOC_ALLOW_THP", "0")];

/// mimalloc reads its options from the environment when the process starts, before `main`, and setting one
/// from Rust would take `unsafe` FFI, which this workspace forbids: so `raftq serve`, started without one of
/// [`ALLOCATOR_OPTIONS`], runs itself again (same pid, arguments and environment) with the missing ones set.
/// When that cannot be done (the binary was replaced on disk since it started), it goes on with mimalloc's
/// defaults. A variable the user set is kept as it is.
fn with_allocator_options() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let (Some(arg0), Some(sub)) = (args.next(), args.next()) else { return };
    if sub != "serve" {
        return;
    }
    let missing: Vec<_> = ALLOCATOR_OPTIONS.iter().filter(|(k, _)| std::env::var_os(k).is_none()).collect();
    if missing.is_empty() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let err = std::process::Command::new(exe).arg0(arg0).arg(sub).args(args).envs(missing.into_iter().copied()).exec();
    eprintln!("note: running with mimalloc's default options (could not re-run with them set: {err})");
}

#[derive(Parser)]
#[command(name = "raftq", version, about = "A Raft-replicated task queue")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node (with no flags: a one-node cluster in ./raftq-data).
    Serve(cmd::serve::ServeArgs),
    /// Enqueue, inspect, cancel and work tasks.
    Task {
        #[command(subcommand)]
        cmd: cmd::task::TaskCmd,
    },
    /// Tasks per state in each queue.
    Queues(cmd::queues::QueuesArgs),
    /// Inspect, redrive and purge dead-lettered tasks.
    Dlq {
        #[command(subcommand)]
        cmd: cmd::dlq::DlqCmd,
    },
    /// Job features: pause and resume queues, list tasks, schedules, the capacity view.
    Jobs {
        #[command(subcommand)]
        cmd: cmd::jobs::JobsCmd,
    },
    /// Load a node or cluster (an embedded node unless --addr is given): full cycles or enqueues only.
    Bench(cmd::bench::BenchArgs),
    /// The benchmark suite behind the README's table: starts its own nodes, every scenario 3 times.
    BenchSuite(cmd::bench_suite::SuiteArgs),
    /// Run a command per task: payload on stdin; exit 0 completes with stdout, another exit fails with stderr.
    Worker(cmd::worker::WorkerArgs),
    /// Cluster operations: status, leadership transfer, membership, state digests.
    Cluster {
        #[command(subcommand)]
        cmd: cmd::cluster::ClusterCmd,
    },
    /// Write a consistent, checksummed backup of the cluster's state to a file (from any node).
    Backup(cmd::backup::BackupArgs),
    /// Initialise a new node (and so a new cluster) from a backup file, offline; other nodes join with add-node.
    Restore(cmd::backup::RestoreArgs),
    /// Tokens: mint one from an HS256 secret (by default the local node's).
    Token {
        #[command(subcommand)]
        cmd: cmd::token::TokenCmd,
    },
    /// Offline operations on a stopped node's data directory (downgrade to the previous release).
    Data {
        #[command(subcommand)]
        cmd: cmd::data::DataCmd,
    },
}

fn main() -> std::process::ExitCode {
    with_allocator_options();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    // The server's log format is part of its configuration; every other command logs text.
    let serve_cfg = match &cli.cmd {
        Cmd::Serve(a) => Some(a.load()?),
        _ => None,
    };
    cmd::init_logging(serve_cfg.as_ref());
    match cli.cmd {
        Cmd::Serve(_) => cmd::serve::run(serve_cfg.expect("loaded above")).await,
        Cmd::Task { cmd } => cmd::task::run(cmd).await,
        Cmd::Queues(a) => cmd::queues::run(a).await,
        Cmd::Dlq { cmd } => cmd::dlq::run(cmd).await,
        Cmd::Jobs { cmd } => cmd::jobs::run(cmd).await,
        Cmd::Bench(a) => cmd::bench::run(a).await,
        Cmd::BenchSuite(a) => cmd::bench_suite::run(a).await,
        Cmd::Cluster { cmd } => cmd::cluster::run(cmd).await,
        Cmd::Token { cmd } => cmd::token::run(cmd),
        Cmd::Data { cmd } => cmd::data::run(cmd),
        Cmd::Backup(a) => cmd::backup::backup(a).await,
        Cmd::Restore(a) => cmd::backup::restore(a).await,
        Cmd::Worker(a) => {
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            let signalled = cmd::on_signal();
            tokio::spawn(async move {
                signalled.await;
                stop.cancel();
            });
            cmd::worker::run(a, shutdown).await
        }
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand's arguments are well formed (unique names, no clash with the client flags).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The shared client flags, under every client command, with the old spellings still accepted.
    #[test]
    fn every_client_command_takes_the_same_client_flags() {
        let client = ["--addr", "a:1,b:2", "--auth-token", "t", "--ca-file", "/ca", "--output", "json"];
        let commands: &[&[&str]] = &[
            &["task", "get", "x"],
            &["task", "complete", "x", "--token", "7"],
            &["queues"],
            &["dlq", "list", "--queue", "q"],
            &["jobs", "paused"],
            &["jobs", "list"],
            &["cluster", "status"],
            &["cluster", "digest"],
            &["backup", "--out", "f"],
            &["worker", "--queue", "q"],
        ];
        for c in commands {
            let mut args = vec!["raftq"];
            args.extend_from_slice(c);
            args.extend_from_slice(&client);
            if c[0] == "worker" {
                args.extend_from_slice(&["--", "true"]);
            }
            Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        // The bench's token flag has the same name; `raftq jobs --json`, `raftq worker --token` and
        // `raftq bench --token` still parse.
        Cli::try_parse_from(["raftq", "bench", "--addr", "a:1", "--auth-token", "t", "--output", "json"])
            .expect("bench");
        Cli::try_parse_from(["raftq", "bench", "--addr", "a:1", "--token", "t"]).expect("bench --token");
        let cli = Cli::try_parse_from(["raftq", "jobs", "paused", "--json"]).expect("--json");
        let Cmd::Jobs { cmd: cmd::jobs::JobsCmd::Paused { client } } = cli.cmd else { panic!("jobs paused") };
        assert_eq!(client.output(), cmd::client::Output::Json);
        let cli =
            Cli::try_parse_from(["raftq", "worker", "--queue", "q", "--token", "old", "--", "true"]).expect("--token");
        let Cmd::Worker(w) = cli.cmd else { panic!("worker") };
        assert_eq!(w.legacy_token.as_deref(), Some("old"));
        assert_eq!(w.client.addrs, vec![raftq_client::DEFAULT_ADDR.to_string()]);
    }
}
