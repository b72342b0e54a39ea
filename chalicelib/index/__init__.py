"""The block index in Valkey: records, Lua scripts, sessions, usage, leases.

Only this package (with ``control`` and ``storage``) talks to Valkey.
"""
from .block_index import BlockIndex, InstanceLayout, StartOutcome, Usage
from .records import BlockRecord, LocationRecord, Status, Victim

__all__ = ["BlockIndex", "InstanceLayout", "StartOutcome", "Usage", "BlockRecord", "LocationRecord",
           "Status", "Victim"]
