"""The deploy tool's pieces against moto: the default network, where a template goes
(inline or S3), the code location, overrides and a failing stack's report."""

from __future__ import annotations

import json
import os

import boto3
import pytest

from infra import deploy


class Session:
    """What infra.deploy needs of a session: clients (here, the test's moto)."""

    def client(self, service: str, **kwargs):
        return boto3.client(service, **kwargs)


def test_default_network_is_the_default_vpc_in_three_zones(aws):
    network = deploy.default_network(boto3.client("ec2"))
    ec2 = boto3.client("ec2")
    subnets = {s["SubnetId"]: s["AvailabilityZone"] for s in ec2.describe_subnets()["Subnets"]}
    chosen = network["SubnetIds"].split(",")
    assert len(chosen) == 3 and len({subnets[s] for s in chosen}) == 3
    assert ec2.describe_vpcs(VpcIds=[network["VpcId"]])["Vpcs"][0]["IsDefault"]
    assert network["RouteTableIds"].startswith("rtb-")


def test_given_network_is_kept(aws):
    parameters = deploy.stack_parameters(Session(), "dev", {"VpcId": "vpc-1", "SubnetIds": "subnet-a,subnet-b"})
    assert parameters == {"Stage": "dev", "VpcId": "vpc-1", "SubnetIds": "subnet-a,subnet-b"}


def test_a_large_template_goes_through_s3_and_says_so_without_a_bucket(aws):
    large = {
        "Resources": {
            "Padding": {
                "Type": "AWS::CloudFormation::WaitConditionHandle",
                "Metadata": {"text": "x" * deploy.INLINE_TEMPLATE_LIMIT},
            }
        }
    }
    with pytest.raises(deploy.DeployError, match="inline limit"):
        deploy.template_source(Session(), large, None, "kvcm/dev/sam")
    boto3.client("s3").create_bucket(Bucket="artifacts")
    source = deploy.template_source(Session(), large, "artifacts", "kvcm/dev/sam")
    key = source["TemplateURL"].split("/artifacts/", 1)[1]
    stored = boto3.client("s3").get_object(Bucket="artifacts", Key=key)
    assert stored["ServerSideEncryption"] == "AES256" and json.loads(stored["Body"].read()) == large
    assert deploy.template_source(Session(), {"Resources": {}}, None, "x") == {"TemplateBody": '{"Resources":{}}'}


def test_packaged_functions_point_at_the_uploaded_code():
    template = {
        "Resources": {
            "Api": {"Type": "AWS::Serverless::Function", "Properties": {"CodeUri": "./deployment.zip"}},
            "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
        }
    }
    deploy.with_uploaded_code(template, "bucket", "kvcm/dev/deployment-1.zip")
    assert template["Resources"]["Api"]["Properties"]["CodeUri"] == {
        "Bucket": "bucket",
        "Key": "kvcm/dev/deployment-1.zip",
    }
    assert template["Resources"]["Table"]["Properties"] == {}


def test_overrides_are_key_value_words():
    assert deploy.parse_overrides(["ValkeyUrl=rediss://h:6379/0?a=b", "SubnetIds=a,b", "RouteTableIds="]) == {
        "ValkeyUrl": "rediss://h:6379/0?a=b",
        "SubnetIds": "a,b",
        "RouteTableIds": "",
    }
    with pytest.raises(deploy.DeployError, match="not Key=Value"):
        deploy.parse_overrides(["VpcId"])


def test_a_failing_stack_reports_why(aws):
    broken = {"Resources": {"Queue": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": {"Ref": "Missing"}}}}}
    with pytest.raises(deploy.DeployError, match="kvcm-broken"):
        deploy.deploy_stack(Session(), "kvcm-broken", {"TemplateBody": json.dumps(broken)}, {}, poll_s=0.1)


def test_an_explicit_endpoint_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    client = deploy.session("us-east-1", "localhost:4566").client("cloudformation")
    assert client.meta.endpoint_url == "http://localhost:4566"


def test_the_uploaded_package_carries_bytecode_that_needs_no_source_mtime(tmp_path):
    import importlib.util
    import io
    import subprocess
    import sys
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "import lib.helper\nVALUE = lib.helper.answer()\n")
        archive.writestr("lib/__init__.py", "")
        archive.writestr("lib/helper.py", "def answer():\n    return 42\n")
    compiled = deploy.with_bytecode(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(compiled)) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path)
    tag = sys.implementation.cache_tag
    assert {"app.py", "lib/helper.py", f"__pycache__/app.{tag}.pyc", f"lib/__pycache__/helper.{tag}.pyc"} <= names
    pyc = (tmp_path / "lib" / "__pycache__" / f"helper.{tag}.pyc").read_bytes()
    assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01  # unchecked hash
    # the source's mtime changes (as unzipping on Lambda may do): the bytecode is still used
    (tmp_path / "lib" / "helper.py").write_text("def answer():\n    return 0\n")
    run = subprocess.run(
        [sys.executable, "-S", "-B", "-c", "import app; print(app.VALUE)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        # as on Lambda: bytecode is looked for beside the sources (the edit loop keeps its own elsewhere)
        env={k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"},
    )
    assert run.stdout.strip() == "42"
