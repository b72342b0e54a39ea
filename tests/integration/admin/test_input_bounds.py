"""Configurations that used to be accepted and then failed every later call, invisible
characters in names, weak admin passwords (issue 28.9, 28.14, 28.16): refused at the
door with INVALID_ARGUMENT naming the field, nothing written."""

import pytest

from chalicelib.protocol.models import StorageConfig
from tests.helpers import SPECS
from tests.integration.control.harness import code, group, group_json, message, nfs, post, register_request, snapshot


def _register(**overrides) -> dict:
    body = {
        "instance_group": "g1",
        "instance_id": "i-new",
        "block_size": 16,
        "location_spec_infos": SPECS[:1],
        "model_deployment": {"model_name": "qwen", "dtype": "bf16"},
    }
    body.update(overrides)
    return body


@pytest.fixture
def populated(client, control):
    control.add_storage(StorageConfig.model_validate(nfs("nfs1")))
    control.create_group(group("g1", "nfs1"))
    return client


BIG = "x" * 420_000

REFUSED = [
    (
        "registerInstance",
        _register(location_spec_infos=[{"name": "tp0", "size": 2**62}]),
        "location_spec_infos[0].size",
    ),
    (
        "registerInstance",
        _register(location_spec_infos=[{"name": "tp0", "size": 2**40}, {"name": "tp1", "size": 2**62 - 2**40}]),
        "location_spec_infos",
    ),
    ("registerInstance", _register(model_deployment={"model_name": BIG, "dtype": "bf16"}), "model_name"),
    ("registerInstance", _register(model_deployment={"model_name": "q", "dtype": BIG}), "model_deployment.dtype"),
    ("registerInstance", _register(model_deployment={"model_name": "q", "dtype": "b", "lora_name": BIG}), "lora_name"),
    ("createInstanceGroup", {"instance_group": group_json("g2", "nfs1", user_data=BIG)}, "instance_group.user_data"),
    ("createInstanceGroup", {"instance_group": group_json("g2", "nfs1", extra_info=BIG)}, "instance_group.extra_info"),
    (
        "createInstanceGroup",
        {"instance_group": group_json("g2", "nfs1", revisit_interval_buckets=BIG)},
        "instance_group.revisit_interval_buckets",
    ),
    # Invisible and bidi characters: Cf (format), Zl, Zp (separators), Co (private use).
    *[
        ("registerInstance", _register(instance_id=f"engine{char}1"), "instance_id")
        for char in ("\u200b", "\u202e", "\ufeff", "\u00ad", "\u2060", "\u2028", "\u2029", "\ue000")
    ],
    ("createInstanceGroup", {"instance_group": group_json("g\u200b2", "nfs1")}, "instance_group.name"),
    ("registerInstance", _register(location_spec_infos=[{"name": "tp\u202e0", "size": 1}]), "location_spec_infos[0]"),
    ("addAccount", {"user_name": "ro\u200bot", "role": "ROLE_USER"}, "user_name"),
    # Weak admin passwords: common patterns pass a length check.
    ("addAccount", {"user_name": "admin2", "password": "Password1234", "role": "ROLE_ADMIN"}, "password"),
    ("addAccount", {"user_name": "admin2", "password": "qwerty123456", "role": "ROLE_ADMIN"}, "password"),
    ("addAccount", {"user_name": "admin2", "password": "abcdefghijkl", "role": "ROLE_ADMIN"}, "password"),
    ("addAccount", {"user_name": "admin2", "password": "admin2admin2!", "role": "ROLE_ADMIN"}, "password"),
]


@pytest.mark.parametrize("method, body, field", REFUSED, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(REFUSED)])
def test_unbounded_or_invisible_input_is_refused_naming_the_field(populated, runtime, method, body, field):
    before = snapshot(runtime)
    status, data = post(populated, method, body)
    assert (status, code(data)) == (200, "INVALID_ARGUMENT"), data["header"]
    assert "field '" in message(data) and field in message(data), message(data)
    assert len(message(data)) < 1024
    assert snapshot(runtime) == before


def test_bounds_leave_ordinary_values_alone(populated):
    body = _register(
        instance_id="Qwen/Qwen3-8B@10.0.0.1:8000-ünïcode",
        location_spec_infos=[{"name": "tp0", "size": 2**30}, {"name": "tp1", "size": 2**30}],
        model_deployment={"model_name": "Qwen/Qwen3-8B", "dtype": "bf16", "user_data": "u" * 60_000},
    )
    assert code(post(populated, "registerInstance", body)[1]) == "OK"
    strong = {"user_name": "admin3", "password": "correct horse battery staple", "role": "ROLE_ADMIN"}
    assert code(post(populated, "addAccount", strong)[1]) == "OK"


def test_a_body_of_bad_list_items_gets_a_bounded_message(populated, control):
    """Issue 28.4: 500,000 bad strings (2.5 MB) answered 28.9 MB of INVALID_ARGUMENT after
    seconds of CPU: an over-long key list is refused by its length, another list stops at
    its first bad item (bench/bench_validation.py has the costs)."""
    control.register_instance(register_request("i1", "g1"))
    refusals = {
        "block_keys": "field 'block_keys': 500000 keys exceed the limit of 16384",
        "token_ids": "field 'token_ids[0]': expected an integer, got 'x'",
    }
    for field, expected in refusals.items():
        body = {"instance_id": "i1", "query_type": "QT_BATCH_GET", field: ["x"] * 500_000}
        status, data = post(populated, "getCacheLocation", body)
        assert (status, code(data), message(data)) == (200, "INVALID_ARGUMENT", expected)
