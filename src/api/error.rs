//! The API layer's errors and the one mapping from them to the wire.
//!
//! Every error has a stable [`Reason`] (the vocabulary shared with the SDK, in `raftq-proto`); the reason decides
//! the gRPC code and the HTTP status, in two exhaustive tables side by side ([`grpc_code`], [`http_status`]).
//! A gRPC status carries the reason both as the prefix of its message and in the `x-raftq-reason` metadata; a
//! REST error is `{"error": {"code": REASON, "message": ...}}`. A not-leader answer also names the leader's
//! address (`x-raftq-leader`), an overload answer its retry hint (`x-raftq-retry-after-ms`, REST `Retry-After`).

use axum::http::StatusCode;
use raftq_proto::reason::{header, Reason};
use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::leader::proposer::ProposeError;
use crate::queue::Rejected;
use crate::raft::errors::RaftFailure;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(String),
    /// The state machine refused the command.
    #[error("{0}")]
    Rejected(Rejected),
    /// Something was not found: a task, a schedule, a node, a route (see [`not_found`]).
    #[error("{0}")]
    NotFound(String),
    /// This node does not lead; nothing was applied.
    #[error("this node is not the leader")]
    NotLeader { leader_addr: Option<String> },
    /// A write whose outcome is not known: it may have been applied.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The node cannot serve now; nothing was applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// No acceptable token, or a token that does not allow this.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A membership change that could not be made safely now; nothing was changed.
    #[error("{0}")]
    MembershipUnsafe(String),
    /// Over the tenant's rate: nothing was applied; try again after `retry_after_ms`.
    #[error("{message}")]
    RateLimited { message: String, retry_after_ms: u64 },
    /// The tenant has as many streams open on this node as it may.
    #[error("{message}")]
    TooManyStreams { message: String, retry_after_ms: u64 },
    /// REST: the path is served, not with this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The request needs a newer cluster version than the cluster runs; nothing was applied.
    #[error("{0}")]
    FeatureNotActive(String),
    /// The queue or tenant is at its depth limit: nothing was applied; try again after `retry_after_ms`.
    #[error("{message}")]
    QueueFull { message: String, retry_after_ms: u64 },
    /// The leader's refusal of a request this node forwarded to it, passed on as the leader gave it.
    #[error("{}", .0.message)]
    Leader(Box<LeaderAnswer>),
}

/// A refusal as the leader sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderAnswer {
    pub reason: Reason,
    /// Without the reason prefix.
    pub message: String,
    pub leader_addr: Option<String>,
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    pub fn reason(&self) -> Reason {
        match self {
            ApiError::InvalidArgument(_) => Reason::InvalidArgument,
            ApiError::Rejected(r) => match r {
                Rejected::NotFound => Reason::NotFound,
                Rejected::LeaseLost => Reason::LeaseLost,
                Rejected::NotInProgress => Reason::NotInProgress,
                Rejected::NotClaimable => Reason::NotClaimable,
                Rejected::AlreadyEnded => Reason::AlreadyEnded,
                Rejected::IdExists => Reason::AlreadyExists,
                Rejected::SingletonActive(_) => Reason::SingletonActive,
            },
            ApiError::NotFound(_) => Reason::NotFound,
            ApiError::NotLeader { .. } => Reason::NotLeader,
            ApiError::Unknown(_) => Reason::UnknownOutcome,
            ApiError::Unavailable(_) => Reason::Unavailable,
            ApiError::Internal(_) => Reason::Internal,
            ApiError::Auth(a) => match a {
                AuthError::Missing => Reason::TokenMissing,
                AuthError::Invalid(_) => Reason::TokenInvalid,
                AuthError::Expired => Reason::TokenExpired,
                AuthError::NotYetValid => Reason::TokenNotYetValid,
                AuthError::WrongIssuer(_) => Reason::TokenWrongIssuer,
                AuthError::WrongAudience(_) => Reason::TokenWrongAudience,
                AuthError::UnknownKey(_) => Reason::TokenUnknownKey,
                AuthError::BadSignature(_) => Reason::TokenBadSignature,
                AuthError::ScopeRequired(_) => Reason::ScopeRequired,
                AuthError::QueueNotAllowed(_) => Reason::QueueNotAllowed,
            },
            ApiError::MembershipUnsafe(_) => Reason::MembershipUnsafe,
            ApiError::RateLimited { .. } => Reason::RateLimited,
            ApiError::TooManyStreams { .. } => Reason::TooManyStreams,
            ApiError::MethodNotAllowed(_) => Reason::MethodNotAllowed,
            ApiError::FeatureNotActive(_) => Reason::FeatureNotActive,
            ApiError::QueueFull { .. } => Reason::QueueFull,
            ApiError::Leader(a) => a.reason,
        }
    }

    /// The leader's address on a not-leader answer, when known.
    pub fn leader_addr(&self) -> Option<&str> {
        match self {
            ApiError::NotLeader { leader_addr } => leader_addr.as_deref(),
            ApiError::Leader(a) => a.leader_addr.as_deref(),
            _ => None,
        }
    }

    /// When to try again, for an overload answer.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after_ms, .. }
            | ApiError::TooManyStreams { retry_after_ms, .. }
            | ApiError::QueueFull { retry_after_ms, .. } => Some(*retry_after_ms),
            ApiError::Leader(a) => a.retry_after_ms,
            _ => None,
        }
    }

    pub fn grpc_code(&self) -> Code {
        grpc_code(self.reason())
    }

    pub fn http_status(&self) -> StatusCode {
        http_status(self.reason())
    }

    /// The refusal a status from another raftq node stands for; `None` when it carries no raftq reason (the
    /// transport or the framework answered, not raftq: whether the request was handled is unknown).
    pub fn from_status(s: &Status) -> Option<ApiError> {
        let md = s.metadata();
        let code = md.get(header::REASON).and_then(|v| v.to_str().ok())?;
        let text = |name: &str| md.get(name).and_then(|v| v.to_str().ok());
        Some(ApiError::leader_answer(
            code,
            s.message(),
            text(header::LEADER).map(String::from),
            text(header::RETRY_AFTER_MS).and_then(|v| v.parse().ok()),
        ))
    }

    /// A per-item or stream error of another raftq node (`code`, `message`).
    pub fn leader_answer(
        code: &str,
        message: &str,
        leader_addr: Option<String>,
        retry_after_ms: Option<u64>,
    ) -> ApiError {
        let message = message.strip_prefix(code).and_then(|m| m.strip_prefix(": ")).unwrap_or(message);
        match Reason::parse(code) {
            Some(reason) => ApiError::Leader(Box::new(LeaderAnswer {
                reason,
                message: message.to_string(),
                leader_addr: leader_addr.filter(|a| !a.is_empty()),
                retry_after_ms,
            })),
            // Nodes of one version share the vocabulary: an unknown reason is a fault, reported with its code.
            None => ApiError::Internal(format!("the leader answered an unknown reason {code:?}: {message}")),
        }
    }
}

/// The gRPC code of every reason.
pub fn grpc_code(r: Reason) -> Code {
    match r {
        Reason::InvalidArgument => Code::InvalidArgument,
        Reason::NotFound => Code::NotFound,
        Reason::AlreadyExists => Code::AlreadyExists,
        Reason::LeaseLost => Code::FailedPrecondition,
        Reason::NotInProgress => Code::FailedPrecondition,
        Reason::NotClaimable => Code::FailedPrecondition,
        Reason::AlreadyEnded => Code::FailedPrecondition,
        Reason::MembershipUnsafe => Code::FailedPrecondition,
        Reason::NotLeader => Code::Unavailable,
        Reason::Unavailable => Code::Unavailable,
        Reason::UnknownOutcome => Code::DeadlineExceeded,
        Reason::Internal => Code::Internal,
        Reason::TokenMissing => Code::Unauthenticated,
        Reason::TokenInvalid => Code::Unauthenticated,
        Reason::TokenExpired => Code::Unauthenticated,
        Reason::TokenNotYetValid => Code::Unauthenticated,
        Reason::TokenWrongIssuer => Code::Unauthenticated,
        Reason::TokenWrongAudience => Code::Unauthenticated,
        Reason::TokenUnknownKey => Code::Unauthenticated,
        Reason::TokenBadSignature => Code::Unauthenticated,
        Reason::ClusterAuth => Code::Unauthenticated,
        Reason::ScopeRequired => Code::PermissionDenied,
        Reason::QueueNotAllowed => Code::PermissionDenied,
        Reason::RateLimited => Code::ResourceExhausted,
        Reason::TooManyStreams => Code::ResourceExhausted,
        Reason::MethodNotAllowed => Code::Unimplemented,
        Reason::FeatureNotActive => Code::FailedPrecondition,
        Reason::QueueFull => Code::ResourceExhausted,
        Reason::SingletonActive => Code::AlreadyExists,
    }
}

/// The HTTP status of every reason (REST).
pub fn http_status(r: Reason) -> StatusCode {
    match r {
        Reason::InvalidArgument => StatusCode::BAD_REQUEST,
        Reason::NotFound => StatusCode::NOT_FOUND,
        Reason::AlreadyExists => StatusCode::CONFLICT,
        Reason::LeaseLost => StatusCode::CONFLICT,
        Reason::NotInProgress => StatusCode::CONFLICT,
        Reason::NotClaimable => StatusCode::CONFLICT,
        Reason::AlreadyEnded => StatusCode::CONFLICT,
        Reason::MembershipUnsafe => StatusCode::CONFLICT,
        Reason::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
        Reason::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::UnknownOutcome => StatusCode::GATEWAY_TIMEOUT,
        Reason::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::TokenMissing => StatusCode::UNAUTHORIZED,
        Reason::TokenInvalid => StatusCode::UNAUTHORIZED,
        Reason::TokenExpired => StatusCode::UNAUTHORIZED,
        Reason::TokenNotYetValid => StatusCode::UNAUTHORIZED,
        Reason::TokenWrongIssuer => StatusCode::UNAUTHORIZED,
        Reason::TokenWrongAudience => StatusCode::UNAUTHORIZED,
        Reason::TokenUnknownKey => StatusCode::UNAUTHORIZED,
        Reason::TokenBadSignature => StatusCode::UNAUTHORIZED,
        Reason::ClusterAuth => StatusCode::UNAUTHORIZED,
        Reason::ScopeRequired => StatusCode::FORBIDDEN,
        Reason::QueueNotAllowed => StatusCode::FORBIDDEN,
        Reason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Reason::TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
        Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Reason::FeatureNotActive => StatusCode::CONFLICT,
        Reason::QueueFull => StatusCode::TOO_MANY_REQUESTS,
        Reason::SingletonActive => StatusCode::CONFLICT,
    }
}

pub fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::InvalidArgument(msg.into())
}

/// `NOT_FOUND`: "task not found", "schedule not found"...
pub fn not_found(what: &str) -> ApiError {
    ApiError::NotFound(format!("{what} not found"))
}

impl From<Rejected> for ApiError {
    fn from(r: Rejected) -> Self {
        ApiError::Rejected(r)
    }
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NotLeader { leader_addr, .. } => ApiError::NotLeader { leader_addr },
            ProposeError::Unknown(m) => ApiError::Unknown(m),
            ProposeError::Fatal(m) => ApiError::Unavailable(m),
            ProposeError::Storage(m) => ApiError::Internal(m),
            e @ ProposeError::FeatureNotActive { .. } => ApiError::FeatureNotActive(e.to_string()),
            e @ ProposeError::Overloaded { retry_after_ms, .. } => {
                ApiError::RateLimited { message: e.to_string(), retry_after_ms }
            }
            ProposeError::QueueFull(f) => {
                let whose =
                    if f.queue.is_empty() { format!("tenant '{}'", f.tenant) } else { format!("queue '{}'", f.queue) };
                ApiError::QueueFull {
                    message: format!(
                        "{whose} holds {} waiting tasks and its depth limit is {}: {} more do not fit; retry in {} ms",
                        f.waiting, f.max_depth, f.adding, f.retry_after_ms
                    ),
                    retry_after_ms: f.retry_after_ms,
                }
            }
        }
    }
}

impl From<RaftFailure> for ApiError {
    fn from(e: RaftFailure) -> Self {
        match e {
            RaftFailure::NotLeader { leader_addr, .. } => ApiError::NotLeader { leader_addr },
            RaftFailure::Unknown(m) => ApiError::Unknown(m),
            RaftFailure::MembershipUnsafe(m) => ApiError::MembershipUnsafe(m),
            RaftFailure::NoQuorum(m) => ApiError::Unavailable(format!("no quorum: {m}")),
            RaftFailure::ShuttingDown => ApiError::Unavailable("shutting down".into()),
            // Another node can serve: this one's Raft has stopped.
            RaftFailure::Fatal(m) => ApiError::Unavailable(format!("raft stopped: {m}")),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let reason = e.reason();
        let mut status = Status::new(grpc_code(reason), format!("{reason}: {e}"));
        let md = status.metadata_mut();
        md.insert(header::REASON, reason.as_str().parse().expect("reason codes are ascii"));
        if let Some(ms) = e.retry_after_ms() {
            md.insert(header::RETRY_AFTER_MS, ms.to_string().parse().expect("digits"));
        }
        if let Some(addr) = e.leader_addr().and_then(|a| a.parse().ok()) {
            md.insert(header::LEADER, addr);
        }
        status
    }
}

/// A gRPC answer: the result, or the error's status.
pub fn reply<R>(r: Result<R, ApiError>) -> Result<tonic::Response<R>, Status> {
    r.map(tonic::Response::new).map_err(Status::from)
}

/// Splits a checked batch into its valid items, to be proposed together (moved, not copied), and each item's
/// outcome of the check in request order, for `merge_items`: items fail one by one.
pub fn split_items<T>(checked: Vec<Result<T, ApiError>>) -> (Vec<T>, Vec<Result<(), ApiError>>) {
    let mut valid = Vec::with_capacity(checked.len());
    let mut outcomes = Vec::with_capacity(checked.len());
    for c in checked {
        match c {
            Ok(item) => {
                valid.push(item);
                outcomes.push(Ok(()));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    (valid, outcomes)
}

/// Per-item results of a batch in request order: the refusal of each invalid item, and for each valid one the
/// next result of what was applied (in the same order as `split_items`' valid items).
pub fn merge_items<R, E: Into<ApiError>>(
    checked: Vec<Result<(), ApiError>>,
    applied: impl IntoIterator<Item = Result<R, E>>,
) -> Vec<Result<R, ApiError>> {
    let mut applied = applied.into_iter();
    checked
        .into_iter()
        .map(|c| match c {
            Err(e) => Err(e),
            Ok(()) => match applied.next() {
                Some(r) => r.map_err(Into::into),
                None => Err(ApiError::Internal("a batch result is missing".into())),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_batch_proposes_the_valid_items_in_order_and_merges_each_result_back_in_its_place() {
        let checked: Vec<Result<String, ApiError>> =
            vec![Ok("a".into()), Err(invalid("bad b")), Ok("c".into()), Err(not_found("task"))];
        let (valid, marks) = split_items(checked);
        assert_eq!(valid, ["a", "c"]);
        let applied: Vec<Result<u32, ApiError>> = vec![Ok(1), Err(ApiError::Rejected(Rejected::LeaseLost))];
        let merged = merge_items(marks, applied);
        assert_eq!(merged.len(), 4);
        assert!(matches!(merged[0], Ok(1)));
        assert_eq!(merged[1].as_ref().unwrap_err().to_string(), invalid("bad b").to_string());
        assert!(matches!(merged[2], Err(ApiError::Rejected(Rejected::LeaseLost))));
        assert_eq!(merged[3].as_ref().unwrap_err().reason(), not_found("task").reason());
        // Fewer results than valid items: the missing one is an internal error, never a success.
        let (_, marks) = split_items::<()>(vec![Ok(()), Ok(())]);
        let merged = merge_items(marks, Vec::<Result<u32, ApiError>>::from([Ok(7)]));
        assert!(matches!(merged[1], Err(ApiError::Internal(_))));
    }

    #[test]
    fn a_status_travels_to_another_node_and_back_unchanged() {
        let cases = [
            ApiError::NotLeader { leader_addr: Some("10.0.0.2:9091".into()) },
            ApiError::Rejected(Rejected::LeaseLost),
            ApiError::Auth(AuthError::ScopeRequired(crate::auth::Scope::Admin)),
            ApiError::RateLimited { message: "slow down".into(), retry_after_ms: 250 },
            ApiError::MembershipUnsafe("node 3 is down".into()),
            not_found("task"),
        ];
        for e in cases {
            let (reason, message, leader, retry) =
                (e.reason(), e.to_string(), e.leader_addr().map(String::from), e.retry_after_ms());
            let status = Status::from(e);
            assert_eq!(status.code(), grpc_code(reason));
            assert_eq!(status.message(), format!("{reason}: {message}"));
            let back = ApiError::from_status(&status).expect("a raftq status");
            assert_eq!(
                (back.reason(), back.to_string(), back.leader_addr().map(String::from), back.retry_after_ms()),
                (reason, message, leader, retry)
            );
            assert_eq!(back.http_status(), http_status(reason));
        }
        assert!(ApiError::from_status(&Status::unavailable("tcp connect error")).is_none());
    }

    #[test]
    fn every_reason_has_a_client_or_server_error_status() {
        for r in Reason::ALL {
            let s = http_status(r);
            assert!(s.is_client_error() || s.is_server_error(), "{r}: {s}");
            assert_ne!(grpc_code(r), Code::Ok, "{r}");
            // Retry-safe answers are the 503s: nothing was applied.
            assert_eq!(s == StatusCode::SERVICE_UNAVAILABLE, matches!(r, Reason::NotLeader | Reason::Unavailable));
        }
    }
}
