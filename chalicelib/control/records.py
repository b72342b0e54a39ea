"""What the control plane stores, as read back by the data plane.

Records are immutable snapshots shared between threads by ``ConfigCache``: treat them and
the wire models inside them as read-only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel

from ..protocol.block_keys import ROLLING, BlockKeyScheme, scheme_from_config
from ..protocol.codes import QueryType, Role, StorageType
from ..protocol.models import (
    Account,
    InstanceGroup,
    InstanceInfo,
    KeySchemeConfig,
    LocationSpecGroup,
    LocationSpecInfo,
    ModelDeployment,
    RegisterInstanceRequest,
    StorageConfig,
)


def dump_doc(model: Any) -> str:
    """A wire model as the compact JSON kept in the table (absent sub-messages omitted)."""
    return json.dumps(model.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


def load_doc[M: BaseModel](model: type[M], doc: str) -> M:
    """The inverse of ``dump_doc``."""
    return model.model_validate(json.loads(doc))


@dataclass(frozen=True)
class StorageRecord:
    """A storage: its config, whether it may be used now, and its write version."""

    config: StorageConfig
    available: bool
    version: int

    @property
    def name(self) -> str:
        return self.config.global_unique_name

    @property
    def storage_type(self) -> StorageType:
        return self.config.storage_type


def _stored_scheme(config: KeySchemeConfig | None) -> KeySchemeConfig | None:
    """What a record keeps of a (validated) ``key_scheme``: any spelling of the default is
    kept as none, so that each scheme has one identity."""
    if config is None or scheme_from_config(config) is ROLLING:
        return None
    return config.model_copy()


@dataclass(frozen=True)
class InstanceRecord:
    """A registered inference instance.

    ``location_spec_infos`` are in registration order: a spec's byte offset inside a block
    is the sum of the sizes before it. ``incarnation`` is unique per registration, so a
    removal that raced with a re-registration of the same id never deletes the new one.
    ``removing_us`` is when its removal began (0: not being removed): the record stays
    until every block is gone, and the instance is unknown to every call meanwhile.
    """

    instance_id: str
    group: str
    block_size: int
    location_spec_infos: tuple[LocationSpecInfo, ...]
    model_deployment: ModelDeployment
    location_spec_groups: tuple[LocationSpecGroup, ...]
    created_us: int
    incarnation: str
    removing_us: int = 0
    #: The query type getHostCacheState uses when a request leaves it unset.
    default_query_type: QueryType = QueryType.QT_UNSPECIFIED
    #: How its ``token_ids`` become keys (KVCM extension; None: upstream's rolling hash).
    key_scheme: KeySchemeConfig | None = None

    @classmethod
    def from_request(cls, request: RegisterInstanceRequest, created_us: int, incarnation: str) -> InstanceRecord:
        """The record a (validated) registerInstance request asks for."""
        assert request.model_deployment is not None, "validation requires model_deployment"
        return cls(
            instance_id=request.instance_id,
            group=request.instance_group,
            block_size=request.block_size,
            location_spec_infos=tuple(s.model_copy() for s in request.location_spec_infos),
            model_deployment=request.model_deployment.model_copy(),
            location_spec_groups=tuple(g.model_copy() for g in request.location_spec_groups),
            created_us=created_us,
            incarnation=incarnation,
            default_query_type=request.registered_query_type,
            key_scheme=_stored_scheme(request.key_scheme),
        )

    @cached_property
    def block_key_scheme(self) -> BlockKeyScheme:
        """The scheme ``key_scheme`` names (validated at registration)."""
        return scheme_from_config(self.key_scheme)

    @property
    def spec_names(self) -> list[str]:
        return [s.name for s in self.location_spec_infos]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all specs."""
        return sum(s.size for s in self.location_spec_infos)

    def identity(self) -> dict[str, Any]:
        """What must match for a re-registration to be the same instance
        (everything but ``model_deployment.user_data`` and bookkeeping)."""
        return {
            "instance_group": self.group,
            "block_size": self.block_size,
            "location_spec_infos": [s.model_dump() for s in self.location_spec_infos],
            "model_deployment": self.model_deployment.identity(),
            "location_spec_groups": [g.model_dump() for g in self.location_spec_groups],
            "default_query_type": int(self.default_query_type),
            **({"key_scheme": self.key_scheme.model_dump()} if self.key_scheme else {}),
        }

    def to_instance_info(self, quota_group_name: str = "") -> InstanceInfo:
        """The wire ``InstanceInfo`` of this instance."""
        return InstanceInfo(
            quota_group_name=quota_group_name,
            instance_group_name=self.group,
            instance_id=self.instance_id,
            block_size=self.block_size,
            location_spec_infos=[s.model_copy() for s in self.location_spec_infos],
            model_deployment=self.model_deployment.model_copy(),
            location_spec_groups=[g.model_copy() for g in self.location_spec_groups],
            default_query_type=self.default_query_type,
            key_scheme=self.key_scheme.model_copy() if self.key_scheme else None,
        )

    def to_doc(self) -> str:
        info = self.to_instance_info().model_dump(mode="json", exclude_none=True)
        return json.dumps(
            {
                "info": info,
                "created_us": self.created_us,
                "incarnation": self.incarnation,
                **({"removing_us": self.removing_us} if self.removing_us else {}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_doc(cls, doc: str) -> InstanceRecord:
        data = json.loads(doc)
        info = InstanceInfo.model_validate(data["info"])
        return cls(
            instance_id=info.instance_id,
            group=info.instance_group_name,
            block_size=info.block_size,
            location_spec_infos=tuple(info.location_spec_infos),
            model_deployment=info.model_deployment or ModelDeployment(),
            location_spec_groups=tuple(info.location_spec_groups),
            created_us=int(data["created_us"]),
            incarnation=data["incarnation"],
            removing_us=int(data.get("removing_us", 0)),
            default_query_type=info.default_query_type,
            key_scheme=info.key_scheme,
        )


@dataclass(frozen=True)
class AccountRecord:
    """An account: its role, scope (instance groups, ``*`` = all; optional instance-id
    prefixes) and, for admin accounts, the salted hash of the bootstrap password."""

    user_name: str
    role: Role
    groups: tuple[str, ...]
    instance_prefixes: tuple[str, ...]
    password_hash: str = ""

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> AccountRecord:
        return cls(
            user_name=item["sk"],
            role=Role(int(item["role"])),
            groups=tuple(item.get("groups") or ("*",)),
            instance_prefixes=tuple(item.get("prefixes") or ()),
            password_hash=item.get("password", ""),
        )

    def to_account(self) -> Account:
        """The wire ``Account`` (never the hash)."""
        return Account(
            user_name=self.user_name,
            role=self.role,
            instance_groups=list(self.groups),
            instance_id_prefixes=list(self.instance_prefixes),
        )


def candidate_storages(group: InstanceGroup, storages: Mapping[str, StorageRecord]) -> list[tuple[StorageConfig, bool]]:
    """The group's candidate storages that exist, in candidate order, with their availability
    (candidates not added yet are skipped)."""
    return [(storages[name].config, storages[name].available) for name in group.storage_candidates if name in storages]
