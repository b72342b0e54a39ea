"""The console in a real headless Chromium (Debian's package, driven by Playwright) against the
local stack: every page loads and shows the seeded group's numbers; a screenshot of each page
(and of /docs) is saved in out/console-screenshots/ for people to look at."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chalicelib.protocol import models as m
from kvcm_client import KvcmClient, KvcmError
from kvcm_client.cli import human_size
from local_stack import LocalStack

from .harness import run_execution

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "out" / "console-screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = ["groups", "instances", "storages", "traffic", "capacity"]
SPEC_BYTES = 64 * 1024


def _require_browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's package")
        pytest.skip("no chromium (make test installs it)")
    return pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    playwright_api = _require_browser()
    with playwright_api.sync_playwright() as playwright:
        # A persistent context on a fresh profile folder: the --user-data-dir of this run only.
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def _write(client: KvcmClient, instance_id: str, keys: list[int]) -> None:
    """Register ``instance_id`` in the seeded group and write ``keys``."""
    client.register_instance(
        instance_group="default",
        instance_id=instance_id,
        block_size=16,
        location_spec_infos=[m.LocationSpecInfo(name="tp0", size=SPEC_BYTES)],
        model_deployment=m.ModelDeployment(model_name="qwen", dtype="bf16"),
    )
    session = client.start_write_cache(instance_id=instance_id, block_keys=keys).write_session_id
    client.finish_write_cache(instance_id=instance_id, write_session_id=session, success_blocks={"offset": len(keys)})


@pytest.fixture(scope="module")
def seeded(stack: LocalStack) -> Iterator[dict]:
    """Blocks written in the seeded group, reads for the hit ratio, and a sweep if none ran.

    The event-report storage it adds is removed afterwards: the stack is shared by the package."""
    with KvcmClient(stack.api_url) as client:
        _write(client, "console-1", list(range(1, 11)))
        for _ in range(3):  # 3 of 4 asked blocks found each time: 75 %
            client.get_cache_location(instance_id="console-1", query_type="QT_PREFIX_MATCH", block_keys=[1, 2, 3, 999])
        # A second instance at 100 %: the headline ratio weighs instances by blocks asked.
        _write(client, "console-2", [1])
        client.get_cache_location(instance_id="console-2", query_type="QT_PREFIX_MATCH", block_keys=[1])
        # An event-report storage: a type and no spec.
        client.add_storage(
            storage=m.StorageConfig.model_validate(
                {"global_unique_name": "console_er", "storage_type": "ST_EVENT_REPORT_L1P5", "event_report": {}}
            )
        )
        # A refused call, counted under its code.
        with pytest.raises(KvcmError) as refused:
            client.get_cache_location(instance_id="nosuch", query_type="QT_PREFIX_MATCH", block_keys=[1])
        assert refused.value.code.name == "INSTANCE_NOT_EXIST"
        if not client.get_capacity_report().curves:
            s3 = stack.aws.client("s3")
            bucket = f"console-{uuid.uuid4().hex[:8]}"
            s3.create_bucket(Bucket=bucket)
            trace = "".join(
                json.dumps({"timestamp": t, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2, t % 3 + 3]})
                + "\n"
                for t in range(12)
            )
            s3.put_object(Bucket=bucket, Key="t.jsonl", Body=trace.encode())
            execution = run_execution(
                stack,
                "optimizer_sweep",
                {
                    "trace": {"bucket": bucket, "key": "t.jsonl", "format": "mooncake"},
                    "capacities": [1, 3, 100_000],  # a wide last label: never clipped
                    "policies": ["lru"],
                    "output": {"bucket": bucket, "prefix": "console"},
                },
                timeout_s=120,
            )
            assert execution["status"] == "SUCCEEDED", execution
        usage = client.get_instance_group_usage(instance_group_name="default").usage[0]
    yield {"usage": usage}
    with KvcmClient(stack.api_url) as client:
        client.remove_storage(storage_unique_name="console_er")


def show(page, stack: LocalStack, name: str) -> None:
    page.goto(f"{stack.api_url}/console#{name}")
    page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
    assert page.is_visible(f"#page-{name}")


def save(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_groups_page_shows_the_seeded_groups_numbers(browser_page, stack: LocalStack, seeded):
    show(browser_page, stack, "groups")
    row = browser_page.locator("#groups-table tbody tr[data-group=default] td").all_inner_texts()
    usage = seeded["usage"]
    assert row[:7] == [
        "default",
        "100.0 GiB",
        human_size(usage.used_bytes),
        f"{100 * usage.used_bytes / usage.capacity:.1f}%",
        "90.0 GiB",
        f"{usage.key_count:,}",
        str(len(usage.instances)),
    ]
    assert usage.used_bytes >= 10 * SPEC_BYTES
    # The tiers cell: each storage's bytes (the seeded group has one, nfs_01), then each type's.
    (nfs,) = [s for s in usage.by_storage if s.storage_name == "nfs_01"]
    assert nfs.used_bytes == usage.used_bytes
    assert row[9].splitlines()[0] == f"nfs_01 (nfs): {human_size(nfs.used_bytes)}"
    assert browser_page.locator("#groups-table tr[data-group=default] .bar-mark").count() == 1
    assert browser_page.inner_text("#health") == "healthy"
    save(browser_page, "groups")


def test_groups_page_says_when_reclaim_is_off(browser_page, stack: LocalStack, seeded):
    """A watermark above the quota (upstream's used_percentage above 1) is shown as reclaim off,
    with no watermark mark on the bar."""
    name = f"off-{uuid.uuid4().hex[:6]}"
    with KvcmClient(stack.api_url) as client:
        client.create_instance_group(
            instance_group=m.InstanceGroup(
                name=name,
                storage_candidates=["nfs_01"],
                quota=m.InstanceGroupQuota(capacity=2**30),
                cache_config=m.CacheConfig(
                    reclaim_strategy=m.CacheReclaimStrategy(trigger_strategy=m.TriggerStrategy(used_percentage=80))
                ),
            )
        )
        try:
            show(browser_page, stack, "groups")
            row = browser_page.locator(f"#groups-table tbody tr[data-group={name}]")
            assert row.locator("td").nth(4).inner_text() == "off (80.0 GiB > quota)"
            assert row.locator(".bar-mark").count() == 0
            save(browser_page, "groups-reclaim-off")
        finally:
            client.remove_instance_group(name=name)


def test_instances_page_shows_usage_and_hit_ratio(browser_page, stack: LocalStack, seeded):
    show(browser_page, stack, "instances")
    rows = [r.locator("td").all_inner_texts() for r in browser_page.locator("#instances-table tbody tr").all()]
    mine = next(r for r in rows if r[0] == "console-1")
    assert mine[1:5] == ["default", "16", "tp0 64.0 KiB", "qwen (bf16)"]
    assert mine[5:] == ["640.0 KiB", "10", "75.0%"]
    save(browser_page, "instances")


def test_storages_page_shows_the_seeded_storage_and_its_health(browser_page, stack: LocalStack, seeded):
    show(browser_page, stack, "storages")
    rows = [r.locator("td").all_inner_texts() for r in browser_page.locator("#storages-table tbody tr").all()]
    nfs = next(r for r in rows if r[0] == "nfs_01")
    assert nfs[1] == "nfs" and nfs[2].endswith("nfs_01") and nfs[3:] == ["HEALTHY", ""]
    reported = next(r for r in rows if r[0] == "console_er")
    assert reported[1] == "event report l1p5"  # not an empty TYPE
    save(browser_page, "storages")


def test_a_group_without_storage_turns_the_badge_red_with_the_reason(browser_page, stack: LocalStack, tmp_path):
    """Issue 23 item 4: the badge is not green while a group has no storage to write to, and
    the Storages page says why the storage is out of service."""
    from chalicelib.runtime import get_runtime

    root = tmp_path / "mount"
    root.mkdir()
    with KvcmClient(stack.api_url) as client:
        client.add_storage(
            storage=m.StorageConfig.model_validate(
                {"global_unique_name": "console_gone", "nfs": {"root_path": str(root)}}
            )
        )
        client.create_instance_group(
            instance_group=m.InstanceGroup.model_validate(
                {"name": "console_gone_g", "storage_candidates": ["console_gone"], "quota": {"capacity": 1 << 30}}
            )
        )
        runtime = get_runtime()
        backend = runtime.storages.backend(runtime.control.get_storage("console_gone").config)
        try:
            root.rename(tmp_path / "moved")
            for _ in range(2):  # the two failed probes of a scheduled round
                runtime.storage_prober.probe([backend], 1.0, confirm=False)
            browser_page.goto("about:blank")  # a fresh load, not a hash change on the page already open
            show(browser_page, stack, "storages")
            assert browser_page.inner_text("#health") == "UNHEALTHY"
            assert "bad" in browser_page.get_attribute("#health", "class")
            banner = browser_page.inner_text("#health-problems")
            assert "instance group 'console_gone_g' has no storage to write to" in banner
            rows = [r.locator("td").all_inner_texts() for r in browser_page.locator("#storages-table tbody tr").all()]
            gone = next(r for r in rows if r[0] == "console_gone")
            assert gone[3] == "UNAVAILABLE" and "cannot write in" in gone[4] and str(root) in gone[4]
            save(browser_page, "storages-unhealthy")
        finally:
            client.remove_instance_group(name="console_gone_g")
            client.remove_storage(storage_unique_name="console_gone")
    browser_page.goto("about:blank")
    show(browser_page, stack, "storages")
    assert browser_page.inner_text("#health") == "healthy" and browser_page.is_hidden("#health-problems")


def test_traffic_page_shows_rates_and_the_hit_ratio(browser_page, stack: LocalStack, seeded):
    show(browser_page, stack, "traffic")
    # Rates need two samples: the page refreshes every 5 s.
    browser_page.wait_for_function("document.getElementById('request-rate').textContent !== '…'", timeout=20_000)
    assert float(browser_page.inner_text("#request-rate")) > 0
    # blocks found over blocks asked, over every instance: not the mean of their ratios
    with KvcmClient(stack.api_url) as client:
        metrics = client.get_metrics().metrics
    counts = {
        name: {
            t.tag_value: int(p.metric_value.int_value) for p in metrics if p.metric_name == name for t in p.metric_tags
        }
        for name in ("manager.get_cache_location_hit_block_counter", "manager.get_cache_location_query_block_counter")
    }
    found, asked = counts.values()
    weighted = sum(found.values()) / sum(asked.values())
    mean = sum(found.get(i, 0) / n for i, n in asked.items()) / len(asked)
    assert abs(weighted - mean) > 0.001  # the seeded instances tell them apart
    assert browser_page.inner_text("#hit-ratio") == f"{100 * weighted:.1f}%"
    rows = {r.locator("td").first.inner_text(): r for r in browser_page.locator("#traffic-table tbody tr").all()}
    assert "GetCacheLocation" in rows and "GetInstanceGroupUsage" in rows
    assert "INSTANCE_NOT_EXIST" in rows["GetCacheLocation"].locator("td").last.inner_text()
    save(browser_page, "traffic")


def test_capacity_page_plots_the_latest_sweep(browser_page, stack: LocalStack, seeded):
    show(browser_page, stack, "capacity")
    assert browser_page.is_visible("#capacity-report") and not browser_page.is_visible("#capacity-empty")
    assert browser_page.locator("#curve polyline.curve").count() >= 1
    assert browser_page.inner_text("#recommendation").startswith(("Recommendation:", "No capacity"))
    source = browser_page.inner_text("#capacity-source")
    assert source.startswith(("Sweep ", "Latest sweep")) and "Sweep ," not in source
    plot = browser_page.locator("#curve").bounding_box()
    for tick in browser_page.locator("#curve text.tick").all():  # no label clipped at the plot's edges
        box = tick.bounding_box()
        assert plot["x"] <= box["x"] and box["x"] + box["width"] <= plot["x"] + plot["width"] + 0.5, tick.inner_text()
    save(browser_page, "capacity")


def test_docs_page_renders_every_operation(browser_page, stack: LocalStack):
    browser_page.goto(f"{stack.api_url}/docs")
    browser_page.wait_for_selector(".opblock", timeout=20_000)
    exact = re.compile(r"^\s*/api/getCacheLocation\s*$")  # not getCacheLocationLen and its kin
    assert browser_page.locator(".opblock-summary-path", has_text=exact).count() == 1
    save(browser_page, "docs")


def test_with_auth_on_the_console_asks_for_an_admin_bearer(browser_page, stack: LocalStack, seeded, auth_on):
    page = browser_page.context.new_page()  # a new tab: no bearer kept yet
    try:
        page.goto(f"{stack.api_url}/console#groups")
        page.wait_for_selector("#signin:not([hidden])", timeout=20_000)
        assert page.locator("#groups-table tbody tr[data-group=default]").count() == 0
        assert page.inner_text("#signin-error") == ""  # asked for a bearer, no mistake made yet
        save(page, "signin-first")
        page.fill("#token", "nobody:wrong-password-123")
        page.click("#signin button")
        page.wait_for_function("document.getElementById('signin-error').textContent.includes('nobody')", timeout=20_000)
        save(page, "signin")
        page.fill("#token", auth_on)
        page.click("#signin button")
        page.wait_for_selector("body[data-loaded=true]", timeout=20_000)
        assert page.is_hidden("#signin")
        assert page.locator("#groups-table tbody tr[data-group=default] td").first.inner_text() == "default"
    finally:
        page.close()
