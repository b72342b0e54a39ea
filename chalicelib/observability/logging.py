"""The service logger: Powertools JSON logs with the request's trace_id as correlation id."""

from __future__ import annotations

import logging
import os

from aws_lambda_powertools import Logger

LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}

logger = Logger(service="kvcm", level=os.environ.get("KVCM_LOG_LEVEL", "INFO"))


def set_level(name: str) -> None:
    """Change the log level at run time (``updateLogger``); raises ValueError for an unknown name."""
    level = LEVELS.get(name.strip().upper())
    if level is None:
        raise ValueError(f"unknown log level {name!r} (one of DEBUG, INFO, WARN, ERROR)")
    logger.setLevel(level)


def apply_level(name: str) -> None:
    """Like ``set_level`` for a level stored by another container: a name this version does
    not know is logged, not raised (the caller is serving a request)."""
    try:
        set_level(name)
    except ValueError as exc:
        logger.warning("stored log level ignored: %s", exc)


def set_correlation_id(trace_id: str) -> None:
    """The correlation id of the calling thread's log lines from now on (none for ``""``).
    Per thread (Powertools' thread-safe keys, a context variable): the local server serves
    requests on a thread each, and the logger's shared keys would give one request's lines
    another's id; a Lambda container serves one request at a time either way."""
    logger.thread_safe_append_keys(correlation_id=trace_id or None)


def access_log(api: str, trace_id: str, code: str, latency_us: int, principal: str = "") -> None:
    """One line per API call; ``principal`` names the caller when auth is on (account/key id)."""
    logger.info(
        "access",
        extra={"api": api, "trace_id": trace_id, "code": code, "latency_us": latency_us, "principal": principal},
    )
