//! The one mapping from API errors to the wire. Every status carries a stable reason, both as the prefix of its
//! message and in the `x-raftq-reason` metadata; a not-leader answer also names the leader's address.

use tonic::{Code, Status};

use crate::queue::Rejected;
use crate::raft::proposer::ProposeError;

pub const REASON_HEADER: &str = "x-raftq-reason";
pub const LEADER_HEADER: &str = "x-raftq-leader";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Rejected(Rejected),
    #[error("task not found")]
    NotFound,
    #[error("this node is not the leader")]
    NotLeader { leader_addr: Option<String> },
    /// A write whose outcome is not known: it may have been applied.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// No valid credentials: the reason says what is wrong with the token.
    #[error("{message}")]
    Unauthenticated { reason: &'static str, message: String },
    /// Valid credentials that do not allow this: a missing scope or a queue outside the token's patterns.
    #[error("{message}")]
    PermissionDenied { reason: &'static str, message: String },
    /// The request cannot be served in the cluster's present state (a membership change that could not commit).
    #[error("{message}")]
    Precondition { reason: &'static str, message: String },
    /// A limit was reached: nothing was applied; try again after `retry_after_ms`.
    #[error("{message}")]
    ResourceExhausted { reason: &'static str, message: String, retry_after_ms: u64 },
}

/// Every reason code of authentication, authorisation and limits, so a forwarded status maps back to its error.
pub const AUTH_REASONS: [&str; 10] = [
    "TOKEN_MISSING",
    "TOKEN_INVALID",
    "TOKEN_EXPIRED",
    "TOKEN_NOT_YET_VALID",
    "TOKEN_WRONG_ISSUER",
    "TOKEN_WRONG_AUDIENCE",
    "TOKEN_UNKNOWN_KEY",
    "TOKEN_BAD_SIGNATURE",
    "SCOPE_REQUIRED",
    "QUEUE_NOT_ALLOWED",
];
pub const LIMIT_REASONS: [&str; 2] = ["RATE_LIMITED", "TOO_MANY_STREAMS"];
/// Metadata (and REST `Retry-After`) telling an overloaded client when to try again.
pub const RETRY_AFTER_HEADER: &str = "x-raftq-retry-after-ms";

impl ApiError {
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::InvalidArgument(_) => "INVALID_ARGUMENT",
            ApiError::Rejected(r) => r.reason(),
            ApiError::NotFound => "NOT_FOUND",
            ApiError::NotLeader { .. } => "NOT_LEADER",
            ApiError::Unknown(_) => "UNKNOWN_OUTCOME",
            ApiError::Unavailable(_) => "UNAVAILABLE",
            ApiError::Internal(_) => "INTERNAL",
            ApiError::Unauthenticated { reason, .. }
            | ApiError::Precondition { reason, .. }
            | ApiError::PermissionDenied { reason, .. }
            | ApiError::ResourceExhausted { reason, .. } => reason,
        }
    }

    fn code(&self) -> Code {
        match self {
            ApiError::InvalidArgument(_) => Code::InvalidArgument,
            ApiError::Rejected(Rejected::NotFound) | ApiError::NotFound => Code::NotFound,
            ApiError::Rejected(Rejected::LeaseLost)
            | ApiError::Rejected(Rejected::NotInProgress)
            | ApiError::Rejected(Rejected::NotClaimable)
            | ApiError::Rejected(Rejected::AlreadyEnded) => Code::FailedPrecondition,
            ApiError::Rejected(Rejected::IdExists) => Code::AlreadyExists,
            ApiError::NotLeader { .. } | ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::Unknown(_) => Code::DeadlineExceeded,
            ApiError::Internal(_) => Code::Internal,
            ApiError::Unauthenticated { .. } => Code::Unauthenticated,
            ApiError::Precondition { .. } => Code::FailedPrecondition,
            ApiError::PermissionDenied { .. } => Code::PermissionDenied,
            ApiError::ResourceExhausted { .. } => Code::ResourceExhausted,
        }
    }
}

pub fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::InvalidArgument(msg.into())
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
        }
    }
}

impl ApiError {
    /// The error a forwarded request's status stands for. A status without a reason never reached raftq's
    /// handlers (a transport failure): for a write its outcome is unknown.
    pub fn from_status(s: &Status) -> ApiError {
        let reason = s.metadata().get(REASON_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        let msg = s.message().to_string();
        match reason {
            "INVALID_ARGUMENT" => ApiError::InvalidArgument(msg),
            "NOT_FOUND" => ApiError::NotFound,
            "LEASE_LOST" => ApiError::Rejected(Rejected::LeaseLost),
            "NOT_IN_PROGRESS" => ApiError::Rejected(Rejected::NotInProgress),
            "NOT_CLAIMABLE" => ApiError::Rejected(Rejected::NotClaimable),
            "ALREADY_ENDED" => ApiError::Rejected(Rejected::AlreadyEnded),
            "ALREADY_EXISTS" => ApiError::Rejected(Rejected::IdExists),
            "NOT_LEADER" => ApiError::NotLeader {
                leader_addr: s.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok()).map(String::from),
            },
            "UNAVAILABLE" => ApiError::Unavailable(msg),
            "INTERNAL" => ApiError::Internal(msg),
            r if AUTH_REASONS.contains(&r) || LIMIT_REASONS.contains(&r) => {
                let reason = AUTH_REASONS.iter().chain(LIMIT_REASONS.iter()).find(|x| **x == r).copied().unwrap_or("");
                let message = msg.split_once(": ").map(|(_, m)| m.to_string()).unwrap_or(msg);
                match s.code() {
                    Code::Unauthenticated => ApiError::Unauthenticated { reason, message },
                    Code::PermissionDenied => ApiError::PermissionDenied { reason, message },
                    _ => ApiError::ResourceExhausted {
                        reason,
                        message,
                        retry_after_ms: s
                            .metadata()
                            .get(RETRY_AFTER_HEADER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(1000),
                    },
                }
            }
            _ => ApiError::Unknown(format!("the leader did not answer: {msg}")),
        }
    }

    /// Whether a failed write surely did not happen, so sending it again cannot apply it twice.
    pub fn surely_not_applied(&self) -> bool {
        matches!(self, ApiError::NotLeader { .. } | ApiError::Unavailable(_))
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let reason = e.reason();
        let mut status = Status::new(e.code(), format!("{reason}: {e}"));
        let md = status.metadata_mut();
        md.insert(REASON_HEADER, reason.parse().expect("reason codes are ascii"));
        if let ApiError::ResourceExhausted { retry_after_ms, .. } = &e {
            md.insert(RETRY_AFTER_HEADER, retry_after_ms.to_string().parse().expect("digits"));
        }
        if let ApiError::NotLeader { leader_addr: Some(addr) } = &e {
            if let Ok(v) = addr.parse() {
                md.insert(LEADER_HEADER, v);
            }
        }
        status
    }
}

/// The valid items of a batch, to be proposed together: items fail one by one.
pub fn valid_items<T: Clone>(checked: &[Result<T, ApiError>]) -> Vec<T> {
    checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect()
}

/// Per-item results of a batch in request order: the refusal of each invalid item, and for each valid one the
/// next result of what was applied (in the same order as `valid_items`).
pub fn merge_items<T, R, E: Into<ApiError>>(
    checked: Vec<Result<T, ApiError>>,
    applied: impl IntoIterator<Item = Result<R, E>>,
) -> Vec<Result<R, ApiError>> {
    let mut applied = applied.into_iter();
    checked
        .into_iter()
        .map(|c| match c {
            Err(e) => Err(e),
            Ok(_) => match applied.next() {
                Some(r) => r.map_err(Into::into),
                None => Err(ApiError::Internal("a batch result is missing".into())),
            },
        })
        .collect()
}
