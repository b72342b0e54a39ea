"""AdminService methods (handlers in ``chalicelib.services.admin``)."""

from __future__ import annotations

from ..auth import Action as A
from ..auth import targets as t
from ..protocol import models as m
from ..services.admin import AccountAdmin, GroupAdmin, ServiceAdmin, StorageAdmin
from ..services.migrations import MigrationAdmin
from ..services.quarantine import CopyQuarantineAdmin
from .api import api_blueprint
from .dispatch import Operation

OPERATIONS: list[Operation] = [
    Operation(api_name, request_model, handler, service="admin", action=action, target=target)
    for api_name, request_model, handler, action, target in (
        ("addStorage", m.StorageRequest, StorageAdmin.add_storage, A.SERVICE_WRITE, t.service),
        ("enableStorage", m.StorageNameRequest, StorageAdmin.enable_storage, A.SERVICE_WRITE, t.service),
        ("disableStorage", m.StorageNameRequest, StorageAdmin.disable_storage, A.SERVICE_WRITE, t.service),
        ("removeStorage", m.StorageNameRequest, StorageAdmin.remove_storage, A.SERVICE_WRITE, t.service),
        ("updateStorage", m.UpdateStorageRequest, StorageAdmin.update_storage, A.SERVICE_WRITE, t.service),
        ("listStorage", m.ListRequest, StorageAdmin.list_storage, A.SERVICE_READ, t.service),
        (
            "createInstanceGroup",
            m.CreateInstanceGroupRequest,
            GroupAdmin.create_instance_group,
            A.GROUP_WRITE,
            t.group_body,
        ),
        (
            "updateInstanceGroup",
            m.UpdateInstanceGroupRequest,
            GroupAdmin.update_instance_group,
            A.GROUP_WRITE,
            t.group_body,
        ),
        (
            "removeInstanceGroup",
            m.InstanceGroupNameRequest,
            GroupAdmin.remove_instance_group,
            A.GROUP_WRITE,
            t.group_name,
        ),
        ("getInstanceGroup", m.InstanceGroupNameRequest, GroupAdmin.get_instance_group, A.GROUP_READ, t.group_name),
        ("listInstanceGroup", m.ListRequest, GroupAdmin.list_instance_group, A.GROUP_READ, t.service),
        ("removeInstance", m.RemoveInstanceRequest, GroupAdmin.remove_instance, A.GROUP_WRITE, t.instance),
        ("migrateCache", m.MigrateCacheRequest, MigrationAdmin.migrate_cache, A.GROUP_WRITE, t.instance),
        (
            "listAsyncCopyQuarantine",
            m.ListAsyncCopyQuarantineRequest,
            CopyQuarantineAdmin.list_async_copy_quarantine,
            A.GROUP_READ,
            t.group_listing,
        ),
        (
            "breakGlassReleaseAsyncCopy",
            m.BreakGlassReleaseAsyncCopyRequest,
            CopyQuarantineAdmin.break_glass_release_async_copy,
            A.SERVICE_WRITE,
            t.service,
        ),
        ("listInstanceInfo", m.ListInstanceInfoRequest, GroupAdmin.list_instance_info, A.GROUP_READ, t.group_listing),
        (
            "getInstanceGroupUsage",
            m.GetInstanceGroupUsageRequest,
            GroupAdmin.get_instance_group_usage,
            A.GROUP_READ,
            t.group_listing,
        ),
        ("getCapacityReport", m.ListRequest, GroupAdmin.get_capacity_report, A.SERVICE_READ, t.service),
        ("getGroupHitCurve", m.InstanceGroupNameRequest, GroupAdmin.get_group_hit_curve, A.GROUP_READ, t.group_name),
        (
            "resetGroupHitCurve",
            m.InstanceGroupNameRequest,
            GroupAdmin.reset_group_hit_curve,
            A.GROUP_WRITE,
            t.group_name,
        ),
        ("addAccount", m.AddAccountRequest, AccountAdmin.add_account, A.ACCOUNTS_WRITE, t.service),
        ("deleteAccount", m.DeleteAccountRequest, AccountAdmin.delete_account, A.ACCOUNTS_WRITE, t.service),
        ("listAccount", m.ListRequest, AccountAdmin.list_account, A.ACCOUNTS_READ, t.service),
        ("createApiKey", m.CreateApiKeyRequest, AccountAdmin.create_api_key, A.ACCOUNTS_WRITE, t.service),
        ("revokeApiKey", m.RevokeApiKeyRequest, AccountAdmin.revoke_api_key, A.ACCOUNTS_WRITE, t.service),
        ("listApiKey", m.ListApiKeyRequest, AccountAdmin.list_api_key, A.ACCOUNTS_READ, t.service),
        ("listAuditLog", m.ListAuditLogRequest, AccountAdmin.list_audit_log, A.ACCOUNTS_READ, t.service),
        ("getMetrics", m.ListRequest, ServiceAdmin.get_metrics, A.SERVICE_READ, t.service),
        ("checkHealth", m.ListRequest, ServiceAdmin.check_health, A.SERVICE_READ, t.service),
        ("getManagerClusterInfo", m.ListRequest, ServiceAdmin.get_manager_cluster_info, A.SERVICE_READ, t.service),
        ("leaderDemote", m.ListRequest, ServiceAdmin.leader_demote, A.SERVICE_WRITE, t.service),
        ("getLeaderElectorConfig", m.ListRequest, ServiceAdmin.get_leader_elector_config, A.SERVICE_READ, t.service),
        (
            "updateLeaderElectorConfig",
            m.UpdateLeaderElectorConfigRequest,
            ServiceAdmin.update_leader_elector_config,
            A.SERVICE_WRITE,
            t.service,
        ),
        ("updateLogger", m.UpdateLoggerRequest, ServiceAdmin.update_logger, A.SERVICE_WRITE, t.service),
    )
]

blueprint = api_blueprint(__name__, OPERATIONS)
