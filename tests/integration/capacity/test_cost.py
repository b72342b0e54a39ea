"""A round's cost follows the sample, not the instance: 1k and 50k blocks cost the same."""

from __future__ import annotations

import random

import pytest

from chalicelib.clock import ManualClock
from chalicelib.index import BlockIndex

from .harness import Cluster, counting_client, make_group, server_calls


def measured_round(valkey_url: str, blocks: int, victims: int = 20) -> tuple[int, int, int]:
    """(round trips, server commands, victims) of one round freeing ``victims`` blocks of
    an instance holding ``blocks`` blocks in chains of 10, its buckets grown for them."""
    client, counting = counting_client(valkey_url)
    client.flushall()
    clock = ManualClock()
    cluster = Cluster(BlockIndex(client, "t", clock), clock, rng=random.Random(5))
    cluster.add_instance("i1")
    cluster.bulk_chains("i1", count=blocks // 10, length=10)

    def lower_to(remaining: int) -> None:
        # the group stays due: the round before freed something
        cluster.group = make_group(capacity_blocks=blocks, used_percentage=remaining / blocks, step_percentage=100)

    reclaimer = cluster.reclaimer()
    lower_to(blocks - victims)
    assert reclaimer.run_round().victims == victims  # warms the scripts up
    lower_to(blocks - 2 * victims)
    client.config_resetstat()
    sends_before = counting.sends
    report = reclaimer.run_round()
    trips = counting.sends - sends_before
    calls = server_calls(client)
    client.close()
    return trips, calls, report.victims


@pytest.fixture(scope="module")
def costs(valkey_url):
    return {n: measured_round(valkey_url, n) for n in (1_000, 50_000)}


def test_round_cost_does_not_grow_with_the_number_of_blocks(costs):
    (small_trips, small_calls, small_victims), (big_trips, big_calls, big_victims) = costs[1_000], costs[50_000]
    assert small_victims == big_victims == 20
    assert big_trips <= small_trips + 2, costs
    assert big_calls <= 1.5 * small_calls, costs
    # and it is small in absolute terms: no scan of the 50k blocks
    assert big_calls < 1_000, costs
