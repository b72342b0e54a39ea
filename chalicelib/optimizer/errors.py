"""Typed errors of the optimizer: callers catch ``OptimizerError`` for all of them."""

from __future__ import annotations


class OptimizerError(Exception):
    """Base class of every error the optimizer raises on purpose."""


class ConfigError(OptimizerError, ValueError):
    """An invalid setting: unknown policy or mode, negative capacity, bad CLI value..."""


class TraceFormatError(OptimizerError, ValueError):
    """A trace line that cannot be read; ``line`` is 1-based, ``path`` the file (if known)."""

    def __init__(self, message: str, *, line: int | None = None, path: str | None = None) -> None:
        self.message = message
        self.line = line
        self.path = path
        where = ":".join(str(part) for part in (path, line) if part is not None)
        super().__init__(f"{where}: {message}" if where else message)
