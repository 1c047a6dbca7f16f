from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader_id", "has_leader", "last_log_index", "applied_index", "committed_index", "replication_lag", "members", "snapshot_index", "purged_index", "version", "cluster_version")
    class ReplicationLagEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PURGED_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    term: int
    leader_id: int
    has_leader: bool
    last_log_index: int
    applied_index: int
    committed_index: int
    replication_lag: _containers.ScalarMap[int, int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    snapshot_index: int
    purged_index: int
    version: int
    cluster_version: int
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[int] = ..., has_leader: bool = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., replication_lag: _Optional[_Mapping[int, int]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., snapshot_index: _Optional[int] = ..., purged_index: _Optional[int] = ..., version: _Optional[int] = ..., cluster_version: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "raft_addr", "api_addr", "voter")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    API_ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    raft_addr: str
    api_addr: str
    voter: bool
    def __init__(self, node_id: _Optional[int] = ..., raft_addr: _Optional[str] = ..., api_addr: _Optional[str] = ..., voter: bool = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ("to", "timeout_ms")
    TO_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    to: int
    timeout_ms: int
    def __init__(self, to: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TransferLeaderResponse(_message.Message):
    __slots__ = ("leader_id", "took_ms")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    took_ms: int
    def __init__(self, leader_id: _Optional[int] = ..., took_ms: _Optional[int] = ...) -> None: ...

class AddNodeRequest(_message.Message):
    __slots__ = ("node_id", "raft_addr", "api_addr", "learner_only")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    API_ADDR_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ONLY_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    raft_addr: str
    api_addr: str
    learner_only: bool
    def __init__(self, node_id: _Optional[int] = ..., raft_addr: _Optional[str] = ..., api_addr: _Optional[str] = ..., learner_only: bool = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("node_id", "force")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    force: bool
    def __init__(self, node_id: _Optional[int] = ..., force: bool = ...) -> None: ...

class MembershipResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class DigestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DigestResponse(_message.Message):
    __slots__ = ("node_id", "applied_index", "digest", "tasks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    applied_index: int
    digest: int
    tasks: int
    def __init__(self, node_id: _Optional[int] = ..., applied_index: _Optional[int] = ..., digest: _Optional[int] = ..., tasks: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("data", "records", "applied_index")
    DATA_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    records: int
    applied_index: int
    def __init__(self, data: _Optional[bytes] = ..., records: _Optional[int] = ..., applied_index: _Optional[int] = ...) -> None: ...
