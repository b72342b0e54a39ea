"""removeInstance and whole-instance trims as purges: inline for a small instance, the
``instance_purge`` state machine (real ASL in moto) for the rest."""

from pathlib import Path

import pytest

from chalicelib.cache import purge
from chalicelib.control.errors import InstanceRemovingError
from chalicelib.index.types import MODE_RAW
from chalicelib.protocol.errors import InstanceNotFoundError
from chalicelib.protocol.models import (
    FinishWriteCacheRequest,
    RegisterInstanceRequest,
    RemoveInstanceRequest,
    StartWriteCacheRequest,
)
from tests.helpers import SPECS

from .harness import wait_for
from .test_workflows import _write_files


def _write(rt, keys, instance_id="i1") -> list[Path]:
    """Start, write the files at the URIs' paths, finish: the blocks are SERVING."""
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance_id, block_keys=keys))
    paths = _write_files(start)
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest.model_validate(
            {
                "instance_id": instance_id,
                "write_session_id": start.write_session_id,
                "success_blocks": {"offset": len(start.locations)},
            }
        )
    )
    return paths


def _register(rt, instance_id="i1", block_size=4):
    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g1",
                "instance_id": instance_id,
                "block_size": block_size,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )


@pytest.mark.slow  # waits for a state machine run on the wall clock
def test_a_large_instance_is_handed_to_the_state_machine_and_removed_with_its_data(stack, monkeypatch):
    rt = stack.runtime
    rt.reconfigure(purge_state_machine_arn=stack.machines["instance_purge"])
    monkeypatch.setattr(purge, "INLINE_BLOCKS", 8)
    monkeypatch.setattr(purge, "BUCKETS_PER_STEP", 4)
    files = [p for first in range(0, 60, 12) for p in _write(rt, list(range(first + 1, first + 13)))]
    layout = rt.contexts("i1").layout
    assert all(p.exists() for p in files) and rt.index.occupied_count(layout) > 4

    rt.group_admin.remove_instance(RemoveInstanceRequest(instance_id="i1"))

    executions = stack.sfn.list_executions(stateMachineArn=stack.machines["instance_purge"])["executions"]
    assert len(executions) == 1
    assert wait_for(lambda: rt.control.get_instance("i1") is None, 60), "the purge did not finish"
    assert not any(p.exists() for p in files)
    assert rt.index.occupied_count(layout) == 0
    assert rt.valkey.exists(layout.key("u"), layout.key("sd"), layout.occupied) == 0
    assert rt.index.group_usage(["g1"])[0].bytes == 0
    _register(rt)  # the id is free again
    assert rt.index.read_raw(rt.contexts("i1").layout, [1, 2], MODE_RAW) == [None, None]


@pytest.mark.slow  # waits for a state machine run on the wall clock
def test_a_purge_continues_as_a_new_execution(stack, monkeypatch):
    rt = stack.runtime
    rt.reconfigure(purge_state_machine_arn=stack.machines["instance_purge"])
    monkeypatch.setattr(purge, "INLINE_BLOCKS", 1)
    monkeypatch.setattr(purge, "BUCKETS_PER_STEP", 1)
    from chalicelib.workflows import purges

    monkeypatch.setattr(purges, "MAX_STEPS", 2)
    _write(rt, list(range(1, 13)))
    rt.group_admin.remove_instance(RemoveInstanceRequest(instance_id="i1"))
    assert wait_for(lambda: rt.control.get_instance("i1") is None, 60), "the purge did not finish"
    executions = stack.sfn.list_executions(stateMachineArn=stack.machines["instance_purge"])["executions"]
    assert len(executions) >= 2, "the purge never handed over to a fresh execution"


def test_an_instance_being_removed_is_unknown_and_its_id_cannot_be_registered(stack):
    """A removal that has begun (here: its purge never ran, as after a crash) hides the
    instance from every call and keeps its id until the purge ends; the watchdog
    resumes it."""
    rt = stack.runtime
    files = _write(rt, [1, 2, 3])
    rt.control.begin_instance_removal("i1")
    rt.config.invalidate()
    with pytest.raises(InstanceNotFoundError):
        rt.contexts("i1")
    with pytest.raises(InstanceRemovingError, match="being removed"):
        _register(rt)
    assert [r.instance_id for r in rt.control.list_instances(removing=True)] == ["i1"]

    assert rt.purge_executions.purge_watchdog() == {"running": False, "resumed": ["i1"]}
    assert rt.control.get_instance("i1") is None and not any(p.exists() for p in files)
    _register(rt)


def test_writes_of_a_container_that_missed_the_removal_are_refused(stack):
    """A container whose config still shows the instance (up to the refresh period)
    cannot write into a key space being removed: the index refuses it."""
    rt = stack.runtime
    _write(rt, [1])
    ctx = rt.contexts("i1")
    rt.index.set_removing(ctx.layout, True)
    with pytest.raises(InstanceNotFoundError):
        rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[2]))
