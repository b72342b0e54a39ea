"""Valkey stores of the service's other concerns, beside the block index: the background
lease, fault injection, service metrics, storage health and engine-reported locations.

They share ``stores.valkey`` (client, error mapping, Lua loading) with ``index``. With
``index``, ``control`` and ``storage``, this is the only package that talks to Valkey.
"""
