"""Who may do what: roles → actions, and scopes → targets (docs/security.md).

Every operation declares one ``Action`` and how to find its ``Target`` in the request;
``check_action`` runs before the body is parsed, ``check_target`` once the target is
known. The dispatcher calls both for every method, so this table is the whole policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..protocol.codes import Role
from ..protocol.errors import ForbiddenError

#: The scope of an account that may act on every instance group and the service itself.
ALL_GROUPS = "*"


class Action(Enum):
    """What a method does, as far as permissions go; ``audited`` actions are mutations."""

    META_READ = ("meta.read", False)  # getInstanceInfo, getCacheMeta, getCacheMetaDetail
    META_WRITE = ("meta.write", False)  # the engine's calls: register, locate, write, remove, trim
    GROUP_READ = ("group.read", False)
    GROUP_WRITE = ("group.write", True)
    SERVICE_READ = ("service.read", False)  # storages, metrics, health, cluster info
    SERVICE_WRITE = ("service.write", True)  # storages, lease, log level
    ACCOUNTS_READ = ("accounts.read", False)  # accounts, API keys, the audit log
    ACCOUNTS_WRITE = ("accounts.write", True)
    DEBUG = ("debug", True)

    def __init__(self, label: str, audited: bool) -> None:
        self.label = label
        self.audited = audited


_READS = {Action.META_READ, Action.GROUP_READ, Action.SERVICE_READ}
ROLE_ACTIONS: dict[Role, frozenset[Action]] = {
    Role.ROLE_ADMIN: frozenset(Action),
    Role.ROLE_OPERATOR: frozenset(
        {
            Action.META_READ,
            Action.META_WRITE,
            Action.GROUP_READ,
            Action.GROUP_WRITE,
            Action.SERVICE_READ,
            Action.SERVICE_WRITE,
        }
    ),
    Role.ROLE_USER: frozenset({Action.META_READ, Action.META_WRITE}),  # the engine role
    Role.ROLE_READ_ONLY: frozenset(_READS),
}


@dataclass(frozen=True)
class Scope:
    """The instance groups an account may act in (``*`` = all, and the service-wide
    methods), optionally narrowed to instance ids starting with one of ``instance_prefixes``."""

    groups: frozenset[str] = frozenset({ALL_GROUPS})
    instance_prefixes: tuple[str, ...] = ()

    @property
    def unrestricted(self) -> bool:
        return ALL_GROUPS in self.groups and not self.instance_prefixes

    def describe(self) -> str:
        groups = ", ".join(sorted(self.groups))
        listed = ", ".join(repr(p) for p in self.instance_prefixes)
        prefixes = f"; instance ids {listed}" if self.instance_prefixes else ""
        return f"groups {groups}{prefixes}"


@dataclass(frozen=True)
class Principal:
    """Who made the call: the account, its role and scope, and the API key used (if any)."""

    user_name: str
    role: Role
    scope: Scope = Scope()
    key_id: str = ""

    @property
    def label(self) -> str:
        """How logs and the audit log name the caller (never a secret)."""
        return f"{self.user_name}/{self.key_id}" if self.key_id else self.user_name


@dataclass(frozen=True)
class Target:
    """What a call acts on: the whole service, or an instance group and/or an instance.
    ``group`` is None when it is not known (an instance that is not registered)."""

    service: bool = False
    group: str | None = None
    instance_id: str | None = None


SERVICE = Target(service=True)


def check_action(principal: Principal, action: Action, api_name: str) -> None:
    """ForbiddenError unless the principal's role allows ``action``."""
    if action not in ROLE_ACTIONS.get(principal.role, frozenset()):
        raise ForbiddenError(
            f"account '{principal.user_name}' ({principal.role.name}) may not call {api_name} ({action.label})"
        )


def check_target(principal: Principal, target: Target, api_name: str) -> None:
    """ForbiddenError unless ``target`` lies inside the principal's scope."""
    scope = principal.scope
    if scope.unrestricted:
        return
    if target.service:
        raise ForbiddenError(
            f"account '{principal.user_name}' is scoped to {scope.describe()}: {api_name} acts on the whole service"
        )
    if target.group is not None and ALL_GROUPS not in scope.groups and target.group not in scope.groups:
        raise ForbiddenError(
            f"account '{principal.user_name}' is scoped to {scope.describe()}: {api_name} "
            f"acts on instance group '{target.group}'"
        )
    if (
        target.instance_id is not None
        and scope.instance_prefixes
        and not target.instance_id.startswith(scope.instance_prefixes)
    ):
        raise ForbiddenError(
            f"account '{principal.user_name}' is scoped to {scope.describe()}: {api_name} "
            f"acts on instance '{target.instance_id}'"
        )
