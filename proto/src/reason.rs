//! The stable reason codes raftq answers with, and the names of the metadata (gRPC) and headers (REST) that carry
//! them: one vocabulary for the server, which sends them, and the SDK, which classifies by them.
//!
//! A refused gRPC call carries its reason twice: in the `x-raftq-reason` metadata and as the prefix of the status
//! message (`LEASE_LOST: the lease token is not the current one`); a per-item error and a stream error carry it
//! in their `code`/`reason` field; a REST error carries it as `{"error": {"code": ...}}`. A reason string never
//! changes meaning once released; new ones may be added, so a client must accept reasons it does not know.
//!
//! Plain Rust: no gRPC or HTTP types, so any client can use it.

/// Metadata and header names.
pub mod header {
    /// The stable reason of a refusal (gRPC metadata; a REST error has it in its body).
    pub const REASON: &str = "x-raftq-reason";
    /// The leader's public gRPC address, with `NOT_LEADER` when the node knows it.
    pub const LEADER: &str = "x-raftq-leader";
    /// `x-raftq-redirect: 1`: answer `NOT_LEADER` with the leader's address instead of forwarding to it.
    pub const REDIRECT: &str = "x-raftq-redirect";
    /// `x-raftq-read: stale`: serve a read from the node's own replica, without asking the leader.
    pub const READ: &str = "x-raftq-read";
    /// Set by a node on a request it forwards to the leader: that request is never forwarded again.
    pub const FORWARDED: &str = "x-raftq-forwarded";
    /// With `RATE_LIMITED` and `TOO_MANY_STREAMS`: how long to wait before trying again (REST: `Retry-After`,
    /// in seconds, and `retry_after_ms` in the error body).
    pub const RETRY_AFTER_MS: &str = "x-raftq-retry-after-ms";
    /// A peer's credential on the Raft port (derived from the cluster secret).
    pub const CLUSTER_AUTH: &str = "x-raftq-cluster-auth";
}

/// Every reason code raftq sends. Matching on it is exhaustive on purpose: a new reason has to be placed in every
/// mapping (gRPC code, HTTP status, what a client does with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A request that breaks a rule (the message names the field); nothing was applied.
    InvalidArgument,
    /// No such task, schedule, dead letter, member or route (another tenant's task is not found either).
    NotFound,
    /// A task with this id already exists.
    AlreadyExists,
    /// The fencing token is not the task's current one: another worker holds the task now.
    LeaseLost,
    /// The task is not in progress.
    NotInProgress,
    /// The task cannot be claimed.
    NotClaimable,
    /// The task has already ended.
    AlreadyEnded,
    /// The node is not the leader, and nothing was applied; the leader's address comes with it when known.
    /// Safe to send again (to the leader).
    NotLeader,
    /// A write whose outcome is not known: it may or may not have been applied (a timeout, the leader lost in
    /// flight). Check with a read, or repeat it only if it is idempotent.
    UnknownOutcome,
    /// The node cannot serve now (shutting down, no quorum); nothing was applied.
    Unavailable,
    /// A server fault.
    Internal,
    /// No bearer token.
    TokenMissing,
    /// The token cannot be read, or lacks a required claim (`exp`, `tid`, a configured `iss` or `aud`).
    TokenInvalid,
    /// The token has expired.
    TokenExpired,
    /// The token's `nbf` is in the future.
    TokenNotYetValid,
    /// The token's issuer is not the configured one.
    TokenWrongIssuer,
    /// The token's audience is not the configured one.
    TokenWrongAudience,
    /// No configured key has the token's key id (or algorithm).
    TokenUnknownKey,
    /// The token's signature does not verify.
    TokenBadSignature,
    /// The token does not grant the scope the operation needs.
    ScopeRequired,
    /// The queue is outside the token's queue patterns.
    QueueNotAllowed,
    /// A call on the Raft port without the cluster credential.
    ClusterAuth,
    /// A membership change refused because it could not be made safely now; nothing was changed.
    MembershipUnsafe,
    /// Over the tenant's rate; nothing was applied; try again after the retry hint.
    RateLimited,
    /// The tenant has as many streams open on this node as it may.
    TooManyStreams,
    /// REST: the path exists, not with this method.
    MethodNotAllowed,
    /// The request needs a cluster version the cluster does not run yet (a node still runs an older binary);
    /// nothing was applied.
    FeatureNotActive,
    /// The queue (or the tenant) holds as many waiting tasks as its depth limit allows; nothing was applied; try
    /// again after the retry hint.
    QueueFull,
    /// A singleton key's task is pending or in progress (the message names it); nothing was created.
    SingletonActive,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 29] = [
        Reason::InvalidArgument,
        Reason::NotFound,
        Reason::AlreadyExists,
        Reason::LeaseLost,
        Reason::NotInProgress,
        Reason::NotClaimable,
        Reason::AlreadyEnded,
        Reason::NotLeader,
        Reason::UnknownOutcome,
        Reason::Unavailable,
        Reason::Internal,
        Reason::TokenMissing,
        Reason::TokenInvalid,
        Reason::TokenExpired,
        Reason::TokenNotYetValid,
        Reason::TokenWrongIssuer,
        Reason::TokenWrongAudience,
        Reason::TokenUnknownKey,
        Reason::TokenBadSignature,
        Reason::ScopeRequired,
        Reason::QueueNotAllowed,
        Reason::ClusterAuth,
        Reason::MembershipUnsafe,
        Reason::RateLimited,
        Reason::TooManyStreams,
        Reason::MethodNotAllowed,
        Reason::FeatureNotActive,
        Reason::QueueFull,
        Reason::SingletonActive,
    ];

    /// The code as it travels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidArgument => "INVALID_ARGUMENT",
            Reason::NotFound => "NOT_FOUND",
            Reason::AlreadyExists => "ALREADY_EXISTS",
            Reason::LeaseLost => "LEASE_LOST",
            Reason::NotInProgress => "NOT_IN_PROGRESS",
            Reason::NotClaimable => "NOT_CLAIMABLE",
            Reason::AlreadyEnded => "ALREADY_ENDED",
            Reason::NotLeader => "NOT_LEADER",
            Reason::UnknownOutcome => "UNKNOWN_OUTCOME",
            Reason::Unavailable => "UNAVAILABLE",
            Reason::Internal => "INTERNAL",
            Reason::TokenMissing => "TOKEN_MISSING",
            Reason::TokenInvalid => "TOKEN_INVALID",
            Reason::TokenExpired => "TOKEN_EXPIRED",
            Reason::TokenNotYetValid => "TOKEN_NOT_YET_VALID",
            Reason::TokenWrongIssuer => "TOKEN_WRONG_ISSUER",
            Reason::TokenWrongAudience => "TOKEN_WRONG_AUDIENCE",
            Reason::TokenUnknownKey => "TOKEN_UNKNOWN_KEY",
            Reason::TokenBadSignature => "TOKEN_BAD_SIGNATURE",
            Reason::ScopeRequired => "SCOPE_REQUIRED",
            Reason::QueueNotAllowed => "QUEUE_NOT_ALLOWED",
            Reason::ClusterAuth => "CLUSTER_AUTH",
            Reason::MembershipUnsafe => "MEMBERSHIP_UNSAFE",
            Reason::RateLimited => "RATE_LIMITED",
            Reason::TooManyStreams => "TOO_MANY_STREAMS",
            Reason::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Reason::FeatureNotActive => "FEATURE_NOT_ACTIVE",
            Reason::QueueFull => "QUEUE_FULL",
            Reason::SingletonActive => "SINGLETON_ACTIVE",
        }
    }

    /// The reason a code stands for; `None` for one this version does not know (a newer server's).
    pub fn parse(code: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// The authentication failures: the token is missing or not acceptable (gRPC `UNAUTHENTICATED`, HTTP 401).
    pub const fn is_token(self) -> bool {
        matches!(
            self,
            Reason::TokenMissing
                | Reason::TokenInvalid
                | Reason::TokenExpired
                | Reason::TokenNotYetValid
                | Reason::TokenWrongIssuer
                | Reason::TokenWrongAudience
                | Reason::TokenUnknownKey
                | Reason::TokenBadSignature
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_parses_back_and_codes_are_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert!(seen.insert(r.as_str()), "{r} twice");
            assert!(r.as_str().bytes().all(|b| b.is_ascii_uppercase() || b == b'_'), "{r}");
        }
        assert_eq!(Reason::parse("SOMETHING_NEW"), None);
        assert!(Reason::TokenExpired.is_token() && !Reason::ScopeRequired.is_token());
    }
}
