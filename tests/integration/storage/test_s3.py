"""S3 backend on the moto server: keys, batching, error reporting."""

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from chalicelib.storage import BlockRef, S3Backend, SpecSlot, StorageError, StorageUnavailableError
from tests.helpers import free_port

from .harness import storage_config

SPECS = (SpecSlot("tp0", 0, 8), SpecSlot("tp1", 8, 8))
BUCKET = "kv-s3"


def backend(prefix="", bucket=BUCKET, factory=lambda: boto3.client("s3")):
    return S3Backend(storage_config("s3_01", "s3", {"bucket": bucket, "prefix": prefix}), factory)


def ref(key, instance="inst"):
    return BlockRef(instance, key, 1, 0, 0, SPECS)


@pytest.fixture
def s3(aws):
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.mark.parametrize(
    "prefix, key",
    [
        ("", "inst/tp1/00000000000000ff"),
        ("/", "inst/tp1/00000000000000ff"),
        ("/a/b/", "a/b/inst/tp1/00000000000000ff"),
    ],
)
def test_object_key_and_uri(prefix, key):
    target = backend(prefix)
    assert target.object_key("inst", "tp1", 255) == key
    assert target.uri(ref(255), SPECS[1]) == f"s3://s3_01/{key}?size=8"


def test_delete_batches_of_1000_and_tolerates_missing_keys(s3):
    target = backend("p")
    blocks = [ref(k) for k in range(1250)]  # 2500 keys: 3 DeleteObjects calls
    for block in (blocks[0], blocks[-1]):
        for spec in SPECS:
            s3.put_object(Bucket=BUCKET, Key=target.object_key("inst", spec.name, block.block_key), Body=b"12345678")
    batches = []
    target.client.meta.events.register(
        "before-call.s3.DeleteObjects", lambda params, **_: batches.append(params["body"].count(b"<Key>"))
    )
    target.delete(blocks)
    assert batches == [1000, 1000, 500]
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def test_delete_reports_per_key_errors():
    client = boto3.client("s3", region_name="us-east-1")
    target = backend(factory=lambda: client)
    with Stubber(client) as stub:
        stub.add_response(
            "delete_objects",
            {"Errors": [{"Key": "inst/tp0/0000000000000001", "Code": "AccessDenied", "Message": "no"}]},
        )
        with pytest.raises(StorageError, match="AccessDenied"):
            target.delete([ref(1)])


def test_delete_from_a_missing_bucket_fails(aws):
    with pytest.raises(StorageError, match="NoSuchBucket"):
        backend(bucket="gone").delete([ref(1)])


def test_exists_raises_on_errors_other_than_not_found():
    client = boto3.client("s3", region_name="us-east-1")
    target = backend(factory=lambda: client)
    with Stubber(client) as stub:
        stub.add_client_error("head_object", service_error_code="403", http_status_code=403)
        with pytest.raises(StorageError, match="403"):
            target.exists(ref(1))


def test_probe_fails_when_the_endpoint_is_down():
    client = boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    with pytest.raises(StorageUnavailableError, match="s3_01: bucket 'kv-s3' unusable"):
        backend(factory=lambda: client).probe()
