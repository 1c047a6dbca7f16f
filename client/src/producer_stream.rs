//! The pipelined producer over `ProducerStream.Stream`: Hello first, then creates numbered by a client
//! sequence number and answered by `CreateAck`s carrying that number, many in flight at once. A broken stream
//! is reopened for the next create; creates it carried end with an unknown outcome and are never resent.
//!
//! Creates that queue up on the stream while it sends (a producer faster than one message at a time) leave as
//! one `CreateBatch` (see [`pack`]): one message, one decode and one answer for many creates, each create still
//! answered with its own results. Creates with a debounce or singleton key are never packed (the server
//! proposes those alone, and may refuse them before its cluster version allows them), nor is a create sent again
//! after an overload refusal (a depth limit refuses a whole batch: alone, each gets in as room allows).

use foldhash::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use raftq_proto::v1 as pb;
use raftq_proto::v1::producer_stream_client::ProducerStreamClient;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backoff::Backoff;
use crate::connection::{outbound, HELLO_TIMEOUT, MAX_MESSAGE_BYTES, STREAM_SEND_BUFFER};
use crate::error::{Error, Result};
use crate::producer::{enqueue_results, next_step, Kind, Next, Producer, ProducerInner};
use crate::task::{Enqueued, NewTask};

/// A create refused with NOT_LEADER (so not applied) is sent again on a stream to the leader at most this
/// many times: enough to follow one leader change, not to spin through an election.
const MAX_REDIRECTS: u32 = 3;

/// Bytes of tasks packed into one `CreateBatch` at most (one create larger than this leaves alone).
const PACK_MAX_BYTES: usize = 1 << 20;
/// Tasks packed into one `CreateBatch` at most (and never more than the server's `max_create_items`).
const PACK_MAX_ITEMS: usize = 256;

/// A create's ack, and whether it came as part of a packed `CreateBatch`'s.
type Answer = Result<(pb::CreateAck, bool)>;
type PendingMap = Arc<Mutex<HashMap<u64, Waiter>>>;
/// Packed creates in flight: a `CreateBatch`'s sequence number (its first create's) -> each packed create's
/// sequence number and task count, in order.
type PackedMap = Arc<Mutex<HashMap<u64, Vec<(u64, usize)>>>>;
/// An event queued on the stream, and whether it may be packed with others.
type Outgoing = (pb::ProducerEvent, bool);

/// A create waiting for its ack, holding its room in the in-flight limit: the ack reader releases it when the
/// answer arrives (or the stream ends), whether or not the caller is awaiting the create's future yet.
struct Waiter {
    tx: oneshot::Sender<Answer>,
    permit: OwnedSemaphorePermit,
}

/// A pipelined producer: `create` returns as soon as the task is on the stream, with a [`PendingEnqueue`]
/// that resolves when the server acknowledges it. Awaiting many pending creates together keeps many in
/// flight on one stream:
///
/// ```no_run
/// # async fn f(p: raftq_client::Producer) -> raftq_client::Result<()> {
/// use raftq_client::NewTask;
/// let s = p.stream().await?;
/// let mut pending = Vec::new();
/// for i in 0..1000 {
///     pending.push(s.create(NewTask::new("emails", format!("hello {i}"))).await?);
/// }
/// for r in futures::future::join_all(pending).await {
///     println!("{}", r?.task_id);
/// }
/// # Ok(()) }
/// ```
///
/// At most `ProducerConfig::stream_max_in_flight` creates are unanswered at once; `create` waits for room,
/// which an answer frees as it arrives (collecting more pending creates than that before awaiting any of them
/// is fine). If the stream breaks, creates still waiting for their answer end with [`Error::UnknownOutcome`] (they
/// may have been applied) and the next `create` opens a new stream.
#[derive(Clone)]
pub struct StreamProducer {
    inner: Arc<Inner>,
}

struct Inner {
    producer: Producer,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    next_seq: AtomicU64,
    in_flight: Arc<Semaphore>,
}

struct Session {
    addr: String,
    tx: mpsc::Sender<Outgoing>,
    pending: PendingMap,
    closed: CancellationToken,
    _reader: AbortOnDropHandle<()>,
}

impl fmt::Debug for StreamProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamProducer").field("next_seq", &self.inner.next_seq.load(Ordering::Relaxed)).finish()
    }
}

/// The answer to one [`StreamProducer::create`]: a future of the item's result.
#[must_use = "the create's outcome is only known by awaiting it"]
pub struct PendingEnqueue(BoxFuture<'static, Result<Enqueued>>);

impl Future for PendingEnqueue {
    type Output = Result<Enqueued>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for PendingEnqueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PendingEnqueue")
    }
}

/// The answer to one [`StreamProducer::create_batch`]: a future of the per-item results, in order, or of
/// the batch's failure as a whole.
#[must_use = "the batch's outcome is only known by awaiting it"]
pub struct PendingBatch(BoxFuture<'static, Result<Vec<Result<Enqueued>>>>);

impl Future for PendingBatch {
    type Output = Result<Vec<Result<Enqueued>>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for PendingBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PendingBatch")
    }
}

impl StreamProducer {
    pub(crate) async fn open(producer: Producer) -> Result<StreamProducer> {
        let in_flight = Arc::new(Semaphore::new(producer.inner.cfg.stream_max_in_flight));
        let inner = Arc::new(Inner {
            producer,
            session: tokio::sync::Mutex::new(None),
            next_seq: AtomicU64::new(1),
            in_flight,
        });
        inner.session().await?;
        Ok(StreamProducer { inner })
    }

    /// Puts one create on the stream (waiting for room when `stream_max_in_flight` are pending) and returns
    /// the future of its result.
    pub async fn create(&self, task: NewTask) -> Result<PendingEnqueue> {
        let req = task.into_proto();
        let permit = self.inner.permit().await?;
        let inner = self.inner.clone();
        let items = vec![req];
        let rx = inner.submit(&items, permit, true).await?;
        Ok(PendingEnqueue(Box::pin(async move {
            let ack = inner.answer(rx, &items).await;
            let mut v = enqueue_results(ack?.results, 1)?;
            v.pop().expect("exactly one result, checked above")
        })))
    }

    /// Puts many creates on the stream as one request (one Raft entry) and returns the future of their
    /// results: items succeed or fail one by one.
    pub async fn create_batch(&self, tasks: Vec<NewTask>) -> Result<PendingBatch> {
        if tasks.is_empty() {
            return Ok(PendingBatch(Box::pin(async { Ok(Vec::new()) })));
        }
        let items: Vec<pb::EnqueueRequest> = tasks.into_iter().map(NewTask::into_proto).collect();
        let permit = self.inner.permit().await?;
        let inner = self.inner.clone();
        let rx = inner.submit(&items, permit, true).await?;
        Ok(PendingBatch(Box::pin(async move {
            let ack = inner.answer(rx, &items).await;
            enqueue_results(ack?.results, items.len())
        })))
    }
}

fn event(seq: u64, items: &[pb::EnqueueRequest]) -> pb::ProducerEvent {
    use pb::producer_event::Event;
    let event = match items {
        [one] => Event::Create(pb::Create { seq, task: Some(one.clone()) }),
        many => Event::CreateBatch(pb::CreateBatch { seq, tasks: many.to_vec() }),
    };
    pb::ProducerEvent { event: Some(event) }
}

impl Inner {
    /// Room for one more create in flight.
    async fn permit(&self) -> Result<OwnedSemaphorePermit> {
        self.in_flight.clone().acquire_owned().await.map_err(|_| Error::Closed("the producer stream is closed".into()))
    }

    /// Sends a create (or batch) on the current stream, reopening it when it is closed. Only a send that
    /// certainly did not leave is repeated. `permit` is released when the answer arrives.
    async fn submit(
        &self,
        items: &[pb::EnqueueRequest],
        mut permit: OwnedSemaphorePermit,
        pack: bool,
    ) -> Result<oneshot::Receiver<Answer>> {
        let mut last = None;
        for _ in 0..=MAX_REDIRECTS {
            let s = self.session().await?;
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            {
                let mut p = s.pending.lock().expect("pending lock poisoned");
                // The reader cancels `closed` under this lock before it fails what is pending: an entry added
                // after that would never be answered.
                if s.closed.is_cancelled() {
                    continue;
                }
                p.insert(seq, Waiter { tx, permit });
            }
            let sent = tokio::select! {
                // The send first: with room on the stream it is done at its first poll, without waiting on the
                // stream's shared `closed` token.
                biased;
                r = s.tx.send((event(seq, items), pack)) => r.is_ok(),
                _ = s.closed.cancelled() => false,
            };
            if sent {
                return Ok(rx);
            }
            // The stream's send side is gone, so the create never left: safe to send on a new stream. The
            // reader may have failed the entry meanwhile (taking its permit): then take new room.
            let waiter = s.pending.lock().expect("pending lock poisoned").remove(&seq);
            s.closed.cancel();
            permit = match waiter {
                Some(w) => w.permit,
                None => self.permit().await?,
            };
            last = Some(Error::Closed("the producer stream closed while sending".into()));
        }
        Err(last.unwrap_or_else(|| Error::Closed("the producer stream keeps closing".into())))
    }

    /// Waits for the ack of `rx`; a NOT_LEADER refusal (nothing applied) is sent again to the leader. An overload
    /// refusal (`QUEUE_FULL`, `RATE_LIMITED`: nothing applied) is sent again after the server's retry hint, for up
    /// to `request_timeout`, holding its room in the in-flight limit meanwhile: a producer faster than the queue
    /// drains finds `create` waiting (flow control) instead of flooding the server with refused creates. A create
    /// refused with the packed batch it went in is sent again alone at once: the batch as a whole may not have
    /// fitted where the create alone does.
    async fn answer(&self, mut rx: oneshot::Receiver<Answer>, items: &[pb::EnqueueRequest]) -> Result<pb::CreateAck> {
        let mut redirects = 0;
        let give_up = tokio::time::Instant::now() + self.producer.inner.cfg.request_timeout;
        loop {
            let (ack, packed) = rx.await.unwrap_or_else(|_| {
                Err(Error::UnknownOutcome { message: "the producer stream ended before the answer".into() })
            })?;
            let Some(pb::Error { code, message, retry_after_ms }) = &ack.error else {
                return Ok(ack);
            };
            let err = Error::from_reason(code, message, None);
            if err.is_overload() && packed {
                let permit = self.permit().await?;
                rx = self.submit(items, permit, false).await?;
                continue;
            }
            if err.is_overload() {
                let wait = std::time::Duration::from_millis((*retry_after_ms).clamp(10, 30_000));
                if tokio::time::Instant::now() + wait > give_up {
                    return Err(err);
                }
                let permit = self.permit().await?;
                tokio::time::sleep(wait).await;
                // Alone: packed with others, it could be refused whole again for their sake.
                rx = self.submit(items, permit, false).await?;
                continue;
            }
            if !matches!(err, Error::NotLeader { .. }) || redirects >= MAX_REDIRECTS {
                return Err(err);
            }
            redirects += 1;
            self.not_leader(&err).await;
            // The refused create's room was freed with its answer; the resend takes new room.
            let permit = self.permit().await?;
            rx = self.submit(items, permit, true).await?;
        }
    }

    /// The stream's node is not the leader: close it and point the connector at the leader.
    async fn not_leader(&self, err: &Error) {
        let Error::NotLeader { leader } = err else { return };
        let mut cur = self.session.lock().await;
        if let Some(s) = cur.take() {
            self.producer.inner.conn.redirect(&s.addr, leader.as_deref());
            s.closed.cancel();
        }
    }

    /// The open stream, or a new one (following NOT_LEADER and retrying unreachable servers with backoff).
    async fn session(&self) -> Result<Arc<Session>> {
        let mut cur = self.session.lock().await;
        if let Some(s) = cur.as_ref().filter(|s| !s.closed.is_cancelled()) {
            return Ok(s.clone());
        }
        let cfg = &self.producer.inner.cfg;
        let mut backoff = Backoff::new(cfg.retry_backoff_min, cfg.retry_backoff_max);
        let mut tries = 0;
        loop {
            tries += 1;
            match Session::open(&self.producer).await {
                Ok(s) => {
                    *cur = Some(s.clone());
                    return Ok(s);
                }
                // Opening a stream changes nothing on the server: retry like a read.
                Err(e) => match next_step(Kind::Read, &e) {
                    Next::Stop => return Err(e),
                    _ if tries > cfg.max_retries => return Err(e),
                    Next::Now => {}
                    Next::Later => tokio::time::sleep(backoff.next_delay()).await,
                },
            }
        }
    }
}

impl Session {
    async fn open(producer: &Producer) -> Result<Arc<Session>> {
        let conn = &producer.inner.conn;
        let (addr, ch) = conn.channel().await?;
        let (tx, rx) = mpsc::channel(STREAM_SEND_BUFFER);
        let token = conn.token(producer.inner.cfg.token.as_deref());
        let hello = pb::Hello { token, worker_id: String::new() };
        tx.try_send((pb::ProducerEvent { event: Some(pb::producer_event::Event::Hello(hello)) }, false))
            .expect("a new channel has room for the Hello");
        let closed = CancellationToken::new();
        let mut client = ProducerStreamClient::new(ch)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        // The packer learns the server's limit from the HelloAck; nothing but the Hello is sent before it.
        let max_items = Arc::new(AtomicU64::new(0));
        let packed: PackedMap = Arc::default();
        let req = conn.request(pack(rx, closed.clone(), packed.clone(), max_items.clone()));
        let opened = tokio::time::timeout(HELLO_TIMEOUT, async {
            let mut inbound = client.stream(req).await?.into_inner();
            match inbound.message().await? {
                Some(pb::ProducerServerEvent { event: Some(pb::producer_server_event::Event::HelloAck(ack)) }) => {
                    Ok(Ok((inbound, ack.max_create_items)))
                }
                other => Ok(Err(Error::Protocol(format!("expected HelloAck, got {other:?}")))),
            }
        })
        .await;
        let inbound = match opened {
            Ok(Ok(Ok((inbound, max)))) => {
                max_items.store(u64::from(max).min(PACK_MAX_ITEMS as u64), Ordering::Relaxed);
                inbound
            }
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(status)) => {
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
                conn.failed(&addr);
                return Err(Error::Transport {
                    message: format!("no HelloAck from {addr} within {HELLO_TIMEOUT:?}"),
                    source: None,
                });
            }
        };
        let pending: PendingMap = Arc::default();
        let lost = Lost { producer: producer.inner.clone(), addr: addr.clone() };
        let reader = tokio::spawn(read_acks(inbound, pending.clone(), packed, closed.clone(), lost));
        tracing::debug!(addr = %addr, "producer stream opened");
        Ok(Arc::new(Session { addr, tx, pending, closed, _reader: AbortOnDropHandle::new(reader) }))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// The stream's node, for the connector to move on from when the stream breaks under it.
struct Lost {
    producer: Arc<ProducerInner>,
    addr: String,
}

/// Hands each CreateAck to the create waiting for its sequence number. When the stream ends, whatever is
/// still waiting gets an unknown outcome: it was sent and may have been applied.
async fn read_acks(
    mut inbound: tonic::Streaming<pb::ProducerServerEvent>,
    pending: PendingMap,
    packed: PackedMap,
    closed: CancellationToken,
    lost: Lost,
) {
    let why = loop {
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = closed.cancelled() => break "the producer stream was closed".to_string(),
        };
        match msg {
            Ok(Some(pb::ProducerServerEvent { event: Some(pb::producer_server_event::Event::Ack(ack)) })) => {
                let parts = packed.lock().expect("packed lock poisoned").remove(&ack.seq);
                match parts {
                    None => answer(&pending, ack, false),
                    Some(parts) => {
                        for ack in unpack(ack, &parts) {
                            answer(&pending, ack, true);
                        }
                    }
                }
            }
            Ok(Some(other)) => tracing::debug!(event = ?other, "ignoring an unexpected producer stream event"),
            Ok(None) => {
                lost.producer.conn.stream_broke(&lost.addr, None);
                break "the server ended the producer stream".to_string();
            }
            Err(status) => {
                let why = format!("the producer stream failed: {status}");
                lost.producer.conn.stream_broke(&lost.addr, Some(&Error::from_status(status, false)));
                break why;
            }
        }
    };
    let n = fail_pending(&pending, &closed, &why);
    if n > 0 {
        tracing::warn!(creates = n, reason = %why, "producer stream ended with creates in flight");
    }
}

/// Hands one create's ack to its waiter. Dropping the waiter frees its room, whether or not anyone awaits the
/// answer yet.
fn answer(pending: &PendingMap, ack: pb::CreateAck, packed: bool) {
    let waiter = pending.lock().expect("pending lock poisoned").remove(&ack.seq);
    match waiter {
        Some(Waiter { tx, permit }) => {
            drop(permit);
            let _ = tx.send(Ok((ack, packed)));
        }
        None => tracing::warn!(seq = ack.seq, "an ack for no pending create"),
    }
}

/// The stream's outbound side: events as they were queued, except that creates queued one after another
/// (nothing else between them, each queued as one that may be packed) leave as one `CreateBatch`, up to
/// `max_items` tasks (0 or 1: never packed; set from the server's HelloAck) and [`PACK_MAX_BYTES`]. The batch
/// takes its first create's sequence number, and `packed` remembers which creates it carries so that
/// [`unpack`] can answer each.
fn pack(
    rx: mpsc::Receiver<Outgoing>,
    closed: CancellationToken,
    packed: PackedMap,
    max_items: Arc<AtomicU64>,
) -> impl futures::Stream<Item = pb::ProducerEvent> + Send + 'static {
    use futures::{FutureExt, StreamExt};
    // Fused: packing may see the end first, and the next turn asks again.
    let events = outbound(rx, closed).fuse();
    futures::stream::unfold((Box::pin(events), None::<Outgoing>), move |(mut events, carry)| {
        let (packed, max) = (packed.clone(), max_items.load(Ordering::Relaxed) as usize);
        async move {
            let (first, may) = match carry {
                Some(e) => e,
                None => events.next().await?,
            };
            let Some((seq, n, bytes)) = packable(&first).filter(|_| may && max > 1) else {
                return Some((first, (events, None)));
            };
            let mut batch = Batch { seq, tasks: Vec::new(), parts: Vec::new(), bytes: 0, max };
            if !batch.fits(n, bytes) {
                return Some((first, (events, None)));
            }
            batch.push(first, bytes);
            let mut carry = None;
            // Only what is queued already: packing never waits for more.
            while let Some(Some((next, may))) = events.next().now_or_never() {
                match packable(&next).filter(|_| may) {
                    Some((_, n, bytes)) if batch.fits(n, bytes) => batch.push(next, bytes),
                    _ => {
                        carry = Some((next, may));
                        break;
                    }
                }
            }
            Some((batch.finish(&packed), (events, carry)))
        }
    })
}

/// Creates being packed into one `CreateBatch`.
struct Batch {
    seq: u64,
    tasks: Vec<pb::EnqueueRequest>,
    parts: Vec<(u64, usize)>,
    bytes: usize,
    max: usize,
}

impl Batch {
    fn fits(&self, items: usize, bytes: usize) -> bool {
        self.tasks.len() + items <= self.max && self.bytes + bytes <= PACK_MAX_BYTES
    }

    /// Adds a packable create (`bytes`: its tasks' encoded size, as [`packable`] measured it).
    fn push(&mut self, event: pb::ProducerEvent, bytes: usize) {
        use pb::producer_event::Event;
        let (seq, tasks) = match event.event {
            Some(Event::Create(c)) => (c.seq, c.task.into_iter().collect()),
            Some(Event::CreateBatch(b)) => (b.seq, b.tasks),
            _ => unreachable!("only packable events are pushed"),
        };
        self.bytes += bytes;
        self.parts.push((seq, tasks.len()));
        self.tasks.extend(tasks);
    }

    /// The event to send: the one create (or batch) as it was queued, or a `CreateBatch` of them all, remembered
    /// in `packed`.
    fn finish(mut self, packed: &PackedMap) -> pb::ProducerEvent {
        use pb::producer_event::Event;
        let event = match self.parts[..] {
            [(seq, 1)] => Event::Create(pb::Create { seq, task: self.tasks.pop() }),
            [(seq, _)] => Event::CreateBatch(pb::CreateBatch { seq, tasks: self.tasks }),
            _ => {
                packed.lock().expect("packed lock poisoned").insert(self.seq, self.parts);
                Event::CreateBatch(pb::CreateBatch { seq: self.seq, tasks: self.tasks })
            }
        };
        pb::ProducerEvent { event: Some(event) }
    }
}

/// A create that may be packed: its sequence number, task count and encoded task bytes. Not one whose tasks
/// use a debounce or singleton key.
fn packable(e: &pb::ProducerEvent) -> Option<(u64, usize, usize)> {
    use pb::producer_event::Event;
    let (seq, tasks) = match &e.event {
        Some(Event::Create(c)) => (c.seq, std::slice::from_ref(c.task.as_ref()?)),
        Some(Event::CreateBatch(b)) => (b.seq, &b.tasks[..]),
        _ => return None,
    };
    if tasks.is_empty() || tasks.iter().any(|t| t.debounce.is_some() || t.singleton.is_some()) {
        return None;
    }
    Some((seq, tasks.len(), tasks.iter().map(prost::Message::encoded_len).sum()))
}

/// Splits the ack of a packed `CreateBatch` into one ack per create it carried: each its own results, in
/// order, or the batch's error when it failed as a whole. Results missing from a short answer are missing from
/// the last creates' acks (whose callers report the mismatch).
fn unpack(ack: pb::CreateAck, parts: &[(u64, usize)]) -> Vec<pb::CreateAck> {
    let mut results = ack.results.into_iter();
    parts
        .iter()
        .map(|&(seq, n)| match &ack.error {
            Some(e) => pb::CreateAck { seq, results: vec![], error: Some(e.clone()) },
            None => pb::CreateAck { seq, results: results.by_ref().take(n).collect(), error: None },
        })
        .collect()
}

/// Closes the session and answers every waiting create with an unknown outcome; returns how many there were.
fn fail_pending(pending: &PendingMap, closed: &CancellationToken, why: &str) -> usize {
    let mut p = pending.lock().expect("pending lock poisoned");
    closed.cancel();
    let n = p.len();
    for (_, Waiter { tx, permit }) in p.drain() {
        drop(permit);
        let _ = tx.send(Err(Error::UnknownOutcome { message: format!("{why} before the answer") }));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_item_is_a_create_and_many_are_a_batch() {
        let t = pb::EnqueueRequest { queue: "q".into(), ..Default::default() };
        let one = event(7, std::slice::from_ref(&t));
        assert!(matches!(one.event, Some(pb::producer_event::Event::Create(pb::Create { seq: 7, .. }))));
        let many = event(8, &[t.clone(), t]);
        assert!(
            matches!(many.event, Some(pb::producer_event::Event::CreateBatch(ref b)) if b.seq == 8 && b.tasks.len() == 2)
        );
    }

    fn create(seq: u64, queue: &str) -> pb::ProducerEvent {
        event(seq, &[pb::EnqueueRequest { queue: queue.into(), ..Default::default() }])
    }

    fn seqs_and_sizes(e: &pb::ProducerEvent) -> (u64, usize) {
        packable(e).map(|(seq, n, _)| (seq, n)).expect("a create")
    }

    /// Queues `events`, then reads what the packer sends (the queue stays open: it waits for nothing more).
    async fn packed_as(events: Vec<Outgoing>, max: u64) -> (Vec<pb::ProducerEvent>, PackedMap) {
        use futures::StreamExt;
        let (tx, rx) = mpsc::channel(64);
        let n = events.len();
        for e in events {
            tx.try_send(e).expect("room");
        }
        let packed: PackedMap = Arc::default();
        let out = pack(rx, CancellationToken::new(), packed.clone(), Arc::new(AtomicU64::new(max)));
        let mut out = Box::pin(out);
        let mut sent = Vec::new();
        let mut carried = 0;
        while carried < n {
            let e = out.next().await.expect("an event");
            carried += match &e.event {
                Some(pb::producer_event::Event::CreateBatch(b)) => {
                    packed.lock().unwrap().get(&b.seq).map_or(1, |parts| parts.len())
                }
                _ => 1,
            };
            sent.push(e);
        }
        (sent, packed)
    }

    #[tokio::test]
    async fn creates_queued_together_leave_as_one_batch_that_is_answered_create_by_create() {
        let keyed = {
            let mut t = pb::EnqueueRequest { queue: "q".into(), ..Default::default() };
            t.singleton = Some(pb::Singleton { key: "s".into(), mode: 0 });
            event(4, &[t])
        };
        let two = event(2, &[pb::EnqueueRequest::default(), pb::EnqueueRequest::default()]);
        let queued = vec![create(1, "a"), two, keyed, create(5, "b"), create(6, "c"), create(7, "d"), create(8, "e")];
        let mut queued: Vec<Outgoing> = queued.into_iter().map(|e| (e, true)).collect();
        queued[5].1 = false; // 7: sent again after an overload refusal
        let (sent, packed) = packed_as(queued, 256).await;
        let shapes: Vec<_> = sent.iter().map(seqs_and_sizes_or_keyed).collect();
        // 1 and 2 (three tasks) packed; the singleton create alone and never packed; 5 and 6 packed after it; 7
        // alone, as it was queued; 8 after it.
        assert_eq!(shapes, vec![(1, 3), (4, 1), (5, 2), (7, 1), (8, 1)], "{sent:?}");
        assert_eq!(packed.lock().unwrap().get(&1), Some(&vec![(1, 1), (2, 2)]));
        assert_eq!(packed.lock().unwrap().get(&5), Some(&vec![(5, 1), (6, 1)]));
        assert_eq!(packed.lock().unwrap().len(), 2);

        // The batch's answer, split: each create gets its own results, in order.
        let ok = |id: &str| pb::EnqueueResult {
            result: Some(pb::enqueue_result::Result::Ok(pb::EnqueueResponse {
                task_id: id.into(),
                ..Default::default()
            })),
        };
        let ack = pb::CreateAck { seq: 1, results: vec![ok("t1"), ok("t2"), ok("t3")], error: None };
        let acks = unpack(ack, &[(1, 1), (2, 2)]);
        assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(acks[0].results, vec![ok("t1")]);
        assert_eq!(acks[1].results, vec![ok("t2"), ok("t3")]);
        // A batch refused as a whole: every create it carried gets the refusal.
        let refused = pb::Error { code: "NOT_LEADER".into(), ..Default::default() };
        let acks = unpack(pb::CreateAck { seq: 5, results: vec![], error: Some(refused.clone()) }, &[(5, 1), (6, 1)]);
        assert!(acks.iter().all(|a| a.error.as_ref() == Some(&refused) && a.results.is_empty()), "{acks:?}");
        assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), vec![5, 6]);
    }

    fn seqs_and_sizes_or_keyed(e: &pb::ProducerEvent) -> (u64, usize) {
        match &e.event {
            Some(pb::producer_event::Event::Create(c)) if c.task.as_ref().is_some_and(|t| t.singleton.is_some()) => {
                (c.seq, 1)
            }
            _ => seqs_and_sizes(e),
        }
    }

    #[tokio::test]
    async fn packing_keeps_to_the_servers_limit_and_is_off_when_the_server_names_none() {
        let (sent, packed) = packed_as((1..=5).map(|s| (create(s, "q"), true)).collect(), 2).await;
        let shapes: Vec<_> = sent.iter().map(seqs_and_sizes).collect();
        assert_eq!(shapes, vec![(1, 2), (3, 2), (5, 1)]);
        assert!(matches!(sent[2].event, Some(pb::producer_event::Event::Create(_))), "one create leaves as it was");
        assert_eq!(packed.lock().unwrap().len(), 2);

        let (sent, packed) = packed_as((1..=3).map(|s| (create(s, "q"), true)).collect(), 0).await;
        assert!(sent.iter().all(|e| matches!(e.event, Some(pb::producer_event::Event::Create(_)))), "{sent:?}");
        assert!(packed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_broken_stream_fails_pending_creates_as_unknown_outcome_and_frees_their_room() {
        let room = Arc::new(Semaphore::new(1));
        let pending: PendingMap = Arc::default();
        let (tx, rx) = oneshot::channel();
        let permit = room.clone().try_acquire_owned().expect("room");
        pending.lock().unwrap().insert(1, Waiter { tx, permit });
        assert_eq!(room.available_permits(), 0);
        let closed = CancellationToken::new();
        assert_eq!(fail_pending(&pending, &closed, "the producer stream failed"), 1);
        assert!(closed.is_cancelled(), "no create may be added after the failure");
        assert_eq!(room.available_permits(), 1, "freed without anyone awaiting the answer");
        let got = rx.await.expect("answered");
        assert!(matches!(got, Err(Error::UnknownOutcome { .. })), "{got:?}");
    }
}
