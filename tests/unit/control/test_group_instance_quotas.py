"""The KVCM extension fields of a group: ``instance_quotas`` and ``tuning`` (validation and
defaults; bad input names the field)."""

import pytest

from chalicelib.control.groups import MAX_INSTANCE_QUOTAS, default_tuning, normalize_group
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import InstanceGroup


def group(**fields) -> InstanceGroup:
    return InstanceGroup.model_validate(
        {"name": "g", "storage_candidates": ["nfs1"], "quota": {"capacity": 1000}, **fields}
    )


def test_instance_quotas_and_tuning_are_kept_with_defaults_filled_in():
    g = normalize_group(group(instance_quotas={"i1": "600", "i2": 400}, tuning={"enabled": True}))
    assert g.instance_quotas == {"i1": 600, "i2": 400}
    assert (g.tuning.enabled, g.tuning.max_shift, g.tuning.min_gain, g.tuning.window_seconds) == (True, 0.2, 0.0, 3600)
    assert normalize_group(group()).tuning is None and normalize_group(group()).instance_quotas == {}
    assert default_tuning().enabled is False and default_tuning().max_shift == 0.2
    # rendered as proto3 JSON renders a map<string, int64>
    assert g.model_dump(mode="json")["instance_quotas"] == {"i1": "600", "i2": "400"}


@pytest.mark.parametrize(
    "fields, path",
    [
        ({"instance_quotas": {"i1": -1}}, "instance_group.instance_quotas.i1"),
        ({"instance_quotas": {"i1": 0}}, "instance_group.instance_quotas.i1"),
        ({"instance_quotas": {"i{1}": 5}}, "instance_group.instance_quotas.i{1}"),
        ({"instance_quotas": {"": 5}}, "instance_group.instance_quotas"),
        ({"instance_quotas": {"i1": 600, "i2": 401}}, "instance_group.instance_quotas"),
        ({"instance_quotas": {f"i{n}": 1 for n in range(MAX_INSTANCE_QUOTAS + 1)}}, "instance_group.instance_quotas"),
        ({"tuning": {"max_shift": 1.5}}, "instance_group.tuning.max_shift"),
        ({"tuning": {"max_shift": -0.1}}, "instance_group.tuning.max_shift"),
        ({"tuning": {"min_gain": -0.01}}, "instance_group.tuning.min_gain"),
        ({"tuning": {"window_seconds": -1}}, "instance_group.tuning.window_seconds"),
        ({"tuning": {"enabled": True}, "quota": {"capacity": 0}}, "instance_group.tuning.enabled"),
    ],
)
def test_bad_fields_are_named(fields, path):
    with pytest.raises(InvalidArgumentError, match=f"field '{path.replace('{', '[{]').replace('}', '[}]')}'"):
        normalize_group(group(**fields))


def test_without_a_group_quota_instance_quotas_have_no_sum_bound():
    g = normalize_group(group(quota={"capacity": 0}, instance_quotas={"i1": 10**12}))
    assert g.instance_quotas == {"i1": 10**12}
