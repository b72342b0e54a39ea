"""The block index in Valkey: block records, the Lua scripts that move them, write
sessions and usage counters. The service's other Valkey stores live in ``stores``."""

from .block_index import BlockIndex, InstanceLayout, StartOutcome, Usage
from .layout import Status
from .records import BlockRecord, LocationRecord, Victim

__all__ = ["BlockIndex", "InstanceLayout", "StartOutcome", "Usage", "BlockRecord", "LocationRecord", "Status", "Victim"]
