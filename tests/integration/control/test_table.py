"""The control table on moto: creation, and DynamoDB failures as SERVICE_NOT_READY."""

import boto3
import pytest
from botocore.config import Config

from chalicelib.control import ControlPlane, ensure_table
from chalicelib.protocol.errors import ServiceNotReadyError
from tests.helpers import free_port


def test_ensure_table_is_idempotent(aws):
    client = boto3.client("dynamodb")
    ensure_table(client, "t1")
    ensure_table(client, "t1")
    description = client.describe_table(TableName="t1")["Table"]
    assert description["TableStatus"] == "ACTIVE"
    assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert [k["AttributeName"] for k in description["KeySchema"]] == ["pk", "sk"]


def test_missing_table_is_service_not_ready(aws, clock):
    plane = ControlPlane(dynamodb=lambda: boto3.client("dynamodb"), table_name="absent", clock=clock)
    with pytest.raises(ServiceNotReadyError, match="ResourceNotFoundException"):
        plane.get_instance("i1")
    with pytest.raises(ServiceNotReadyError):
        plane.list_storages()


def test_unreachable_endpoint_is_service_not_ready(clock):
    def dead_client():
        return boto3.client(
            "dynamodb",
            endpoint_url=f"http://127.0.0.1:{free_port()}",
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(retries={"max_attempts": 1}, connect_timeout=0.5),
        )

    plane = ControlPlane(dynamodb=dead_client, table_name="t", clock=clock)
    with pytest.raises(ServiceNotReadyError, match="unreachable"):
        plane.ping()
