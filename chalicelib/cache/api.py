"""MetaService handlers: ``handler(runtime, request) -> response``."""
from __future__ import annotations

import functools

from ..control.validation import invalid, require_name
from ..control.views import storage_configs_json
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError, InvalidArgumentError
from .deletion import InlineDeleter
from .service import CacheService
from ..protocol.models import (
    GetInstanceInfoRequest,
    GetInstanceInfoResponse,
    RegisterInstanceRequest,
    RegisterInstanceResponse,
    RemoveInstanceRequest,
    Response,
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
start_write_cache = _cache_method("start_write_cache")
finish_write_cache = _cache_method("finish_write_cache")
remove_cache = _cache_method("remove_cache")
trim_cache = _cache_method("trim_cache")


def remove_instance(runtime, req: RemoveInstanceRequest) -> Response:
    """removeInstance: delete the instance's cache (data, then metadata), then its record.

    The cache goes first and synchronously: a failure part way leaves a registered
    instance to remove again, never an unregistered instance's blocks.
    """
    record = runtime.control.get_instance(require_name(req.instance_id, "instance_id"))
    if record is None:
        raise InstanceNotFoundError(f"instance '{req.instance_id}' does not exist")
    if req.instance_group and req.instance_group != record.group:
        raise invalid("instance_group", f"is '{req.instance_group}', but instance '{req.instance_id}' belongs to "
                                        f"instance group '{record.group}'")
    ctx = runtime.contexts(req.instance_id)
    deletion = InlineDeleter(runtime.deletion)
    chunk_victims = runtime.cache.remove_matching(ctx, None, deleter=deletion)
    runtime.index.drop_all(ctx.layout)
    runtime.control.remove_instance(req.instance_id, req.instance_group)
    runtime.contexts.forget(req.instance_id)
    logger.info("instance removed", extra={"instance_id": req.instance_id, "blocks": chunk_victims})
    return Response()
