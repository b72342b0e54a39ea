"""Process environment changes that are undone when the stack stops.

The app reads its configuration (and boto3 its endpoint and credentials) from the
environment, exactly as on Lambda; the stack therefore sets variables rather than
passing objects around, and restores them so an in-process stack leaves no trace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class EnvPatch:
    """Sets variables and remembers what they were; ``restore`` puts them back."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, values: Mapping[str, str]) -> None:
        """Set every variable (first change of a name records its previous value)."""
        for key, value in values.items():
            self._saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def set_default(self, values: Mapping[str, str]) -> None:
        """Set the variables that are not set yet (the user's environment wins)."""
        self.set({key: value for key, value in values.items() if not os.environ.get(key)})

    def restore(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()
