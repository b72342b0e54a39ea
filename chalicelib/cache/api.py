"""MetaService handlers: ``handler(runtime, request) -> response``."""
from __future__ import annotations

from ..control.views import storage_configs_json
from ..protocol.errors import InvalidArgumentError
from ..protocol.models import (
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    GetCacheLocationResponse,
    GetCacheMetaRequest,
    GetCacheMetaResponse,
    GetInstanceInfoRequest,
    GetInstanceInfoResponse,
    RegisterInstanceRequest,
    RegisterInstanceResponse,
    RemoveCacheRequest,
    Response,
    StartWriteCacheRequest,
    StartWriteCacheResponse,
    TrimCacheRequest,
)


def register_instance(runtime, req: RegisterInstanceRequest) -> RegisterInstanceResponse:
    """Register (idempotently) and fix the instance's index layout; returns the group's storages."""
    record = runtime.control.register_instance(req)
    group = runtime.config.group(record.group)
    runtime.contexts.bucket_bits(record, group)
    return RegisterInstanceResponse(storage_configs=storage_configs_json(runtime.config.storages_for_group(record.group)))


def get_instance_info(runtime, req: GetInstanceInfoRequest) -> GetInstanceInfoResponse:
    if not req.instance_id:
        raise InvalidArgumentError("field 'instance_id' is required")
    record = runtime.config.instance(req.instance_id)
    return GetInstanceInfoResponse(instance_group=record.group, instance_info=record.to_instance_info())


def get_cache_location(runtime, req: GetCacheLocationRequest) -> GetCacheLocationResponse:
    return runtime.cache.get_cache_location(req)


def get_cache_meta(runtime, req: GetCacheMetaRequest) -> GetCacheMetaResponse:
    return runtime.cache.get_cache_meta(req)


def start_write_cache(runtime, req: StartWriteCacheRequest) -> StartWriteCacheResponse:
    return runtime.cache.start_write_cache(req)


def finish_write_cache(runtime, req: FinishWriteCacheRequest) -> Response:
    return runtime.cache.finish_write_cache(req)


def remove_cache(runtime, req: RemoveCacheRequest) -> Response:
    return runtime.cache.remove_cache(req)


def trim_cache(runtime, req: TrimCacheRequest) -> Response:
    return runtime.cache.trim_cache(req)


def drop_instance_cache(runtime, instance_id: str) -> None:
    """Delete every block of an instance (data and metadata), for removeInstance."""
    ctx = runtime.contexts(instance_id)
    runtime.cache.remove_matching(ctx, None)
    runtime.index.drop_all(ctx.layout)
    runtime.contexts.forget(instance_id)
