"""Leader discovery against the local stack: getClusterInfo names the API itself, and a
client discovering the leader (kvcm_client, upstream's algorithm) keeps talking to it."""

from __future__ import annotations

from kvcm_client import KvcmClient
from local_stack import LocalStack

from .harness import Api


def test_get_cluster_info_names_the_stacks_own_endpoint(stack: LocalStack, api: Api):
    status, answer = api.call("getClusterInfo", {"trace_id": "leader_discovery_1"})
    assert status == 200 and answer["header"]["status"]["code"] == "OK"
    endpoint = answer["leader_endpoint"]
    assert f"http://{endpoint['host']}:{endpoint['meta_http_port']}" == stack.api_url
    with KvcmClient(stack.api_url, auto_discover_leader=True) as client:
        assert client.url == stack.api_url
        assert client.check_health().is_health
