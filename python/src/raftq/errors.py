"""The SDK's exceptions and the mapping from what the server sends (a gRPC status, a batch item's error, a
stream error) to them. Owns the decision "does retrying help"; retries nothing itself.

Every exception is a :class:`RaftqError` with ``reason`` (the server's stable code, or ``None`` when the error
did not come from the server) and ``retryable``. Errors from the server are :class:`ServerError` subclasses
chosen by the reason's family: ``except raftq.NotFoundError`` or ``if e.reason == "LEASE_LOST"`` both work.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import grpc

from . import reasons


class RaftqError(Exception):
    """Base of every error of this SDK."""

    reason: Optional[str] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def retryable(self) -> bool:
        """Whether the same request can succeed later, unchanged, and is safe to repeat."""
        return False


class ConfigError(RaftqError):
    """The configuration breaks these rules (all of them are listed in ``problems``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("invalid configuration: " + "; ".join(problems))
        self.problems: List[str] = list(problems)


class TransportError(RaftqError):
    """No answer from the server: it could not be reached, or the connection broke before the request was
    sent. Retryable."""

    @property
    def retryable(self) -> bool:
        return True


class ProtocolError(RaftqError):
    """The server broke the protocol (an answer of the wrong kind, a wrong number of results)."""


class ClosedError(RaftqError):
    """The producer, stream or worker was closed, so the request was not sent."""


class AlreadyRunningError(RaftqError):
    """``Worker.run`` was called while the same worker was already running."""


class UnknownOutcomeError(RaftqError):
    """A write whose outcome is not known: it may or may not have been applied (it timed out, or the connection
    broke while it was in flight). Check with a read, or repeat it only if it is idempotent (an enqueue with an
    idempotency key). Not retryable in the sense of ``retryable``."""

    reason = reasons.UNKNOWN_OUTCOME


class ServerError(RaftqError):
    """The server refused the request with a stable reason code."""

    def __init__(self, reason: str, message: str, code: Optional[str] = None) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        #: What the server said, without the reason prefix.
        self.detail = message
        #: The gRPC status code name, when the error came as a status.
        self.code = code

    @property
    def retryable(self) -> bool:
        return reasons.is_retryable(self.reason or "")


class NotLeaderError(ServerError):
    """The node that answered is not the leader; nothing was applied. ``leader`` is the leader's address when
    the node knows it."""

    def __init__(self, reason: str, message: str, code: Optional[str] = None, leader: Optional[str] = None) -> None:
        super().__init__(reason, message, code)
        self.leader = leader


class InvalidArgumentError(ServerError):
    """The request breaks a rule (``INVALID_ARGUMENT``); the message names the field."""


class NotFoundError(ServerError):
    """No such task, or it belongs to another tenant (``NOT_FOUND``)."""


class LeaseLostError(ServerError):
    """The fencing token is no longer the task's current one (``LEASE_LOST``)."""


class ConflictError(ServerError):
    """The task is not in a state that allows this (``NOT_IN_PROGRESS``, ``NOT_CLAIMABLE``, ``ALREADY_ENDED``,
    ``ALREADY_EXISTS``, ``SINGLETON_ACTIVE``)."""


class AuthenticationError(ServerError):
    """No valid credentials (``TOKEN_*``, ``UNAUTHENTICATED``)."""


class PermissionDeniedError(ServerError):
    """Valid credentials that do not allow this (``SCOPE_REQUIRED``, ``QUEUE_NOT_ALLOWED``)."""


class ResourceExhaustedError(ServerError):
    """A limit was reached and nothing was applied (``RATE_LIMITED``, ``TOO_MANY_STREAMS``); try again after
    ``retry_after_ms``."""

    def __init__(
        self, reason: str, message: str, code: Optional[str] = None, retry_after_ms: Optional[int] = None
    ) -> None:
        super().__init__(reason, message, code)
        self.retry_after_ms = retry_after_ms


class UnavailableError(ServerError):
    """The node cannot serve now (``UNAVAILABLE``); retryable."""


class PreconditionError(ServerError):
    """The cluster's present state does not allow this (``MEMBERSHIP_UNSAFE``)."""


class InternalError(ServerError):
    """A server fault (``INTERNAL``)."""


_FAMILY: Dict[str, Type[ServerError]] = {
    "invalid_argument": InvalidArgumentError,
    "not_found": NotFoundError,
    "lease_lost": LeaseLostError,
    "conflict": ConflictError,
    "not_leader": NotLeaderError,
    "unavailable": UnavailableError,
    "internal": InternalError,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "resource_exhausted": ResourceExhaustedError,
    "precondition": PreconditionError,
    "server": ServerError,
}


def _strip_reason(reason: str, message: str) -> str:
    """The server puts the reason in front of the message (``NOT_FOUND: task not found``); keep the rest."""
    if reason and message.startswith(reason + ":"):
        return message[len(reason) + 1 :].lstrip()
    return message


def from_reason(
    reason: str,
    message: str,
    leader: Optional[str] = None,
    code: Optional[str] = None,
    retry_after_ms: Optional[int] = None,
) -> RaftqError:
    """The error a stable reason code and message stand for, as they arrive in batch items and stream errors."""
    message = _strip_reason(reason, message)
    if not reason:
        return ServerError("UNKNOWN", message, code)
    if reason == reasons.UNKNOWN_OUTCOME:
        return UnknownOutcomeError(f"outcome unknown: {message}")
    known = reasons.ALL_REASONS.get(reason)
    cls = _FAMILY[known.family] if known else ServerError
    if cls is NotLeaderError:
        return NotLeaderError(reason, message, code, leader=leader or None)
    if cls is ResourceExhaustedError:
        return ResourceExhaustedError(reason, message, code, retry_after_ms=retry_after_ms)
    return cls(reason, message, code)


def _metadata(err: grpc.RpcError) -> Dict[str, str]:
    md: Dict[str, str] = {}
    trailing: Any
    try:
        trailing = err.trailing_metadata()
    except Exception:  # noqa: BLE001 - a status without metadata
        trailing = None
    for k, v in trailing or ():
        md[k] = v.decode("latin-1") if isinstance(v, bytes) else v
    return md


# What the gRPC core says when it never got a connection: the request was not sent.
_CONNECT_FAILURE_HINTS: Tuple[str, ...] = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "no address",
)


def is_connect_failure(err: grpc.RpcError) -> bool:
    """True when the status says no connection could be made: the request was never sent."""
    code = err.code()
    details = (err.details() or "").lower()
    return code == grpc.StatusCode.UNAVAILABLE and any(h in details for h in _CONNECT_FAILURE_HINTS)


def from_rpc_error(err: grpc.RpcError, write: bool) -> RaftqError:
    """Maps a failed call. ``write`` says whether the request was a write: a status that did not come from raftq
    (a broken connection, a client-side deadline) then means the write may have happened."""
    code = err.code()
    details = err.details() or ""
    md = _metadata(err)
    reason = md.get(reasons.REASON_HEADER)
    if reason:
        retry_after = md.get(reasons.RETRY_AFTER_HEADER)
        return from_reason(
            reason,
            details,
            leader=md.get(reasons.LEADER_HEADER),
            code=code.name,
            retry_after_ms=int(retry_after) if retry_after and retry_after.isdigit() else None,
        )
    if is_connect_failure(err):
        return TransportError(f"{code.name}: {details}")
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        if write:
            return UnknownOutcomeError(f"no answer to the write ({code.name}: {details})")
        return TransportError(f"{code.name}: {details}")
    return from_reason(code.name, details, code=code.name)
