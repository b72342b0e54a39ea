"""Handlers behind the state machines' tasks and the scheduled functions, and the
starting of executions. ``app.py`` wires them as Lambda functions and schedules."""
