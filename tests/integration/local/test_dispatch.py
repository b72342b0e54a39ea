"""Lambda invocations inside moto reach the injected handlers (LambdaDispatch)."""

from __future__ import annotations

import io
import json
import zipfile

import boto3
import pytest

from local_stack.aws import LAMBDA_RUNTIME
from local_stack.dispatch import LambdaDispatch, function_name_of


def handlers() -> dict:
    def double(event, context):
        if event.get("n") is None:
            raise KeyError("n")
        return {
            "n": event["n"] * 2,
            "function": context.function_name,
            "has_time_left": context.get_remaining_time_in_millis() > 0,
        }

    return {"double": double}


@pytest.mark.parametrize(
    "name",
    [
        "double",
        "double:$LATEST",
        "arn:aws:lambda:us-east-1:123456789012:function:double",
        "arn:aws:lambda:us-east-1:123456789012:function:double:live",
    ],
)
def test_function_name_of_accepts_names_and_arns(name: str):
    assert function_name_of(name) == "double"


def test_invoke_calls_the_handler_with_the_decoded_payload():
    headers: dict = {}
    result = LambdaDispatch(handlers()).invoke("double", b'{"n": 21}', headers)
    assert json.loads(result) == {"n": 42, "function": "double", "has_time_left": True}
    assert headers == {}


def test_a_raising_handler_is_an_unhandled_function_error():
    headers: dict = {}
    error = json.loads(LambdaDispatch(handlers()).invoke("double", "{}", headers))
    assert headers == {"x-amz-function-error": "Unhandled"}
    assert error["errorType"] == "KeyError" and error["errorMessage"] == "'n'"


def test_unknown_function_is_not_found():
    assert LambdaDispatch(handlers()).invoke("nope", "{}", {}) is None


def test_installed_in_moto_while_entered(aws):
    from moto.awslambda_simple.models import LambdaSimpleBackend

    client = boto3.client("lambda")
    role = boto3.client("iam").create_role(
        RoleName="r",
        AssumeRolePolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "lambda.amazonaws.com"}}
                ],
            }
        ),
    )["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("app.py", "")
    client.create_function(
        FunctionName="double",
        Runtime=LAMBDA_RUNTIME,
        Role=role,
        Handler="app.double",
        Code={"ZipFile": code.getvalue()},
    )
    original = LambdaSimpleBackend.invoke
    with LambdaDispatch(handlers()):
        ok = client.invoke(FunctionName="double", Payload=b'{"n": 2}')
        failed = client.invoke(FunctionName="double", Payload=b"{}")
    assert json.loads(ok["Payload"].read())["n"] == 4
    assert failed["FunctionError"] == "Unhandled"
    assert LambdaSimpleBackend.invoke is original
