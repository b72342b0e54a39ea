"""The cyclic garbage collector waits while the app's modules are imported.

Importing the app creates some 90,000 objects that live as long as the container:
modules, classes, functions, pydantic's field and schema objects. Left on, the collector
walks them over and over while they are created (a young-generation pass every 700
allocations, the older generations' passes walking them again), and none of them is
garbage: about 7 % of a cold start's CPU before its first answer (docs/cold-start.md).

Importing this module turns the collector off (when it was on); ``resume`` moves
everything allocated so far to the permanent generation (``gc.freeze``: no later pass
walks the app's modules again) and turns it back on. app.py imports this module before
the app's own modules, and ``runtime.py`` (which imports nearly all of them) resumes at
the end of its import, so the pause never outlasts an ``import app`` that succeeds.
"""

from __future__ import annotations

import gc

_paused = gc.isenabled()
gc.disable()


def resume() -> None:
    """End the pause: the objects so far frozen, the collector on again (if it was on
    before the pause; a second call does nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
