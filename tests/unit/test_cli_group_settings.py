"""``kvcm group add|update`` refuses settings that are almost surely mistakes (a percentage
given as the watermark fraction, a quota in bytes meant in GiB) before calling the API, and
``kvcm usage`` says when a group's reclaim is off."""

from __future__ import annotations

import pytest

from chalicelib.protocol import models as m
from kvcm_client.cli import EXIT_USAGE, apply_group_options, group_doubts, main, parse_watermark, usage_rows


@pytest.mark.parametrize(
    "options, named",
    [
        (["--watermark", "80"], "--watermark 80"),
        (["--watermark", "150%"], "--watermark 150%"),
        (["--quota", "100"], "--quota 100"),
        (["--quota", "64KiB"], "--quota 64KiB"),
    ],
)
def test_a_likely_mistake_is_refused_before_any_call(capsys, options, named):
    # No server: the unit tier's guard fails the test if the CLI tried to reach one.
    for command in (["group", "add", "gx", "--storage", "nfs_01"], ["group", "update", "gx"]):
        status = main(
            [
                "--url",
                "http://127.0.0.1:9",
                *command,
                *(["--quota", "1GiB"] if "--quota" not in options else []),
                *options,
            ]
        )
        err = capsys.readouterr().err
        assert status == EXIT_USAGE, err
        assert named in err and "--force" in err


def test_the_watermark_is_a_fraction_or_a_percentage():
    assert parse_watermark("0.8") == 0.8 and parse_watermark("80%") == 0.8 and parse_watermark(" 95.5 % ") == 0.955
    for bad in ("", "x", "-0.1", "0", "0%", "nan", "inf"):
        with pytest.raises(Exception, match="watermark"):
            parse_watermark(bad)


def test_what_is_refused_and_what_force_applies_as_given():
    group = apply_group_options(m.InstanceGroup(name="gx"), ["nfs_01"], "1GiB", "80%", None)
    assert group.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 0.8
    assert group_doubts(group) == []
    off = apply_group_options(m.InstanceGroup(name="gx"), ["nfs_01"], "1GiB", "80", None)
    assert off.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 80  # upstream: reclaim off
    (doubt,) = group_doubts(off)
    assert "80" in doubt and "80%" in doubt and "never" in doubt
    tiny = apply_group_options(m.InstanceGroup(name="gx"), ["nfs_01"], "100", None, None)
    (doubt,) = group_doubts(tiny)
    assert "100 bytes" in doubt
    # 0 is unlimited, not tiny; a per-storage-type quota in bytes is doubted as well
    assert group_doubts(apply_group_options(m.InstanceGroup(name="gx"), ["nfs_01"], "0", None, None)) == []
    typed = m.InstanceGroup(
        name="gx", quota=m.InstanceGroupQuota(quota_config=[m.QuotaConfig(storage_type="ST_NFS", capacity=512)])
    )
    assert "quota.quota_config[0].capacity" in group_doubts(typed)[0]


def test_usage_says_when_reclaim_is_off():
    usage = [
        m.InstanceGroupUsage(name="on", capacity=2**30, watermark_bytes=int(0.9 * 2**30)),
        m.InstanceGroupUsage(name="off", capacity=2**30, watermark_bytes=80 * 2**30),
        m.InstanceGroupUsage(name="unlimited"),
    ]
    rows = usage_rows(usage, 3)
    assert rows[0][4] == "921.6 MiB" and rows[1][4] == "off (80.0 GiB > quota)" and rows[2][4] == "-"


def test_the_json_option_says_int64_values_are_strings(capsys):
    assert main(["--help"]) == 0
    assert "int64 values are strings" in " ".join(capsys.readouterr().out.split())
