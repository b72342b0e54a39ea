"""Python SDK of the KVCM API: ``KvcmClient`` with one typed method per API method.

The request and response types are the service's pydantic models
(``chalicelib.protocol.models``); ``methods.py`` is generated from the route tables.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DEFAULT_URL": "client",
    "KvcmClient": "client",
    "AuthError": "errors",
    "ClientError": "errors",
    "KvcmError": "errors",
    "ProtocolError": "errors",
    "TransportError": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy, so that ``python -m kvcm_client.generate`` runs even when methods.py is stale
    # (names a model that no longer exists).
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvcm_client' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
