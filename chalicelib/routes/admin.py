"""AdminService methods (handlers in ``chalicelib.control.admin``; removeInstance, which also
deletes the instance's cache, in ``chalicelib.cache.api``)."""
from __future__ import annotations

from ..cache import api
from ..capacity import usage
from ..control import admin
from ..protocol.models import (AddAccountRequest, CreateInstanceGroupRequest, DeleteAccountRequest,
                               InstanceGroupNameRequest, ListInstanceInfoRequest, ListRequest, RemoveInstanceRequest,
                               StorageNameRequest, StorageRequest, UpdateInstanceGroupRequest,
                               UpdateLeaderElectorConfigRequest, UpdateLoggerRequest, UpdateStorageRequest)
from ..protocol.models import GetInstanceGroupUsageRequest
from .api import api_blueprint
from .dispatch import Operation

OPERATIONS: list[Operation] = [
    Operation(api_name, request_model, handler, service="admin")
    for api_name, request_model, handler in (
        ("addStorage", StorageRequest, admin.add_storage),
        ("enableStorage", StorageNameRequest, admin.enable_storage),
        ("disableStorage", StorageNameRequest, admin.disable_storage),
        ("removeStorage", StorageNameRequest, admin.remove_storage),
        ("updateStorage", UpdateStorageRequest, admin.update_storage),
        ("listStorage", ListRequest, admin.list_storage),
        ("createInstanceGroup", CreateInstanceGroupRequest, admin.create_instance_group),
        ("updateInstanceGroup", UpdateInstanceGroupRequest, admin.update_instance_group),
        ("removeInstanceGroup", InstanceGroupNameRequest, admin.remove_instance_group),
        ("getInstanceGroup", InstanceGroupNameRequest, admin.get_instance_group),
        ("listInstanceGroup", ListRequest, admin.list_instance_group),
        ("removeInstance", RemoveInstanceRequest, api.remove_instance),
        ("listInstanceInfo", ListInstanceInfoRequest, admin.list_instance_info),
        ("getInstanceGroupUsage", GetInstanceGroupUsageRequest, usage.get_instance_group_usage),
        ("addAccount", AddAccountRequest, admin.add_account),
        ("deleteAccount", DeleteAccountRequest, admin.delete_account),
        ("listAccount", ListRequest, admin.list_account),
        ("getMetrics", ListRequest, admin.get_metrics),
        ("checkHealth", ListRequest, admin.check_health),
        ("getManagerClusterInfo", ListRequest, admin.get_manager_cluster_info),
        ("leaderDemote", ListRequest, admin.leader_demote),
        ("getLeaderElectorConfig", ListRequest, admin.get_leader_elector_config),
        ("updateLeaderElectorConfig", UpdateLeaderElectorConfigRequest, admin.update_leader_elector_config),
        ("updateLogger", UpdateLoggerRequest, admin.update_logger),
    )
]

blueprint = api_blueprint(__name__, OPERATIONS)
