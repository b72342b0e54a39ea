"""MetaService methods."""
from __future__ import annotations

from .api import api_blueprint
from .dispatch import Operation

OPERATIONS: list[Operation] = []

blueprint = api_blueprint(__name__, OPERATIONS)
