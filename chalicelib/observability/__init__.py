"""Logging, metrics and the event log."""
