"""The server's stable reason codes: every rejection carries one (gRPC metadata ``x-raftq-reason``, a stream
error's ``reason``, a batch item's ``Error.code``, REST ``{"error": {"code": ...}}``).

This list mirrors the server's vocabulary; ``tests/test_reasons.py`` parses the Rust sources and fails when the
two differ, so a reason added on the server must be added here (with its family and whether a retry can help).
"""

from dataclasses import dataclass
from typing import Dict, FrozenSet

#: Metadata key of the reason code on a gRPC status.
REASON_HEADER = "x-raftq-reason"
#: Metadata key of the leader's public address on a ``NOT_LEADER`` answer.
LEADER_HEADER = "x-raftq-leader"
#: Metadata key telling an overloaded client when to try again (milliseconds).
RETRY_AFTER_HEADER = "x-raftq-retry-after-ms"
#: Request metadata asking a follower to answer ``NOT_LEADER`` (with the leader's address) instead of forwarding.
REDIRECT_HEADER = "x-raftq-redirect"


@dataclass(frozen=True)
class Reason:
    """One reason code: its name, the family of errors it belongs to, whether the same request can succeed
    later unchanged (nothing was applied), and what it means."""

    code: str
    family: str
    retryable: bool
    meaning: str


def _r(code: str, family: str, retryable: bool, meaning: str) -> Reason:
    return Reason(code, family, retryable, meaning)


# Families name the exception class an error becomes (see errors.py).
_SERVER = [
    _r("INVALID_ARGUMENT", "invalid_argument", False, "the request breaks a rule; the message names the field"),
    _r("NOT_FOUND", "not_found", False, "no such task (or it belongs to another tenant)"),
    _r("LEASE_LOST", "lease_lost", False, "the fencing token is not the task's current one"),
    _r("NOT_IN_PROGRESS", "conflict", False, "the task is not in progress"),
    _r("NOT_CLAIMABLE", "conflict", False, "the task is not claimable"),
    _r("ALREADY_ENDED", "conflict", False, "the task has already ended"),
    _r("ALREADY_EXISTS", "conflict", False, "a task with this id already exists"),
    _r("NOT_LEADER", "not_leader", True, "this node is not the leader; nothing was applied"),
    _r("UNKNOWN_OUTCOME", "unknown_outcome", False, "the write may or may not have been applied"),
    _r("UNAVAILABLE", "unavailable", True, "the node cannot serve now (no leader, shutting down)"),
    _r("INTERNAL", "internal", False, "a server fault"),
    _r("TOKEN_MISSING", "unauthenticated", False, "no bearer token"),
    _r("TOKEN_INVALID", "unauthenticated", False, "the token cannot be parsed"),
    _r("TOKEN_EXPIRED", "unauthenticated", False, "the token has expired"),
    _r("TOKEN_NOT_YET_VALID", "unauthenticated", False, "the token's nbf is in the future"),
    _r("TOKEN_WRONG_ISSUER", "unauthenticated", False, "the token's iss is not the one required"),
    _r("TOKEN_WRONG_AUDIENCE", "unauthenticated", False, "the token's aud is not the one required"),
    _r("TOKEN_UNKNOWN_KEY", "unauthenticated", False, "no key with the token's kid"),
    _r("TOKEN_BAD_SIGNATURE", "unauthenticated", False, "the token's signature does not verify"),
    _r("SCOPE_REQUIRED", "permission_denied", False, "the token lacks the scope this call needs"),
    _r("QUEUE_NOT_ALLOWED", "permission_denied", False, "the queue is outside the token's patterns"),
    _r("RATE_LIMITED", "resource_exhausted", True, "over the tenant's rate; retry after the hint"),
    _r("TOO_MANY_STREAMS", "resource_exhausted", True, "the tenant holds too many streams on this node"),
    _r("MEMBERSHIP_UNSAFE", "precondition", False, "a membership change that may not commit now"),
    _r("CLUSTER_AUTH", "unauthenticated", False, "the Raft port takes calls from cluster peers only"),
    _r("METHOD_NOT_ALLOWED", "invalid_argument", False, "REST only: the path is not served with this HTTP method"),
    _r("QUEUE_FULL", "resource_exhausted", True, "the queue or tenant is at its depth limit; retry after the hint"),
    _r("FEATURE_NOT_ACTIVE", "precondition", False, "needs a cluster version the cluster does not run yet (a node runs an older binary)"),
    _r("SINGLETON_ACTIVE", "conflict", False, "a singleton key's task is pending or in progress (the message names it)"),
]

#: Every reason code the server sends, by code.
SERVER_REASONS: Dict[str, Reason] = {r.code: r for r in _SERVER}

# Statuses that carry no raftq reason (the gRPC framework or transport answered) get a reason named after
# their gRPC code, as the Rust SDK does.
_CODE = [
    _r("UNAUTHENTICATED", "unauthenticated", False, "gRPC UNAUTHENTICATED without a raftq reason"),
    _r("PERMISSION_DENIED", "permission_denied", False, "gRPC PERMISSION_DENIED without a raftq reason"),
    _r("RESOURCE_EXHAUSTED", "resource_exhausted", True, "gRPC RESOURCE_EXHAUSTED without a raftq reason"),
    _r("UNIMPLEMENTED", "server", False, "the server does not know this call"),
    _r("FAILED_PRECONDITION", "precondition", False, "gRPC FAILED_PRECONDITION without a raftq reason"),
    _r("DEADLINE_EXCEEDED", "server", False, "gRPC DEADLINE_EXCEEDED without a raftq reason"),
    _r("CANCELLED", "server", False, "gRPC CANCELLED without a raftq reason"),
    _r("UNKNOWN", "server", False, "an answer without a reason"),
]

#: Every reason an error of this SDK may carry: the server's, plus those named after gRPC codes.
ALL_REASONS: Dict[str, Reason] = {**SERVER_REASONS, **{r.code: r for r in _CODE}}

#: Reasons whose requests were not applied and may succeed later unchanged.
RETRYABLE: FrozenSet[str] = frozenset(code for code, r in ALL_REASONS.items() if r.retryable)

# Convenient names for the codes code most often compares against.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
NOT_FOUND = "NOT_FOUND"
LEASE_LOST = "LEASE_LOST"
NOT_IN_PROGRESS = "NOT_IN_PROGRESS"
ALREADY_ENDED = "ALREADY_ENDED"
NOT_LEADER = "NOT_LEADER"
UNKNOWN_OUTCOME = "UNKNOWN_OUTCOME"
UNAVAILABLE = "UNAVAILABLE"
TOKEN_EXPIRED = "TOKEN_EXPIRED"
RATE_LIMITED = "RATE_LIMITED"


def is_retryable(code: str) -> bool:
    """Whether a request refused with ``code`` can succeed later, unchanged, and is safe to repeat."""
    return code in RETRYABLE
