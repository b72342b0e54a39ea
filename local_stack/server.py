"""The app's HTTP API, served by Chalice's local server on a thread.

One access line per request: the app writes its JSON access line for every ``/api/``
call, so the server's own line (``BaseHTTPRequestHandler``'s format, on stderr) is kept
only for the other paths (``/metrics``, ``/docs``...).
"""

from __future__ import annotations

import functools
import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .config import REPO_ROOT

LOCAL_STAGE = "local"
POLL_INTERVAL_S = 0.05
#: The listen backlog: connections accepted by the kernel before the server thread takes
#: them. socketserver's 5 reset most of a burst of fresh connections (80 of 96 at once);
#: upstream's suites open 24-thread pools, connectors' tests more. Linux caps it at
#: net.core.somaxconn (4096 by default).
LISTEN_BACKLOG = 1024


def chalice_config(project_dir: Path = REPO_ROOT) -> Any:
    """The ``local`` stage of ``.chalice/config.json`` (environment variables included)."""
    from chalice.config import Config

    config_file = project_dir / ".chalice" / "config.json"
    from_disk = json.loads(config_file.read_text(encoding="utf-8")) if config_file.exists() else {}
    # Config.create would take config_from_disk for a user parameter; the constructor does not.
    return Config(
        chalice_stage=LOCAL_STAGE,
        config_from_disk=from_disk,
        user_provided_params={"app_name": "kvcm", "project_dir": str(project_dir)},
    )


class _QuietForApi(BaseHTTPRequestHandler):
    """Chalice's request handler, mixed in before it: no log line for ``/api/`` paths (the
    app logs those), and no Nagle."""

    # The response goes out in several writes (status, headers, body): with Nagle's
    # algorithm each small one after the first waits for the client's delayed ACK,
    # about 40 ms per call on a keep-alive connection.
    disable_nagle_algorithm = True

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # 405 (a GET on a POST method) is Chalice's own answer: the app never saw it.
        if not self.path.startswith("/api/") or code == 405:
            super().log_request(code, size)


def _quiet_for_api(handler_cls: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler_cls`` with ``_QuietForApi`` mixed in."""
    return type("Handler", (_QuietForApi, handler_cls), {})


class ApiServer:
    """Serves ``app`` on ``host:port`` (0 = free port) until ``stop``."""

    def __init__(self, app: Any, config: Any, host: str, port: int) -> None:
        self.app = app
        self.config = config
        self.host = host
        self._requested_port = port
        self._server: Any | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("API server is not started")
        port: int = self._server.server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Bind and serve; returns the base URL."""
        from chalice.local import LocalChalice, LocalDevServer, create_local_server

        # create_local_server turns the app into a LocalChalice (thread-local current
        # request) by rebasing its class, which cannot be done twice: reuse it on restart.
        if isinstance(self.app, LocalChalice):
            self._server = LocalDevServer(self.app, self.config, self.host, self._requested_port)
        else:
            self._server = create_local_server(self.app, self.config, self.host, self._requested_port)
        # The server listens as it is built, with socketserver's backlog: listen() again.
        self._server.server.socket.listen(LISTEN_BACKLOG)
        handler = self._server.server.RequestHandlerClass  # functools.partial(handler class, app, config)
        self._server.server.RequestHandlerClass = functools.partial(
            _quiet_for_api(handler.func), *handler.args, **handler.keywords
        )
        # Not LocalDevServer.serve_forever: it prints the requested port (wrong for port 0)
        # and polls for shutdown every 0.5 s, which would slow every stop down.
        self._thread = threading.Thread(
            target=self._server.server.serve_forever, args=(POLL_INTERVAL_S,), name="kvcm-local-api", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server.server_close()
            if self._thread is not None:
                self._thread.join()
