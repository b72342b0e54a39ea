"""Valkey stores of the service's own concerns, beside the block index: the background
lease, fault injection, service metrics, the cache GC's scan state and engine-reported
locations.

They share the Valkey plumbing (``chalicelib.valkey``: client, error mapping, Lua loading)
with ``index`` and ``storage``; they build on no data backend (``storage``, whose health
state keeps its own store, ``storage.health_store``). ``control`` talks to DynamoDB only.
"""
