"""One sentence per API method, what it does for its caller: the OpenAPI document's
``summary`` of ``POST /api/<method>`` (the handlers' docstrings, written for this code's
readers, become the longer ``description``). A method without one fails the document."""

from __future__ import annotations

SUMMARIES = {
    # MetaService
    "registerInstance": "Register an engine instance in its group (idempotent) and get the group's storages.",
    "getInstanceInfo": "An instance's registration: group, block size, location specs and model deployment.",
    "getCacheLocation": "Which of the keys are cached, by prefix, batch or sliding-window match, with their URIs.",
    "getCacheMeta": "Per key, its first location and status, and every copy of it (a debugging view of the index).",
    "getCacheMetaDetail": "Per key, its raw metadata: parent, record fields and every copy with its status.",
    "startWriteCache": "Begin a two-phase write: where to write the keys nobody has (the others are masked out).",
    "finishWriteCache": "End a two-phase write: the written blocks start serving, the others are dropped.",
    "removeCache": "Stop serving the keys at once; their data is deleted by a workflow.",
    "trimCache": "Remove an instance's blocks by strategy: all, all metadata, or older than a time.",
    "getCacheLocationLen": "How many of the keys are cached by the match type: a length, no locations.",
    "getClusterInfo": "This node's id, the leader's id and the leader's endpoint (upstream's leader discovery).",
    "reportEvent": "Apply the cache events an engine reports for an event-report storage (add, delete, heartbeat...).",
    "getHostCacheState": "Per host, the leading blocks of a prompt it holds (cache-aware routing).",
    "getCacheLocationsByBackend": "Per key, one location per selected storage type.",
    # AdminService
    "addStorage": "Add a data storage (NFS, 3FS, Mooncake, memory pool, S3, event report); it starts available.",
    "enableStorage": "Make a storage available for new writes again.",
    "disableStorage": "Stop new writes to a storage; what it holds is still read.",
    "removeStorage": "Remove a storage that no instance group lists.",
    "updateStorage": "Replace a storage's configuration (changing its type needs force_update).",
    "listStorage": "Every storage with its configuration and availability.",
    "createInstanceGroup": "Create an instance group: its candidate storages, quota and reclaim strategy.",
    "updateInstanceGroup": "Replace an instance group's configuration if it is still at current_version.",
    "removeInstanceGroup": "Remove an instance group that has no instances, and its usage counters.",
    "getInstanceGroup": "One instance group's configuration, defaults filled in.",
    "listInstanceGroup": "Every instance group's configuration.",
    "removeInstance": "Unregister an instance: unknown from now on, its blocks deleted by a workflow.",
    "migrateCache": "Copy blocks of an instance from one storage of its group to another (tiered storage).",
    "listInstanceInfo": "The registered instances of one group, or of all groups.",
    "getInstanceGroupUsage": "How full each group is: quota, watermark, bytes and keys, by storage type and instance.",
    "getCapacityReport": "The latest optimizer sweep's hit-ratio curves and its capacity recommendation.",
    "getGroupHitCurve": "A group's live hit-ratio curve against its quota, from its own sampled traffic, and its age.",
    "addAccount": "Add an account with a role (and the groups it may act on).",
    "deleteAccount": "Delete an account and its API keys.",
    "listAccount": "Every account's name, role and scope (never a password).",
    "createApiKey": "Create an API key for an account; the key is in this response only.",
    "revokeApiKey": "Revoke an API key at once.",
    "listApiKey": "API key ids, owners and lifetimes (never a key or its hash).",
    "listAuditLog": "The audit records of admin calls within a time range.",
    "getMetrics": "The service's metrics: counters as int_value, means and gauges as float_value.",
    "checkHealth": "Whether the index (Valkey) and the control table answer, and the lease holder.",
    "getManagerClusterInfo": "The manager's nodes and which one holds the leader lease.",
    "leaderDemote": "Release the leader lease if this node holds it (SERVER_NOT_LEADER otherwise).",
    "getLeaderElectorConfig": "The leader election's campaign delay (campaign_delay_time_ms).",
    "updateLeaderElectorConfig": "Change the leader election's campaign delay.",
    "updateLogger": "Set the service's log level, here at once and in every other container soon after.",
    # DebugService
    "injectFault": "Make a method fail as asked (always, or at a given call), for fault-injection tests.",
    "removeFault": "Remove one injected fault.",
    "clearFaults": "Remove every injected fault.",
}
