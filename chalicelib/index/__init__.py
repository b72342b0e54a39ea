"""The block index in Valkey: block records, the Lua scripts that move them, write
sessions and usage counters. The service's other Valkey stores live in ``stores``.

A stack: ``types`` (values), ``tag_index`` (one hash tag), ``sharding`` (several, over
``ShardPrimitives``), ``block_index`` (``BlockIndex``, which picks per layout)."""

from .block_index import BlockIndex
from .layout import Status
from .records import BlockRecord, LocationRecord, Victim
from .types import InstanceLayout, StartOutcome, Usage

__all__ = ["BlockIndex", "InstanceLayout", "StartOutcome", "Usage", "BlockRecord", "LocationRecord", "Status", "Victim"]
