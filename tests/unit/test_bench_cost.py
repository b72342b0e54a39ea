"""bench/bench_cost.py's bill: the arithmetic from measured figures to dollars (pure logic;
the measuring runs in the bench against a real Valkey and moto)."""

from __future__ import annotations

import math

import pytest

from bench.bench_cost import EVENTS_PER_CALL, PRICES, SECONDS_PER_MONTH, Figures, Model, lambda_memory_mb


def model(**overrides) -> Model:
    read = Figures(cpu_us=900, valkey_cpu_us=100, round_trips=2, commands=2, log_b=200, request_b=1000, response_b=9000)
    write = Figures(
        cpu_us=1500,
        valkey_cpu_us=500,
        round_trips=4,
        commands=6,
        log_b=400,
        extra={"valkey_bytes_per_block": 64},
        invocations=2,
    )
    report = Figures(cpu_us=40_000, valkey_cpu_us=5000, round_trips=1, commands=1, net_in_b=150_000, log_b=200)
    refresh = Figures(rru=1.0, extra={"interval_s": 2.0})
    values = {
        "figures": {"read": read, "write": write, "report": report, "host state": Figures(), "config refresh": refresh},
        "memory_gb": 1769 / 1024,
        "get_cpu_us": 20.0,
        "rtt_us": 300.0,
        "keys_per_call": 128,
        "blocks": 20_000_000,
        **overrides,
    }
    return Model(**values)


def test_the_memory_size_is_the_api_functions():
    assert lambda_memory_mb() == 1769


def test_a_call_is_billed_in_whole_milliseconds_of_cpu_valkey_and_round_trips():
    m = model()
    read = m.figures["read"]
    assert read.duration_ms(m.rtt_us) == pytest.approx((900 + 100 + 2 * 300) / 1000)
    # 1.6 ms is billed as 2 ms at 1769 MB
    assert m.per_call(read)["Lambda duration"] == pytest.approx(0.002 * 1769 / 1024 * PRICES["lambda_gb_s"].usd)


def test_each_invocation_of_a_two_phase_write_is_billed_apart():
    m = model()
    write = m.figures["write"]  # 3.2 ms of work over two invocations: 2 ms each
    assert write.billed_ms(m.rtt_us) == 4
    assert m.per_call(write)["Lambda requests"] == pytest.approx(2 * PRICES["lambda_request"].usd)


def test_ecpus_are_the_largest_of_commands_kilobytes_and_cpu_in_gets():
    assert Figures(commands=2, valkey_cpu_us=100).ecpu(get_cpu_us=20) == 5  # CPU: 5 GETs' worth
    assert Figures(commands=1, net_in_b=150_000).ecpu(get_cpu_us=20) == pytest.approx(146.48, abs=0.01)  # bytes
    assert Figures(commands=6, valkey_cpu_us=20).ecpu(get_cpu_us=20) == 6  # commands


def test_an_engine_request_is_a_read_a_two_phase_write_and_its_events():
    m = model()
    calls = [n for _, n in m.engine_request()]
    assert calls == [1.0, 1.0, 128 / EVENTS_PER_CALL]
    lines = m.monthly(100)
    # the two-phase write is two invocations, each a front-door request
    requests = 100 * (1 + 2 + 128 / EVENTS_PER_CALL) * SECONDS_PER_MONTH
    assert lines["Lambda requests"] == pytest.approx(requests * 0.20e-6)
    assert lines["rest_api"] == pytest.approx(requests * 3.50e-6)
    assert lines["http_api"] == pytest.approx(requests * 1.00e-6)
    assert lines["function_url"] == 0


def test_config_refreshes_are_billed_per_container():
    m = model()
    busy_s = (0.9 + 0.1 + 0.6) / 1000 + (1.5 + 0.5 + 1.2) / 1000 + 128 / 1000 * (40 + 5 + 0.3) / 1000
    assert m.containers(1000) == pytest.approx(1000 * busy_s)
    assert m.containers(1) == 1.0  # at least one warm container
    reads = m.monthly(1000)["DynamoDB"] / PRICES["ddb_rru"].usd
    assert reads == pytest.approx(m.containers(1000) * SECONDS_PER_MONTH / 2.0)


def test_provisioned_valkey_is_sized_by_cpu_and_by_memory_with_a_replica_each():
    m = model()
    assert m.valkey_nodes(1) == 2  # one primary, one replica
    cpu_s = m.valkey_cpu_s(10_000)
    assert m.valkey_nodes(10_000) == 2 * math.ceil(cpu_s / 0.6)
    big = model(blocks=2_000_000_000)  # 128 GB of index: memory decides
    assert big.valkey_nodes(1) == 2 * math.ceil(128 / (13.07 * 1.073741824 * 0.75))


def test_break_even_is_where_the_fleet_stops_costing_more():
    m = model()
    rate = m.break_even()
    assert rate is not None
    assert m.fleet_total(rate) <= m.serverless_total(rate)
    assert m.fleet_total(rate / 1.02) > m.serverless_total(rate / 1.02)
