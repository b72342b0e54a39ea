"""chalicelib.aws_models answers what botocore's own loader answers, from the same files."""

from __future__ import annotations

import os

import botocore.session
import pytest
from botocore.exceptions import UnknownServiceError
from botocore.loaders import Loader

from chalicelib.aws_models import ModelLoader

MODEL_TYPES = ("service-2", "endpoint-rule-set-1", "paginators-1", "waiters-2")
#: The services the app makes clients of (runtime.py).
APP_SERVICES = ("dynamodb", "s3", "stepfunctions", "secretsmanager")


@pytest.fixture(scope="module")
def botocores() -> Loader:
    return Loader()


@pytest.mark.parametrize("type_name", MODEL_TYPES)
def test_services_are_botocores_services(botocores: Loader, type_name: str) -> None:
    expected = botocores.list_available_services(type_name)
    names = ModelLoader().list_available_services(type_name)
    assert list(names) == expected
    assert len(names) == len(expected) and names[0] == expected[0] and names[-3:] == expected[-3:]


@pytest.mark.parametrize("type_name", MODEL_TYPES)
def test_a_service_is_known_exactly_when_botocore_lists_it(botocores: Loader, type_name: str) -> None:
    listed = set(botocores.list_available_services(type_name))
    # Every service: those without a model of this type (most have no waiters) are not services of it.
    candidates = set(botocores.list_available_services("service-2")) | listed
    if type_name == "waiters-2":
        assert candidates - listed
    names = ModelLoader().list_available_services(type_name)
    assert {name for name in candidates if name in names} == listed


@pytest.mark.parametrize("name", ["nope", "", ".", "..", "dynamodb/2012-08-10", "data", None, 3])
def test_what_is_no_service_is_not_known(name: object) -> None:
    assert name not in ModelLoader().list_available_services("service-2")


@pytest.mark.parametrize("name", ["endpoints", "partitions", "_retry", "sdk-default-configuration"])
def test_data_files_load_as_botocore_loads_them(botocores: Loader, name: str) -> None:
    data = ModelLoader().load_data(name)
    assert type(data) is dict
    assert data == botocores.load_data(name)
    assert list(data) == list(botocores.load_data(name))


@pytest.mark.parametrize("service", APP_SERVICES)
@pytest.mark.parametrize("type_name", ["service-2", "endpoint-rule-set-1", "paginators-1"])
def test_models_load_as_botocore_loads_them(botocores: Loader, service: str, type_name: str) -> None:
    assert ModelLoader().load_service_model(service, type_name) == botocores.load_service_model(service, type_name)


def _session() -> botocore.session.Session:
    session = botocore.session.get_session()
    session.register_component("data_loader", ModelLoader())
    return session


def test_a_session_makes_clients_and_refuses_unknown_services(monkeypatch: pytest.MonkeyPatch) -> None:
    # The integration tier's moto fixture exports AWS_ENDPOINT_URL for the whole session;
    # the endpoint asserted here is the one the rule set resolves.
    for name in [name for name in os.environ if name.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    session, credentials = _session(), {"aws_access_key_id": "k", "aws_secret_access_key": "s"}
    client = session.create_client("dynamodb", region_name="us-east-1", **credentials)
    assert client.meta.service_model.service_name == "dynamodb"
    assert client.meta.endpoint_url == "https://dynamodb.us-east-1.amazonaws.com"
    with pytest.raises(UnknownServiceError) as refused:
        session.create_client("dynamodbx", region_name="us-east-1", **credentials)
    assert "dynamodb," in str(refused.value)  # the message lists the known services, as botocore's
