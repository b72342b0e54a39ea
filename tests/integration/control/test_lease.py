"""The background-job lease on a real Valkey (TTL expiry via PEXPIRE, time via ManualClock)."""

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.stores.lease import Lease
from chalicelib.valkey import ValkeyUnavailableError
from tests.helpers import free_port

TTL_MS = 10_000


@pytest.fixture
def make(valkey, clock):
    def make_lease(node_id, **kwargs):
        return Lease(valkey, prefix="kvcmtest", node_id=node_id, ttl_ms=TTL_MS, clock=clock, **kwargs)

    return make_lease


@pytest.fixture
def a(make):
    return make("node-a")


@pytest.fixture
def b(make):
    return make("node-b")


def holder_key(valkey):
    keys = valkey.keys("*holder")
    assert len(keys) == 1
    return keys[0]


def expire_now(valkey):
    valkey.pexpire(holder_key(valkey), 1)
    time.sleep(0.005)


def test_one_holder_at_a_time(a, b, clock, valkey):
    assert a.try_acquire()
    assert not b.try_acquire()
    assert a.holder() == b.holder() == "node-a"
    assert a.is_held() and not b.is_held()
    assert a.expires_at_us() == pytest.approx(clock.now() * 1e6 + TTL_MS * 1000, abs=50_000)
    assert b.expires_at_us() == 0
    assert b.status().holder == "node-a"


def test_renew_extends_only_our_own_lease(a, b, valkey):
    assert not a.renew()  # nobody holds it: renew never takes it
    assert a.holder() is None
    assert a.try_acquire()
    valkey.pexpire(holder_key(valkey), 500)
    assert not b.renew()
    assert valkey.pttl(holder_key(valkey)) <= 500
    assert a.renew()
    assert valkey.pttl(holder_key(valkey)) > TTL_MS - 1000


def test_release_is_compare_and_delete(a, b):
    assert a.try_acquire()
    assert not b.release()
    assert a.holder() == "node-a"
    assert a.release()
    assert a.holder() is None and not a.is_held()
    assert not a.release()


def test_expired_lease_goes_to_another_node(a, b, valkey):
    assert a.try_acquire()
    expire_now(valkey)
    assert a.holder() is None and a.expires_at_us() == 0
    assert b.try_acquire()
    assert not a.try_acquire()
    assert not a.renew()
    assert a.holder() == "node-b"


def test_campaign_delay_after_losing_the_lease(a, b, valkey, clock):
    a.set_campaign_delay_ms(5_000)
    assert a.try_acquire()
    expire_now(valkey)
    assert b.try_acquire()
    assert not a.try_acquire()  # a learns it lost the lease now
    assert b.release()
    clock.advance(4.9)
    assert not a.try_acquire()  # free, but a is still in its campaign delay
    assert a.holder() is None
    clock.advance(0.2)
    assert a.try_acquire()


def test_campaign_delay_after_release(a, b, clock):
    assert a.try_acquire()
    a.release()
    assert a.try_acquire()  # default delay 0: may campaign right away
    b.set_campaign_delay_ms(1_000)
    a.release()
    assert not a.try_acquire()
    assert b.try_acquire()  # b never lost or released anything: no delay for it
    b.release()
    clock.advance(1.0)
    assert a.try_acquire()


def test_config_is_shared_and_validated(a, b, make):
    assert a.campaign_delay_ms() == 0
    assert make("node-c", default_campaign_delay_ms=250).campaign_delay_ms() == 250
    a.set_campaign_delay_ms(1234)
    assert b.campaign_delay_ms() == 1234
    with pytest.raises(InvalidArgumentError, match="field 'campaign_delay_time_ms' must be >= 0"):
        b.set_campaign_delay_ms(-1)
    assert a.campaign_delay_ms() == 1234


def test_last_loop_time_is_the_last_step_of_any_node(a, b, clock):
    assert a.last_loop_time_ms() == 0
    a.try_acquire()
    first = int(clock.now() * 1000)
    assert b.last_loop_time_ms() == first
    clock.advance(3)
    b.try_acquire()  # a losing campaign is still a loop step
    assert a.last_loop_time_ms() == first + 3000
    clock.advance(1)
    a.renew()
    assert a.last_loop_time_ms() == first + 4000


def test_valkey_unreachable(clock):
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    lease = Lease(dead, prefix="kvcmtest", node_id="n", ttl_ms=TTL_MS, clock=clock)
    for call in (
        lease.try_acquire,
        lease.renew,
        lease.release,
        lease.holder,
        lease.campaign_delay_ms,
        lease.last_loop_time_ms,
        lambda: lease.set_campaign_delay_ms(5),
    ):
        with pytest.raises(ValkeyUnavailableError):
            call()
