"""MetaService handlers: ``handler(runtime, request) -> response``."""
from __future__ import annotations

import functools

from ..control.validation import require_name
from ..control.views import storage_configs_json
from ..protocol.errors import InvalidArgumentError, UnsupportedError
from .service import CacheService
from ..protocol.models import (
    GetInstanceInfoRequest,
    GetInstanceInfoResponse,
    RegisterInstanceRequest,
    RegisterInstanceResponse,
    RemoveInstanceRequest,
    Response,
    StartWriteCacheRequest,
    StartWriteCacheResponse,
)


def register_instance(runtime, req: RegisterInstanceRequest) -> RegisterInstanceResponse:
    """Register (idempotently) and fix the instance's index layout; returns the group's storages."""
    record = runtime.control.register_instance(req)
    group = runtime.config.group(record.group)
    runtime.contexts.bucket_bits(record, group, registering=True)
    return RegisterInstanceResponse(storage_configs=storage_configs_json(runtime.config.storages_for_group(record.group)),
                                    extra_info=group.extra_info)


def get_instance_info(runtime, req: GetInstanceInfoRequest) -> GetInstanceInfoResponse:
    if not req.instance_id:
        raise InvalidArgumentError("field 'instance_id' is required")
    record = runtime.config.instance(req.instance_id)
    quota_group = runtime.config.group(record.group).global_quota_group_name
    return GetInstanceInfoResponse(instance_group=record.group, instance_info=record.to_instance_info(quota_group))


def _cache_method(name: str):
    """The handler of a method served by ``runtime.cache`` as it is (with its name,
    docstring and annotations, so the response type reads from it)."""
    def handler(runtime, req):
        return getattr(runtime.cache, name)(req)

    return functools.update_wrapper(handler, getattr(CacheService, name))


get_cache_location = _cache_method("get_cache_location")
get_cache_meta = _cache_method("get_cache_meta")


def start_write_cache(runtime, req: StartWriteCacheRequest) -> StartWriteCacheResponse:
    """Where to write the keys nobody holds or writes yet (``min_replica_count`` 0 or 1:
    KVCM writes a key only while no location of it exists, so more replicas are refused)."""
    if req.min_replica_count < 0:
        raise InvalidArgumentError("field 'min_replica_count' must be >= 0")
    if req.min_replica_count > 1:
        raise UnsupportedError(f"field 'min_replica_count': {req.min_replica_count} replicas; KVCM writes a key "
                               f"only while no location of it exists (0 or 1)")
    return runtime.cache.start_write_cache(req)


finish_write_cache = _cache_method("finish_write_cache")
remove_cache = _cache_method("remove_cache")
trim_cache = _cache_method("trim_cache")


def remove_instance(runtime, req: RemoveInstanceRequest) -> Response:
    """removeInstance: the instance is unknown from now on; its blocks (data, then
    metadata) and then its record go in a purge that answers within the call for a small
    instance and continues in the ``instance_purge`` state machine for a large one."""
    runtime.purge.remove_instance(require_name(req.instance_id, "instance_id"), req.instance_group)
    return Response()
