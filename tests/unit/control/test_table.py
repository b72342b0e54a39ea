"""ControlTable's transaction retries and error mapping (DynamoDB client faked)."""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from chalicelib.clock import ManualClock
from chalicelib.control.table import Cancelled, ControlTable, put, table_definition
from chalicelib.protocol.errors import ServiceNotReadyError


def cancelled(*codes):
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
            "CancellationReasons": [{"Code": c} for c in codes],
        },
        "TransactWriteItems",
    )


class FakeClient:
    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = []

    def transact_write_items(self, TransactItems):
        self.calls.append(TransactItems)
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome


def table(client):
    return ControlTable(lambda: client, "t", ManualClock(), max_attempts=3)


def test_writes_append_the_epoch_bump():
    client = FakeClient(None)
    table(client).write([put("STORAGE", "a", {"doc": "{}"})])
    items = client.calls[0]
    assert items[0]["Put"]["TableName"] == "t" and items[0]["Put"]["Item"]["sk"] == {"S": "a"}
    assert items[-1]["Update"]["Key"]["pk"] == {"S": "EPOCH"}
    assert 0 <= int(items[-1]["Update"]["Key"]["sk"]["S"]) < 8
    assert items[-1]["Update"]["UpdateExpression"] == "ADD epoch :one"


def test_conflicts_are_retried_then_succeed():
    client = FakeClient(cancelled("TransactionConflict", "None"), cancelled("None", "ThrottlingError"), None)
    table(client).write([put("A", "a", {})])
    assert len(client.calls) == 3


def test_persistent_conflicts_become_service_not_ready():
    client = FakeClient(*[cancelled("TransactionConflict", "None")] * 3)
    with pytest.raises(ServiceNotReadyError, match="busy"):
        table(client).write([put("A", "a", {})])


def test_a_failed_condition_is_reported_with_its_position_and_not_retried():
    client = FakeClient(cancelled("None", "ConditionalCheckFailed", "TransactionConflict"))
    with pytest.raises(Cancelled) as err:
        table(client).write([put("A", "a", {}), put("B", "b", {})])
    assert err.value.failed(1) and not err.value.failed(0) and not err.value.failed(5)
    assert len(client.calls) == 1


def test_other_cancellations_are_not_hidden():
    client = FakeClient(cancelled("ValidationError", "None"))
    with pytest.raises(ClientError):
        table(client).write([put("A", "a", {})])


def test_connection_errors_become_service_not_ready():
    client = FakeClient(EndpointConnectionError(endpoint_url="http://nowhere"))
    with pytest.raises(ServiceNotReadyError, match="unreachable"):
        table(client).write([put("A", "a", {})])


def test_table_definition_serves_boto3_and_cloudformation():
    definition = table_definition("kvcm-control")
    assert definition == {
        "TableName": "kvcm-control",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        "BillingMode": "PAY_PER_REQUEST",
    }
