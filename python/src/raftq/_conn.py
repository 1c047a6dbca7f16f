"""Which server to talk to: the configured addresses in order, a leader named by a ``NOT_LEADER`` answer first,
one cached channel at a time; the bearer token and redirect header of every request; the retry rule of unary
calls and the backoff between tries. The sync and asyncio connectors differ only in how a channel is made.
"""

import asyncio
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

import grpc
import grpc.aio

from . import reasons
from .errors import ConfigError, NotLeaderError, RaftqError, ServerError, TransportError, UnknownOutcomeError

#: The address the examples and the server default to.
DEFAULT_ADDR = "127.0.0.1:9091"

#: The largest message sent or accepted: a batch of tasks with large payloads (the server's API limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: HTTP/2 pings on idle connections: a server that vanished without closing the socket is noticed within
#: interval + timeout instead of at the next request or never. Same values as the Rust SDK.
KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 10_000

TokenProvider = Callable[[], Optional[str]]

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """A server address as given (``host:port``, ``http://host:port``, ``https://host:port``), normalised."""

    #: ``http://host:port`` or ``https://host:port``: how it is named in logs and compared.
    uri: str
    #: ``host:port``: what gRPC dials.
    hostport: str
    tls: bool


def parse_addr(addr: str, tls_default: bool) -> Target:
    """A bare ``host:port`` uses TLS when a CA was given; explains what is wrong otherwise."""
    a = addr.strip()
    if not a:
        raise ValueError("an address is empty")
    if "://" in a:
        scheme, rest = a.split("://", 1)
        if scheme not in ("http", "https"):
            raise ValueError(f"address {a!r}: unknown scheme {scheme!r}")
        tls = scheme == "https"
    else:
        rest, tls = a, tls_default
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or " " in rest or "/" in rest:
        raise ValueError(f"address {a!r} must be host:port (optionally with http:// or https://)")
    return Target(("https://" if tls else "http://") + rest, rest, tls)


def validate_target(
    addrs: Sequence[str], token: Optional[str], ca: Optional[bytes], problems: List[str]
) -> List[Target]:
    """Checks an address list, a token and a CA; appends one line per problem."""
    if isinstance(addrs, str):
        problems.append("addrs must be a list of addresses, not a string")
        return []
    targets = []
    if not addrs:
        problems.append("addrs must list at least one server address")
    for a in addrs:
        try:
            targets.append(parse_addr(a, ca is not None))
        except ValueError as e:
            problems.append(str(e))
    if ca is not None and b"-----BEGIN CERTIFICATE-----" not in ca:
        problems.append("tls_ca_pem must hold a PEM certificate")
    if token is not None and not _printable(token):
        problems.append("token must be printable ASCII")
    return targets


def _printable(s: str) -> bool:
    return all(32 <= ord(c) < 127 for c in s)


CHANNEL_OPTIONS: List[Tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Each connector owns its connections: a channel closed after a failure must not keep a shared one alive.
    ("grpc.use_local_subchannel_pool", 1),
]


class Backoff:
    """Delays that double from ``lo`` up to ``hi``; each is drawn from the upper half of the current step
    ("equal jitter"), so clients that lost the same server do not come back in lockstep."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo = max(lo, 0.001)
        self.hi = max(hi, self.lo)
        self.step = self.lo

    def next_delay(self) -> float:
        step = self.step
        self.step = min(self.step * 2, self.hi)
        return step / 2 + random.uniform(0, step / 2)

    def reset(self) -> None:
        self.step = self.lo


class _Addresses:
    """The address order and leader hints, shared by the sync and asyncio connectors. Thread-safe."""

    def __init__(
        self,
        addrs: Sequence[str],
        token: Optional[str],
        token_provider: Optional[TokenProvider],
        tls_ca_pem: Optional[bytes],
        connect_timeout: float,
    ) -> None:
        problems: List[str] = []
        self.targets = validate_target(addrs, token, tls_ca_pem, problems)
        if problems:
            raise ConfigError(problems)
        self.token_value = token
        self.token_provider = token_provider
        self.ca = tls_ca_pem
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._next = 0
        self._leader: Optional[Target] = None
        self._unreachable_leader: Optional[str] = None

    def token(self) -> str:
        """The token requests carry now: the provider's, else the configured one."""
        if self.token_provider is not None:
            return self.token_provider() or ""
        return self.token_value or ""

    def metadata(self, redirect: bool = True) -> List[Tuple[str, str]]:
        md = [(reasons.REDIRECT_HEADER, "1")] if redirect else []
        t = self.token()
        if t:
            md.append(("authorization", f"Bearer {t}"))
        return md

    def candidates(self) -> Tuple[List[Target], Optional[Target], int]:
        """The leader last named (tried once), then every address from the one after the last that failed."""
        with self._lock:
            named, self._leader = self._leader, None
            start = self._next
        n = len(self.targets)
        order = [self.targets[(start + i) % n] for i in range(n)]
        return ([named] if named else []) + order, named, start

    def connected(self, t: Target) -> None:
        with self._lock:
            for i, x in enumerate(self.targets):
                if x.uri == t.uri:
                    self._next = i

    def connect_failed(self, t: Target, named: Optional[Target]) -> None:
        if named is not None and named.uri == t.uri and all(x.uri != t.uri for x in self.targets):
            with self._lock:
                self._unreachable_leader = t.uri

    def all_failed(self, start: int) -> None:
        with self._lock:
            self._next = (start + 1) % len(self.targets)

    def failed(self, uri: str) -> None:
        """The server at ``uri`` failed: move on to the next address."""
        with self._lock:
            for i, x in enumerate(self.targets):
                if x.uri == uri:
                    self._next = (i + 1) % len(self.targets)

    def redirect(self, uri: str, leader: Optional[str]) -> None:
        """``uri`` is not the leader: try ``leader`` (when known and reachable) first next time."""
        target: Optional[Target] = None
        if leader:
            try:
                target = parse_addr(leader, self.ca is not None)
            except ValueError:
                target = None
        with self._lock:
            unreachable = target is not None and target.uri == self._unreachable_leader
        # Without a leader (an election is running), or with one this client cannot reach, stay on the list.
        if target is None or target.uri == uri or unreachable:
            self.failed(uri)
            return
        with self._lock:
            self._leader = target

    def new_channel(self, t: Target, aio: bool) -> Any:
        """A channel to ``t`` (not yet connected), plain or TLS."""
        module: Any = grpc.aio if aio else grpc
        if t.tls:
            return module.secure_channel(t.hostport, grpc.ssl_channel_credentials(self.ca), CHANNEL_OPTIONS)
        return module.insecure_channel(t.hostport, CHANNEL_OPTIONS)

    def after_failure(self, t: Optional[Target], err: RaftqError) -> None:
        """Follows a NOT_LEADER answer's leader, or moves past a server that could not be reached."""
        if t is None:
            return
        if isinstance(err, NotLeaderError):
            self.redirect(t.uri, err.leader)
        elif isinstance(err, TransportError):
            self.failed(t.uri)


class SyncConnector(_Addresses):
    """One cached ``grpc.Channel`` to the server that should be leader."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._current: Optional[Tuple[Target, grpc.Channel, Dict[str, Any]]] = None
        self._chan_lock = threading.Lock()

    def channel(self) -> Tuple[Target, grpc.Channel, Dict[str, Any]]:
        """The cached channel, or a new one to the first candidate that connects within ``connect_timeout``."""
        with self._chan_lock:
            if self._current is not None:
                return self._current
            candidates, named, start = self.candidates()
            last: Optional[str] = None
            for t in candidates:
                ch = self.new_channel(t, aio=False)
                try:
                    grpc.channel_ready_future(ch).result(timeout=self.connect_timeout)
                except grpc.FutureTimeoutError:
                    ch.close()
                    self.connect_failed(t, named)
                    last = f"cannot connect to {t.uri} within {self.connect_timeout}s"
                    continue
                self.connected(t)
                self._current = (t, ch, {})
                return self._current
            self.all_failed(start)
            raise TransportError(last or "no address to connect to")

    def drop(self, uri: str) -> None:
        with self._chan_lock:
            if self._current is not None and self._current[0].uri == uri:
                self._current[1].close()
                self._current = None

    def failed(self, uri: str) -> None:
        self.drop(uri)
        super().failed(uri)

    def redirect(self, uri: str, leader: Optional[str]) -> None:
        self.drop(uri)
        super().redirect(uri, leader)

    def close(self) -> None:
        with self._chan_lock:
            if self._current is not None:
                self._current[1].close()
                self._current = None


class AsyncConnector(_Addresses):
    """One cached ``grpc.aio.Channel`` to the server that should be leader. Use from one event loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._current: Optional[Tuple[Target, grpc.aio.Channel, Dict[str, Any]]] = None
        self._chan_lock: Optional[asyncio.Lock] = None
        self._retired: List[grpc.aio.Channel] = []

    async def channel(self) -> Tuple[Target, grpc.aio.Channel, Dict[str, Any]]:
        if self._current is not None:
            return self._current
        if self._chan_lock is None:
            self._chan_lock = asyncio.Lock()
        async with self._chan_lock:
            if self._current is not None:
                return self._current
            candidates, named, start = self.candidates()
            last: Optional[str] = None
            for t in candidates:
                ch = self.new_channel(t, aio=True)
                try:
                    await asyncio.wait_for(ch.channel_ready(), self.connect_timeout)
                except (asyncio.TimeoutError, grpc.aio.AioRpcError):
                    await ch.close()
                    self.connect_failed(t, named)
                    last = f"cannot connect to {t.uri} within {self.connect_timeout}s"
                    continue
                self.connected(t)
                self._current = (t, ch, {})
                return self._current
            self.all_failed(start)
            raise TransportError(last or "no address to connect to")

    def drop(self, uri: str) -> None:
        """Forgets the channel to ``uri``; it is closed when the connector closes (calls may still use it)."""
        if self._current is not None and self._current[0].uri == uri:
            self._retired.append(self._current[1])
            self._current = None

    def failed(self, uri: str) -> None:
        self.drop(uri)
        super().failed(uri)

    def redirect(self, uri: str, leader: Optional[str]) -> None:
        self.drop(uri)
        super().redirect(uri, leader)

    async def close(self) -> None:
        chans = self._retired + ([self._current[1]] if self._current else [])
        self._current, self._retired = None, []
        for ch in chans:
            await ch.close()


@dataclass
class Op(Generic[T]):
    """One unary call: the method, the request, how to read the answer, and whether it is a write."""

    path: str
    request: Any
    response: Any
    parse: Callable[[Any], T]
    write: bool
    #: Added to the request timeout (a long poll's wait), seconds.
    extra_timeout: float = 0.0


class Step:
    NOW = "now"
    LATER = "later"
    STOP = "stop"


#: Overload refusals: the server refused the request whole before proposing anything.
OVERLOAD = frozenset({"RATE_LIMITED", "QUEUE_FULL", "TOO_MANY_STREAMS"})


def next_step(write: bool, e: RaftqError, tries: int = 0, max_retries: Optional[int] = None) -> str:
    """The retry rule. Reads retry everything transient. Writes retry only what certainly was not applied: a
    ``NOT_LEADER`` answer, an overload refusal and a connection that could not be made. An unknown outcome is never retried. Past
    ``max_retries`` retries, nothing is."""
    if max_retries is not None and tries > max_retries:
        return Step.STOP
    if isinstance(e, NotLeaderError):
        return Step.NOW if e.leader else Step.LATER
    if isinstance(e, TransportError):
        return Step.LATER
    if not write and isinstance(e, UnknownOutcomeError):
        return Step.LATER
    if not write and isinstance(e, ServerError) and e.retryable:
        return Step.LATER
    if isinstance(e, ServerError) and e.reason in OVERLOAD:
        # Refused whole before anything was proposed: a write too may go again, after the backoff.
        return Step.LATER
    return Step.STOP


def multicallable(kind: str, ch: Any, cache: Dict[str, Any], op: "Op[Any]") -> Any:
    """The cached callable of ``op``'s method on a channel."""
    mc = cache.get(op.path)
    if mc is None:
        make = ch.unary_unary if kind == "unary" else ch.stream_stream
        mc = make(
            op.path, request_serializer=type(op.request).SerializeToString, response_deserializer=op.response.FromString
        )
        cache[op.path] = mc
    return mc
