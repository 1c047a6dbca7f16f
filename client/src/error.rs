//! The SDK's one error type and the mapping from what the server sends (a gRPC status, a per-item error, a
//! stream error) to it. Owns the decision "does retrying help"; it must not retry anything itself. The reason
//! codes and metadata names are the server's own, from `raftq_proto::reason`.

use raftq_proto::reason::{header, Reason};
use tonic::{Code, Status};

/// Metadata key of the stable reason code a raftq status carries.
pub const REASON_HEADER: &str = header::REASON;
/// Metadata key of the leader's public address on a `NOT_LEADER` answer.
pub const LEADER_HEADER: &str = header::LEADER;

/// Reason code of an answer from a node that is not the leader.
pub const NOT_LEADER: &str = Reason::NotLeader.as_str();
/// Reason code of a write whose outcome is not known (it timed out on the server; it may have been applied).
pub const UNKNOWN_OUTCOME: &str = Reason::UnknownOutcome.as_str();
/// Reason code of a result or lease extension whose fencing token is no longer the task's current one.
pub const LEASE_LOST: &str = Reason::LeaseLost.as_str();

/// A `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the SDK. Ask [`Error::is_retryable`] whether trying again can help and
/// [`Error::reason`] for the server's stable reason code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration breaks these rules (all of them are listed).
    #[error("invalid configuration: {}", .0.join("; "))]
    Config(Vec<String>),
    /// The node that answered is not the leader; `leader` is the leader's address when the node knows it.
    /// Nothing was applied.
    #[error("not the leader (leader: {})", .leader.as_deref().unwrap_or("unknown"))]
    NotLeader {
        /// The leader's public address, as the server reported it.
        leader: Option<String>,
    },
    /// A write whose outcome is not known: it may or may not have been applied (it timed out, or the
    /// connection broke while it was in flight). Check with a read, or repeat it only if it is idempotent
    /// (an enqueue with an idempotency key).
    #[error("outcome unknown: {message}")]
    UnknownOutcome {
        /// What the server or the transport said.
        message: String,
    },
    /// The server refused the request with a stable reason code (`INVALID_ARGUMENT`, `NOT_FOUND`,
    /// `LEASE_LOST`, `UNAVAILABLE`, ...).
    #[error("{reason}: {message}")]
    Server {
        /// The stable reason code.
        reason: String,
        /// The human-readable rest of the message.
        message: String,
    },
    /// No answer from the server: it could not be reached, or the connection broke before a request was
    /// sent.
    #[error("transport: {message}")]
    Transport {
        /// What failed.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The server broke the protocol (an answer of the wrong kind, a wrong number of results).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The stream or worker was shut down, so the request was not sent.
    #[error("closed: {0}")]
    Closed(String),
    /// `Worker::run` was called while the same worker was already running.
    #[error("the worker is already running")]
    AlreadyRunning,
}

impl Error {
    /// The server's stable reason code (`NOT_LEADER`, `UNKNOWN_OUTCOME`, `INVALID_ARGUMENT`, `LEASE_LOST`...);
    /// `None` for errors that did not come from the server.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Error::NotLeader { .. } => Some(NOT_LEADER),
            Error::UnknownOutcome { .. } => Some(UNKNOWN_OUTCOME),
            Error::Server { reason, .. } => Some(reason),
            Error::Config(_)
            | Error::Transport { .. }
            | Error::Protocol(_)
            | Error::Closed(_)
            | Error::AlreadyRunning => None,
        }
    }

    /// An overload refusal (`RATE_LIMITED`, `QUEUE_FULL`, `TOO_MANY_STREAMS`): the request was refused whole
    /// before anything was proposed, so even a write may be sent again after a backoff.
    pub fn is_overload(&self) -> bool {
        match self {
            Error::Server { reason, .. } => {
                matches!(Reason::parse(reason), Some(Reason::RateLimited | Reason::QueueFull | Reason::TooManyStreams))
            }
            _ => false,
        }
    }

    /// Whether the same request can succeed later, unchanged, and is safe to repeat: not the leader, the node
    /// unavailable or overloaded, the server unreachable. An unknown outcome is not retryable in this sense:
    /// the write may have happened (see [`Error::UnknownOutcome`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NotLeader { .. } | Error::Transport { .. } => true,
            Error::Server { reason, .. } => retryable_reason(reason),
            Error::Config(_)
            | Error::UnknownOutcome { .. }
            | Error::Protocol(_)
            | Error::Closed(_)
            | Error::AlreadyRunning => false,
        }
    }

    /// The error a stable reason code and message stand for, as they arrive in per-item and stream errors.
    pub(crate) fn from_reason(reason: &str, message: &str, leader: Option<&str>) -> Error {
        let message = strip_reason(reason, message).to_string();
        match Reason::parse(reason) {
            Some(Reason::NotLeader) => {
                Error::NotLeader { leader: leader.filter(|l| !l.is_empty()).map(str::to_string) }
            }
            Some(Reason::UnknownOutcome) => Error::UnknownOutcome { message },
            // A reason this SDK does not know yet (a newer server) is kept as it came.
            _ if reason.is_empty() => Error::Server { reason: "UNKNOWN".into(), message },
            _ => Error::Server { reason: reason.to_string(), message },
        }
    }

    /// Maps a status. `write` says whether the request was a write: a status that did not come from raftq
    /// (a broken connection, a client-side deadline) then means the write may have happened.
    pub(crate) fn from_status(status: Status, write: bool) -> Error {
        if let Some(reason) = status.metadata().get(REASON_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string) {
            let leader = status.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
            return Error::from_reason(&reason, status.message(), leader.as_deref());
        }
        if is_connect_failure(&status) {
            return transport(status);
        }
        match status.code() {
            // No raftq reason: the framework or the transport answered, not the API.
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
                if write {
                    Error::UnknownOutcome {
                        message: format!(
                            "no answer to the write ({}: {})",
                            code_reason(status.code()),
                            status.message()
                        ),
                    }
                } else {
                    transport(status)
                }
            }
            code => Error::Server { reason: code_reason(code).to_string(), message: status.message().to_string() },
        }
    }

    pub(crate) fn transport_error(e: tonic::transport::Error) -> Error {
        Error::Transport { message: display_chain(&e), source: Some(Box::new(e)) }
    }
}

fn transport(status: Status) -> Error {
    Error::Transport {
        message: format!("{}: {}", code_reason(status.code()), status.message()),
        source: Some(Box::new(status)),
    }
}

/// Reasons whose requests were not applied and may succeed later unchanged: raftq's `NOT_LEADER` and
/// `UNAVAILABLE`, the overload refusals `RATE_LIMITED`, `TOO_MANY_STREAMS` and `QUEUE_FULL` (after their retry-after hint), and
/// the gRPC code name `RESOURCE_EXHAUSTED` of a framework refusal. The Python SDK classifies the same way.
fn retryable_reason(reason: &str) -> bool {
    match Reason::parse(reason) {
        Some(r) => matches!(
            r,
            Reason::NotLeader | Reason::Unavailable | Reason::RateLimited | Reason::TooManyStreams | Reason::QueueFull
        ),
        None => reason == code_reason(Code::ResourceExhausted),
    }
}

/// The server puts the reason in front of the message (`NOT_FOUND: task not found`); keep the rest.
fn strip_reason<'a>(reason: &str, message: &'a str) -> &'a str {
    if reason.is_empty() {
        return message;
    }
    message.strip_prefix(reason).and_then(|m| m.strip_prefix(':')).map(str::trim_start).unwrap_or(message)
}

/// True when the status says the connection could not be made: the request was never sent.
pub(crate) fn is_connect_failure(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(e) = source {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

fn display_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// A reason code for a status that carries none, named like the gRPC code.
fn code_reason(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raftq_status(code: Code, reason: &str, msg: &str, leader: Option<&str>) -> Status {
        let mut s = Status::new(code, format!("{reason}: {msg}"));
        s.metadata_mut().insert(REASON_HEADER, reason.parse().expect("ascii"));
        if let Some(l) = leader {
            s.metadata_mut().insert(LEADER_HEADER, l.parse().expect("ascii"));
        }
        s
    }

    #[test]
    fn not_leader_status_carries_the_leader_and_is_retryable() {
        let s = raftq_status(Code::Unavailable, "NOT_LEADER", "this node is not the leader", Some("10.0.0.2:9091"));
        let e = Error::from_status(s, true);
        assert!(matches!(&e, Error::NotLeader { leader: Some(l) } if l == "10.0.0.2:9091"), "{e:?}");
        assert_eq!(e.reason(), Some("NOT_LEADER"));
        assert!(e.is_retryable());
    }

    #[test]
    fn not_leader_without_known_leader_has_no_address() {
        let s = raftq_status(Code::Unavailable, "NOT_LEADER", "x", None);
        assert!(matches!(Error::from_status(s, false), Error::NotLeader { leader: None }));
    }

    #[test]
    fn reason_is_read_from_metadata_and_stripped_from_the_message() {
        let s = raftq_status(Code::NotFound, "NOT_FOUND", "task not found", None);
        let e = Error::from_status(s, false);
        assert_eq!(e.reason(), Some("NOT_FOUND"));
        assert_eq!(e.to_string(), "NOT_FOUND: task not found");
        assert!(!e.is_retryable());
    }

    #[test]
    fn overload_refusals_are_retryable_and_rule_breaks_are_not() {
        for (code, reason) in [(Code::ResourceExhausted, "RATE_LIMITED"), (Code::ResourceExhausted, "TOO_MANY_STREAMS")]
        {
            assert!(Error::from_status(raftq_status(code, reason, "slow down", None), true).is_retryable(), "{reason}");
        }
        let e = Error::from_status(raftq_status(Code::InvalidArgument, "INVALID_ARGUMENT", "bad", None), true);
        assert!(!e.is_retryable());
    }

    #[test]
    fn unknown_outcome_is_its_own_variant_and_not_retryable() {
        let s = raftq_status(Code::DeadlineExceeded, "UNKNOWN_OUTCOME", "outcome unknown: timeout", None);
        let e = Error::from_status(s, true);
        assert!(matches!(e, Error::UnknownOutcome { .. }), "{e:?}");
        assert_eq!(e.reason(), Some("UNKNOWN_OUTCOME"));
        assert!(!e.is_retryable());
    }

    #[test]
    fn rejections_are_not_retryable_and_unavailable_is() {
        for (reason, retry) in [
            ("INVALID_ARGUMENT", false),
            ("NOT_FOUND", false),
            ("LEASE_LOST", false),
            ("ALREADY_ENDED", false),
            ("UNAUTHENTICATED", false),
            ("UNAVAILABLE", true),
            ("RESOURCE_EXHAUSTED", true),
        ] {
            let e = Error::from_reason(reason, "m", None);
            assert_eq!(e.is_retryable(), retry, "{reason}");
            assert_eq!(e.reason(), Some(reason));
        }
    }

    #[test]
    fn status_without_reason_is_unknown_outcome_for_a_write_and_transport_for_a_read() {
        let write = Error::from_status(Status::unavailable("connection reset"), true);
        assert!(matches!(write, Error::UnknownOutcome { .. }), "{write:?}");
        let read = Error::from_status(Status::unavailable("connection reset"), false);
        assert!(matches!(read, Error::Transport { .. }), "{read:?}");
        assert!(read.is_retryable());
        assert_eq!(read.reason(), None);
    }

    #[test]
    fn connect_failure_is_transport_even_for_a_write() {
        let s = Status::from_error(Box::new(tonic::ConnectError("connection refused".into())));
        assert!(is_connect_failure(&s));
        let e = Error::from_status(s, true);
        assert!(matches!(e, Error::Transport { .. }), "{e:?}");
        assert!(e.is_retryable());
    }

    #[test]
    fn framework_statuses_get_a_reason_named_after_the_code() {
        let e = Error::from_status(Status::unimplemented("no such method"), true);
        assert_eq!(e.reason(), Some("UNIMPLEMENTED"));
        assert!(!e.is_retryable());
    }

    #[test]
    fn every_server_reason_is_classified_by_the_shared_vocabulary() {
        for r in Reason::ALL {
            let e = Error::from_reason(r.as_str(), &format!("{r}: m"), Some("10.0.0.2:9091"));
            assert_eq!(e.reason(), Some(r.as_str()), "{r}");
            match r {
                Reason::NotLeader => assert!(matches!(&e, Error::NotLeader { leader: Some(_) }), "{e:?}"),
                Reason::UnknownOutcome => assert!(matches!(&e, Error::UnknownOutcome { message } if message == "m")),
                _ => assert!(matches!(&e, Error::Server { message, .. } if message == "m"), "{e:?}"),
            }
            // Only answers that say nothing was applied, and the node may serve later, are retryable.
            let overload = matches!(r, Reason::RateLimited | Reason::TooManyStreams | Reason::QueueFull);
            let later = overload || matches!(r, Reason::NotLeader | Reason::Unavailable);
            assert_eq!(e.is_retryable(), later, "{r}");
            assert_eq!(e.is_overload(), overload, "{r}");
        }
        // A reason from a newer server is kept as it came.
        let e = Error::from_reason("SOMETHING_NEW", "m", None);
        assert_eq!((e.reason(), e.is_retryable()), (Some("SOMETHING_NEW"), false));
    }

    #[test]
    fn per_item_errors_map_like_statuses() {
        let e = Error::from_reason("INVALID_ARGUMENT", "INVALID_ARGUMENT: priority 12 is outside 0-9", None);
        assert_eq!(e.to_string(), "INVALID_ARGUMENT: priority 12 is outside 0-9");
        let e = Error::from_reason("NOT_LEADER", "", Some(""));
        assert!(matches!(e, Error::NotLeader { leader: None }));
    }
}
