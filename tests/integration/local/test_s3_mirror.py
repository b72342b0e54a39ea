"""moto's S3 kept on disk by ``S3Mirror``: every write path, versioned buckets, and what a
crash can leave behind (the process-level kill -9 is in test_stack_process.py)."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from local_stack.s3 import S3Mirror, object_file_name


@pytest.fixture
def mirrored(aws, tmp_path):
    """An S3 mirror on ``tmp_path / "s3"``, attached for the test."""
    mirror = S3Mirror(tmp_path / "s3")
    mirror.attach()
    yield mirror
    mirror.detach()


def restart(aws: str, mirror: S3Mirror) -> tuple[int, int]:
    """What a new stack does: moto forgets everything, the mirror puts it back."""
    mirror.detach()
    urllib.request.urlopen(urllib.request.Request(f"{aws}/moto-api/reset", method="POST")).read()
    restored = S3Mirror(mirror.root).restore()
    mirror.attach()
    return restored


def body(s3, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_every_write_path_is_kept_and_a_deletion_stays(aws, mirrored):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="cold")
    s3.put_object(Bucket="cold", Key="put", Body=b"p")
    s3.copy_object(Bucket="cold", Key="copied", CopySource={"Bucket": "cold", "Key": "put"})
    upload = s3.create_multipart_upload(Bucket="cold", Key="multipart")["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(Bucket="cold", Key="multipart", PartNumber=n, UploadId=upload, Body=data)["ETag"],
        }
        for n, data in ((1, b"a" * (5 << 20)), (2, b"b"))
    ]
    s3.complete_multipart_upload(Bucket="cold", Key="multipart", UploadId=upload, MultipartUpload={"Parts": parts})
    s3.put_object(Bucket="cold", Key="batch-deleted", Body=b"x")
    s3.put_object(Bucket="cold", Key="deleted", Body=b"x")
    s3.delete_objects(Bucket="cold", Delete={"Objects": [{"Key": "batch-deleted"}]})
    s3.delete_object(Bucket="cold", Key="deleted")
    s3.create_bucket(Bucket="full")
    s3.put_object(Bucket="full", Key="k", Body=b"k")
    with pytest.raises(s3.exceptions.ClientError, match="BucketNotEmpty"):
        s3.delete_bucket(Bucket="full")

    assert restart(aws, mirrored) == (2, 4)
    assert body(s3, "cold", "put") == body(s3, "cold", "copied") == b"p"
    assert body(s3, "cold", "multipart") == b"a" * (5 << 20) + b"b"
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket="cold")["Contents"]) == ["copied", "multipart", "put"]
    s3.delete_object(Bucket="full", Key="k")
    s3.delete_bucket(Bucket="full")
    assert restart(aws, mirrored) == (1, 3)
    assert [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]] == ["cold"]


def test_a_versioned_bucket_keeps_the_latest_bytes_and_a_delete_marker_hides_them(aws, mirrored):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket="versioned", Key="k", Body=b"v1")
    newest = s3.put_object(Bucket="versioned", Key="k", Body=b"v2")["VersionId"]
    s3.put_object(Bucket="versioned", Key="hidden", Body=b"h")
    s3.delete_object(Bucket="versioned", Key="hidden")  # a delete marker
    s3.delete_object(Bucket="versioned", Key="k", VersionId=newest)  # v1 is the latest again

    assert restart(aws, mirrored) == (1, 1)
    assert body(s3, "versioned", "k") == b"v1"
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="versioned", Key="hidden")


def test_concurrent_puts_of_one_key_leave_the_last_answered_bytes(aws, mirrored):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="cold")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: s3.put_object(Bucket="cold", Key="k", Body=str(n).encode() * 1000), range(64)))
    in_moto = body(s3, "cold", "k")
    restart(aws, mirrored)
    assert body(s3, "cold", "k") == in_moto


def test_what_a_crash_can_leave_is_cleared_and_a_cut_object_skipped(aws, mirrored):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="cold")
    s3.put_object(Bucket="cold", Key="whole", Body=b"whole")
    s3.put_object(Bucket="cold", Key="cut", Body=b"0123456789")
    objects = mirrored.root / "cold" / "objects"
    cut = objects / object_file_name("cut")
    cut.write_bytes(cut.read_bytes()[:-3])  # a machine crash before the page cache was written
    (objects / "abc.partial").write_bytes(b"never renamed")
    (mirrored.root / "half-created" / "objects").mkdir(parents=True)  # no bucket.json
    (mirrored.root / ".gone.deleted" / "objects").mkdir(parents=True)

    assert restart(aws, mirrored) == (1, 1)
    assert body(s3, "cold", "whole") == b"whole"
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="cold", Key="cut")
    assert sorted(path.name for path in mirrored.root.iterdir()) == ["cold"]
    assert not (objects / "abc.partial").exists()
    assert json.loads((mirrored.root / "cold" / "bucket.json").read_text())["region"] == "us-east-1"
