//! The worker and producer stream protocols, spoken raw over gRPC.

use std::time::{Duration, Instant};

use raftq_proto::v1 as pb;
use raftq_proto::v1::producer_stream_client::ProducerStreamClient;
use raftq_proto::v1::worker_stream_client::WorkerStreamClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::support::*;

struct Session {
    tx: mpsc::Sender<pb::WorkerEvent>,
    rx: Streaming<pb::ServerEvent>,
}

async fn open(addr: &str, first: pb::worker_event::Event) -> Result<Session, tonic::Status> {
    let ch =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("url").connect().await.expect("c");
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::WorkerEvent { event: Some(first) }).await.expect("send");
    let mut resp = WorkerStreamClient::new(ch).stream(ReceiverStream::new(rx)).await?.into_inner();
    match resp.message().await? {
        Some(pb::ServerEvent { event: Some(pb::server_event::Event::HelloAck(_)) }) => {}
        other => panic!("expected HelloAck, got {other:?}"),
    }
    Ok(Session { tx, rx: resp })
}

/// A producer stream, its Hello sent.
async fn open_producer(addr: &str) -> (mpsc::Sender<pb::ProducerEvent>, Streaming<pb::ProducerServerEvent>) {
    let (tx, rx) = mpsc::channel(64);
    tx.send(pb::ProducerEvent { event: Some(pb::producer_event::Event::Hello(pb::Hello::default())) })
        .await
        .expect("send");
    let resp = ProducerStreamClient::new(channel(addr).await).stream(ReceiverStream::new(rx)).await.expect("open");
    (tx, resp.into_inner())
}

fn hello() -> pb::worker_event::Event {
    pb::worker_event::Event::Hello(pb::Hello { token: String::new(), worker_id: "w-raw".into() })
}

impl Session {
    async fn send(&self, e: pb::worker_event::Event) {
        self.tx.send(pb::WorkerEvent { event: Some(e) }).await.expect("send");
    }
    async fn next(&mut self) -> pb::server_event::Event {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an event within 10 s")
            .expect("stream ok")
            .expect("stream open")
            .event
            .expect("event set")
    }
    async fn ready(&self, request_id: u64, queue: &str, count: u32) {
        self.send(pb::worker_event::Event::Ready(pb::Ready {
            request_id,
            queues: vec![queue.into()],
            lease_seconds: 30,
            count,
            lease_ms: 0,
        }))
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stream_must_start_with_hello() {
    let n = TestNode::start().await;
    let addr = n.node().grpc_addr.to_string();
    let ready =
        pb::worker_event::Event::Ready(pb::Ready { request_id: 1, queues: vec!["q".into()], ..Default::default() });
    let err = match open(&addr, ready).await {
        Err(e) => e,
        Ok(mut s) => match s.rx.message().await {
            Err(e) => e,
            other => panic!("expected an error, got {other:?}"),
        },
    };
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("HELLO_REQUIRED"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_result_cycle_with_matched_acks() {
    let n = TestNode::start().await;
    let mut c = n.client().await;
    for i in 0..5 {
        c.enqueue(enq("s", &format!("t{i}"))).await.expect("enqueue");
    }
    let mut s = open(&n.node().grpc_addr.to_string(), hello()).await.expect("open");
    s.ready(7, "s", 3).await;
    let pb::server_event::Event::TaskBatch(b) = s.next().await else { panic!("expected a batch") };
    assert_eq!(b.request_id, 7);
    assert_eq!(b.tasks.len(), 3);
    let results = b
        .tasks
        .iter()
        .map(|t| pb::Result {
            request_id: 0,
            task_id: t.id.clone(),
            token: t.lease.as_ref().expect("lease").token,
            outcome: Some(pb::result::Outcome::Completed(pb::Complete {
                result: b"ok".to_vec().into(),
                follow_ups: vec![],
            })),
        })
        .collect();
    s.send(pb::worker_event::Event::ResultBatch(pb::ResultBatch { request_id: 8, results })).await;
    let pb::server_event::Event::AckBatch(acks) = s.next().await else { panic!("expected acks") };
    assert_eq!(acks.request_id, 8);
    assert!(acks.acks.iter().all(|a| a.applied && a.state == pb::TaskState::Completed as i32), "{acks:?}");

    // A result with a wrong token is answered, not applied, with its reason.
    s.ready(9, "s", 1).await;
    let pb::server_event::Event::TaskBatch(b) = s.next().await else { panic!("expected a batch") };
    let t = &b.tasks[0];
    s.send(pb::worker_event::Event::Result(pb::Result {
        request_id: 10,
        task_id: t.id.clone(),
        token: t.lease.as_ref().expect("lease").token + 1,
        outcome: Some(pb::result::Outcome::Failed(pb::Fail { error: "x".into(), retryable: false })),
    }))
    .await;
    let pb::server_event::Event::Ack(a) = s.next().await else { panic!("expected an ack") };
    assert_eq!((a.request_id, a.applied, a.reason.as_str()), (10, false, "LEASE_LOST"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_ready_is_answered_empty_then_served_when_work_arrives() {
    let n = TestNode::start_with(|c| c.ready_hold_ms = 300).await;
    let mut s = open(&n.node().grpc_addr.to_string(), hello()).await.expect("open");
    let start = Instant::now();
    s.ready(1, "idle", 1).await;
    let pb::server_event::Event::TaskBatch(b) = s.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len()), (1, 0));
    assert!(start.elapsed() >= Duration::from_millis(300), "answered at the end of the hold");
    s.ready(2, "idle", 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    n.client().await.enqueue(enq("idle", "x")).await.expect("enqueue");
    let pb::server_event::Event::TaskBatch(b) = s.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_stream_acks_by_sequence() {
    let n = TestNode::start().await;
    let (tx, mut resp) = open_producer(&n.node().grpc_addr.to_string()).await;
    let ev = |e| pb::ProducerEvent { event: Some(e) };
    for seq in 1..=20u64 {
        let e = if seq % 5 == 0 {
            pb::producer_event::Event::CreateBatch(pb::CreateBatch {
                seq,
                tasks: vec![enq("p", "a"), enq("bad q", "b")],
            })
        } else {
            pb::producer_event::Event::Create(pb::Create { seq, task: Some(enq("p", &format!("{seq}"))) })
        };
        tx.send(ev(e)).await.expect("send");
    }
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < 20 {
        let m = resp.message().await.expect("ok").expect("open");
        match m.event {
            Some(pb::producer_server_event::Event::HelloAck(_)) => {}
            Some(pb::producer_server_event::Event::Ack(a)) => {
                seen.insert(a.seq, a);
            }
            None => panic!("empty event"),
        }
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (1..=20).collect::<Vec<_>>());
    use pb::enqueue_result::Result as R;
    for (seq, a) in &seen {
        if seq % 5 == 0 {
            assert!(matches!(a.results[0].result, Some(R::Ok(_))));
            assert!(matches!(&a.results[1].result, Some(R::Error(e)) if e.code == "INVALID_ARGUMENT"));
        } else {
            assert_eq!(a.results.len(), 1);
            assert!(matches!(a.results[0].result, Some(R::Ok(_))));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_worker_event_and_a_ready_for_no_tasks_get_stream_errors() {
    let n = TestNode::start().await;
    n.client().await.enqueue(enq("e", "x")).await.expect("enqueue");
    let mut s = open(&n.node().grpc_addr.to_string(), hello()).await.expect("open");
    // A WorkerEvent with no event set: nothing to serve, but not silence.
    s.tx.send(pb::WorkerEvent { event: None }).await.expect("send");
    let pb::server_event::Event::Error(e) = s.next().await else { panic!("expected a stream error") };
    assert_eq!((e.request_id, e.reason.as_str()), (0, "INVALID_ARGUMENT"), "{e:?}");
    // Ready for 0 tasks is a mistake, not "the default": refused, and nothing is claimed.
    s.ready(3, "e", 0).await;
    let pb::server_event::Event::Error(e) = s.next().await else { panic!("expected a stream error") };
    assert_eq!((e.request_id, e.reason.as_str()), (3, "INVALID_ARGUMENT"), "{e:?}");
    assert!(e.message.contains("count"), "{e:?}");
    // The stream still serves.
    s.ready(4, "e", 1).await;
    let pb::server_event::Event::TaskBatch(b) = s.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len()), (4, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_producer_event_is_refused() {
    let n = TestNode::start().await;
    let (tx, mut resp) = open_producer(&n.node().grpc_addr.to_string()).await;
    tx.send(pb::ProducerEvent { event: None }).await.expect("send");
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), resp.message())
            .await
            .expect("an answer within 10 s")
            .expect("ok")
            .expect("open");
        match m.event {
            Some(pb::producer_server_event::Event::HelloAck(_)) => {}
            Some(pb::producer_server_event::Event::Ack(a)) => {
                let e = a.error.expect("a refusal");
                assert_eq!((a.seq, e.code.as_str(), a.results.len()), (0, "INVALID_ARGUMENT", 0), "{e:?}");
                return;
            }
            None => panic!("empty event"),
        }
    }
}

/// A worker stream `worker_id` whose Ready (one task of `queue`) is parked on the node by now: nothing tells the
/// client, so it gives the dispatcher a moment.
async fn parked_ready(addr: &str, worker_id: &str, request_id: u64, queue: &str) -> Session {
    let hello = pb::worker_event::Event::Hello(pb::Hello { token: String::new(), worker_id: worker_id.into() });
    let s = open(addr, hello).await.expect("open");
    s.ready(request_id, queue, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    s
}

/// A Ready parked on an empty queue gets a new task claimed right behind the enqueue's entry (the dispatcher's
/// hand-off, counted in `handed_off`). An idempotent duplicate is handed off too, under the id its enqueue would
/// have had: apply finds no such task, and the Ready waits on and takes the next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_ready_takes_a_new_task_behind_its_enqueue_and_a_duplicate_leaves_it_waiting() {
    let n = TestNode::start().await;
    let handed = || n.node().shared.metrics.handed_off.load(std::sync::atomic::Ordering::Relaxed);
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    let mut first = parked_ready(&addr, "w-raw", 1, "h").await;
    let keyed = pb::EnqueueRequest { idempotency_key: "order-7".into(), ..enq("h", "one") };
    let id = c.enqueue(keyed.clone()).await.expect("enqueue").into_inner().task_id;
    let pb::server_event::Event::TaskBatch(b) = first.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len(), b.tasks[0].id.as_str()), (1, 1, id.as_str()));
    wait_until(Duration::from_secs(5), || handed() == 1).await;

    let mut second = parked_ready(&addr, "w-2", 2, "h").await;
    let dup = c.enqueue(keyed).await.expect("enqueue").into_inner();
    assert_eq!(dup.task_id, id, "the key's task, not a new one");
    // The duplicate's claim finds nothing; the Ready is parked again (no task, no answer yet).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(handed(), 1, "no task was claimed for the duplicate");
    let id2 = c.enqueue(enq("h", "two")).await.expect("enqueue").into_inner().task_id;
    let pb::server_event::Event::TaskBatch(b) = second.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len(), b.tasks[0].id.as_str()), (2, 1, id2.as_str()));
    wait_until(Duration::from_secs(5), || handed() == 2).await;
}

/// A task with a concurrency key is handed to a parked Ready behind its enqueue, as an unkeyed one is, while its
/// key has room; a task whose key is at its limit is not: the Ready stays parked until a slot of the key frees,
/// then takes it through the regular pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_ready_takes_a_keyed_task_behind_its_enqueue_only_while_its_key_has_room() {
    let n = TestNode::start().await;
    let handed = || n.node().shared.metrics.handed_off.load(std::sync::atomic::Ordering::Relaxed);
    let addr = n.node().grpc_addr.to_string();
    let mut c = n.client().await;
    let keyed = |payload: &str| pb::EnqueueRequest {
        concurrency_key: "acct-1".into(),
        concurrency_limit: 1,
        ..enq("hk", payload)
    };
    let mut first = parked_ready(&addr, "w-raw", 1, "hk").await;
    let id = c.enqueue(keyed("one")).await.expect("enqueue").into_inner().task_id;
    let pb::server_event::Event::TaskBatch(b) = first.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len(), b.tasks[0].id.as_str()), (1, 1, id.as_str()));
    wait_until(Duration::from_secs(5), || handed() == 1).await;

    // The key's one slot is taken: the next task of the key waits, and is not handed off.
    let mut second = parked_ready(&addr, "w-2", 2, "hk").await;
    let id2 = c.enqueue(keyed("two")).await.expect("enqueue").into_inner().task_id;
    let early = tokio::time::timeout(Duration::from_millis(500), second.rx.message()).await;
    assert!(early.is_err(), "a task of a full key was delivered: {early:?}");
    assert_eq!(handed(), 1, "nothing handed off for a full key");

    // The first task ends; its slot goes to the waiting task through the regular pick.
    let token = b.tasks[0].lease.as_ref().expect("lease").token;
    first
        .send(pb::worker_event::Event::Result(pb::Result {
            request_id: 3,
            task_id: id.clone(),
            token,
            outcome: Some(pb::result::Outcome::Completed(pb::Complete {
                result: b"ok".to_vec().into(),
                follow_ups: vec![],
            })),
        }))
        .await;
    let pb::server_event::Event::TaskBatch(b) = second.next().await else { panic!("expected a batch") };
    assert_eq!((b.request_id, b.tasks.len(), b.tasks[0].id.as_str()), (2, 1, id2.as_str()));
    assert_eq!(handed(), 1, "the second task came through the regular pick");
}
