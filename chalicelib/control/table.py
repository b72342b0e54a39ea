"""The control table: one DynamoDB table, single-table design.

Every item has a string partition key ``pk`` naming the entity kind and a string sort key
``sk`` naming the entity, so listing a kind is one Query and reading an entity one GetItem:

==============  ===============  ==========================================================
pk              sk               attributes
==============  ===============  ==========================================================
``STORAGE``     storage name     ``doc`` (StorageConfig JSON), ``available``, ``version``,
                                 ``updated_us``
``STORAGE_REF`` storage name     ``groups``: string set of the groups listing it as candidate
``GROUP``       group name       ``doc`` (InstanceGroup JSON), ``version``,
                                 ``instance_count``, ``max_instance_count``
``INSTANCE``    instance id      ``doc`` (InstanceRecord JSON, creation time included),
                                 ``group``, ``incarnation``
``ACCOUNT``     user name        ``role``, ``groups``, ``prefixes`` (scope), ``created_us``;
                                 admins: ``password`` (salted hash)
``API_KEY``     key id           ``user_name``, ``digest`` (SHA-256 of the key), ``created_us``,
                                 ``expires_us``
``AUDIT#<day>`` time µs + rand   ``principal``, ``source``, ``api``, ``target``, ``code``,
                                 ``message``, ``expires_at`` (TTL); written outside the epoch
``EPOCH``       ``0`` .. ``7``   ``epoch``: counter shards of the config epoch
``CHANGE``      time µs + rand   ``entities``: the ``<pk>/<sk>`` of the cached items one
                                 write changed, ``at_us``, ``expires_at`` (TTL)
==============  ===============  ==========================================================

Every write is a ``TransactWriteItems`` that also increments one epoch shard (chosen at
random), so the config epoch — the sum of the shards — changes with every write and
``ConfigCache`` checks for changes with a single Query. Sharding keeps concurrent writes
(e.g. a burst of instance registrations) from all conflicting on one counter item.
The same transaction puts a ``CHANGE`` record naming what it changed, so a cache that sees
the epoch move re-reads only those entities (``changes_since``), not everything.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError, NoRegionError
from botocore.exceptions import ConnectionError as BotoConnectionError

from ..clock import Clock
from ..protocol.errors import ServiceNotReadyError
from .attributes import deserialize, serialize

PK, SK = "pk", "sk"
#: Items with this attribute (epoch seconds) are deleted by DynamoDB after that time.
TTL_ATTRIBUTE = "expires_at"
EPOCH_PK = "EPOCH"
EPOCH_SHARDS = 8
CHANGE_PK = "CHANGE"
#: Change records expire after this (DynamoDB TTL); a cache that finds fewer records than
#: epoch steps (it looked longer ago, or a record expired) revalidates everything it holds.
CHANGE_RETENTION_S = 3600

# Client errors that mean "DynamoDB cannot serve us now", not "the request is wrong".
_UNAVAILABLE_CODES = frozenset(
    {
        "ResourceNotFoundException",
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "TransactionInProgressException",
    }
)
# Cancellation reasons worth retrying: another transaction held an item, or throttling.
_RETRYABLE_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})


def table_definition(name: str) -> dict[str, Any]:
    """The table's shape, valid both as ``create_table(**...)`` and as the CloudFormation
    ``AWS::DynamoDB::Table`` properties (the two share these property names)."""
    return {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": SK, "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": PK, "KeyType": "HASH"}, {"AttributeName": SK, "KeyType": "RANGE"}],
        "BillingMode": "PAY_PER_REQUEST",
    }


def ensure_table(dynamodb: Any, name: str) -> None:
    """Create the control table if it does not exist and wait until it is usable
    (local stack and tests; deployed stages get it from the infra template)."""
    try:
        status = dynamodb.create_table(**table_definition(name))["TableDescription"]["TableStatus"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ResourceInUseException":
            raise
        status = "EXISTS"  # created before, maybe still CREATING: the waiter tells
    if status != "ACTIVE":
        dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    if status != "EXISTS":
        # Audit records expire (control.audit); deployed stages get this from the template.
        dynamodb.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
        )


def encode(values: Mapping[str, Any]) -> dict[str, Any]:
    """Python values → DynamoDB attribute values."""
    return {k: serialize(v) for k, v in values.items()}


def decode(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item → Python values (numbers come back as ``Decimal``)."""
    return {k: deserialize(v) for k, v in item.items()}


def key(pk: str, sk: str) -> dict[str, Any]:
    return {PK: {"S": pk}, SK: {"S": sk}}


@dataclass(frozen=True)
class Op:
    """One element of a TransactWriteItems call (the table fills in its name)."""

    kind: str  # "Put", "Update", "Delete" or "ConditionCheck"
    body: dict[str, Any]
    #: False for items no cache holds (e.g. a group's instance counter): not named in the change record.
    cached: bool = True

    @property
    def entity(self) -> str:
        """``<pk>/<sk>`` of the item written (pk never contains ``/``)."""
        item_key = self.body.get("Key") or self.body["Item"]
        return f"{item_key[PK]['S']}/{item_key[SK]['S']}"


@dataclass(frozen=True)
class Change:
    """One write's change record: which cached items it changed (``<pk>/<sk>`` each)."""

    sort_key: str
    at_us: int
    entities: tuple[str, ...]


def _expression(
    body: dict[str, Any], condition: str | None, names: dict[str, Any] | None, values: dict[str, Any] | None
) -> dict[str, Any]:
    if condition:
        body["ConditionExpression"] = condition
    if names:
        body["ExpressionAttributeNames"] = names
    if values:
        body["ExpressionAttributeValues"] = encode(values)
    return body


def put(
    pk: str,
    sk: str,
    attrs: Mapping[str, Any],
    condition: str | None = None,
    names: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> Op:
    """Replace an item."""
    item = {**key(pk, sk), **encode(attrs)}
    return Op("Put", _expression({"Item": item}, condition, names, values))


def update(
    pk: str,
    sk: str,
    expression: str,
    condition: str | None = None,
    names: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> Op:
    """Update an item in place (creating it unless the condition forbids it)."""
    return Op("Update", _expression({"Key": key(pk, sk), "UpdateExpression": expression}, condition, names, values))


def delete(
    pk: str,
    sk: str,
    condition: str | None = None,
    names: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> Op:
    """Delete an item."""
    return Op("Delete", _expression({"Key": key(pk, sk)}, condition, names, values))


def check(
    pk: str, sk: str, condition: str, names: dict[str, Any] | None = None, values: dict[str, Any] | None = None
) -> Op:
    """Require a condition on an item without writing it."""
    return Op("ConditionCheck", _expression({"Key": key(pk, sk)}, condition, names, values))


class Cancelled(Exception):
    """A transaction was refused because a condition failed; ``failed(i)`` tells which."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__(", ".join(reasons))
        self.reasons = reasons

    def failed(self, index: int) -> bool:
        return index < len(self.reasons) and self.reasons[index] == "ConditionalCheckFailed"


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Turn "DynamoDB unreachable/unavailable" failures into ServiceNotReadyError."""
    try:
        yield
    except (BotoConnectionError, HTTPClientError, NoCredentialsError, NoRegionError) as exc:
        raise ServiceNotReadyError(f"control table unreachable during {action}: {exc}") from exc
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _UNAVAILABLE_CODES:
            raise ServiceNotReadyError(f"control table unavailable during {action}: {code}") from exc
        raise


class ControlTable:
    """Reads and transactional writes on the control table."""

    def __init__(self, client_factory: Callable[[], Any], name: str, clock: Clock, max_attempts: int = 6) -> None:
        self._client_factory = client_factory
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.name = name
        self._clock = clock
        self._max_attempts = max_attempts

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._client_factory()
        return self._client

    def get(self, pk: str, sk: str) -> dict[str, Any] | None:
        """One item, strongly consistent, or None."""
        with aws_errors(f"get {pk}/{sk}"):
            response = self.client.get_item(TableName=self.name, Key=key(pk, sk), ConsistentRead=True)
        item = response.get("Item")
        return decode(item) if item else None

    def query(self, pk: str) -> list[dict[str, Any]]:
        """Every item of one partition, in sort-key order, strongly consistent."""
        return self._paged(
            f"query {pk}",
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": PK},
            ExpressionAttributeValues={":pk": {"S": pk}},
        )

    def _paged(self, action: str, **query: Any) -> list[dict[str, Any]]:
        """Every item a strongly consistent Query matches, page after page."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.name, "ConsistentRead": True, **query}
        with aws_errors(action):
            while True:
                page = self.client.query(**kwargs)
                items.extend(decode(i) for i in page.get("Items", []))
                if "LastEvaluatedKey" not in page:
                    return items
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def epoch(self) -> int:
        """The config epoch: grows by one with every write (0 before the first)."""
        # A shard item without the attribute counts 0: moto's transactions create an updated
        # item before applying the update, so a concurrent Query can see the bare key.
        return sum(int(item.get("epoch", 0)) for item in self.query(EPOCH_PK))

    def changes_since(self, since_us: int) -> list[Change]:
        """The change records written at or after ``since_us`` (by the writers' clocks), oldest first."""
        items = self._paged(
            "query changes",
            KeyConditionExpression="#pk = :pk AND #sk >= :from",
            ExpressionAttributeNames={"#pk": PK, "#sk": SK},
            ExpressionAttributeValues={":pk": {"S": CHANGE_PK}, ":from": {"S": f"{max(since_us, 0):020d}"}},
        )
        return [Change(str(i[SK]), int(i["at_us"]), tuple(str(e) for e in i["entities"])) for i in items]

    def write(self, ops: list[Op]) -> None:
        """Apply ``ops`` and bump the epoch atomically.

        Raises ``Cancelled`` when a condition fails (reasons index ``ops``), and
        ServiceNotReadyError when conflicts or throttling persist past the retries.
        """
        items = [{op.kind: {"TableName": self.name, **op.body}} for op in ops]
        now = self._clock.now()
        change = {
            PK: CHANGE_PK,
            SK: f"{int(now * 1e6):020d}#{random.getrandbits(32):08x}",
            "at_us": int(now * 1e6),
            "entities": sorted({op.entity for op in ops if op.cached and op.kind != "ConditionCheck"}),
            TTL_ATTRIBUTE: int(now) + CHANGE_RETENTION_S,
        }
        items.append({"Put": {"TableName": self.name, "Item": encode(change)}})
        shard = str(random.randrange(EPOCH_SHARDS))
        items.append(
            {
                "Update": {
                    "TableName": self.name,
                    "Key": key(EPOCH_PK, shard),
                    "UpdateExpression": "ADD epoch :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            }
        )
        for attempt in range(self._max_attempts):
            try:
                with aws_errors("transaction"):
                    self.client.transact_write_items(TransactItems=items)
                return
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                    raise
                reasons = [r.get("Code", "None") for r in exc.response.get("CancellationReasons", [])]
                if "ConditionalCheckFailed" in reasons:
                    raise Cancelled(reasons) from None
                if not any(r in _RETRYABLE_REASONS for r in reasons):
                    raise
            # Full jitter: concurrent writers of the same item spread out instead of colliding again.
            self._clock.sleep(random.uniform(0, 0.025 * 2**attempt))
        raise ServiceNotReadyError("control table busy: transaction kept conflicting, retry later")
