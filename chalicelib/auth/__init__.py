"""Who may call what: credentials (``authorizer``), roles and scopes (``policy``), and
what each method acts on (``targets``). docs/security.md describes the model."""

from .authorizer import Authorizer, FailureLimiter, parse_bearer, principal_of
from .policy import ALL_GROUPS, Action, Principal, Scope, Target, check_action, check_target

__all__ = [
    "ALL_GROUPS",
    "Action",
    "Authorizer",
    "FailureLimiter",
    "Principal",
    "Scope",
    "Target",
    "check_action",
    "check_target",
    "parse_bearer",
    "principal_of",
]
