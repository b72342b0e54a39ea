"""kvcm_client against the local stack: typed calls, errors, retries, pooling, leader discovery.

Retries and discovery are driven by a small HTTP proxy in front of the stack that can drop
a connection or answer for the service (SERVICE_NOT_READY, getClusterInfo); everything else
it forwards to the real stack.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from chalicelib.protocol import models as m
from chalicelib.protocol.codes import ErrorCode, QueryType
from kvcm_client import KvcmClient, KvcmError, TransportError
from local_stack import LocalStack

#: What the proxy does with a request: None forwards it, "drop" closes the connection,
#: a dict is answered as the JSON body.
Rule = Callable[[str, int], object | None]


class Proxy:
    """Forwards to ``target``; counts requests per path and accepted connections."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.rule: Rule = lambda path, n: None
        self.requests: dict[str, int] = {}
        self.connections = 0
        upstream = urllib3.PoolManager()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                proxy.connections += 1

            def log_message(self, *args) -> None:
                pass

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                n = proxy.requests[self.path] = proxy.requests.get(self.path, 0) + 1
                action = proxy.rule(self.path, n)
                if action == "drop":
                    self.close_connection = True
                    return
                if action is None:
                    reply = upstream.request(
                        self.command, proxy.target + self.path, body=body or None, headers=dict(self.headers)
                    )
                    status, data, content_type = reply.status, reply.data, reply.headers.get("Content-Type", "")
                else:
                    status, data, content_type = 200, json.dumps(action).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(stack: LocalStack) -> Iterator[Proxy]:
    running = Proxy(stack.api_url)
    yield running
    running.close()


def not_ready(api_name: str) -> dict:
    return {"header": {"status": {"code": "SERVICE_NOT_READY", "message": "index unavailable"}}}


def test_two_phase_write_and_read_with_typed_models(stack: LocalStack):
    with KvcmClient(stack.api_url) as client:
        registered = client.register_instance(
            instance_group="default",
            instance_id="sdk-1",
            block_size=16,
            location_spec_infos=[m.LocationSpecInfo(name="tp0", size=4096)],
            model_deployment=m.ModelDeployment(model_name="qwen", dtype="bf16"),
        )
        assert isinstance(registered, m.RegisterInstanceResponse)
        assert json.loads(registered.storage_configs)[0]["global_unique_name"] == "nfs_01"
        started = client.start_write_cache(m.StartWriteCacheRequest(instance_id="sdk-1", block_keys=[1, 2, 3]))
        assert len(started.write_session_id) == 32 and len(started.locations) == 3
        client.finish_write_cache(
            instance_id="sdk-1", write_session_id=started.write_session_id, success_blocks=m.BlockMask(offset=3)
        )
        found = client.get_cache_location(
            instance_id="sdk-1", query_type=QueryType.QT_PREFIX_MATCH, block_keys=[1, 2, 9]
        )
        assert isinstance(found, m.GetCacheLocationResponse) and len(found.locations) == 2
        assert found.locations[0]["location_specs"][0]["uri"].startswith("file://nfs_01/")
        info = client.get_instance_info(instance_id="sdk-1")
        assert info.instance_info.block_size == 16 and info.header.status.code == ErrorCode.OK


def test_an_error_code_raises_unless_check_is_off(stack: LocalStack):
    with KvcmClient(stack.api_url) as client:
        with pytest.raises(KvcmError) as caught:
            client.get_instance_info(instance_id="no-such-instance")
        assert caught.value.code == ErrorCode.INSTANCE_NOT_EXIST
        assert isinstance(caught.value.response, m.GetInstanceInfoResponse)
    with KvcmClient(stack.api_url, check=False) as client:
        answer = client.get_cache_location(instance_id="sdk-missing", query_type="QT_BATCH_GET", block_keys=[1])
        assert answer.header.status.code == ErrorCode.INSTANCE_NOT_EXIST and len(answer.locations) == 0


def test_calls_share_pooled_connections(proxy: Proxy):
    with KvcmClient(proxy.url) as client:
        for _ in range(5):
            client.list_storage()
            client.check_health()
    assert proxy.requests["/api/listStorage"] == 5 and proxy.connections == 1


def test_idempotent_methods_are_retried_with_backoff(proxy: Proxy):
    sleeps: list[float] = []
    proxy.rule = lambda path, n: "drop" if n == 1 else (not_ready(path) if n == 2 else None)
    with KvcmClient(proxy.url, retries=3, backoff_s=0.1, sleep=sleeps.append) as client:
        storages = client.list_storage()
    assert "nfs_01" in [s.global_unique_name for s in storages.storage]
    assert proxy.requests["/api/listStorage"] == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2


def test_retries_give_up_after_the_budget(proxy: Proxy):
    proxy.rule = lambda path, n: not_ready(path)
    with KvcmClient(proxy.url, retries=2, sleep=lambda s: None) as client:
        with pytest.raises(KvcmError) as caught:
            client.get_metrics()
    assert caught.value.code == ErrorCode.SERVICE_NOT_READY and proxy.requests["/api/getMetrics"] == 3


def test_other_methods_are_sent_once(proxy: Proxy):
    proxy.rule = lambda path, n: "drop" if path == "/api/startWriteCache" else not_ready(path)
    with KvcmClient(proxy.url, retries=3, sleep=lambda s: None) as client:
        with pytest.raises(TransportError):
            client.start_write_cache(instance_id="sdk-1", block_keys=[7])
        with pytest.raises(KvcmError) as caught:
            client.add_storage(storage=m.StorageConfig(global_unique_name="x", nfs=m.NfsStorageSpec(root_path="/x")))
    assert caught.value.code == ErrorCode.SERVICE_NOT_READY
    assert proxy.requests["/api/startWriteCache"] == 1 and proxy.requests["/api/addStorage"] == 1


def test_leader_discovery_moves_to_the_announced_leader(stack: LocalStack, proxy: Proxy):
    host, port = stack.api_url.removeprefix("http://").split(":")
    proxy.rule = lambda path, n: (
        {
            "header": {"status": {"code": "OK"}},
            "self_node_id": "b",
            "leader_node_id": "a",
            "leader_endpoint": {"node_id": "a", "host": host, "meta_http_port": int(port)},
        }
        if path == "/api/getClusterInfo"
        else None
    )
    with KvcmClient(proxy.url, auto_discover_leader=True) as client:
        assert client.url == stack.api_url
        client.list_storage()
    assert "/api/listStorage" not in proxy.requests


def test_not_leader_answers_rediscover_and_retry(stack: LocalStack, proxy: Proxy):
    host, port = stack.api_url.removeprefix("http://").split(":")
    leader = {"header": {"status": {"code": "OK"}}, "leader_endpoint": {"host": host, "meta_http_port": int(port)}}
    # The first discovery names nobody; the call then hits a follower, which says so.
    proxy.rule = lambda path, n: (
        (leader if n > 1 else {"header": {"status": {"code": "OK"}}})
        if path == "/api/getClusterInfo"
        else {"header": {"status": {"code": "SERVER_NOT_LEADER", "message": "not leader"}}}
    )
    with KvcmClient(proxy.url, auto_discover_leader=True, sleep=lambda s: None) as client:
        assert client.url == proxy.url
        assert "nfs_01" in [s.global_unique_name for s in client.list_storage().storage]
        assert client.url == stack.api_url


def test_without_get_cluster_info_the_seed_url_stays(stack: LocalStack):
    with KvcmClient(stack.api_url, auto_discover_leader=True) as client:
        assert client.url == stack.api_url
        assert client.check_health().is_health


def test_auth_refusals_raise_auth_error_and_are_not_retried(stack: LocalStack, auth_on):
    from kvcm_client import AuthError

    with KvcmClient(stack.api_url, retries=3, sleep=lambda s: pytest.fail("an auth refusal was retried")) as client:
        with pytest.raises(AuthError) as caught:
            client.list_storage()
    assert caught.value.http_status == 401 and caught.value.code != ErrorCode.OK
    with KvcmClient(stack.api_url, token=auth_on) as client:
        assert client.list_storage().storage
