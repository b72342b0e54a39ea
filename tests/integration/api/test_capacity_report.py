"""getCapacityReport without a sweep workflow configured: OK and empty (the e2e tests cover a real sweep)."""

from tests.integration.control.harness import call


def test_capacity_report_is_empty_without_a_sweep_workflow(client, runtime):
    assert runtime.settings.sweep_state_machine_arn == ""
    answer = call(client, "getCapacityReport")
    assert answer["header"]["status"]["code"] == "OK"
    assert (answer["execution_name"], answer["curves"], answer.get("recommendation")) == ("", [], None)
