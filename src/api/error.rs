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
}

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

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let reason = e.reason();
        let mut status = Status::new(e.code(), format!("{reason}: {e}"));
        let md = status.metadata_mut();
        md.insert(REASON_HEADER, reason.parse().expect("reason codes are ascii"));
        if let ApiError::NotLeader { leader_addr: Some(addr) } = &e {
            if let Ok(v) = addr.parse() {
                md.insert(LEADER_HEADER, v);
            }
        }
        status
    }
}
