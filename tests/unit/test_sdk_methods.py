"""kvcm_client's typed methods are the route tables' methods with the service's own models."""

import inspect

from kvcm_client import KvcmClient, generate, methods


def test_methods_py_is_generated_from_the_current_route_tables():
    assert generate.main(["--check"]) == 0


def test_every_api_method_has_a_typed_method_with_the_routes_models():
    for op in generate.operations():
        assert methods.OPERATIONS[op.api_name] == (op.request_model, op.response_model, op.service)
        signature = inspect.signature(getattr(KvcmClient, generate.snake_case(op.api_name)))
        assert signature.return_annotation == f"m.{op.response_model.__name__}"
    assert len(methods.OPERATIONS) == len(generate.operations())


def test_only_reads_and_repeatable_writes_are_retried():
    assert {"getCacheLocation", "listStorage", "checkHealth", "registerInstance", "removeCache"} <= methods.IDEMPOTENT
    assert (
        not {
            "startWriteCache",
            "finishWriteCache",
            "addStorage",
            "createInstanceGroup",
            "addAccount",
            "removeInstance",
            "trimCache",
            "leaderDemote",
        }
        & methods.IDEMPOTENT
    )
