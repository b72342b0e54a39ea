"""AdminService methods (handlers in ``chalicelib.control.admin``; removeInstance, which also
deletes the instance's cache, in ``chalicelib.cache.api``)."""
from __future__ import annotations

from ..auth import Action as A
from ..auth import targets as t
from ..cache import api
from ..capacity import usage
from ..workflows import sweeps
from ..control import admin
from ..protocol.models import (AddAccountRequest, CreateApiKeyRequest, CreateInstanceGroupRequest,
                               DeleteAccountRequest, InstanceGroupNameRequest, ListApiKeyRequest,
                               ListAuditLogRequest, ListInstanceInfoRequest, ListRequest, RemoveInstanceRequest,
                               RevokeApiKeyRequest, StorageNameRequest, StorageRequest, UpdateInstanceGroupRequest,
                               UpdateLeaderElectorConfigRequest, UpdateLoggerRequest, UpdateStorageRequest)
from ..protocol.models import GetInstanceGroupUsageRequest
from .api import api_blueprint
from .dispatch import Operation

OPERATIONS: list[Operation] = [
    Operation(api_name, request_model, handler, service="admin", action=action, target=target)
    for api_name, request_model, handler, action, target in (
        ("addStorage", StorageRequest, admin.add_storage, A.SERVICE_WRITE, t.service),
        ("enableStorage", StorageNameRequest, admin.enable_storage, A.SERVICE_WRITE, t.service),
        ("disableStorage", StorageNameRequest, admin.disable_storage, A.SERVICE_WRITE, t.service),
        ("removeStorage", StorageNameRequest, admin.remove_storage, A.SERVICE_WRITE, t.service),
        ("updateStorage", UpdateStorageRequest, admin.update_storage, A.SERVICE_WRITE, t.service),
        ("listStorage", ListRequest, admin.list_storage, A.SERVICE_READ, t.service),
        ("createInstanceGroup", CreateInstanceGroupRequest, admin.create_instance_group, A.GROUP_WRITE,
         t.group_body),
        ("updateInstanceGroup", UpdateInstanceGroupRequest, admin.update_instance_group, A.GROUP_WRITE,
         t.group_body),
        ("removeInstanceGroup", InstanceGroupNameRequest, admin.remove_instance_group, A.GROUP_WRITE, t.group_name),
        ("getInstanceGroup", InstanceGroupNameRequest, admin.get_instance_group, A.GROUP_READ, t.group_name),
        ("listInstanceGroup", ListRequest, admin.list_instance_group, A.GROUP_READ, t.service),
        ("removeInstance", RemoveInstanceRequest, api.remove_instance, A.GROUP_WRITE, t.instance),
        ("listInstanceInfo", ListInstanceInfoRequest, admin.list_instance_info, A.GROUP_READ, t.group_listing),
        ("getInstanceGroupUsage", GetInstanceGroupUsageRequest, usage.get_instance_group_usage, A.GROUP_READ, t.group_listing),
        ("getCapacityReport", ListRequest, sweeps.get_capacity_report, A.SERVICE_READ, t.service),
        ("addAccount", AddAccountRequest, admin.add_account, A.ACCOUNTS_WRITE, t.service),
        ("deleteAccount", DeleteAccountRequest, admin.delete_account, A.ACCOUNTS_WRITE, t.service),
        ("listAccount", ListRequest, admin.list_account, A.ACCOUNTS_READ, t.service),
        ("createApiKey", CreateApiKeyRequest, admin.create_api_key, A.ACCOUNTS_WRITE, t.service),
        ("revokeApiKey", RevokeApiKeyRequest, admin.revoke_api_key, A.ACCOUNTS_WRITE, t.service),
        ("listApiKey", ListApiKeyRequest, admin.list_api_key, A.ACCOUNTS_READ, t.service),
        ("listAuditLog", ListAuditLogRequest, admin.list_audit_log, A.ACCOUNTS_READ, t.service),
        ("getMetrics", ListRequest, admin.get_metrics, A.SERVICE_READ, t.service),
        ("checkHealth", ListRequest, admin.check_health, A.SERVICE_READ, t.service),
        ("getManagerClusterInfo", ListRequest, admin.get_manager_cluster_info, A.SERVICE_READ, t.service),
        ("leaderDemote", ListRequest, admin.leader_demote, A.SERVICE_WRITE, t.service),
        ("getLeaderElectorConfig", ListRequest, admin.get_leader_elector_config, A.SERVICE_READ, t.service),
        ("updateLeaderElectorConfig", UpdateLeaderElectorConfigRequest, admin.update_leader_elector_config,
         A.SERVICE_WRITE, t.service),
        ("updateLogger", UpdateLoggerRequest, admin.update_logger, A.SERVICE_WRITE, t.service),
    )
]

blueprint = api_blueprint(__name__, OPERATIONS)
