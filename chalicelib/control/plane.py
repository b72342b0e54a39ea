"""The control plane: storages, instance groups, instances and accounts in DynamoDB.

Invariants are kept by conditions inside the write transactions, never by a read followed
by a blind write, so concurrent admin calls (from any number of Lambda containers) cannot
break them:

- a group's ``instance_count`` equals its registered instances; registration checks
  ``max_instance_count`` in the same transaction that increments it;
- a group is removed only at ``instance_count = 0``;
- a storage is removed only while no group lists it (``STORAGE_REF`` sets, maintained in
  the transactions that create, update and remove groups);
- group updates are optimistic on ``version``.

Reads are strongly consistent. Unreachable DynamoDB → ServiceNotReadyError.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..clock import Clock, now_us
from ..protocol.codes import Role
from ..protocol.errors import CapacityExceededError, DuplicateEntityError, InstanceNotFoundError, KvcmError
from ..protocol.models import Account, InstanceGroup, RegisterInstanceRequest, StorageConfig
from ..protocol.validation import invalid, require_name, validate_storage_config
from .api_keys import ApiKeyRecord, digest, new_api_key
from .errors import EntityInUseError, InstanceRemovingError, UnknownEntityError, VersionConflictError
from .groups import normalize_group
from .passwords import dummy_hash, hash_password, verify_password
from .records import AccountRecord, InstanceRecord, StorageRecord, candidate_storages, dump_doc, load_doc
from .table import Cancelled, Change, ControlTable, Op, check, delete, put, update
from .validation import validate_account, validate_register_request

STORAGE, STORAGE_REF, GROUP, INSTANCE, ACCOUNT = "STORAGE", "STORAGE_REF", "GROUP", "INSTANCE", "ACCOUNT"
API_KEY = "API_KEY"
#: Enough to rotate keys with overlap; keeps deleteAccount within one transaction.
MAX_API_KEYS_PER_ACCOUNT = 10
#: An account's scope covering every instance group (auth.policy.ALL_GROUPS).
ALL_GROUPS = "*"
SETTING = "SETTING"

# Attribute names go through placeholders: several (e.g. GROUP, ROLE) are DynamoDB reserved words.
_N = {
    "#pk": "pk",
    "#doc": "doc",
    "#ver": "version",
    "#avail": "available",
    "#count": "instance_count",
    "#max": "max_instance_count",
    "#groups": "groups",
    "#inc": "incarnation",
    "#at": "updated_us",
}
_EXISTS = "attribute_exists(#pk)"
_ABSENT = "attribute_not_exists(#pk)"
# Bounded retries when a concurrent writer changed what a conditional write was based on.
_OPTIMISTIC_ATTEMPTS = 4


def _names(expression: str) -> dict[str, str]:
    """The placeholders ``expression`` uses (DynamoDB rejects unused ones)."""
    return {k: _N[k] for k in set(re.findall(r"#\w+", expression))}


def _op(factory: Callable[..., Op], pk: str, sk: str, *expressions: str, values: dict[str, Any] | None = None) -> Op:
    """``factory(pk, sk, *expressions)`` (update and/or condition expressions) with the
    attribute-name placeholders they use."""
    return factory(pk, sk, *expressions, names=_names(" ".join(expressions)), values=values)


def _create(pk: str, sk: str, attrs: dict[str, Any]) -> Op:
    """Put an item that must not exist yet."""
    return put(pk, sk, attrs, _ABSENT, names=_names(_ABSENT))


def _ref_op(storage: str, group: str, action: str) -> Op:
    """Add (ADD) or drop (DELETE) ``group`` in the set of groups that list ``storage``."""
    return _op(update, STORAGE_REF, storage, f"{action} #groups :g", values={":g": {group}})


def _count_op(sign: str, group: str, condition: str) -> Op:
    """Move a group's ``instance_count`` by one under ``condition``; caches hold no counter,
    so the write invalidates nothing cached for the group."""
    op = _op(update, GROUP, group, f"SET #count = #count {sign} :one", condition, values={":one": 1, ":zero": 0})
    return replace(op, cached=False)


def _storage_exists(storage: str) -> Op:
    """Require storage ``storage`` in the same transaction (removeStorage deletes it in one
    that requires no group to list it: of the two, one is refused)."""
    return _op(check, STORAGE, storage, _EXISTS)


class ControlPlane:
    """All control-plane reads and writes. Thread-safe; one per container."""

    def __init__(self, dynamodb: Callable[[], Any], table_name: str, clock: Clock) -> None:
        self.table = ControlTable(dynamodb, table_name, clock)
        self.clock = clock
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every successful write made through this object
        (the container's ConfigCache uses it to see its own writes at once)."""
        self._listeners.append(callback)

    def _write(self, ops: list[Op]) -> None:
        self.table.write(ops)
        for callback in list(self._listeners):
            callback()

    # ---------------------------------------------------------------- health

    def epoch(self) -> int:
        """The config epoch; changes with every write."""
        return self.table.epoch()

    def changes_since(self, since_us: int) -> list[Change]:
        """What the writes since ``since_us`` changed (``ControlTable.changes_since``)."""
        return self.table.changes_since(since_us)

    def ping(self) -> None:
        """Raise ServiceNotReadyError unless the table answers."""
        self.table.epoch()

    # ---------------------------------------------------------------- storages

    def add_storage(self, config: StorageConfig) -> StorageRecord:
        """Add a storage, available. A name that exists → DuplicateEntityError, nothing changed."""
        config = validate_storage_config(config)
        name = config.global_unique_name
        attrs = {"doc": dump_doc(config), "available": True, "version": 1, "updated_us": now_us(self.clock)}
        try:
            self._write([_create(STORAGE, name, attrs)])
        except Cancelled:
            raise DuplicateEntityError(f"storage '{name}' already exists") from None
        return StorageRecord(config, True, 1)

    def update_storage(self, config: StorageConfig, force: bool = False) -> None:
        """Replace a storage's config atomically (availability kept). Changing the storage
        type needs ``force``: locations already stored there were written for the old type."""
        config = validate_storage_config(config)
        name = config.global_unique_name
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            current = self.get_storage(name)
            if not force and current.storage_type != config.storage_type:
                raise invalid(
                    "storage",
                    f"would change storage '{name}' from {current.storage_type.name} to "
                    f"{config.storage_type.name}; set force_update to replace its type",
                )
            op = _op(
                update,
                STORAGE,
                name,
                "SET #doc = :doc, #ver = #ver + :one, #at = :now",
                "#ver = :ver",
                values={":doc": dump_doc(config), ":one": 1, ":now": now_us(self.clock), ":ver": current.version},
            )
            try:
                self._write([op])
                return
            except Cancelled:
                continue  # changed or removed since we read it: decide again on what is there now
        raise VersionConflictError(f"storage '{name}' kept changing during the update, retry")

    def set_storage_available(self, name: str, available: bool) -> None:
        """enableStorage / disableStorage."""
        require_name(name, "storage_unique_name")
        op = _op(
            update,
            STORAGE,
            name,
            "SET #avail = :a, #ver = #ver + :one, #at = :now",
            _EXISTS,
            values={":a": available, ":one": 1, ":now": now_us(self.clock)},
        )
        try:
            self._write([op])
        except Cancelled:
            raise UnknownEntityError(f"storage '{name}' does not exist") from None

    def remove_storage(self, name: str) -> None:
        """Remove a storage; refused while an instance group lists it as a candidate."""
        require_name(name, "storage_unique_name")
        ops = [_op(delete, STORAGE, name, _EXISTS), _op(check, STORAGE_REF, name, "attribute_not_exists(#groups)")]
        try:
            self._write(ops)
        except Cancelled as cancelled:
            if cancelled.failed(0):
                raise UnknownEntityError(f"storage '{name}' does not exist") from None
            ref = self.table.get(STORAGE_REF, name) or {}
            groups = ", ".join(f"'{g}'" for g in sorted(ref.get("groups", ())))
            raise EntityInUseError(f"storage '{name}' is a storage candidate of instance group(s) {groups}") from None

    def get_storage(self, name: str) -> StorageRecord:
        """One storage, or UnknownEntityError."""
        item = self.table.get(STORAGE, name)
        if item is None:
            raise UnknownEntityError(f"storage '{name}' does not exist")
        return self._storage(item)

    def list_storages(self) -> list[StorageRecord]:
        """Every storage, by name."""
        return [self._storage(item) for item in self.table.query(STORAGE)]

    @staticmethod
    def _storage(item: dict[str, Any]) -> StorageRecord:
        return StorageRecord(load_doc(StorageConfig, item["doc"]), bool(item["available"]), int(item["version"]))

    # ---------------------------------------------------------------- instance groups

    def create_group(self, group: InstanceGroup | None) -> InstanceGroup:
        """Create a group (defaults filled in; version 1 unless the request sets one).
        An existing name → DuplicateEntityError."""
        g = normalize_group(group)
        g.version = g.version or 1
        attrs = {
            "doc": dump_doc(g),
            "version": g.version,
            "instance_count": 0,
            "max_instance_count": g.max_instance_count,
        }
        ops = [_create(GROUP, g.name, attrs)]
        ops += [_ref_op(storage, g.name, "ADD") for storage in g.storage_candidates]
        checks = len(ops)
        ops += [_storage_exists(storage) for storage in g.storage_candidates]
        try:
            self._write(ops)
        except Cancelled as cancelled:
            if cancelled.failed(0):
                raise DuplicateEntityError(f"instance group '{g.name}' already exists") from None
            raise self._missing_storage(g, cancelled, checks) from None
        return g

    def update_group(self, group: InstanceGroup | None, current_version: int) -> InstanceGroup:
        """Replace a group if ``current_version`` is the stored version; the new version is
        ``group.version``, or stored + 1 when that is 0, and must be greater than the stored
        one. Of concurrent updates from the same version exactly one succeeds; the others
        get VersionConflictError."""
        g = normalize_group(group)
        item = self._group_item(g.name)
        stored = int(item["version"])
        if current_version != stored:
            raise VersionConflictError(
                f"instance group '{g.name}' is at version {stored}, not current_version {current_version}"
            )
        g.version = g.version or stored + 1
        if g.version <= stored:
            raise VersionConflictError(
                f"field 'instance_group.version' must be greater than the stored version {stored}, got {g.version}"
            )
        old = set(load_doc(InstanceGroup, item["doc"]).storage_candidates)
        new = set(g.storage_candidates)
        ops = [
            _op(
                update,
                GROUP,
                g.name,
                "SET #doc = :doc, #ver = :new, #max = :max",
                "#ver = :cur",
                values={":doc": dump_doc(g), ":new": g.version, ":max": g.max_instance_count, ":cur": stored},
            )
        ]
        ops += [_ref_op(s, g.name, "ADD") for s in sorted(new - old)]
        ops += [_ref_op(s, g.name, "DELETE") for s in sorted(old - new)]
        checks = len(ops)
        ops += [_storage_exists(storage) for storage in g.storage_candidates]
        try:
            self._write(ops)
        except Cancelled as cancelled:
            if not cancelled.failed(0):
                raise self._missing_storage(g, cancelled, checks) from None
            now = int(self._group_item(g.name)["version"])
            raise VersionConflictError(
                f"instance group '{g.name}' was updated concurrently: it is at "
                f"version {now}, not current_version {current_version}"
            ) from None
        return g

    def remove_group(self, name: str) -> None:
        """Remove a group; refused (EntityInUseError) while instances belong to it."""
        require_name(name, "name")
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            item = self._group_item(name)
            count = int(item["instance_count"])
            if count:
                raise EntityInUseError(f"instance group '{name}' still has {count} registered instance(s)")
            candidates = load_doc(InstanceGroup, item["doc"]).storage_candidates
            ops = [
                _op(
                    delete,
                    GROUP,
                    name,
                    "#ver = :ver AND #count = :zero",
                    values={":ver": int(item["version"]), ":zero": 0},
                )
            ]
            ops += [_ref_op(s, name, "DELETE") for s in candidates]
            try:
                self._write(ops)
                return
            except Cancelled:
                continue  # an instance registered or the group changed meanwhile: re-read and decide again
        raise VersionConflictError(f"instance group '{name}' kept changing during removal, retry")

    def _missing_storage(self, group: InstanceGroup, cancelled: Cancelled, checks: int) -> KvcmError:
        """The error of a group write refused by its storage checks (``ops[checks:]``, one per
        candidate): the first candidate that is not a storage, named by its field."""
        missing = [i for i, _ in enumerate(group.storage_candidates) if cancelled.failed(checks + i)]
        if not missing:  # the transaction did not say which: look
            missing = [i for i, name in enumerate(group.storage_candidates) if self.table.get(STORAGE, name) is None]
        if not missing:
            return VersionConflictError(f"instance group '{group.name}': its storages changed during the write, retry")
        i = missing[0]
        return invalid(
            f"instance_group.storage_candidates[{i}]",
            f"names storage '{group.storage_candidates[i]}', which does not exist (addStorage first)",
        )

    def get_group(self, name: str) -> InstanceGroup:
        """One group, or UnknownEntityError."""
        return load_doc(InstanceGroup, self._group_item(name)["doc"])

    def list_groups(self) -> list[InstanceGroup]:
        """Every group, by name."""
        return [load_doc(InstanceGroup, item["doc"]) for item in self.table.query(GROUP)]

    def storages_for_group(self, name: str) -> list[tuple[StorageConfig, bool]]:
        """The group's candidate storages that exist, in candidate order, with availability."""
        group = self.get_group(name)
        return candidate_storages(group, {s.name: s for s in self.list_storages()})

    def _group_item(self, name: str) -> dict[str, Any]:
        item = self.table.get(GROUP, name)
        if item is None:
            raise UnknownEntityError(f"instance group '{name}' does not exist")
        return item

    # ---------------------------------------------------------------- instances

    def register_instance(self, request: RegisterInstanceRequest) -> InstanceRecord:
        """Register an instance (MetaService.registerInstance).

        The same id with the same config (``model_deployment.user_data`` aside) returns the
        stored record; a different config → DuplicateEntityError; unknown group →
        UnknownEntityError; group at ``max_instance_count`` → CapacityExceededError; an
        instance still being removed → InstanceRemovingError.
        """
        validate_register_request(request)
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            existing = self.get_instance(request.instance_id)
            if existing is not None and existing.removing_us:
                raise InstanceRemovingError(
                    f"instance '{request.instance_id}' is being removed: register it "
                    f"again once its removal has finished"
                )
            if existing is not None:
                return self._same_instance(existing, request)
            record = InstanceRecord.from_request(request, now_us(self.clock), uuid.uuid4().hex)
            attrs = {"doc": record.to_doc(), "group": record.group, "incarnation": record.incarnation}
            ops = [
                _create(INSTANCE, record.instance_id, attrs),
                _count_op("+", record.group, f"{_EXISTS} AND (#max = :zero OR #count < #max)"),
            ]
            try:
                self._write(ops)
                return record
            except Cancelled as cancelled:
                if cancelled.failed(0):
                    continue  # registered concurrently: compare with what won
                item = self._group_item(record.group)
                raise CapacityExceededError(
                    f"instance group '{record.group}' already has its maximum of "
                    f"{int(item['max_instance_count'])} instance(s)"
                ) from None
        raise VersionConflictError(f"instance '{request.instance_id}' kept changing during registration, retry")

    @staticmethod
    def _same_instance(existing: InstanceRecord, request: RegisterInstanceRequest) -> InstanceRecord:
        wanted = InstanceRecord.from_request(request, existing.created_us, existing.incarnation).identity()
        stored = existing.identity()
        if wanted != stored:
            differing = sorted(k for k, v in wanted.items() if stored[k] != v)
            raise DuplicateEntityError(
                f"instance '{existing.instance_id}' is already registered with a different {', '.join(differing)}"
            )
        return existing

    def get_instance(self, instance_id: str) -> InstanceRecord | None:
        """One instance, or None."""
        item = self.table.get(INSTANCE, instance_id)
        return InstanceRecord.from_doc(item["doc"]) if item else None

    def begin_instance_removal(self, instance_id: str, group: str = "") -> InstanceRecord:
        """Mark an instance as being removed (from now on it is unknown to every call, and
        its id cannot be registered again until ``remove_instance``); returns the marked
        record, as it is when already marked. When ``group`` is given it must be the
        instance's group. Unknown id → InstanceNotFoundError."""
        require_name(instance_id, "instance_id")
        for _ in range(_OPTIMISTIC_ATTEMPTS):
            record = self.get_instance(instance_id)
            if record is None:
                raise InstanceNotFoundError(f"instance '{instance_id}' does not exist")
            if group and group != record.group:
                raise invalid(
                    "instance_group",
                    f"is '{group}', but instance '{instance_id}' belongs to instance group '{record.group}'",
                )
            if record.removing_us:
                return record
            marked = replace(record, removing_us=now_us(self.clock))
            try:
                self._write(
                    [
                        _op(
                            update,
                            INSTANCE,
                            instance_id,
                            "SET #doc = :doc",
                            "#inc = :inc",
                            values={":doc": marked.to_doc(), ":inc": record.incarnation},
                        )
                    ]
                )
                return marked
            except Cancelled:
                continue  # removed and registered again meanwhile: look again
        raise VersionConflictError(f"instance '{instance_id}' kept changing during removal, retry")

    def remove_instance(self, instance_id: str, incarnation: str) -> InstanceRecord:
        """Delete the record of ``incarnation`` of an instance (the end of its removal) and
        release its place in the group. Another incarnation or none → InstanceNotFoundError."""
        record = self.get_instance(instance_id)
        if record is None or record.incarnation != incarnation:
            raise InstanceNotFoundError(f"instance '{instance_id}' does not exist")
        ops = [
            _op(delete, INSTANCE, instance_id, "#inc = :inc", values={":inc": record.incarnation}),
            _count_op("-", record.group, f"{_EXISTS} AND #count > :zero"),
        ]
        try:
            self._write(ops)
        except Cancelled as cancelled:
            if cancelled.failed(0):
                raise InstanceNotFoundError(f"instance '{instance_id}' does not exist") from None
            raise KvcmError(f"instance group '{record.group}' has no count for instance '{instance_id}'") from None
        return record

    def list_instances(self, group: str = "", removing: bool = False) -> list[InstanceRecord]:
        """The instances of ``group`` (all when empty), by id; those being removed only
        with ``removing`` (then only those)."""
        records = [
            InstanceRecord.from_doc(item["doc"])
            for item in self.table.query(INSTANCE)
            if not group or item["group"] == group
        ]
        return [r for r in records if bool(r.removing_us) == removing]

    # ---------------------------------------------------------------- service settings

    def set_log_level(self, level: str) -> None:
        """The log level every container applies (``updateLogger``); ``level`` is a name
        ``observability.logging`` accepts."""
        self._write([put(SETTING, "log_level", {"value": level})])

    def log_level(self) -> str | None:
        """The level set by ``set_log_level``, or None."""
        item = self.table.get(SETTING, "log_level")
        return item["value"] if item else None

    # ---------------------------------------------------------------- accounts and API keys

    def add_account(
        self,
        user_name: str,
        password: str,
        role: Role,
        groups: Sequence[str] = (),
        instance_prefixes: Sequence[str] = (),
    ) -> None:
        """Add an account with its scope (no groups = every group). Only admin accounts keep
        a password (a salted hash of it), for bootstrapping; the others use API keys."""
        validate_account(user_name, password, role, groups, instance_prefixes)
        attrs: dict[str, Any] = {
            "role": int(role),
            "created_us": now_us(self.clock),
            "groups": list(groups) or [ALL_GROUPS],
            "prefixes": list(instance_prefixes),
        }
        if role == Role.ROLE_ADMIN:
            attrs["password"] = hash_password(password)
        try:
            self._write([_create(ACCOUNT, user_name, attrs)])
        except Cancelled:
            raise DuplicateEntityError(f"account '{user_name}' already exists") from None

    def delete_account(self, user_name: str) -> None:
        """Delete an account and its API keys; unknown → UnknownEntityError."""
        require_name(user_name, "user_name")
        keys = [k.key_id for k in self.list_api_keys(user_name)]
        try:
            self._write([_op(delete, ACCOUNT, user_name, _EXISTS)] + [delete(API_KEY, k) for k in keys])
        except Cancelled:
            raise UnknownEntityError(f"account '{user_name}' does not exist") from None

    def list_accounts(self) -> list[Account]:
        """Every account's name, role and scope (never a hash)."""
        return [AccountRecord.from_item(item).to_account() for item in self.table.query(ACCOUNT)]

    def get_account(self, user_name: str) -> AccountRecord | None:
        """One account, or None."""
        item = self.table.get(ACCOUNT, user_name) if user_name else None
        return AccountRecord.from_item(item) if item else None

    def verify_account(self, user_name: str, password: str) -> AccountRecord | None:
        """The account if it has a password and ``password`` matches, else None (slow on
        purpose: scrypt; a missing account or password costs the same)."""
        account = self.get_account(user_name)
        encoded = account.password_hash if account and account.password_hash else dummy_hash()
        if verify_password(password, encoded) and account is not None and account.password_hash:
            return account
        return None

    def create_api_key(self, user_name: str, ttl_s: int) -> tuple[str, ApiKeyRecord]:
        """A new key of an existing account, valid ``ttl_s`` seconds: (the key, shown only
        now; its record). Unknown account → UnknownEntityError."""
        require_name(user_name, "user_name")
        if len(self.list_api_keys(user_name)) >= MAX_API_KEYS_PER_ACCOUNT:
            raise CapacityExceededError(
                f"account '{user_name}' already has {MAX_API_KEYS_PER_ACCOUNT} API keys: revoke one first"
            )
        key_id, api_key = new_api_key()
        created = now_us(self.clock)
        record = ApiKeyRecord(key_id, user_name, digest(api_key), created, created + ttl_s * 1_000_000)
        attrs = {
            "user_name": user_name,
            "digest": record.digest,
            "created_us": created,
            "expires_us": record.expires_us,
        }
        try:
            self._write([_create(API_KEY, key_id, attrs), _op(check, ACCOUNT, user_name, _EXISTS)])
        except Cancelled:
            raise UnknownEntityError(f"account '{user_name}' does not exist") from None
        return api_key, record

    def revoke_api_key(self, key_id: str) -> None:
        """Delete a key; it stops working in every container within the config refresh."""
        require_name(key_id, "key_id")
        try:
            self._write([_op(delete, API_KEY, key_id, _EXISTS)])
        except Cancelled:
            raise UnknownEntityError(f"API key '{key_id}' does not exist") from None

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """One key's record, or None."""
        item = self.table.get(API_KEY, key_id)
        return self._api_key(item) if item else None

    def list_api_keys(self, user_name: str = "") -> list[ApiKeyRecord]:
        """The keys of ``user_name`` (every account's when empty), by key id."""
        return [
            self._api_key(item) for item in self.table.query(API_KEY) if not user_name or item["user_name"] == user_name
        ]

    @staticmethod
    def _api_key(item: dict[str, Any]) -> ApiKeyRecord:
        return ApiKeyRecord(
            item["sk"], item["user_name"], item["digest"], int(item["created_us"]), int(item["expires_us"])
        )
