"""The cyclic garbage collector waits while a container builds what it keeps.

Importing the app creates some 90,000 objects that live as long as the container:
modules, classes, functions, pydantic's field and schema objects; the first AWS client
adds botocore's modules, its session and the service models. Left on, the collector
walks them over and over while they are created (a young-generation pass every 700
allocations, the older generations' passes walking them again), and none of them is
garbage: 4 % of the instructions to a cold start's first answer, more of its time (the
walks are memory-bound; docs/cold-start.md).

So the collector is off meanwhile, and when it resumes, everything allocated so far
moves to the permanent generation (``gc.freeze``: no later pass walks it again; objects
freed by their reference count are freed as ever). Importing this module pauses it, app.py
importing it before the app's own modules, and ``runtime.py`` (which imports nearly all
of them) resumes at the end of its import (``resume``), so the pause never outlasts an
``import app`` that succeeds; ``paused`` does the same around one block (the runtime's
AWS clients).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def _pause() -> bool:
    """Turn the collector off; whether it was on."""
    enabled = gc.isenabled()
    gc.disable()
    return enabled


def _resume(enabled: bool) -> None:
    if enabled:
        gc.freeze()
        gc.enable()


_paused_at_import = _pause()


def resume() -> None:
    """End the pause begun by importing this module: the objects so far frozen, the
    collector on again (if it was on before the pause; a second call does nothing)."""
    global _paused_at_import
    enabled, _paused_at_import = _paused_at_import, False
    _resume(enabled)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off while the block builds objects the container keeps; those frozen
    after it (with the rest so far), when the collector was on."""
    enabled = _pause()
    try:
        yield
    finally:
        _resume(enabled)
