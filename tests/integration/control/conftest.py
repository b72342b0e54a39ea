"""Fixtures of this directory: see ``harness``."""
from .harness import client, control, runtime  # noqa: F401
