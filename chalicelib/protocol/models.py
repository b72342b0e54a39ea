"""pydantic models of every request and response of the wire contract (see API.md).

Field types follow upstream's protobuf: ``Int64`` renders as a string, ``Int32`` as a
number. Sub-messages that are absent stay ``None`` and are omitted when rendering; a
``oneof`` is a set of optional fields of which at most one may be set.

Annotations are evaluated as the classes are created (no ``from __future__ import
annotations``): as strings, pydantic would evaluate some 400 of them again at import, a
cold start's 1 % (docs/cold-start.md).
"""

from typing import Annotated, Any

from pydantic import ConfigDict, Field, PrivateAttr, model_validator
from typing_extensions import TypedDict

from .codes import (
    CacheLocationStatus,
    CachePreferStrategy,
    ErrorCode,
    FaultTriggerStrategy,
    FaultType,
    InstanceReclaimBudgetPolicy,
    LocationSelectStrategy,
    MigrationCopyExecutionMode,
    MigrationMarkClearPolicy,
    MigrationMethod,
    MigrationRetention,
    QueryType,
    ReclaimPolicy,
    ReportEventType,
    Role,
    StorageType,
    TrimStrategy,
)
from .host_state_body import decode_host_state_body
from .reported_events import ReportedEvents, decode_report_body
from .wire import (
    Bool,
    Int32,
    Int64,
    Int64List,
    Items,
    JsonArray,
    KeyList,
    ParseLimits,
    Str,
    WireEnum,
    WireModel,
    decode_body,
    empty_list,
    key_list_of_at_most,
    parse_model,
)

ErrorCodeField = Annotated[ErrorCode, WireEnum(ErrorCode)]
StorageTypeField = Annotated[StorageType, WireEnum(StorageType)]
QueryTypeField = Annotated[QueryType, WireEnum(QueryType)]
TrimStrategyField = Annotated[TrimStrategy, WireEnum(TrimStrategy)]
ReclaimPolicyField = Annotated[ReclaimPolicy, WireEnum(ReclaimPolicy)]
CachePreferStrategyField = Annotated[CachePreferStrategy, WireEnum(CachePreferStrategy)]
RoleField = Annotated[Role, WireEnum(Role)]
FaultTypeField = Annotated[FaultType, WireEnum(FaultType)]
FaultTriggerStrategyField = Annotated[FaultTriggerStrategy, WireEnum(FaultTriggerStrategy)]
CacheLocationStatusField = Annotated[CacheLocationStatus, WireEnum(CacheLocationStatus)]
ReportEventTypeField = Annotated[ReportEventType, WireEnum(ReportEventType)]
LocationSelectStrategyField = Annotated[LocationSelectStrategy, WireEnum(LocationSelectStrategy)]
InstanceReclaimBudgetPolicyField = Annotated[InstanceReclaimBudgetPolicy, WireEnum(InstanceReclaimBudgetPolicy)]
MigrationRetentionField = Annotated[MigrationRetention, WireEnum(MigrationRetention)]
MigrationMarkClearPolicyField = Annotated[MigrationMarkClearPolicy, WireEnum(MigrationMarkClearPolicy)]
MigrationMethodField = Annotated[MigrationMethod, WireEnum(MigrationMethod)]
MigrationCopyExecutionModeField = Annotated[MigrationCopyExecutionMode, WireEnum(MigrationCopyExecutionMode)]


def _one_of(model: WireModel, names: tuple[str, ...], what: str) -> None:
    chosen = [n for n in names if getattr(model, n) is not None]
    if len(chosen) > 1:
        raise ValueError(f"{what} accepts one of {', '.join(names)}, got {', '.join(chosen)}")


# ---------------------------------------------------------------- common


class RequestHeader(WireModel):
    trace_id: Str = ""


class Request(WireModel):
    """Base of every request: upstream puts ``trace_id`` at the top, KVCM also reads ``header``."""

    trace_id: Str = ""
    header: RequestHeader | None = None
    _caller: str = PrivateAttr(default="")

    @property
    def caller(self) -> str:
        """The account that sent the request when auth is on, else "": set by the
        dispatcher once the credentials are checked, never read from the body."""
        return self._caller

    def sent_by(self, caller: str) -> None:
        """Name the authenticated account that sent the request (``caller``)."""
        self._caller = caller

    @classmethod
    def from_body(cls, raw: Any, limits: ParseLimits | None = None) -> "Request":
        """The request in an HTTP body, its key lists within ``limits`` (MalformedBodyError,
        InvalidArgumentError naming the field)."""
        fast = cls.from_canonical(raw) if isinstance(raw, (bytes, str)) and raw else None
        return fast if fast is not None else parse_model(cls, decode_body(raw), limits)

    @classmethod
    def from_canonical(cls, raw: bytes | str) -> "Request | None":
        """The request decoded without pydantic when the body is in the spelling its
        callers send (a method's fast path), else None: the body then takes the pydantic
        path, whose errors name the field."""
        return None

    @property
    def effective_trace_id(self) -> str:
        if self.trace_id:
            return self.trace_id
        return self.header.trace_id if self.header else ""


class Status(WireModel):
    code: ErrorCodeField = ErrorCode.OK
    message: Str = ""


class ResponseHeader(WireModel):
    status: Status = Field(default_factory=Status)
    request_id: Str = ""


class Response(WireModel):
    header: ResponseHeader = Field(default_factory=ResponseHeader)


class BoolMasks(WireModel):
    values: Items[Bool] = Field(default_factory=empty_list)


class BlockMask(WireModel):
    offset: Int32 | None = None
    bool_masks: BoolMasks | None = None

    @model_validator(mode="after")
    def _oneof(self) -> "BlockMask":
        _one_of(self, ("offset", "bool_masks"), "block mask")
        if self.offset is not None and self.offset < 0:
            raise ValueError("offset must be >= 0")
        return self


class LocationSpec(TypedDict):
    """``{name, uri}``; ``uri == ""`` is a miss."""

    name: str
    uri: str


class CacheLocation(TypedDict):
    """``{type: StorageType name, spec_size, location_specs}``."""

    type: str
    spec_size: int
    location_specs: list[LocationSpec]


class CacheLocations(JsonArray):
    """The locations of a response, each rendered to JSON once (``cache.locations``)."""

    item_type = CacheLocation


class LocationSpecInfo(WireModel):
    name: Str = ""
    size: Int64 = 0


class LocationSpecGroup(WireModel):
    name: Str = ""
    spec_names: Items[Str] = Field(default_factory=empty_list)


class ModelDeployment(WireModel):
    model_name: Str = ""
    dtype: Str = ""
    use_mla: Bool = False
    tp_size: Int32 = 0
    dp_size: Int32 = 0
    lora_name: Str = ""
    pp_size: Int32 = 0
    extra: Str = ""
    user_data: Str = ""
    #: EAGLE speculative decoding pops the last block: host prefixes count one block less.
    use_eagle_pop: Bool = False

    def identity(self) -> dict[str, Any]:
        """The fields that identify a deployment (``user_data`` is not one)."""
        return self.model_dump(exclude={"user_data"})


class KeySchemeConfig(WireModel):
    """KVCM extension: how an instance's ``token_ids`` become block keys
    (``protocol/block_keys.py``, docs/api-v2.md). ``name`` "" is upstream's rolling hash."""

    name: Str = ""
    #: vLLM: its PYTHONHASHSEED (``NONE_HASH`` is derived from it); xxh64 / xxh3_64: the seed.
    seed: Str = ""
    #: vLLM: the LoRA adapter every block of the instance is hashed with (name and path).
    lora_name: Str = ""
    lora_path: Str = ""
    #: vLLM: the cache salt hashed into the first block of every request.
    cache_salt: Str = ""


class InstanceInfo(WireModel):
    quota_group_name: Str = ""
    instance_group_name: Str = ""
    instance_id: Str = ""
    block_size: Int32 = 0
    location_spec_infos: Items[LocationSpecInfo] = Field(default_factory=empty_list)
    model_deployment: ModelDeployment | None = None
    location_spec_groups: Items[LocationSpecGroup] = Field(default_factory=empty_list)
    default_query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    #: KVCM extension: the instance's block-key scheme (absent: upstream's rolling hash).
    key_scheme: KeySchemeConfig | None = None


# ---------------------------------------------------------------- storage config


class NfsStorageSpec(WireModel):
    root_path: Str = ""
    key_count_per_file: Int32 = 0


class LocalStorageSpec(WireModel):
    """Upstream's ``local`` spec (type ST_DUMMY): files on the manager's own disk."""

    root_path: Str = ""
    key_count_per_file: Int32 = 0


class ThreeFSStorageSpec(WireModel):
    cluster_name: Str = ""
    mountpoint: Str = ""
    root_dir: Str = ""
    key_count_per_file: Int32 = 0
    touch_file_when_create: Bool = False


class VcnsThreeFSStorageSpec(ThreeFSStorageSpec):
    remote_host: Str = ""
    remote_port: Int32 = 0
    meta_storage_uri: Str = ""


class MooncakeStorageSpec(WireModel):
    local_hostname: Str = ""
    metadata_connstring: Str = ""
    protocol: Str = ""
    rdma_device: Str = ""
    master_service_entry: Str = ""


class TairMemPoolStorageSpec(WireModel):
    domain: Str = ""
    timeout: Int32 = 0
    service_discovery_url: Str = ""
    capacity: Int64 = 0


class S3StorageSpec(WireModel):
    bucket: Str = ""
    prefix: Str = ""
    region: Str = ""


class EventReportStorageSpec(WireModel):
    """Liveness and snapshot settings of an event-report storage (UPSTREAM_V2 §1.2); 0 = default."""

    heartbeat_timeout_ms: Int64 = 0
    cleanup_grace_ms: Int64 = 0
    liveness_check_interval_ms: Int64 = 0
    snapshot_min_interval_ms: Int64 = 0
    snapshot_delta_drain_timeout_ms: Int64 = 0


#: The storage types of engine-reported locations: metadata only, no data backend.
EVENT_REPORT_TYPES = (StorageType.ST_EVENT_REPORT_L1P5, StorageType.ST_EVENT_REPORT_L2)
#: Upstream types KVCM knows by name but cannot serve (UPSTREAM_V2 §2.8).
NO_BACKEND_TYPES = (StorageType.ST_TAIRMEMPOOL_SSD,)


STORAGE_SPEC_FIELDS: dict[str, StorageType] = {
    "nfs": StorageType.ST_NFS,
    "threefs": StorageType.ST_3FS,
    "vcnsthreefs": StorageType.ST_VCNS_3FS,
    "mooncake": StorageType.ST_MOONCAKE,
    "tair_mem_pool": StorageType.ST_TAIRMEMPOOL,
    "s3": StorageType.ST_S3,
    "local": StorageType.ST_DUMMY,
    # Either event-report type: the config's storage_type says which (required).
    "event_report": StorageType.ST_EVENT_REPORT_L1P5,
}


class StorageConfig(WireModel):
    global_unique_name: Str = ""
    check_storage_available_when_open: Bool = False
    nfs: NfsStorageSpec | None = None
    threefs: ThreeFSStorageSpec | None = None
    vcnsthreefs: VcnsThreeFSStorageSpec | None = None
    mooncake: MooncakeStorageSpec | None = None
    tair_mem_pool: TairMemPoolStorageSpec | None = None
    s3: S3StorageSpec | None = None
    local: LocalStorageSpec | None = None
    event_report: EventReportStorageSpec | None = None
    #: The spec's type (filled in when absent); required with ``event_report`` (L1P5 or L2).
    storage_type: StorageTypeField = StorageType.ST_UNSPECIFIED

    @model_validator(mode="after")
    def _oneof(self) -> "StorageConfig":
        _one_of(self, tuple(STORAGE_SPEC_FIELDS), "storage spec")
        field = self.spec_field
        if field == "event_report":
            if self.storage_type not in EVENT_REPORT_TYPES:
                raise ValueError(
                    "storage_type must be ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2 with an event_report spec"
                )
        elif self.storage_type in NO_BACKEND_TYPES:
            raise ValueError(f"storage_type {self.storage_type.name} has no backend in KVCM")
        elif field is not None:
            if self.storage_type == StorageType.ST_UNSPECIFIED:
                self.storage_type = STORAGE_SPEC_FIELDS[field]
            elif self.storage_type != STORAGE_SPEC_FIELDS[field]:
                raise ValueError(f"storage_type {self.storage_type.name} does not match the {field} spec")
        return self

    @property
    def spec_field(self) -> str | None:
        """Which oneof member is set (``nfs``, ``s3``...), or None."""
        for name in STORAGE_SPEC_FIELDS:
            if getattr(self, name) is not None:
                return name
        return None

    @property
    def spec(self) -> WireModel | None:
        """The oneof member that is set, or None."""
        field = self.spec_field
        return getattr(self, field) if field else None


# ---------------------------------------------------------------- instance group

#: What a group's unset fields mean (``control.groups.normalize_group`` fills them in; the
#: reclaimer and the optimizer's simulator read the same values).
DEFAULT_RECLAIM_POLICY = ReclaimPolicy.POLICY_LRU
DEFAULT_USED_PERCENTAGE = 0.9
DEFAULT_TRIGGER_PERIOD_S = 10
DEFAULT_RECLAIM_STEP_PERCENTAGE = 10
DEFAULT_TUNING_MAX_SHIFT = 0.2
DEFAULT_TUNING_WINDOW_S = 3600


class TriggerStrategy(WireModel):
    used_size: Int64 = 0
    used_percentage: float = 0.0


class CacheReclaimStrategy(WireModel):
    storage_unique_name: Str = ""
    reclaim_policy: ReclaimPolicyField = ReclaimPolicy.POLICY_UNSPECIFIED
    trigger_strategy: TriggerStrategy | None = None
    trigger_period_seconds: Int32 = 0
    reclaim_step_size: Int64 = 0
    reclaim_step_percentage: Int32 = 0
    delay_before_delete_ms: Int32 = 0
    ttl_seconds: Int64 = 0
    #: Upstream field 8, a one-field oneof: absent (None) is not USAGE_PROPORTIONAL (0) but
    #: the default, GROUP_LRU for an LRU group (``control.groups`` fills it in).
    instance_reclaim_budget_policy: InstanceReclaimBudgetPolicyField | None = None

    def budget_policy(self) -> InstanceReclaimBudgetPolicy:
        """The budget policy in force: the field, or when absent (a group stored before it
        existed) GROUP_LRU for an LRU group and USAGE_PROPORTIONAL for LFU and TTL, which
        GROUP_LRU cannot order by."""
        if self.instance_reclaim_budget_policy is not None:
            return self.instance_reclaim_budget_policy
        if self.reclaim_policy in (ReclaimPolicy.POLICY_UNSPECIFIED, ReclaimPolicy.POLICY_LRU):
            return InstanceReclaimBudgetPolicy.GROUP_LRU
        return InstanceReclaimBudgetPolicy.USAGE_PROPORTIONAL


class MetaStorageBackendConfig(WireModel):
    storage_type: Str = ""
    storage_uri: Str = ""


class MetaCachePolicyConfig(WireModel):
    capacity: Int64 = 0
    type: Str = ""
    cache_shard_bits: Int32 = 0
    high_pri_pool_ratio: float = 0.0


class MetaIndexerConfig(WireModel):
    max_key_count: Int64 = 0
    mutex_shard_num: Int64 = 0
    batch_key_size: Int64 = 0
    meta_storage_backend_config: MetaStorageBackendConfig | None = None
    meta_cache_policy_config: MetaCachePolicyConfig | None = None


class MigrationCopyMethodConfig(WireModel):
    enabled: Bool = False


class MigrationMarkMethodConfig(WireModel):
    enabled: Bool = False
    #: A wrapped Int64Value upstream: absent (None) is the default, 24 h.
    timeout_ms: Int64 | None = None


class MigrationMethodConfigs(WireModel):
    """``{copy, mark}``. The field is ``copy_config`` in Python (BaseModel has a ``copy``
    method); on the wire, in error paths and when rendered it is ``copy``."""

    model_config = ConfigDict(loc_by_alias=True, serialize_by_alias=True)

    copy_config: MigrationCopyMethodConfig | None = Field(default=None, alias="copy")
    mark: MigrationMarkMethodConfig | None = None


class MigrationStrategy(WireModel):
    """One tier route of a group: when and how blocks of ``source_storage_name`` move to
    ``target_storage_name`` (UPSTREAM_V2 §2.11)."""

    source_storage_name: Str = ""
    target_storage_name: Str = ""
    trigger_threshold: float = 0.0
    method_configs: MigrationMethodConfigs | None = None
    retention: MigrationRetentionField = MigrationRetention.MIGRATION_RETENTION_UNSPECIFIED
    #: KVCM extension: a reclaim round's victims on the source storage (its type over its
    #: watermark) are copied to the target with DELETE_SOURCE instead of dropped
    #: (docs/tiered-storage.md, "Demote instead of delete").
    demote_on_reclaim: bool = False


class MigrationConfig(WireModel):
    """``CacheConfig.migration_config``: the group's tier routes and Copy limits. The
    wrapped numbers (Int32Value / Int64Value / UInt64Value upstream) are None when absent,
    which ``control.groups`` replaces by their defaults; an explicit 0 stays 0 (and is
    refused where it must be positive)."""

    strategies: Items[MigrationStrategy] = Field(default_factory=empty_list)
    copy_max_concurrency: Int32 | None = None
    mark_clear_policy: MigrationMarkClearPolicyField = (
        MigrationMarkClearPolicy.MIGRATION_MARK_CLEAR_ON_NEXT_WRITE_SUCCESS
    )
    copy_execution_mode: MigrationCopyExecutionModeField = MigrationCopyExecutionMode.MIGRATION_COPY_SYNC
    copy_max_inflight_bytes: Int64 | None = None
    copy_max_quarantine_operations: Int64 | None = None
    copy_max_quarantine_bytes: Int64 | None = None
    copy_operation_deadline_ms: Int64 | None = None
    copy_poll_initial_interval_ms: Int64 | None = None
    copy_poll_max_interval_ms: Int64 | None = None
    copy_connect_timeout_ms: Int64 | None = None
    copy_submit_timeout_ms: Int64 | None = None
    copy_query_timeout_ms: Int64 | None = None


class CacheConfig(WireModel):
    reclaim_strategy: CacheReclaimStrategy | None = None
    data_storage_strategy: CachePreferStrategyField = CachePreferStrategy.CPS_UNSPECIFIED
    meta_indexer_config: MetaIndexerConfig | None = None
    #: Tiered storage (absent: one tier, no migration).
    migration_config: MigrationConfig | None = None


class QuotaConfig(WireModel):
    storage_type: StorageTypeField = StorageType.ST_UNSPECIFIED
    capacity: Int64 = 0


class InstanceGroupQuota(WireModel):
    capacity: Int64 = 0
    quota_config: Items[QuotaConfig] = Field(default_factory=empty_list)


class TuningConfig(WireModel):
    """KVCM extension: the per-instance tuning job's settings for one group (docs/optimizer.md)."""

    #: Apply recommendations to ``instance_quotas`` (false: recommend only).
    enabled: Bool = False
    #: The most of the group quota one run moves between instances, in (0, 1]; 0 = 0.2.
    max_shift: float = 0.0
    #: Expected group hit-ratio gain below which a run changes nothing (0 = any gain).
    min_gain: float = 0.0
    #: Seconds of event log a run reads back; 0 = 3600.
    window_seconds: Int64 = 0


#: The most shards (``InstanceGroup.instance_shards``) an instance may spread over: shard s
#: hands out location ids from s << 36, and they have 40 bits (index/sharding.py).
MAX_INSTANCE_SHARDS = 16


class InstanceGroup(WireModel):
    name: Str = ""
    storage_candidates: Items[Str] = Field(default_factory=empty_list)
    global_quota_group_name: Str = ""
    max_instance_count: Int64 = 0
    quota: InstanceGroupQuota | None = None
    cache_config: CacheConfig | None = None
    user_data: Str = ""
    version: Int64 = 0
    #: Opaque JSON handed to clients (registerInstance, reportEvent).
    extra_info: Str = ""
    #: The event-report storages reportEvent may write for this group's instances.
    event_report_storage_candidates: Items[Str] = Field(default_factory=empty_list)
    revisit_interval_buckets: Str = ""
    #: KVCM extension: bytes each listed instance may hold (> 0; its share of ``quota.capacity``,
    #: enforced by startWriteCache and the reclaimer). Unlisted instances: the group quota only.
    instance_quotas: dict[Str, Int64] = Field(default_factory=dict)
    #: KVCM extension: the per-instance tuning job's settings (absent: recommend only).
    tuning: TuningConfig | None = None
    #: KVCM extension: how many Valkey hash tags (shards) each instance registered from now on
    #: spreads its blocks over, 1..16 (0 = 1: today's layout). Fixed per instance when its
    #: key space is claimed (docs/instance-sharding.md).
    instance_shards: Int32 = 0


# ---------------------------------------------------------------- meta service


class KeysRequest(Request):
    """A request naming blocks by ``block_keys`` or by ``token_ids`` (keys win)."""

    instance_id: Str = ""
    block_keys: KeyList = Field(default_factory=empty_list)
    token_ids: Int64List = Field(default_factory=empty_list)


class RegisterInstanceRequest(Request):
    instance_group: Str = ""
    instance_id: Str = ""
    block_size: Int32 = 0
    location_spec_infos: Items[LocationSpecInfo] = Field(default_factory=empty_list)
    model_deployment: ModelDeployment | None = None
    location_spec_groups: Items[LocationSpecGroup] = Field(default_factory=empty_list)
    default_query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    #: KVCM extension: the instance's block-key scheme (absent: upstream's rolling hash).
    key_scheme: KeySchemeConfig | None = None
    #: The same setting under upstream's earlier name (its proto's ``query_type = 8``).
    query_type: QueryTypeField = QueryType.QT_UNSPECIFIED

    @property
    def registered_query_type(self) -> QueryType:
        """The default query type asked for, under either name (validation makes them agree)."""
        return self.default_query_type or self.query_type


class RegisterInstanceResponse(Response):
    storage_configs: Str = ""
    extra_info: Str = ""


class GetInstanceInfoRequest(Request):
    instance_id: Str = ""


class GetInstanceInfoResponse(Response):
    instance_group: Str = ""
    instance_info: InstanceInfo | None = None


class GetCacheLocationRequest(KeysRequest):
    query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    block_mask: BlockMask | None = None
    sw_size: Int32 = 0
    location_spec_names: Items[Str] = Field(default_factory=empty_list)


class GetCacheLocationResponse(Response):
    locations: CacheLocations = Field(default_factory=CacheLocations)


class GetCacheMetaRequest(KeysRequest):
    block_mask: BlockMask | None = None
    detail_level: Int32 = 0


class ReplicaSpec(WireModel):
    """One spec of a replica: its URI, and the PACE node it is on ("" off a memory pool)."""

    name: Str = ""
    uri: Str = ""
    node_id: Str = ""


class ReplicaLocation(WireModel):
    """One copy of a key as upstream's newest getCacheMeta lists it (``replica_locations``)."""

    id: Str = ""
    status: CacheLocationStatusField = CacheLocationStatus.CLS_NOT_FOUND
    type: StorageTypeField = StorageType.ST_UNSPECIFIED
    spec_size: Int32 = 0
    #: µs since the epoch (0: not known, as for a reported location).
    create_time: Int64 = 0
    location_specs: list[ReplicaSpec] = Field(default_factory=empty_list)


class KeyReplicas(WireModel):
    """Every copy of one key, in the order the index holds them (reported ones last)."""

    locations: list[ReplicaLocation] = Field(default_factory=empty_list)


class GetCacheMetaResponse(Response):
    #: Per key its first copy (upstream's older field, kept as it was).
    locations: CacheLocations = Field(default_factory=CacheLocations)
    metas: list[Str] = Field(default_factory=empty_list)
    #: Per key every copy (upstream's newest line).
    replica_locations: list[KeyReplicas] = Field(default_factory=empty_list)


class GetCacheMetaDetailRequest(KeysRequest):
    block_mask: BlockMask | None = None
    #: Reserved, as upstream's.
    detail_level: Int32 = 0


class SpecUri(WireModel):
    name: Str = ""
    uri: Str = ""


class CacheLocationDetail(WireModel):
    location_id: Str = ""
    status: CacheLocationStatusField = CacheLocationStatus.CLS_NOT_FOUND
    type: StorageTypeField = StorageType.ST_UNSPECIFIED
    spec_size: Int32 = 0
    #: µs since the epoch (0: not known, as for a reported location).
    create_time: Int64 = 0
    location_specs: list[SpecUri] = Field(default_factory=empty_list)


class CacheMetaDetailItem(WireModel):
    """One unmasked key's raw metadata: a missing key has no locations and status OK."""

    #: The key's position among the request's keys (masked ones counted).
    request_index: Int32 = 0
    block_key: Int64 = 0
    #: The parent's block key as a decimal string, "" for a prefix's first block.
    prev_block_key: Str = ""
    #: The record's header fields by name (docs/api-v2.md).
    properties: dict[Str, Str] = Field(default_factory=dict)
    locations: list[CacheLocationDetail] = Field(default_factory=empty_list)
    status: Status = Field(default_factory=Status)


class GetCacheMetaDetailResponse(Response):
    items: list[CacheMetaDetailItem] = Field(default_factory=empty_list)


class StartWriteCacheRequest(KeysRequest):
    location_spec_group_names: Items[Str] = Field(default_factory=empty_list)
    write_timeout_seconds: Int32 = 0
    #: Skip a key only when this many replicas exist (UPSTREAM_V2 §2.6); 0 = 1.
    min_replica_count: Int32 = 0


class StartWriteCacheResponse(Response):
    write_session_id: Str = ""
    block_mask: BlockMask | None = None
    locations: CacheLocations = Field(default_factory=CacheLocations)


class FinishWriteCacheRequest(Request):
    instance_id: Str = ""
    write_session_id: Str = ""
    success_blocks: BlockMask | None = None


class FinishWriteCacheResponse(Response):
    #: The session's blocks (its new keys, in order; True = this one) reported successful
    #: that will not be served: a removeCache or trim took them while WRITING. Absent
    #: when every successful block was committed.
    uncommitted_blocks: BlockMask | None = None


class RemoveCacheRequest(KeysRequest):
    block_mask: BlockMask | None = None


class TrimCacheRequest(Request):
    instance_id: Str = ""
    strategy: TrimStrategyField = TrimStrategy.TS_UNSPECIFIED
    begin_timestamp: Int64 = 0
    end_timestamp: Int64 = 0


class GetCacheLocationLenRequest(KeysRequest):
    """UPSTREAM_V2 §2.3: no block mask."""

    query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    sw_size: Int32 = 0


class GetCacheLocationLenResponse(Response):
    cache_location_len: Int64 = 0


class BackendLocationSelector(WireModel):
    backend_type: StorageTypeField = StorageType.ST_UNSPECIFIED
    strategy: LocationSelectStrategyField = LocationSelectStrategy.LSS_UNSPECIFIED


class GetCacheLocationsByBackendRequest(KeysRequest):
    """UPSTREAM_V2 §2.5: at most one location per selected backend per key."""

    query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    block_mask: BlockMask | None = None
    sw_size: Int32 = 0
    #: Empty, or one name per key: each key's locations are projected to its name.
    location_spec_names: Items[Str] = Field(default_factory=empty_list)
    backend_selectors: Items[BackendLocationSelector] = Field(default_factory=empty_list)


class CacheLocationVector(WireModel):
    locations: list[CacheLocation] = Field(default_factory=empty_list)


class GetCacheLocationsByBackendResponse(Response):
    #: One vector per requested key, in order; a miss is an empty vector.
    key_locations: list[CacheLocationVector] = Field(default_factory=empty_list)


class GetClusterInfoRequest(Request):
    instance_id: Str = ""


class MetaNodeEndpoint(WireModel):
    node_id: Str = ""
    host: Str = ""
    meta_rpc_port: Int32 = 0
    meta_http_port: Int32 = 0
    custom_info: Str = ""


class GetClusterInfoResponse(Response):
    self_node_id: Str = ""
    leader_node_id: Str = ""
    leader_endpoint: MetaNodeEndpoint | None = None


# ---------------------------------------------------------------- reportEvent, getHostCacheState (UPSTREAM_V2 §2.1-2.2)


class ReportedSpec(WireModel):
    name: Str = ""
    uri: Str = ""


class NodeRegisterEventParams(WireModel):
    mediums: Items[Str] = Field(default_factory=empty_list)


class BlockAddEventParams(WireModel):
    block_key: Str = ""  # int64 as a decimal string
    uri: Str = ""  # deprecated upstream, ignored: only specs count
    medium: Str = ""
    specs: Items[ReportedSpec] = Field(default_factory=empty_list)


class BlockDeleteEventParams(WireModel):
    block_key: Str = ""
    medium: Str = ""
    spec_names: Items[Str] = Field(default_factory=empty_list)


class BlockSnapshotItem(WireModel):
    block_key: Str = ""
    medium: Str = ""
    specs: Items[ReportedSpec] = Field(default_factory=empty_list)


class BlockSnapshotEventParams(WireModel):
    medium: Str = ""  # deprecated upstream (single-medium form), ignored
    blocks: Items[BlockSnapshotItem] = Field(default_factory=empty_list)


class HostDownEventParams(WireModel):
    pass


class HeartbeatEventParams(WireModel):
    system_status: dict[str, str] = Field(default_factory=dict)  # opaque


#: The oneof member each event type carries.
EVENT_PAYLOADS: dict[ReportEventType, str] = {
    ReportEventType.EVENT_NODE_REGISTER: "node_register",
    ReportEventType.EVENT_BLOCK_ADD: "block_add",
    ReportEventType.EVENT_BLOCK_DELETE: "block_delete",
    ReportEventType.EVENT_HOST_DOWN: "host_down",
    ReportEventType.EVENT_HEARTBEAT: "heartbeat",
    ReportEventType.EVENT_BLOCK_SNAPSHOT: "block_snapshot",
}


class EventItem(WireModel):
    event_type: ReportEventTypeField = ReportEventType.EVENT_UNSPECIFIED
    node_register: NodeRegisterEventParams | None = None
    block_add: BlockAddEventParams | None = None
    block_delete: BlockDeleteEventParams | None = None
    host_down: HostDownEventParams | None = None
    heartbeat: HeartbeatEventParams | None = None
    block_snapshot: BlockSnapshotEventParams | None = None

    @model_validator(mode="after")
    def _oneof(self) -> "EventItem":
        _one_of(self, tuple(EVENT_PAYLOADS.values()), "an event")
        return self

    @property
    def payload_matches(self) -> bool:
        """The payload present is the one ``event_type`` names (empty payloads included)."""
        member = EVENT_PAYLOADS.get(self.event_type)
        return member is not None and getattr(self, member) is not None


class EventItems(ReportedEvents):
    """reportEvent's events: validated as ``EventItem`` models when pydantic parses them."""

    item_model = EventItem


class ReportEventRequest(Request):
    instance_id: Str = ""
    host_ip_port: Str = ""
    events: EventItems = Field(default_factory=EventItems)
    storage_type: StorageTypeField = StorageType.ST_UNSPECIFIED

    @classmethod
    def from_canonical(cls, raw: bytes | str) -> "Request | None":
        """An engine's body (snake_case, enum names, no nulls) decoded straight into structs."""
        body = decode_report_body(raw)
        if body is None:
            return None
        return cls.model_construct(
            instance_id=body.instance_id,
            host_ip_port=body.host_ip_port,
            events=EventItems(body.events),
            storage_type=body.storage,
            trace_id=body.trace_id,
            header=None if body.header is None else RequestHeader(trace_id=body.header.trace_id),
        )


class ReportEventResponse(Response):
    #: Empty when every event succeeded, else one code per event, in order.
    item_results: list[ErrorCodeField] = Field(default_factory=empty_list)
    committed_snapshot_version: Str = ""
    retry_after_ms: Int64 = 0
    snapshot_required: Bool = False
    extra_info: Str = ""


#: getHostCacheState's keys per request: what a 6 MiB body holds of full-width int64 keys
#: as proto3 JSON prints them (``"-9223372036854775808",``, 23 bytes each: 273,530).
#: Upstream routes 20,000-key prompts; the walk's cost is linear in the prefix it finds.
MAX_HOST_STATE_KEYS = 262_144


class GetHostCacheStateRequest(Request):
    instance_id: Str = ""
    query_type: QueryTypeField = QueryType.QT_UNSPECIFIED
    block_cache_keys: key_list_of_at_most(MAX_HOST_STATE_KEYS) = Field(default_factory=empty_list)  # type: ignore[valid-type]
    medium: Items[Str] = Field(default_factory=empty_list)  # empty = every medium
    p2p_host_count: Int64 = 0

    @classmethod
    def from_canonical(cls, raw: bytes | str) -> "Request | None":
        """A router's body (snake_case, the query type by name, no nulls), its keys
        decoded in C (protocol/host_state_body.py)."""
        decoded = decode_host_state_body(raw, MAX_HOST_STATE_KEYS)
        if decoded is None:
            return None
        body, keys = decoded
        return cls.model_construct(
            instance_id=body.instance_id,
            query_type=body.query,
            block_cache_keys=keys,
            medium=body.medium,
            p2p_host_count=body.p2p_host_count,
            trace_id=body.trace_id,
            header=None if body.header is None else RequestHeader(trace_id=body.header.trace_id),
        )


class HostCacheMatch(WireModel):
    """One host's prefix in both of upstream's shapes (docs/api-v2.md): ``prefix_match_blocks``
    (its earlier proto) and ``local`` / ``p2p_1_*`` (its later one). ``p2p_1_fetch`` is None,
    hence omitted, unless a peer fetch is counted: the newest line drops it."""

    host_ip_port: Str = ""
    prefix_match_blocks: Int64 = 0
    local: Int64 = 0
    p2p_1_fetch: Int64 | None = None
    p2p_1_total_match: Int64 = 0


class GetHostCacheStateResponse(Response):
    hosts: list[HostCacheMatch] = Field(default_factory=empty_list)


# ---------------------------------------------------------------- admin service


class StorageRequest(Request):
    storage: StorageConfig | None = None


class StorageNameRequest(Request):
    storage_unique_name: Str = ""


class UpdateStorageRequest(StorageRequest):
    force_update: Bool = False


class ListRequest(Request):
    """A request without arguments (listStorage, checkHealth, getMetrics...)."""


class ListStorageResponse(Response):
    storage: list[StorageConfig] = Field(default_factory=empty_list)


class CreateInstanceGroupRequest(Request):
    instance_group: InstanceGroup | None = None


class UpdateInstanceGroupRequest(Request):
    instance_group: InstanceGroup | None = None
    current_version: Int64 = 0


class InstanceGroupNameRequest(Request):
    name: Str = ""


class GetInstanceGroupResponse(Response):
    instance_group: InstanceGroup | None = None


class ListInstanceGroupResponse(Response):
    instance_group: list[InstanceGroup] = Field(default_factory=empty_list)


class RemoveInstanceRequest(Request):
    instance_group: Str = ""
    instance_id: Str = ""


class MigrationRule(WireModel):
    """migrateCache's sampled selection (upstream: the coldest ``sample_count`` blocks)."""

    sample_count: Int32 = 0


class MigrateCacheRequest(Request):
    """Admin migrateCache (UPSTREAM_V2 §2.11): Copy ``block_keys`` of ``instance_id`` from
    one storage of its group to another."""

    instance_id: Str = ""
    source_storage_name: Str = ""
    target_storage_name: Str = ""
    block_keys: KeyList = Field(default_factory=empty_list)
    rule: MigrationRule | None = None
    method: MigrationMethodField = MigrationMethod.MIGRATION_METHOD_UNSPECIFIED


class MigrateCacheResponse(Response):
    """``accepted``: blocks handed to the Copy (a SERVING location on the source);
    ``rejected``: the others. KVCM adds the Copy's execution (empty when none started)."""

    accepted: Int64 = 0
    rejected: Int64 = 0
    execution_arn: Str = ""


class ListInstanceInfoRequest(Request):
    instance_group_name: Str = ""


class ListInstanceInfoResponse(Response):
    instance_info: list[InstanceInfo] = Field(default_factory=empty_list)


class AdminGetInstanceInfoResponse(Response):
    instance_info: InstanceInfo | None = None


class Account(WireModel):
    user_name: Str = ""
    role: RoleField = Role.ROLE_USER
    # KVCM additions (docs/security.md): the account's scope; no groups = every group ("*").
    instance_groups: list[Str] = Field(default_factory=empty_list)
    instance_id_prefixes: list[Str] = Field(default_factory=empty_list)


class AddAccountRequest(Request):
    user_name: Str = ""
    password: Str = ""
    role: RoleField = Role.ROLE_USER
    instance_groups: Items[Str] = Field(default_factory=empty_list)
    instance_id_prefixes: Items[Str] = Field(default_factory=empty_list)


class ApiKeyInfo(WireModel):
    key_id: Str = ""
    user_name: Str = ""
    created_time: Int64 = 0  # µs
    expire_time: Int64 = 0  # µs, 0 = never


class CreateApiKeyRequest(Request):
    user_name: Str = ""
    #: Lifetime in seconds; 0 = the service default (KVCM_API_KEY_DEFAULT_TTL_S).
    expire_seconds: Int64 = 0


class CreateApiKeyResponse(Response):
    #: The bearer token, shown this once; only its hash is stored.
    api_key: Str = ""
    key_info: ApiKeyInfo | None = None


class RevokeApiKeyRequest(Request):
    key_id: Str = ""


class ListApiKeyRequest(Request):
    user_name: Str = ""  # empty = every account's


class ListApiKeyResponse(Response):
    keys: list[ApiKeyInfo] = Field(default_factory=empty_list)


class AuditRecord(WireModel):
    time: Int64 = 0  # µs
    principal: Str = ""
    source: Str = ""
    api_name: Str = ""
    target: Str = ""
    code: Str = ""
    message: Str = ""


class ListAuditLogRequest(Request):
    #: Records at or after this time (ms since the epoch); 0 = the last 24 hours.
    start_time_ms: Int64 = 0
    #: Records before this time (ms); 0 = now.
    end_time_ms: Int64 = 0
    limit: Int32 = 0  # 0 = 100, at most 1000


class ListAuditLogResponse(Response):
    records: list[AuditRecord] = Field(default_factory=empty_list)


class DeleteAccountRequest(Request):
    user_name: Str = ""


class ListAccountResponse(Response):
    accounts: list[Account] = Field(default_factory=empty_list)


class MetricValue(WireModel):
    int_value: Int64 | None = None
    float_value: float | None = None
    string_value: Str | None = None


class MetricsTag(WireModel):
    tag_key: Str = ""
    tag_value: Str = ""


class MetricsData(WireModel):
    metric_name: Str = ""
    metric_value: MetricValue | None = None
    metric_tags: list[MetricsTag] = Field(default_factory=empty_list)


class GetMetricsResponse(Response):
    timestamp: Int64 = 0
    metrics: list[MetricsData] = Field(default_factory=empty_list)
    extra_data: Str = ""


class StorageHealthInfo(WireModel):
    """KVCM extension of checkHealth: one storage as the health checks see it. ``status``:
    HEALTHY, SUSPECT (a probe failed, not enough to take it out), UNAVAILABLE (no reads, no
    writes), FULL (read, not written), DISABLED (disableStorage), NOT_CHECKED (no probe yet)."""

    storage_unique_name: Str = ""
    status: Str = ""
    reason: Str = ""
    #: When the storage entered its availability state (ms since the epoch; 0 unknown).
    since_ms: Int64 = 0


class GroupHealthInfo(WireModel):
    """KVCM extension of checkHealth: a group with a candidate storage out of service.
    ``status``: NO_WRITABLE_STORAGE (every start fails: the service is unhealthy) or
    DEGRADED (it writes to the other candidates)."""

    instance_group_name: Str = ""
    status: Str = ""
    reason: Str = ""


class CheckHealthResponse(Response):
    is_leader: Bool = False
    is_health: Bool = False
    elector_last_loop_time_ms: Int64 = 0
    #: KVCM extensions: why ``is_health`` is false, one line per cause; every storage's
    #: health; the groups with a candidate out of service.
    problems: list[Str] = Field(default_factory=empty_list)
    storages: list[StorageHealthInfo] = Field(default_factory=empty_list)
    degraded_groups: list[GroupHealthInfo] = Field(default_factory=empty_list)


class NodeEndpoint(WireModel):
    """The admin twin of MetaNodeEndpoint (UPSTREAM_V2 §1.2), admin ports included."""

    node_id: Str = ""
    host: Str = ""
    meta_rpc_port: Int32 = 0
    meta_http_port: Int32 = 0
    admin_rpc_port: Int32 = 0
    admin_http_port: Int32 = 0
    custom_info: Str = ""


class GetManagerClusterInfoResponse(Response):
    info_updated_time: Int64 = 0
    self_leader_expiration_time: Int64 = 0
    self_node_id: Str = ""
    leader_node_id: Str = ""
    leader_endpoint: NodeEndpoint | None = None


class LeaderElectorConfigResponse(Response):
    campaign_delay_time_ms: Int64 = 0


class UpdateLeaderElectorConfigRequest(Request):
    campaign_delay_time_ms: Int64 = 0


class UpdateLoggerRequest(Request):
    module_name: Str = ""
    log_level: Str = ""


# ---------------------------------------------------------------- usage (KVCM addition)


class GetInstanceGroupUsageRequest(Request):
    instance_group_name: Str = ""  # empty = every group


class InstanceUsage(WireModel):
    instance_id: Str = ""
    used_bytes: Int64 = 0
    key_count: Int64 = 0


class StorageTypeUsage(WireModel):
    storage_type: StorageTypeField = StorageType.ST_UNSPECIFIED
    used_bytes: Int64 = 0
    capacity: Int64 = 0  # the type's quota_config capacity, 0 = none
    watermark_bytes: Int64 = 0  # where reclaim starts for this type, 0 = never


class StorageUsage(WireModel):
    """KVCM addition: one storage (tier) of a group, with the bytes its instances hold there."""

    storage_name: Str = ""
    storage_type: StorageTypeField = StorageType.ST_UNSPECIFIED
    used_bytes: Int64 = 0


class InstanceGroupUsage(WireModel):
    name: Str = ""
    capacity: Int64 = 0  # quota.capacity, 0 = unlimited
    #: Where reclaim starts: capacity × used_percentage, or trigger_strategy.used_size when lower.
    watermark_bytes: Int64 = 0
    used_bytes: Int64 = 0
    key_count: Int64 = 0
    max_key_count: Int64 = 0  # per instance, 0 = unlimited
    by_storage_type: list[StorageTypeUsage] = Field(default_factory=empty_list)
    #: Every storage candidate and any other storage the instances still hold bytes on, by name.
    by_storage: list[StorageUsage] = Field(default_factory=empty_list)
    #: The group's instances, most used first.
    instances: list[InstanceUsage] = Field(default_factory=empty_list)


class GetInstanceGroupUsageResponse(Response):
    usage: list[InstanceGroupUsage] = Field(default_factory=empty_list)


class CapacityCurve(WireModel):
    """One policy's block hit ratio at each capacity (blocks) of an optimizer sweep."""

    policy: Str = ""
    capacities: list[Int64] = Field(default_factory=empty_list)
    block_hit_ratio: list[float | None] = Field(default_factory=empty_list)  # null: no reads replayed


class CapacityRecommendation(WireModel):
    policy: Str = ""
    capacity: Int64 = 0  # blocks
    block_hit_ratio: float = 0.0


class GetCapacityReportResponse(Response):
    """The latest successful optimizer sweep (KVCM addition); empty when there is none."""

    execution_name: Str = ""
    finished_time_ms: Int64 = 0
    report_uri: Str = ""  # s3://bucket/key of the whole report.json
    target_hit_ratio: float = 0.0
    curves: list[CapacityCurve] = Field(default_factory=empty_list)
    recommendation: CapacityRecommendation | None = None


class HitCurvePoint(WireModel):
    quota_bytes: Int64 = 0
    hit_ratio: float | None = None  # None: no read seen


class HitCurveInstance(WireModel):
    """One instance's part of a group's live curve (upstream's OptimizerInstanceSummary)."""

    instance_id: Str = ""
    hit_ratio: float | None = None  # at its share of the group quota
    reads: Int64 = 0  # reads with a sampled key
    read_blocks: Int64 = 0  # blocks asked, every read
    sample_rate: float = 0.0
    kept_keys: Int64 = 0
    confident: bool = False  # kept_keys reached the group answer's min_kept_keys
    block_bytes: Int64 = 0
    quota_bytes: Int64 = 0  # its share of the group quota now
    # Estimated from the sample (x 1/sample_rate): distinct blocks written or found since
    # the curve began; and, of an LRU cache of capacity_blocks (its share x the watermark),
    # the blocks it held at most and its evictions (upstream's instance summary).
    unique_keys: Int64 = 0
    capacity_blocks: Int64 = 0
    peak_unique_keys: Int64 = 0
    eviction_count: Int64 = 0


class HitCurveRecommendation(WireModel):
    """The tuning job's last recommendation for the group."""

    time_ms: Int64 = 0
    status: Str = ""
    quota_bytes: Int64 = 0
    hit_ratio: float | None = None  # expected group hit ratio once applied
    current_hit_ratio: float | None = None
    instance_quotas: dict[str, int] = Field(default_factory=dict)


class GetGroupHitCurveResponse(Response):
    """A group's live hit-ratio curve (KVCM addition; upstream's TraceQuery hit rates at
    every capacity): empty ``points`` until the ``hit_curves`` schedule has fed some reads."""

    instance_group: Str = ""
    quota_bytes: Int64 = 0
    used_percentage: float = 0.0
    #: False until every instance's sample holds ``min_kept_keys`` keys: the ratios are then
    #: not yet meaningful (and not exported as metrics).
    confident: bool = False
    min_kept_keys: Int64 = 0
    points: list[HitCurvePoint] = Field(default_factory=empty_list)
    hit_ratio_at_quota: float | None = None
    hit_ratio_at_half_quota: float | None = None
    hit_ratio_at_double_quota: float | None = None
    instances: list[HitCurveInstance] = Field(default_factory=empty_list)
    recommendation: HitCurveRecommendation | None = None
    updated_time_ms: Int64 = 0  # when the schedule last fed the curve (0: never)
    through_time_ms: Int64 = 0  # the time of the last read or write it includes


# ---------------------------------------------------------------- debug service


class InjectFaultRequest(Request):
    api_name: Str = ""
    fault_type: FaultTypeField = FaultType.FT_INTERNAL_ERROR
    fault_trigger_strategy: FaultTriggerStrategyField = FaultTriggerStrategy.ALWAYS
    trigger_at_call: Int64 = 0


class RemoveFaultRequest(Request):
    api_name: Str = ""
