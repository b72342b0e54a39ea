"""HTTP routes: one blueprint per service, every method a ``POST /api/<method>``."""
