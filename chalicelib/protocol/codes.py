"""Wire enums. Values are the protocol numbers; names are what JSON carries."""

from enum import IntEnum


class ErrorCode(IntEnum):
    UNSPECIFIED = 0
    OK = 1
    UNSUPPORTED = 2
    INTERNAL_ERROR = 3
    SERVICE_NOT_READY = 4
    INVALID_ARGUMENT = 5
    DUPLICATE_ENTITY = 6
    REACH_MAX_ENTITY_CAPACITY = 7
    INSTANCE_NOT_EXIST = 8
    SERVER_NOT_LEADER = 9
    # ReportEvent (UPSTREAM_V2 §2.1; 12 was DELTA_IN_PROGRESS, removed upstream).
    NODE_NOT_REGISTERED = 10
    SNAPSHOT_IN_PROGRESS = 11
    SNAPSHOT_RATE_LIMITED = 13
    SNAPSHOT_REQUIRED = 14
    IO_ERROR = 20
    UNKNOWN_ERROR = 100
    # KVCM additions (HTTP 401 / 403 / 429 answers; upstream has no auth).
    UNAUTHENTICATED = 101
    PERMISSION_DENIED = 102


class StorageType(IntEnum):
    ST_UNSPECIFIED = 0
    ST_3FS = 1
    ST_MOONCAKE = 2
    ST_TAIRMEMPOOL = 3
    ST_NFS = 4
    ST_VCNS_3FS = 5
    # UPSTREAM_V2 §2.8: ST_DUMMY is upstream's test backend, the ``local`` spec (files on the
    # manager's disk, storage/local.py); ST_TAIRMEMPOOL_SSD is an accepted name without a
    # backend here; the event-report types hold metadata only.
    ST_DUMMY = 6
    ST_EVENT_REPORT_L1P5 = 7
    ST_EVENT_REPORT_L2 = 8
    ST_TAIRMEMPOOL_SSD = 9
    ST_S3 = 100


class QueryType(IntEnum):
    QT_UNSPECIFIED = 0
    QT_BATCH_GET = 1
    QT_PREFIX_MATCH = 2
    QT_REVERSE_ROLL_SW_MATCH = 3
    QT_PREFIX_MATCH_WITH_MAMBA = 4


class ReportEventType(IntEnum):
    EVENT_UNSPECIFIED = 0
    EVENT_NODE_REGISTER = 1
    EVENT_BLOCK_ADD = 2
    EVENT_BLOCK_DELETE = 3
    EVENT_HOST_DOWN = 4
    EVENT_HEARTBEAT = 5
    EVENT_BLOCK_SNAPSHOT = 6


class LocationSelectStrategy(IntEnum):
    LSS_UNSPECIFIED = 0
    LSS_V6D_PREFIX = 1
    LSS_V6D_COVERAGE = 2
    LSS_WEIGHTED_RANDOM = 3


class CacheLocationStatus(IntEnum):
    CLS_NOT_FOUND = 0
    CLS_NEW = 1
    CLS_WRITING = 2
    CLS_SERVING = 3
    CLS_DELETING = 4


class TrimStrategy(IntEnum):
    TS_UNSPECIFIED = 0
    TS_REMOVE_ALL_CACHE = 1
    TS_REMOVE_ALL_META = 2
    TS_TIMESTAMP = 3


class ReclaimPolicy(IntEnum):
    POLICY_UNSPECIFIED = 0
    POLICY_LRU = 1
    POLICY_LFU = 2
    POLICY_TTL = 3


class InstanceReclaimBudgetPolicy(IntEnum):
    """How a reclaim round spreads a group's need over its instances (UPSTREAM_V2 §2.13)."""

    USAGE_PROPORTIONAL = 0
    FIXED_PER_INSTANCE = 1
    GROUP_LRU = 2


class MigrationRetention(IntEnum):
    """What a tiered Copy does with the source once the target serves (UPSTREAM_V2 §2.11)."""

    MIGRATION_RETENTION_UNSPECIFIED = 0
    MIGRATION_RETENTION_DELETE_SOURCE = 1
    MIGRATION_RETENTION_KEEP_BOTH = 2


class MigrationMethod(IntEnum):
    """What admin migrateCache asks of a block: Copy it, Mark it, or both (UPSTREAM_V2 §2.11)."""

    MIGRATION_METHOD_UNSPECIFIED = 0
    MIGRATION_METHOD_COPY = 1
    MIGRATION_METHOD_MARK = 2
    MIGRATION_METHOD_BOTH = 3


class MigrationMarkClearPolicy(IntEnum):
    """When finishWriteCache clears a block's Mark (UPSTREAM_V2 §2.11)."""

    MIGRATION_MARK_CLEAR_ON_NEXT_WRITE_SUCCESS = 0
    MIGRATION_MARK_CLEAR_ON_FULL_BLOCK_COVERED = 1


class MigrationCopyExecutionMode(IntEnum):
    """Whether a Copy waits on the backend (SYNC) or runs as a tracked async operation."""

    MIGRATION_COPY_SYNC = 0
    MIGRATION_COPY_ASYNC_REQUIRED = 1


class CachePreferStrategy(IntEnum):
    CPS_UNSPECIFIED = 0
    CPS_ALWAYS_3FS = 1
    CPS_PREFER_3FS = 2
    CPS_ALWAYS_MOONCAKE = 3
    CPS_PREFER_MOONCAKE = 4
    CPS_ALWAYS_TAIR_MEMPOOL = 5
    CPS_PREFER_TAIR_MEMPOOL = 6
    CPS_ALWAYS_VCNS_3FS = 7
    CPS_PREFER_VCNS_3FS = 8
    CPS_ALWAYS_S3 = 100
    CPS_PREFER_S3 = 101


class Role(IntEnum):
    """Account roles (docs/security.md). Upstream knows ROLE_USER 0 and ROLE_ADMIN 1;
    ROLE_USER is the engine role (``ROLE_ENGINE`` is accepted as its alias and renders as
    ``ROLE_USER``, so upstream clients read it back)."""

    ROLE_USER = 0
    ROLE_ENGINE = 0
    ROLE_ADMIN = 1
    ROLE_OPERATOR = 2
    ROLE_READ_ONLY = 3


class FaultType(IntEnum):
    FT_INTERNAL_ERROR = 0


class FaultTriggerStrategy(IntEnum):
    ALWAYS = 0
    ONCE = 1


class LogLevel(IntEnum):
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3
