//! `raftq cluster ...`: every node's status, leadership transfer, membership changes and replica digests,
//! through the SDK's `Admin`.

use std::time::Duration;

use anyhow::Result;
use raftq_client::Member;
use serde_json::json;

use super::client::{print_json, ClientArgs, Output};

#[derive(clap::Subcommand)]
pub enum ClusterCmd {
    /// Every node's role, term, log and applied index, replication lag, reachability, the cluster version each
    /// binary supports and the one in force.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move the leadership to node N (or to any other voter); returns when it leads.
    TransferLeader {
        #[arg(long)]
        to: Option<u64>,
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Add a node: it joins as a learner, catches up, then becomes a voter.
    AddNode {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        raft_addr: String,
        #[arg(long)]
        api_addr: String,
        #[arg(long)]
        learner: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a node from the cluster (refused while too few other voters answer, unless --force).
    RemoveNode {
        #[arg(long)]
        id: u64,
        /// Remove it even if the change may not commit (the cluster may stop until missing voters return).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Each node's applied index and state digest; replicas at the same index must agree.
    Digest {
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Status { client } => {
            let rows = client.connect().await?.admin().cluster_status().await?;
            let leader = rows.iter().find_map(|r| r.status.as_ref().ok().filter(|s| s.role == "LEADER"));
            let lag = |id: u64| leader.and_then(|l| l.replication_lag.get(&id).copied());
            // The version in force, as the leader has applied it (any node's answer, without a leader).
            let active = leader.or_else(|| rows.iter().find_map(|r| r.status.as_ref().ok())).map(|s| s.cluster_version);
            match client.output() {
                Output::Json => {
                    let nodes: Vec<serde_json::Value> = rows
                        .iter()
                        .map(|r| {
                            let (m, s) = (&r.member, r.status.as_ref().ok());
                            json!({
                                "node_id": m.node_id, "api_addr": m.api_addr, "raft_addr": m.raft_addr, "voter": m.voter,
                                "reachable": s.is_some(),
                                "role": s.map(|s| s.role.clone()),
                                "term": s.map(|s| s.term),
                                "last_log_index": s.map(|s| s.last_log_index),
                                "applied_index": s.map(|s| s.applied_index),
                                "replication_lag": lag(m.node_id),
                                "version": s.map(|s| s.version),
                                "cluster_version": s.map(|s| s.cluster_version),
                            })
                        })
                        .collect();
                    print_json(
                        &json!({ "leader": leader.map(|l| l.node_id), "cluster_version": active, "nodes": nodes }),
                    );
                }
                Output::Table => {
                    match active {
                        Some(v) => println!("cluster version {v}"),
                        None => println!("cluster version unknown (no node answered)"),
                    }
                    println!(
                        "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8} {:>7}  reachable",
                        "id", "api", "voter", "role", "term", "last_log", "applied", "lag", "version"
                    );
                    for r in &rows {
                        let m = &r.member;
                        let lag = lag(m.node_id).map_or_else(|| "-".to_string(), |v| v.to_string());
                        match &r.status {
                            Ok(s) => println!(
                                "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8} {:>7}  yes",
                                m.node_id,
                                m.api_addr,
                                m.voter,
                                s.role,
                                s.term,
                                s.last_log_index,
                                s.applied_index,
                                lag,
                                s.version
                            ),
                            Err(e) => println!(
                                "{:<5} {:<22} {:<6} {:<10} {:>6} {:>10} {:>10} {:>8} {:>7}  no ({e})",
                                m.node_id, m.api_addr, m.voter, "-", "-", "-", "-", lag, "-"
                            ),
                        }
                    }
                }
            }
        }
        ClusterCmd::TransferLeader { to, timeout, client } => {
            let t = client.connect().await?.admin().transfer_leader(to, timeout.unwrap_or_default()).await?;
            let took_ms = t.took.as_millis();
            match client.output() {
                Output::Json => print_json(&json!({"leader": t.leader_id, "took_ms": took_ms})),
                Output::Table => println!("node {} leads (took {took_ms} ms)", t.leader_id),
            }
        }
        ClusterCmd::AddNode { id, raft_addr, api_addr, learner, client } => {
            let members = client.connect().await?.admin().add_node(id, &raft_addr, &api_addr, learner).await?;
            print_members(client.output(), &members);
        }
        ClusterCmd::RemoveNode { id, force, client } => {
            let members = client.connect().await?.admin().remove_node(id, force).await?;
            print_members(client.output(), &members);
        }
        ClusterCmd::Digest { client } => {
            for (m, d) in client.connect().await?.admin().digests().await? {
                let id = m.node_id;
                match (client.output(), d) {
                    (Output::Json, Ok(d)) => print_json(&json!({
                        "node_id": id, "applied_index": d.applied_index, "digest": format!("{:016x}", d.digest),
                        "tasks": d.tasks,
                    })),
                    (Output::Json, Err(_)) => print_json(&json!({"node_id": id, "reachable": false})),
                    (Output::Table, Ok(d)) => {
                        println!("node {id}: applied {} digest {:016x} tasks {}", d.applied_index, d.digest, d.tasks)
                    }
                    (Output::Table, Err(e)) => println!("node {id}: unreachable ({e})"),
                }
            }
        }
    }
    Ok(())
}

fn print_members(out: Output, members: &[Member]) {
    for m in members {
        match out {
            Output::Json => print_json(
                &json!({"node_id": m.node_id, "raft_addr": m.raft_addr, "api_addr": m.api_addr, "voter": m.voter}),
            ),
            Output::Table => println!(
                "{}\t{}\t{}\t{}",
                m.node_id,
                if m.voter { "voter" } else { "learner" },
                m.raft_addr,
                m.api_addr
            ),
        }
    }
}
