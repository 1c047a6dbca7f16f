//! The producer: unary enqueue, batch enqueue, reads and cancel over `TaskService`, with leader following and
//! the retry rules (reads retry transient errors; writes retry only what was certainly not applied).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use raftq_proto::v1 as pb;
use raftq_proto::v1::task_service_client::TaskServiceClient;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::connection::{validate_target, Connector, DEFAULT_ADDR, MAX_MESSAGE_BYTES};
use crate::error::{Error, Result};
use crate::producer_stream::StreamProducer;
use crate::task::{duration_ms, Enqueued, NewTask, Task, TaskResult, TaskState};

/// How a [`Producer`] reaches the cluster. Build it with struct update syntax over `Default`:
///
/// ```
/// use raftq_client::ProducerConfig;
/// let cfg = ProducerConfig { addrs: vec!["http://10.0.0.1:9091".into()], ..Default::default() };
/// # let _ = cfg;
/// ```
#[derive(Clone)]
pub struct ProducerConfig {
    /// Server addresses (`host:port` or `http://host:port`), tried in order.
    pub addrs: Vec<String>,
    /// Bearer token sent with every request.
    pub token: Option<String>,
    /// Asked for the token of every request (and of each producer stream's Hello), so a long-lived producer
    /// outlives its tokens. Takes precedence over `token`.
    pub token_provider: Option<crate::TokenProvider>,
    /// The CA (PEM) servers are verified with; addresses without a scheme then use https.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// Longest wait for a connection to one address.
    pub connect_timeout: Duration,
    /// Longest wait for the answer to one request (a result wait is added on top).
    pub request_timeout: Duration,
    /// How many more times a request is tried when that is safe (see [`Producer`]).
    pub max_retries: u32,
    /// First delay between tries; it doubles up to `retry_backoff_max`.
    pub retry_backoff_min: Duration,
    /// Longest delay between tries.
    pub retry_backoff_max: Duration,
    /// Creates a [`StreamProducer`] keeps in flight before `create` waits.
    pub stream_max_in_flight: usize,
    /// Ask a follower to name the leader (`NOT_LEADER`) instead of forwarding, and send later requests to the
    /// leader directly (the default: right for a long-lived producer). `false`: every request goes to the node
    /// reached, which forwards it; one hop more per request and no second connection, which suits one-shot
    /// tools (the `raftq` CLI) and clients that cannot reach the leader's advertised address.
    pub follow_leader: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            addrs: vec![DEFAULT_ADDR.into()],
            token: None,
            token_provider: None,
            tls_ca_pem: None,
            connect_timeout: Duration::from_secs(5),
            // Long enough for a write that waits out a leader election (the server reports UNKNOWN_OUTCOME
            // after its own write timeout, 10 s by default).
            request_timeout: Duration::from_secs(30),
            // With the default backoff, 5 retries cover about 3 s: a leader election, not an outage.
            max_retries: 5,
            retry_backoff_min: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(2),
            // Deep enough to fill the server's group commit; the server serves 1024 at once per stream.
            stream_max_in_flight: 1024,
            follow_leader: true,
        }
    }
}

impl fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerConfig")
            .field("addrs", &self.addrs)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff_min", &self.retry_backoff_min)
            .field("retry_backoff_max", &self.retry_backoff_max)
            .field("stream_max_in_flight", &self.stream_max_in_flight)
            .field("follow_leader", &self.follow_leader)
            .finish()
    }
}

impl ProducerConfig {
    /// Every violated rule, one line each.
    pub fn validate(&self) -> Result<()> {
        let mut e = Vec::new();
        validate_target(&self.addrs, self.token.as_deref(), self.tls_ca_pem.as_deref(), &mut e);
        if self.connect_timeout.is_zero() {
            e.push("connect_timeout must be > 0".into());
        }
        if self.request_timeout.is_zero() {
            e.push("request_timeout must be > 0".into());
        }
        if self.retry_backoff_min.is_zero() || self.retry_backoff_min > self.retry_backoff_max {
            e.push("retry_backoff_min must be > 0 and <= retry_backoff_max".into());
        }
        if self.stream_max_in_flight == 0 {
            e.push("stream_max_in_flight must be >= 1".into());
        }
        if e.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(e))
        }
    }
}

/// Whether a request changes state: decides what may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// What to do after a failed try.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again at once (a leader was named).
    Now,
    /// Try again after a backoff delay.
    Later,
    /// Give the error to the caller.
    Stop,
}

/// The retry rule. Reads retry everything transient. Writes retry only what certainly was not applied: a
/// NOT_LEADER answer, an overload refusal and a connection that could not be made. An unknown outcome is never retried.
pub(crate) fn next_step(kind: Kind, e: &Error) -> Next {
    match e {
        Error::NotLeader { leader: Some(_) } => Next::Now,
        Error::NotLeader { leader: None } | Error::Transport { .. } => Next::Later,
        Error::UnknownOutcome { .. } if kind == Kind::Read => Next::Later,
        Error::Server { .. } if kind == Kind::Read && e.is_retryable() => Next::Later,
        // Refused whole before anything was proposed: a write too may go again, after the backoff.
        Error::Server { .. } if e.is_overload() => Next::Later,
        _ => Next::Stop,
    }
}

/// Enqueues tasks and reads them back. Cheap to clone; clones share one connection.
///
/// Each call goes to the last server that answered, starting with the first of `addrs`; a `NOT_LEADER`
/// answer sends it to the leader it names (or the next address). Reads (`get`, `result`) are retried on any
/// transient error; writes (`enqueue`, `enqueue_batch`, `cancel`) only after `NOT_LEADER` or a failed
/// connect, and an unknown outcome is returned as [`Error::UnknownOutcome`], never retried.
#[derive(Clone)]
pub struct Producer {
    pub(crate) inner: Arc<ProducerInner>,
    /// Reads are answered from the replica of the node reached (see [`Producer::stale_reads`]).
    pub(crate) stale: bool,
}

pub(crate) struct ProducerInner {
    pub(crate) cfg: ProducerConfig,
    pub(crate) conn: Connector,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer").field("cfg", &self.inner.cfg).field("stale", &self.stale).finish()
    }
}

impl Producer {
    /// Checks the configuration and connects to the first reachable address.
    pub async fn connect(cfg: ProducerConfig) -> Result<Producer> {
        cfg.validate()?;
        let conn = Connector::new(&cfg.addrs, cfg.token.as_deref(), cfg.tls_ca_pem.as_deref(), cfg.connect_timeout)?
            .with_provider(cfg.token_provider.clone())
            .with_redirects(cfg.follow_leader);
        conn.channel().await?;
        Ok(Producer { inner: Arc::new(ProducerInner { cfg, conn }), stale: false })
    }

    /// The same producer (same connection), whose reads (`get`, `queue_stats`, `dead_letters`, `list_tasks`,
    /// `capacity`, `paused_queues`, `schedules`) are answered by the node reached from its own replica instead
    /// of the leader: cheaper, and possibly behind the latest writes. Writes are unchanged.
    pub fn stale_reads(&self) -> Producer {
        Producer { inner: self.inner.clone(), stale: true }
    }

    /// Enqueues one task.
    pub async fn enqueue(&self, task: NewTask) -> Result<Enqueued> {
        let req = task.into_proto();
        let r = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.enqueue(req).await }
            })
            .await?;
        Ok(Enqueued::from_proto(r))
    }

    /// Enqueues many tasks in one request (one Raft entry). Items succeed or fail one by one; the outer
    /// error is for the request as a whole (nothing was enqueued, or the outcome is unknown).
    pub async fn enqueue_batch(&self, tasks: Vec<NewTask>) -> Result<Vec<Result<Enqueued>>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let n = tasks.len();
        let req = pb::EnqueueBatchRequest { items: tasks.into_iter().map(NewTask::into_proto).collect() };
        let pb::EnqueueBatchResponse { results } = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.enqueue_batch(req).await }
            })
            .await?;
        enqueue_results(results, n)
    }

    /// The task as it is now (a linearizable read on the leader).
    pub async fn get(&self, id: &str) -> Result<Task> {
        let req = pb::GetTaskRequest { id: id.to_string() };
        let stale = self.stale;
        let t = self
            .call(Kind::Read, Duration::ZERO, |mut c, conn| {
                let req = conn.read_request(req.clone(), stale);
                async move { c.get_task(req).await }
            })
            .await?;
        Ok(Task::from_proto(t))
    }

    /// The task's result, waiting up to `wait` (bounded by the server's maximum) for it to end. `done` in
    /// the answer says whether it has.
    pub async fn result(&self, id: &str, wait: Duration) -> Result<TaskResult> {
        let req = pb::GetResultRequest { id: id.to_string(), wait_ms: duration_ms(wait) };
        let r = self
            .call(Kind::Read, wait, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.get_result(req).await }
            })
            .await?;
        Ok(TaskResult::from_proto(r))
    }

    /// Cancels a pending, running or dead-lettered task; returns its new state.
    pub async fn cancel(&self, id: &str) -> Result<TaskState> {
        let req = pb::CancelRequest { id: id.to_string() };
        let pb::CancelResponse { state } = self
            .call(Kind::Write, Duration::ZERO, |mut c, conn| {
                let req = conn.request(req.clone());
                async move { c.cancel(req).await }
            })
            .await?;
        Ok(TaskState::from_proto(state))
    }

    /// Opens a pipelined producer stream: many creates in flight on one stream, each answered by sequence
    /// number.
    pub async fn stream(&self) -> Result<StreamProducer> {
        StreamProducer::open(self.clone()).await
    }

    /// Runs one request with the retry rule of its kind. `extra` is added to the request timeout (a long
    /// poll's wait).
    pub(crate) async fn call<T, F, Fut>(&self, kind: Kind, extra: Duration, f: F) -> Result<T>
    where
        F: FnMut(TaskServiceClient<Channel>, &Connector) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let make = |ch| {
            TaskServiceClient::new(ch)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        };
        self.call_on(kind, extra, make, f).await
    }

    /// `call` for any service on the same connection: `make` builds its client from the channel.
    pub(crate) async fn call_on<C, T, M, F, Fut>(&self, kind: Kind, extra: Duration, make: M, mut f: F) -> Result<T>
    where
        M: Fn(Channel) -> C,
        F: FnMut(C, &Connector) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let cfg = &self.inner.cfg;
        let conn = &self.inner.conn;
        let mut backoff = Backoff::new(cfg.retry_backoff_min, cfg.retry_backoff_max);
        let mut tries = 0u32;
        loop {
            tries += 1;
            // A leader named and followed: tried at once (not after the backoff).
            let mut followed = false;
            let err = match conn.channel().await {
                Err(e) => e,
                Ok((addr, ch)) => {
                    let client = make(ch);
                    let timeout = cfg.request_timeout.saturating_add(extra);
                    let answer = tokio::time::timeout(timeout, f(client, conn)).await;
                    let e = match answer {
                        Ok(Ok(r)) => return Ok(r.into_inner()),
                        Ok(Err(status)) => Error::from_status(status, kind == Kind::Write),
                        Err(_) if kind == Kind::Write => {
                            Error::UnknownOutcome { message: format!("no answer within {timeout:?}") }
                        }
                        Err(_) => Error::Transport { message: format!("no answer within {timeout:?}"), source: None },
                    };
                    match &e {
                        Error::NotLeader { leader } => followed = conn.redirect(&addr, leader.as_deref()),
                        Error::Transport { .. } => conn.failed(&addr),
                        _ => {}
                    }
                    e
                }
            };
            let step = match next_step(kind, &err) {
                Next::Now if !followed => Next::Later,
                step => step,
            };
            if step == Next::Stop || tries > cfg.max_retries {
                return Err(err);
            }
            tracing::debug!(error = %err, tries, "retrying");
            if step == Next::Later {
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// One result per item, in order; a wrong count is a protocol violation.
pub(crate) fn enqueue_results(results: Vec<pb::EnqueueResult>, expected: usize) -> Result<Vec<Result<Enqueued>>> {
    if results.len() != expected {
        return Err(Error::Protocol(format!("{} results for {expected} tasks", results.len())));
    }
    Ok(results.into_iter().map(enqueue_result).collect())
}

fn enqueue_result(r: pb::EnqueueResult) -> Result<Enqueued> {
    let pb::EnqueueResult { result } = r;
    match result {
        Some(pb::enqueue_result::Result::Ok(ok)) => Ok(Enqueued::from_proto(ok)),
        Some(pb::enqueue_result::Result::Error(pb::Error { code, message, .. })) => {
            Err(Error::from_reason(&code, &message, None))
        }
        None => Err(Error::Protocol("an enqueue result with neither ok nor error".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert!(ProducerConfig::default().validate().is_ok());
    }

    #[test]
    fn validate_reports_every_violation() {
        let cfg = ProducerConfig {
            addrs: vec![],
            connect_timeout: Duration::ZERO,
            retry_backoff_min: Duration::from_secs(5),
            retry_backoff_max: Duration::from_secs(1),
            stream_max_in_flight: 0,
            ..Default::default()
        };
        match cfg.validate() {
            Err(Error::Config(e)) => assert_eq!(e.len(), 4, "{e:?}"),
            other => panic!("expected config errors, got {other:?}"),
        }
    }

    #[test]
    fn debug_output_redacts_the_token() {
        let cfg = ProducerConfig { token: Some("secret".into()), ..Default::default() };
        let s = format!("{cfg:?}");
        assert!(!s.contains("secret"), "{s}");
        assert!(s.contains("redacted"), "{s}");
    }

    #[test]
    fn writes_retry_only_what_was_certainly_not_applied() {
        let unknown = Error::UnknownOutcome { message: "t".into() };
        let unavailable = Error::from_reason("UNAVAILABLE", "raft stopped", None);
        let refused = Error::Transport { message: "refused".into(), source: None };
        let led = Error::NotLeader { leader: Some("a:1".into()) };
        assert_eq!(next_step(Kind::Write, &unknown), Next::Stop);
        assert_eq!(next_step(Kind::Write, &unavailable), Next::Stop);
        assert_eq!(next_step(Kind::Write, &refused), Next::Later);
        assert_eq!(next_step(Kind::Write, &led), Next::Now);
        assert_eq!(next_step(Kind::Read, &unknown), Next::Later);
        assert_eq!(next_step(Kind::Read, &unavailable), Next::Later);
        let not_found = Error::from_reason("NOT_FOUND", "", None);
        assert_eq!(next_step(Kind::Read, &not_found), Next::Stop);
        // An overload refusal applied nothing: a write goes again after the backoff.
        for r in ["QUEUE_FULL", "RATE_LIMITED", "TOO_MANY_STREAMS"] {
            assert_eq!(next_step(Kind::Write, &Error::from_reason(r, "", None)), Next::Later, "{r}");
        }
        assert_eq!(next_step(Kind::Write, &not_found), Next::Stop);
    }

    #[test]
    fn batch_results_map_item_by_item() {
        let results = vec![
            pb::EnqueueResult {
                result: Some(pb::enqueue_result::Result::Ok(pb::EnqueueResponse {
                    task_id: "a".into(),
                    duplicate: true,
                    debounced: false,
                })),
            },
            pb::EnqueueResult {
                result: Some(pb::enqueue_result::Result::Error(pb::Error {
                    code: "INVALID_ARGUMENT".into(),
                    message: "priority 12 is outside 0-9".into(),
                    retry_after_ms: 0,
                })),
            },
        ];
        let out = enqueue_results(results.clone(), 2).expect("two results");
        assert!(matches!(&out[0], Ok(e) if e.task_id == "a" && e.duplicate));
        assert_eq!(out[1].as_ref().unwrap_err().reason(), Some("INVALID_ARGUMENT"));
        assert!(matches!(enqueue_results(results, 3), Err(Error::Protocol(_))));
    }
}
