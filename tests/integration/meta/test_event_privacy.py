"""The event log (issue 11.10): off unless configured, and block keys only — a request's
token_ids are prompt content and are written only when KVCM_EVENT_LOG_TOKENS asks."""

from __future__ import annotations

import json

import pytest
from chalice.test import Client

from chalicelib.observability.events import EventLog
from chalicelib.protocol.block_keys import keys_from_tokens
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import api_caller, build_runtime
from tests.integration.meta.harness import SPECS

TOKENS = list(range(100, 112))  # three blocks of four


@pytest.fixture
def logged_calls(valkey, valkey_url, aws, clock, tmp_path):
    def run(**settings) -> list[dict]:
        log = tmp_path / "events.log"
        runtime = build_runtime(valkey, valkey_url, clock, event_log_path=str(log), **settings)
        (tmp_path / "nfs").mkdir(exist_ok=True)
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 4}}
            )
        )
        runtime.control.create_group(InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["nfs_01"]}))
        import app

        with Client(app.app) as client:
            post = api_caller(client)
            post(
                "registerInstance",
                {
                    "instance_group": "g1",
                    "instance_id": "i1",
                    "block_size": 4,
                    "location_spec_infos": SPECS,
                    "model_deployment": {"model_name": "m", "dtype": "fp16"},
                },
            )
            post("startWriteCache", {"instance_id": "i1", "token_ids": TOKENS})
            post("getCacheLocation", {"instance_id": "i1", "token_ids": TOKENS, "query_type": "QT_PREFIX_MATCH"})
        set_runtime(None)
        return [json.loads(line) for line in log.read_text().splitlines()]

    return run


def test_events_carry_keys_not_token_ids_by_default(logged_calls):
    events = logged_calls()
    assert [e["type"] for e in events] == ["StartWriteCache", "GetCacheLocation"]
    for event in events:
        assert event["tokens"] == [] and event["keys"] == keys_from_tokens(TOKENS, 4)
    assert "100" not in json.dumps([e["tokens"] for e in events])


def test_token_ids_only_when_asked_for(logged_calls):
    events = logged_calls(event_log_tokens=True)
    assert all(e["tokens"] == TOKENS and e["keys"] == keys_from_tokens(TOKENS, 4) for e in events)


def test_the_log_is_off_unless_configured_on_lambda_too(monkeypatch, capsys):
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "kvcm-api")
    assert not EventLog.from_settings("").enabled
    log = EventLog.from_settings("stdout")
    log.publish("i1", "FinishWriteCache", 1)
    assert '"type":"FinishWriteCache"' in capsys.readouterr().out
