//! Job features on real three-process clusters: a chained completion is all or nothing under a leader kill.

use std::collections::HashSet;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::ack_request::Action;
use raftq_proto::v1::jobs_client::JobsClient;

use crate::procs::*;
use crate::support::*;

async fn jobs(addr: &str) -> JobsClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("url").connect().await;
    JobsClient::new(ch.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_completions_are_all_or_nothing_across_a_leader_kill() {
    let mut c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.nodes.iter().find(|n| n.id != leader).expect("a follower").id;
    let mut client = c.node(follower).ready().await;
    const PARENTS: usize = 40;
    for i in 0..PARENTS {
        client.enqueue(enq("chain-1", &i.to_string())).await.expect("enqueue");
    }
    let mut claimed = Vec::new();
    while claimed.len() < PARENTS {
        let req = pb::ClaimRequest {
            worker_id: "w".into(),
            queues: vec!["chain-1".into()],
            count: 100,
            lease_ms: 600_000,
            wait_ms: 1_000,
        };
        claimed.extend(client.claim(req).await.expect("claim").into_inner().tasks);
    }
    // Completions with two follow-ups each go out through the follower while the leader is killed.
    let mut sends = Vec::new();
    for t in claimed.clone() {
        let mut cl = client.clone();
        sends.push(tokio::spawn(async move {
            let follow_ups = vec![enq("chain-2", &format!("{}-a", t.id)), enq("chain-2", &format!("{}-b", t.id))];
            let action = Action::Complete(pb::Complete { result: Default::default(), follow_ups });
            let token = t.lease.as_ref().expect("lease").token;
            cl.ack(pb::AckRequest { task_id: t.id.clone(), token, action: Some(action) }).await.is_ok()
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
        if sends.len() == PARENTS / 2 {
            c.node(leader).kill9();
        }
    }
    let mut acked = 0;
    for s in sends {
        if s.await.expect("join") {
            acked += 1;
        }
    }
    let new_leader = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    c.wait_digests_agree(Duration::from_secs(30)).await;

    // Every parent: completed with both follow-ups present, or not completed and none of its follow-ups exists.
    let addr = c.node(follower).grpc.clone();
    let mut j = jobs(&addr).await;
    let mut children = Vec::new();
    let mut token = String::new();
    loop {
        let req =
            pb::ListTasksRequest { queue: "chain-2".into(), page_size: 1000, page_token: token, ..Default::default() };
        let page = j.list_tasks(req).await.expect("list").into_inner();
        children.extend(page.tasks);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut completed = 0;
    let mut seen = HashSet::new();
    for t in &claimed {
        let p = client.get_task(pb::GetTaskRequest { id: t.id.clone() }).await.expect("get").into_inner();
        let mine: Vec<&pb::Task> = children.iter().filter(|f| f.parent_id == t.id).collect();
        if p.state == pb::TaskState::Completed as i32 {
            completed += 1;
            assert_eq!(p.follow_up_ids.len(), 2, "{}", t.id);
            let ids: HashSet<&String> = mine.iter().map(|f| &f.id).collect();
            assert_eq!(ids, p.follow_up_ids.iter().collect(), "both follow-ups of {} exist", t.id);
            let payloads: HashSet<String> = mine.iter().map(|f| String::from_utf8_lossy(&f.payload).into()).collect();
            assert_eq!(payloads, [format!("{}-a", t.id), format!("{}-b", t.id)].into_iter().collect());
        } else {
            assert!(mine.is_empty(), "{} did not complete but has follow-ups", t.id);
            assert!(p.follow_up_ids.is_empty());
        }
        seen.extend(mine.iter().map(|f| f.id.clone()));
    }
    assert_eq!(seen.len(), children.len(), "no follow-up without its parent");
    assert_eq!(children.len(), 2 * completed);
    assert!(completed >= acked, "every acknowledged completion took effect ({completed} >= {acked})");
    eprintln!("chained completions across a leader kill: {acked} acknowledged, {completed} applied of {PARENTS}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_each_occurrence_once_across_leadership_transfers() {
    let c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let any = c.nodes.iter().find(|n| n.id == leader).expect("leader").grpc.clone();
    let mut j = jobs(&any).await;
    let req = pb::CreateScheduleRequest {
        name: "beat".into(),
        task: Some(enq("beats", "b")),
        interval_ms: 100,
        ..Default::default()
    };
    let s = j.create_schedule(req).await.expect("create").into_inner();
    let mut transfers = 0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let l = c.wait_leader(Duration::from_secs(10)).await;
        let to = c.nodes.iter().map(|n| n.id).find(|id| *id != l).expect("another node");
        let node = c.nodes.iter().find(|n| n.id == l).expect("leader node");
        if let Some(mut a) = node.admin().await {
            if a.transfer_leader(pb::TransferLeaderRequest { to, timeout_ms: 5_000 }).await.is_ok() {
                transfers += 1;
            }
        }
    }
    assert!(transfers >= 2, "leadership moved ({transfers} transfers)");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let l = c.wait_leader(Duration::from_secs(10)).await;
    let mut j = jobs(&c.nodes.iter().find(|n| n.id == l).expect("leader").grpc).await;
    let paused = j.pause_schedule(pb::ScheduleRef { id: s.id.clone() }).await.expect("pause").into_inner();
    let req = pb::ListTasksRequest { queue: "beats".into(), page_size: 1000, ..Default::default() };
    let tasks = j.list_tasks(req).await.expect("list").into_inner().tasks;
    let mut occ: Vec<i64> = tasks.iter().map(|t| t.scheduled_for_ms).collect();
    occ.sort();
    let n = occ.len() as i64;
    assert!(n >= 20, "fired {n} times in ~3.5 s at 100 ms");
    assert_eq!(paused.fired, n as u64);
    let want: Vec<i64> = (1..=n).map(|k| s.created_at_ms + 100 * k).collect();
    assert_eq!(occ, want, "every occurrence exactly once, none missed, across {transfers} leadership transfers");
    c.wait_digests_agree(Duration::from_secs(30)).await;
}
