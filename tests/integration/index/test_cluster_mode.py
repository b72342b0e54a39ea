"""The index through redis-py's cluster client against a real cluster-mode Valkey (one
node holding every slot): scripts, cross-instance pipelines and the lease route by hash
tag as they must on ElastiCache Serverless."""

import pytest

from chalicelib.clock import SystemClock
from chalicelib.index import BlockIndex
from chalicelib.index.types import MODE_PREFIX, StartRequest
from chalicelib.stores.lease import Lease
from tests.helpers import valkey_cluster


@pytest.fixture
def cluster(tmp_path):
    with valkey_cluster(tmp_path, 1) as client:
        yield client


def test_index_and_lease_on_a_cluster(cluster):
    index = BlockIndex(cluster, "kvcm", SystemClock())
    layout, other = index.layout("inst", 4), index.layout("other", 4)
    index.start(layout, [1, 2, 3], StartRequest("s1", 2**47, "nfs", "ST_NFS", 8, [200], [0, 0, 0]))
    assert index.due_sessions(["inst", "other"], 2**48) == {"inst": ["s1"]}
    finished = index.finish(layout, "s1", index.session(layout, "s1"), [True, True, False], [200])
    expired, victims = finished.expired, finished.victims
    assert not expired and [v.block_key for v in victims] == [3]
    assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 2
    usage = index.usage([layout, other])
    assert (usage[0].bytes, usage[1].bytes) == (600, 0)
    assert index.drop(layout, victims, [200]).dropped == 1
    index.drop_all(layout)
    assert list(index.scan(layout)) == []
    lease = Lease(cluster, prefix="kvcm", node_id="n1", ttl_ms=1000, clock=SystemClock())
    assert lease.try_acquire() and lease.holder() == "n1"


def test_a_sampled_read_and_a_mark_pipeline_their_extra_command_on_a_cluster(cluster):
    # a cluster pipeline refuses its evalsha method: the script goes as a plain command
    from chalicelib.observability.hit_feed import PREFIX, READ, STREAM_SUFFIX, FeedEntry

    index = BlockIndex(cluster, "kvcm", SystemClock())
    layout = index.layout("inst", 4)
    index.start(layout, [1, 2], StartRequest("s1", 2**47, "nfs", "ST_NFS", 8, [200], [0, 0]))
    index.finish(layout, "s1", index.session(layout, "s1"), [True, True], [200])
    assert len(index.read_raw(layout, [1, 2], MODE_PREFIX, feed=FeedEntry(READ, PREFIX, [1, 2]))) == 2
    assert cluster.xlen(layout.key(STREAM_SUFFIX)) == 1
    assert [v.block_key for v in index.mark_deleting(layout, [2], [200])] == [2]
    assert len(index.due_deletions(2**40, 10)["inst"]) == 1


def test_a_read_follows_its_slot_to_the_node_it_moved_to(tmp_path):
    """A re-sharding moves an instance's slot while the client's slot map still names the
    old node: the read's MULTI there is answered MOVED, and it is sent once more to the node
    holding the slot now."""
    import redis

    with valkey_cluster(tmp_path, 2) as cluster:
        index = BlockIndex(cluster, "kvcm", SystemClock())
        layout = index.layout("inst", 4)
        index.start(layout, [1, 2, 3], StartRequest("s1", 2**47, "nfs", "ST_NFS", 8, [200], [0, 0, 0]))
        index.finish(layout, "s1", index.session(layout, "s1"), [True, True, True], [200])
        assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 3
        slot = cluster.keyslot(layout.key("m"))
        source = cluster.get_node_from_key(layout.key("m"))
        target = next(n for n in cluster.get_primaries() if n.name != source.name)
        src = redis.Redis(host=source.host, port=source.port)
        dst = redis.Redis(host=target.host, port=target.port)
        src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        for node in (src, dst):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        assert cluster.get_node_from_key(layout.key("m")).name == source.name  # the map is stale
        assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 3
        assert cluster.get_node_from_key(layout.key("m")).name == target.name
