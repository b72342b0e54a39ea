"""The shared fixtures give a real Valkey and a real moto endpoint."""

import boto3


def test_valkey_is_real(valkey):
    valkey.set("k", "v")
    assert valkey.get("k") == b"v"
    assert "valkey_version" in valkey.info("server")


def test_moto_answers_boto3(aws):
    ddb = boto3.client("dynamodb")
    assert ddb.list_tables()["TableNames"] == []
