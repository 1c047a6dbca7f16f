//! One worker stream: opening it (Hello, HelloAck), its send queue, and matching the server's answers to
//! waiting requests by request id. A session never reconnects itself; the supervisor in `worker/mod.rs`
//! opens the next one.

use foldhash::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use raftq_proto::v1 as pb;
use raftq_proto::v1::worker_stream_client::WorkerStreamClient;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use crate::connection::{outbound, Connector, HELLO_TIMEOUT, MAX_MESSAGE_BYTES, STREAM_SEND_BUFFER};
use crate::error::{Error, Result};

/// The server's answer to one request.
#[derive(Debug)]
pub(crate) enum Reply {
    Batch(Vec<pb::Task>),
    Ack(pb::TaskAck),
    AckBatch(Vec<pb::TaskAck>),
    Error(pb::StreamError),
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// It never left: the session was already closed.
    NotSent,
    /// It was queued or sent, then the session ended: the server may have acted on it.
    MaybeSent,
}

pub(crate) struct Session {
    pub addr: String,
    tx: mpsc::Sender<pb::WorkerEvent>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    pub closed: CancellationToken,
    /// Something was served on this session: the reconnect backoff may start over.
    answered: AtomicBool,
    /// Readys sent and not yet answered; a slot that stops waiting at shutdown leaves its Ready counted.
    readys: AtomicUsize,
    /// Retiring at shutdown: takes no new requests, closes once those in flight are answered.
    draining: AtomicBool,
    /// Closed because its node named another leader: the next stream goes there at once.
    redirected: AtomicBool,
}

/// Removes a request's waiter when the request ends, however it ends.
struct Waiting<'a> {
    session: &'a Session,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.session.forget(self.id);
    }
}

impl Session {
    /// Connects, sends Hello and waits for HelloAck.
    pub(crate) async fn open(
        conn: &Connector,
        token: &str,
        worker_id: &str,
    ) -> Result<(Session, Streaming<pb::ServerEvent>)> {
        let (addr, ch) = conn.channel().await?;
        let (tx, rx) = mpsc::channel(STREAM_SEND_BUFFER);
        let hello = pb::Hello { token: token.to_string(), worker_id: worker_id.to_string() };
        tx.try_send(pb::WorkerEvent { event: Some(pb::worker_event::Event::Hello(hello)) })
            .expect("a new channel has room for the Hello");
        let closed = CancellationToken::new();
        let mut client = WorkerStreamClient::new(ch)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let req = conn.request(outbound(rx, closed.clone()));
        let opened = tokio::time::timeout(HELLO_TIMEOUT, async {
            let mut inbound = client.stream(req).await?.into_inner();
            let first = inbound.message().await?;
            Ok::<_, tonic::Status>((inbound, first))
        })
        .await;
        let inbound = match opened {
            Ok(Ok((inbound, Some(pb::ServerEvent { event: Some(pb::server_event::Event::HelloAck(_)) })))) => inbound,
            Ok(Ok((_, other))) => {
                closed.cancel();
                return Err(Error::Protocol(format!("expected HelloAck, got {other:?}")));
            }
            Ok(Err(status)) => {
                closed.cancel();
                let e = Error::from_status(status, false);
                match &e {
                    Error::NotLeader { leader } => {
                        conn.redirect(&addr, leader.as_deref());
                    }
                    Error::Transport { .. } => conn.failed(&addr),
                    _ => {}
                }
                return Err(e);
            }
            Err(_) => {
                closed.cancel();
                conn.failed(&addr);
                return Err(Error::Transport {
                    message: format!("no HelloAck from {addr} within {HELLO_TIMEOUT:?}"),
                    source: None,
                });
            }
        };
        let session = Session {
            addr,
            tx,
            pending: Mutex::default(),
            closed,
            answered: AtomicBool::new(false),
            redirected: AtomicBool::new(false),
            readys: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        };
        Ok((session, inbound))
    }

    /// Sends `event` as request `id` and waits for its answer. Cancel-safe: dropping the future forgets the
    /// request, and a late answer then goes to the reader's orphan handling.
    pub(crate) async fn request(&self, id: u64, event: pb::WorkerEvent) -> std::result::Result<Reply, Lost> {
        let _waiting = Waiting { session: self, id };
        let rx = self.send(id, event).await?;
        rx.await.map_err(|_| Lost::MaybeSent)
    }

    /// Sends `event` as request `id`; the receiver gets its answer. Lost when the session ends first.
    pub(crate) async fn send(
        &self,
        id: u64,
        event: pb::WorkerEvent,
    ) -> std::result::Result<oneshot::Receiver<Reply>, Lost> {
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().expect("pending lock poisoned");
            // `close` cancels and `drain` flags under this lock: nothing registered later is lost or kept
            // waiting on a retiring stream.
            if !self.is_live() {
                return Err(Lost::NotSent);
            }
            p.insert(id, tx);
        }
        let sent = tokio::select! {
            r = self.tx.send(event) => r.is_ok(),
            _ = self.closed.cancelled() => false,
        };
        if !sent {
            self.forget(id);
            return Err(Lost::NotSent);
        }
        Ok(rx)
    }

    /// Stops waiting for request `id`: true when its answer had not come, so a late one is an orphan; false
    /// when the answer is already on its way to the receiver.
    pub(crate) fn forget(&self, id: u64) -> bool {
        self.pending.lock().expect("pending lock poisoned").remove(&id).is_some()
    }

    /// Open and not retiring: new requests may use it.
    pub(crate) fn is_live(&self) -> bool {
        !self.closed.is_cancelled() && !self.draining.load(Ordering::SeqCst)
    }

    /// Stops taking new requests; true when none is in flight any more, so the session may close.
    pub(crate) fn drain(&self) -> bool {
        let p = self.pending.lock().expect("pending lock poisoned");
        self.draining.store(true, Ordering::SeqCst);
        p.is_empty()
    }

    /// A Ready went out on this session.
    pub(crate) fn ready_sent(&self) {
        self.readys.fetch_add(1, Ordering::SeqCst);
    }

    /// A Ready of this session was answered.
    pub(crate) fn ready_answered(&self) {
        self.readys.fetch_sub(1, Ordering::SeqCst);
    }

    /// Readys the server may still be holding for this session.
    pub(crate) fn readys_outstanding(&self) -> usize {
        self.readys.load(Ordering::SeqCst)
    }

    /// Hands `reply` to the request `id` waits for; gives it back when nobody waits.
    pub(crate) fn answer(&self, id: u64, reply: Reply) -> std::result::Result<(), Reply> {
        let waiter = self.pending.lock().expect("pending lock poisoned").remove(&id);
        match waiter {
            Some(w) => w.send(reply),
            None => Err(reply),
        }
    }

    /// Ends the session: its stream closes and every waiting request learns it was lost.
    pub(crate) fn close(&self) {
        let mut p = self.pending.lock().expect("pending lock poisoned");
        self.closed.cancel();
        p.clear();
    }

    /// This node is not the leader: close, and have the next session go to `leader` (or the next address).
    pub(crate) fn not_leader(&self, conn: &Connector, leader: Option<&str>) {
        tracing::info!(addr = %self.addr, leader = leader.unwrap_or("unknown"), "worker stream is not on the leader");
        let followed = conn.redirect(&self.addr, leader);
        self.redirected.store(followed, Ordering::Relaxed);
        self.close();
    }

    /// Something failed in a way another server may not: close and move on to the next address.
    pub(crate) fn fail(&self, conn: &Connector) {
        conn.failed(&self.addr);
        self.close();
    }

    pub(crate) fn mark_answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Closed because its node named the leader.
    pub(crate) fn was_redirected(&self) -> bool {
        self.redirected.load(Ordering::Relaxed)
    }

    pub(crate) fn was_answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> (Session, mpsc::Receiver<pb::WorkerEvent>) {
        let (tx, rx) = mpsc::channel(4);
        let s = Session {
            addr: "http://a:1".into(),
            tx,
            pending: Mutex::default(),
            closed: CancellationToken::new(),
            answered: AtomicBool::new(false),
            readys: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            redirected: AtomicBool::new(false),
        };
        (s, rx)
    }

    #[tokio::test]
    async fn answers_reach_the_request_with_the_same_id() {
        let (s, mut rx) = session();
        let req = s.request(7, pb::WorkerEvent::default());
        tokio::pin!(req);
        // Poll until the request is sent, then answer it.
        tokio::select! {
            _ = &mut req => panic!("answered before the answer"),
            e = rx.recv() => assert!(e.is_some()),
        }
        assert!(s.answer(8, Reply::AckBatch(vec![])).is_err(), "no request 8 is waiting");
        assert!(s.answer(7, Reply::Batch(vec![])).is_ok());
        assert!(matches!(req.await, Ok(Reply::Batch(v)) if v.is_empty()));
    }

    #[tokio::test]
    async fn closing_loses_waiting_requests_and_refuses_new_ones() {
        let (s, mut rx) = session();
        let req = s.request(1, pb::WorkerEvent::default());
        tokio::pin!(req);
        tokio::select! {
            _ = &mut req => panic!("answered"),
            _ = rx.recv() => {}
        }
        s.close();
        assert_eq!(req.await.unwrap_err(), Lost::MaybeSent);
        assert_eq!(s.request(2, pb::WorkerEvent::default()).await.unwrap_err(), Lost::NotSent);
    }

    #[tokio::test]
    async fn a_draining_session_refuses_new_requests_and_closes_when_the_last_is_answered() {
        let (s, mut rx) = session();
        let req = s.request(1, pb::WorkerEvent::default());
        tokio::pin!(req);
        tokio::select! {
            _ = &mut req => panic!("answered"),
            _ = rx.recv() => {}
        }
        assert!(!s.drain(), "request 1 is still in flight");
        assert!(!s.is_live());
        assert_eq!(s.request(2, pb::WorkerEvent::default()).await.unwrap_err(), Lost::NotSent);
        assert!(s.answer(1, Reply::Batch(vec![])).is_ok());
        assert!(req.await.is_ok());
        assert!(s.drain(), "nothing in flight: may close");
    }

    #[tokio::test]
    async fn forget_tells_whether_the_answer_was_already_on_its_way() {
        let (s, _rx) = session();
        let mut first = s.send(1, pb::WorkerEvent::default()).await.expect("sent");
        assert!(s.answer(1, Reply::Batch(vec![])).is_ok());
        assert!(!s.forget(1), "answered before forgetting: the receiver holds the answer");
        assert!(matches!(first.try_recv(), Ok(Reply::Batch(_))));
        let _second = s.send(2, pb::WorkerEvent::default()).await.expect("sent");
        assert!(s.forget(2));
        assert!(s.answer(2, Reply::Batch(vec![])).is_err(), "a late answer is an orphan");
    }

    #[tokio::test]
    async fn a_dropped_request_forgets_its_waiter() {
        let (s, mut rx) = session();
        {
            let req = s.request(3, pb::WorkerEvent::default());
            tokio::pin!(req);
            tokio::select! {
                _ = &mut req => panic!("answered"),
                _ = rx.recv() => {}
            }
        }
        assert!(s.answer(3, Reply::Batch(vec![])).is_err(), "the late answer is an orphan");
    }
}
