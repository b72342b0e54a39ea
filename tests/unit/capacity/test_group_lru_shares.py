"""How Group-LRU shares a round's sample among a group's instances (pure)."""

from chalicelib.capacity.instance import sample_shares


def test_half_is_even_half_follows_the_key_counts():
    # 100 candidates: 50 evenly (25 each), 50 by keys (40 and 10)
    assert sample_shares(100, {"a": 800, "b": 200}) == {"a": 65, "b": 35}


def test_the_shares_add_up_exactly_with_largest_remainders():
    shares = sample_shares(101, {"a": 1, "b": 1, "c": 1})
    assert sum(shares.values()) == 101
    assert sorted(shares.values()) == [33, 34, 34]


def test_one_instance_gets_everything():
    assert sample_shares(37, {"only": 5}) == {"only": 37}


def test_empty_instances_and_no_sample_get_nothing():
    assert sample_shares(10, {"a": 0, "b": 4}) == {"b": 10}
    assert sample_shares(0, {"a": 3}) == {}
    assert sample_shares(10, {}) == {}
