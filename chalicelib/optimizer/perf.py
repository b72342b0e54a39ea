"""Performance helpers shared by the replay engine and the curve."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for an allocation-heavy pass.

    A replay or a curve allocates millions of small objects (ints, tuples, lists) and keeps
    large dicts alive, so generation scans keep re-walking them; none of them form
    reference cycles, so reference counting alone frees them. The previous state is
    restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
